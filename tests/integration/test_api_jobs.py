"""The job endpoints against a real server and database: submit, batch, read, list,
attempts, cancel, retry (the contract of issue 3, field by field)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta, timezone

import httpx
import psycopg
import pytest

from tests.factories import attempt_rows, connect, db_now, insert_job, job_row
from tests.helpers import wait_for
from tests.helpers.api import (
    api_client,
    assert_problem,
    error_fields,
    new_job,
)

JOB_FIELDS = {
    "id",
    "type",
    "queue",
    "priority",
    "payload",
    "state",
    "attempt",
    "max_attempts",
    "run_at",
    "created_at",
    "started_at",
    "finished_at",
    "last_error",
    "idempotency_key",
    "lease",
    "result",
    "workflow_id",
    "node",
    "start_by",
    "deadline",
    "heartbeat_timeout_ms",
    "limit_key",
    "trace_context",
}
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def _ts(value: str) -> datetime:
    assert RFC3339_UTC.match(value), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_submit_answers_201_with_location_and_exactly_the_promised_job(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        r = c.post("/jobs", json={"type": "email.send", "payload": {"to": "a@b.c", "n": [1, 2]}})
        assert r.status_code == 201, r.text
        job = r.json()
        assert set(job) == JOB_FIELDS
        assert isinstance(job["id"], str) and job["id"].isdigit()
        assert r.headers["location"] == f"/jobs/{job['id']}"
        assert job["type"] == "email.send"
        assert job["payload"] == {"to": "a@b.c", "n": [1, 2]}
        assert (job["queue"], job["priority"], job["state"], job["attempt"]) == (
            "default",
            0,
            "queued",
            0,
        )
        assert job["max_attempts"] == 5  # DEADMAN_MAX_ATTEMPTS's default
        _ts(job["run_at"]), _ts(job["created_at"])
        assert job["started_at"] is None and job["finished_at"] is None
        assert job["lease"] is None and job["result"] is None and job["last_error"] is None
        assert job["idempotency_key"] is None
        assert c.get(r.headers["location"]).json() == job
        # payload defaults to null
        assert c.post("/jobs", json={"type": "noop"}).json()["payload"] is None


def test_submit_stores_every_field(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        r = c.post(
            "/jobs",
            json={
                "type": "report:build",
                "queue": "reports",
                "priority": -100,
                "max_attempts": 100,
                "backoff": {"strategy": "fixed", "base_ms": 250, "max_ms": 250, "jitter": "none"},
                "timeout_ms": 30_000,
                "payload": [None, True, 1.5, "x"],
            },
        )
        assert r.status_code == 201, r.text
        job = r.json()
        assert (job["queue"], job["priority"], job["max_attempts"]) == ("reports", -100, 100)
    with connect(db_dsn) as conn:
        row = job_row(conn, int(job["id"]))
    assert row["backoff"] == {"strategy": "fixed", "base_ms": 250, "max_ms": 250, "jitter": "none"}
    assert row["timeout_ms"] == 30_000
    assert row["payload"] == [None, True, 1.5, "x"]


def test_run_at_and_delay_schedule_the_job(db_dsn: str) -> None:
    with api_client(db_dsn) as c, connect(db_dsn) as conn:
        now = db_now(conn)
        later = (now + timedelta(hours=2)).astimezone(UTC)
        # the same instant written with a +05:30 offset
        local = later.astimezone(timezone(timedelta(hours=5, minutes=30))).isoformat()
        job = c.post("/jobs", json=new_job(run_at=local)).json()
        assert job["state"] == "scheduled"
        assert _ts(job["run_at"]) == later
        past = c.post("/jobs", json=new_job(run_at="2001-02-03T04:05:06Z")).json()
        assert past["state"] == "queued" and past["run_at"] == "2001-02-03T04:05:06.000000Z"
        delayed = c.post("/jobs", json=new_job(delay_ms=60_000)).json()
        assert delayed["state"] == "scheduled"
        delay = _ts(delayed["run_at"]) - now
        assert timedelta(seconds=59) < delay < timedelta(seconds=90)
        assert c.post("/jobs", json=new_job(delay_ms=0)).json()["state"] == "queued"


def test_a_running_job_shows_its_lease_and_only_then(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running", lease_worker="w-1")
        done = insert_job(conn, state="succeeded")
    with api_client(db_dsn) as c:
        job = c.get(f"/jobs/{running.id}").json()
        assert job["state"] == "running"
        assert job["lease"]["worker"] == "w-1"
        assert job["lease"]["token"] == str(running.lease_token)
        _ts(job["lease"]["expires_at"])
        _ts(job["started_at"])
        finished = c.get(f"/jobs/{done.id}").json()
        assert finished["lease"] is None
        _ts(finished["finished_at"])


def test_unknown_and_malformed_ids_are_404(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        for path in (
            "/jobs/999999",
            "/jobs/0",
            "/jobs/-1",
            "/jobs/abc",
            "/jobs/1.5",
            "/jobs/007",
            "/jobs/99999999999999999999999",
            "/jobs/9223372036854775808",  # one over bigint
            "/jobs/%00",
            "/jobs/1%20OR%201=1",
        ):
            assert_problem(c.get(path), 404, "not-found")
        for suffix in ("attempts",):
            assert_problem(c.get(f"/jobs/abc/{suffix}"), 404)
            assert_problem(c.get(f"/jobs/424242/{suffix}"), 404)
        for action in ("cancel", "retry"):
            assert_problem(c.post(f"/jobs/abc/{action}"), 404)
            assert_problem(c.post(f"/jobs/424242/{action}"), 404)


def test_attempts_lists_the_history_oldest_first(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="retrying", attempt=2)
        for token, attempt, outcome, error in (
            (901, 1, "lease_expired", "lease expired"),
            (902, 2, "failed", "boom"),
        ):
            conn.execute(
                "INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,"
                " outcome, error) VALUES (%s, %s, %s, 'w', now(), %s, %s)",
                (token, job.id, attempt, outcome, error),
            )
        empty = insert_job(conn, state="queued")
    with api_client(db_dsn) as c:
        body = c.get(f"/jobs/{job.id}/attempts").json()
        assert [a["attempt"] for a in body["attempts"]] == [1, 2]
        first = body["attempts"][0]
        assert set(first) == {
            "attempt",
            "lease_token",
            "worker",
            "started_at",
            "finished_at",
            "outcome",
            "error",
        }
        assert first["lease_token"] == "901" and first["outcome"] == "lease_expired"
        assert body["attempts"][1]["error"] == "boom"
        assert c.get(f"/jobs/{empty.id}/attempts").json() == {"attempts": []}


# ---------------------------------------------------------------------------- list


def test_list_is_newest_first_with_keyset_pagination(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        ids = [int(c.post("/jobs", json=new_job(payload=i)).json()["id"]) for i in range(7)]
        seen: list[int] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, str | int] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/jobs", params=params).json()
            assert set(page) == {"jobs", "next_cursor"}
            seen += [int(j["id"]) for j in page["jobs"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(ids, reverse=True)
        assert pages == 3
        # a page that ends exactly at the last row says so (no empty extra page)
        assert c.get("/jobs", params={"limit": 7}).json()["next_cursor"] is None
        assert len(c.get("/jobs").json()["jobs"]) == 7  # default limit 100


def test_list_filters_by_state_type_and_queue(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        a = insert_job(conn, state="queued", type="a", queue="q1").id
        b = insert_job(conn, state="dead", type="a", queue="q2").id
        c_ = insert_job(conn, state="dead", type="b", queue="q1").id
        d = insert_job(conn, state="running", type="b", queue="q2").id

    def ids(client: httpx.Client, **params: str) -> list[int]:
        r = client.get("/jobs", params=params)
        assert r.status_code == 200, r.text
        return [int(j["id"]) for j in r.json()["jobs"]]

    with api_client(db_dsn) as c:
        assert ids(c) == [d, c_, b, a]
        assert ids(c, state="dead") == [c_, b]
        assert ids(c, type="a") == [b, a]
        assert ids(c, queue="q2") == [d, b]
        assert ids(c, state="dead", queue="q1") == [c_]
        assert ids(c, state="dead", type="b", queue="q2") == []
        assert ids(c, state="waiting") == []
        assert ids(c, type="nothing-like-this") == []
        assert ids(c, state="dead", cursor=str(c_)) == [b]


BAD_FILTERS = [
    ("state=finished", "state"),
    ("state=", "state"),
    ("state=QUEUED", "state"),
    ("limit=0", "limit"),
    ("limit=1001", "limit"),
    ("limit=-1", "limit"),
    ("limit=ten", "limit"),
    ("limit=1.5", "limit"),
    ("cursor=abc", "cursor"),
    ("cursor=-5", "cursor"),
    ("cursor=99999999999999999999", "cursor"),
    ("type=", "type"),
    ("type=" + "x" * 129, "type"),
    ("queue=a%20b", "queue"),
    ("state=queued&state=dead", "state"),
]


def test_list_refuses_bad_filters_with_422(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        for query, field in BAD_FILTERS:
            assert field in error_fields(c.get("/jobs?" + query)), query


# ---------------------------------------------------------------------------- batch


def test_batch_creates_all_in_order(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        items = [new_job(payload=i, queue=f"q{i % 2}") for i in range(5)]
        items[3]["idempotency_key"] = "batch-3"
        r = c.post("/jobs/batch", json={"jobs": items})
        assert r.status_code == 201, r.text
        jobs = r.json()["jobs"]
        assert [j["payload"] for j in jobs] == [0, 1, 2, 3, 4]
        assert [j["queue"] for j in jobs] == ["q0", "q1", "q0", "q1", "q0"]
        assert jobs[3]["idempotency_key"] == "batch-3"
        assert all(set(j) == JOB_FIELDS for j in jobs)
        assert "idempotent-replayed" not in r.headers
        # the whole batch again: its keyed job is a replay, the others are new
        again = c.post("/jobs/batch", json={"jobs": items})
        assert again.status_code == 201
        assert again.json()["jobs"][3]["id"] == jobs[3]["id"]
        assert again.json()["jobs"][0]["id"] != jobs[0]["id"]
        # only replays: 200 and the header
        only_keyed = c.post("/jobs/batch", json={"jobs": [items[3]]})
        assert only_keyed.status_code == 200
        assert only_keyed.headers["idempotent-replayed"] == "true"
        assert only_keyed.json()["jobs"][0]["id"] == jobs[3]["id"]


def _count(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone()
        assert row is not None
        return int(row["n"])


def test_batch_is_all_or_nothing(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        c.post("/jobs", json=new_job(payload="original"), headers={"Idempotency-Key": "taken"})
        before = _count(db_dsn)
        bad_item = [new_job(), new_job(priority=101), new_job(type="bad type")]
        fields = error_fields(c.post("/jobs/batch", json={"jobs": bad_item}))
        assert fields == {"jobs[1].priority", "jobs[2].type"}
        # a key already used for a different request fails the whole batch, in SQL
        reused = [new_job(), new_job(payload="different", idempotency_key="taken"), new_job()]
        body = assert_problem(
            c.post("/jobs/batch", json={"jobs": reused}), 422, "idempotency-key-reused"
        )
        assert [e["field"] for e in body["errors"]] == ["jobs[1].idempotency_key"]
        twice = [new_job(idempotency_key="k"), new_job(idempotency_key="k")]
        assert "jobs[1].idempotency_key" in error_fields(
            c.post("/jobs/batch", json={"jobs": twice})
        )
        assert _count(db_dsn) == before


BAD_BATCHES: list[tuple[object, str]] = [
    ({"jobs": []}, "jobs"),
    ({"jobs": [{"type": "noop"}] * 1001}, "jobs"),
    ({"jobs": {"type": "noop"}}, "jobs"),
    ({}, "jobs"),
    ({"jobs": [{"type": "noop"}], "extra": 1}, "extra"),
    ([{"type": "noop"}], "body"),
    ({"jobs": [{"type": "noop"}, 5]}, "jobs[1]"),
    ({"jobs": [{"type": "noop", "idempotency_key": ""}]}, "jobs[0].idempotency_key"),
    ({"jobs": [{"type": "noop", "idempotency_key": "x" * 256}]}, "jobs[0].idempotency_key"),
]


def test_batch_refuses_bad_shapes(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        for body, field in BAD_BATCHES:
            assert field in error_fields(c.post("/jobs/batch", json=body)), body


def test_batch_of_1000_and_header_key_refused(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        r = c.post(
            "/jobs/batch", json={"jobs": [{"type": "noop", "payload": i} for i in range(1000)]}
        )
        assert r.status_code == 201
        ids = [int(j["id"]) for j in r.json()["jobs"]]
        assert ids == sorted(ids) and len(set(ids)) == 1000
        assert [j["payload"] for j in r.json()["jobs"]] == list(range(1000))
        header = c.post("/jobs/batch", json={"jobs": [new_job()]}, headers={"Idempotency-Key": "k"})
        assert "Idempotency-Key" in error_fields(header)


# ---------------------------------------------------------------------------- cancel


def test_cancel_before_running_is_immediate(db_dsn: str) -> None:
    with connect(db_dsn) as conn, api_client(db_dsn) as c:
        for state in ("waiting", "scheduled", "queued", "retrying"):
            job = insert_job(conn, state=state, run_in_s=60 if state == "scheduled" else 0)
            r = c.post(f"/jobs/{job.id}/cancel")
            assert r.status_code == 200, r.text
            assert r.json()["state"] == "cancelled"
            _ts(r.json()["finished_at"])
            assert r.json()["last_error"] == "cancelled"
            assert_problem(c.post(f"/jobs/{job.id}/cancel"), 409, "conflict")
            row = job_row(conn, job.id)
            assert (row["state"], row["cancel_requested"]) == ("cancelled", False)


def test_cancel_of_a_running_job_is_requested_with_202(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="running")
        with api_client(db_dsn) as c:
            for _ in range(2):  # asking again is harmless
                r = c.post(f"/jobs/{job.id}/cancel")
                assert r.status_code == 202, r.text
                assert r.json()["state"] == "running" and r.json()["lease"] is not None
        row = job_row(conn, job.id)
        assert (row["state"], row["cancel_requested"]) == ("running", True)
        assert row["lease_token"] == job.lease_token  # the lease is untouched


def test_cancel_of_a_finished_job_is_409(db_dsn: str) -> None:
    with connect(db_dsn) as conn, api_client(db_dsn) as c:
        for state in ("succeeded", "dead", "cancelled"):
            job = insert_job(conn, state=state)
            assert_problem(c.post(f"/jobs/{job.id}/cancel"), 409, "conflict")
            assert job_row(conn, job.id)["state"] == state


def test_cancel_waits_for_a_concurrent_claim_and_then_asks_the_worker(db_dsn: str) -> None:
    """No read-then-write race: a claim holding the row makes the cancel wait; when the
    claim commits, the cancel sees a running job and answers 202, never cancelling a
    job that a worker believes it holds."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="queued")
    result: dict[str, httpx.Response] = {}
    with api_client(db_dsn) as c, psycopg.connect(db_dsn) as claimer:
        # what a claim writes, in a transaction that holds the row lock until commit
        claimed = claimer.execute(
            "UPDATE deadman.jobs SET state = 'running', attempt = attempt + 1,"
            " lease_token = nextval('deadman.lease_token_seq'), lease_worker = 'w',"
            " lease_expires_at = now() + interval '1 minute', started_at = now()"
            " WHERE id = %s AND state = 'queued'",
            (job.id,),
        )
        assert claimed.rowcount == 1  # claimed, not yet committed
        t = threading.Thread(
            target=lambda: result.setdefault("r", c.post(f"/jobs/{job.id}/cancel"))
        )
        t.start()
        with connect(db_dsn) as watcher:
            wait_for(
                lambda: watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone(),
                timeout=10,
                message="the cancel to wait for the claim's row lock",
            )
        claimer.commit()
        t.join(timeout=10)
    assert result["r"].status_code == 202, result["r"].text
    with connect(db_dsn) as conn:
        row = job_row(conn, job.id)
    assert (row["state"], row["cancel_requested"]) == ("running", True)


# ---------------------------------------------------------------------------- retry


@pytest.mark.parametrize("state", ["dead", "cancelled"])
def test_retry_requeues_with_fresh_attempts_and_keeps_history(db_dsn: str, state: str) -> None:
    with connect(db_dsn) as conn:
        job = insert_job(conn, state=state, attempt=3, max_attempts=3, rescues=2, queue="mail")
        conn.execute(
            "UPDATE deadman.jobs SET cancel_requested = true, result = '1' WHERE id = %s",
            (job.id,),
        )
        conn.execute(
            "INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,"
            " outcome, error) VALUES (77, %s, 3, 'w', now(), 'failed', 'boom')",
            (job.id,),
        )
        with connect(db_dsn) as listener:
            listener.execute("LISTEN deadman_jobs")
            with api_client(db_dsn) as c:
                r = c.post(f"/jobs/{job.id}/retry")
                assert r.status_code == 200, r.text
                body = r.json()
                assert (body["state"], body["attempt"], body["finished_at"]) == ("queued", 0, None)
                assert_problem(c.post(f"/jobs/{job.id}/retry"), 409, "conflict")
            note = next(listener.notifies(timeout=5, stop_after=1))
            assert (note.channel, note.payload) == ("deadman_jobs", "mail")
        row = job_row(conn, job.id)
        assert (row["rescues"], row["cancel_requested"], row["result"]) == (0, False, None)
        assert row["run_at"] <= db_now(conn)
        assert [a["lease_token"] for a in attempt_rows(conn, job.id)] == [77]


def test_retry_of_any_other_state_is_409(db_dsn: str) -> None:
    with connect(db_dsn) as conn, api_client(db_dsn) as c:
        for state in ("waiting", "scheduled", "queued", "running", "retrying", "succeeded"):
            job = insert_job(conn, state=state)
            assert_problem(c.post(f"/jobs/{job.id}/retry"), 409, "conflict")
            assert job_row(conn, job.id)["state"] == state
