"""Flow-control limits on real Postgres: the HTTP contract, the Python client and the
CLI alike, hostile input, and the keyed claim's decisions, including two claimers
racing for a key's last slot in both commit orders (the race-matrix rows of
job_claim against itself, limit_put, job_finish_many and the rescue)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
import pytest

from deadman import Client
from deadman.cli import main
from deadman.config import Settings
from deadman.db.queries import QUERIES
from deadman.model import AttemptOutcome, JobState
from deadman.spec import SpecError
from deadman.store.leases import ClaimParams, Finish, claim_params, finish_params
from tests.factories import connect, expire_lease
from tests.helpers import wait_for
from tests.helpers.api import api_client, assert_problem, error_fields


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=Settings()) as c:
        yield c
        with connect(db_dsn) as conn:
            conn.execute("DELETE FROM deadman.limits")
            conn.execute("DELETE FROM deadman.jobs WHERE limit_key IS NOT NULL")


def claim(conn: psycopg.Connection[Any], queue: str = "lim", limit: int = 10) -> list[Any]:
    rows = conn.execute(
        QUERIES["job_claim"], claim_params(ClaimParams(queue, "w-test", limit, 60_000))
    ).fetchall()
    return list(rows)


def keys_of(rows: list[Any]) -> list[str | None]:
    return [r["limit_key"] for r in rows]


# --------------------------------------------------------------------------- contract


def test_put_get_list_delete_over_http(db_dsn: str, client: Client) -> None:
    with api_client(db_dsn) as http:
        r = http.put("/limits/stripe", json={"concurrency": 5, "rate": None})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "key": "stripe",
            "concurrency": 5,
            "rate": None,
            "running": 0,
            "available": None,
        }
        r = http.put("/limits/mail", json={"rate": {"count": 100, "per_ms": 60_000}})
        assert r.json()["available"] == 100
        assert [x["key"] for x in http.get("/limits").json()["limits"]] == ["mail", "stripe"]
        # replaced, not merged: the rate is gone, the concurrency changed
        r = http.put("/limits/mail", json={"concurrency": 2})
        assert (r.json()["concurrency"], r.json()["rate"]) == (2, None)
        assert http.get("/limits/mail").json()["concurrency"] == 2
        assert http.delete("/limits/mail").status_code == 204
        assert_problem(http.delete("/limits/mail"), 404)
        assert_problem(http.get("/limits/mail"), 404)


def test_jobs_carry_their_limit_key(db_dsn: str, client: Client) -> None:
    with api_client(db_dsn) as http:
        r = http.post("/jobs", json={"type": "t", "queue": "lim", "limit_key": "stripe"})
        assert r.status_code == 201 and r.json()["limit_key"] == "stripe"
        r = http.post(
            "/jobs/batch", json={"jobs": [{"type": "t", "limit_key": "a"}, {"type": "t"}]}
        )
        assert [j["limit_key"] for j in r.json()["jobs"]] == ["a", None]
        r = http.post(
            "/workflows",
            json={"name": "w", "nodes": [{"name": "n", "type": "t", "limit_key": "wf"}]},
        )
        node = http.get(f"/jobs/{r.json()['nodes'][0]['job_id']}").json()
        assert node["limit_key"] == "wf"
    assert client.enqueue("t", limit_key="py").limit_key == "py"
    ids = client.enqueue_many([client.job("t", limit_key="copy"), client.job("t")])
    assert [client.get(i).limit_key for i in ids] == ["copy", None]  # type: ignore[union-attr]


BAD_LIMITS = [
    ({}, {"body"}),
    ({"concurrency": None, "rate": None}, {"body"}),
    ({"concurrency": 0}, {"concurrency"}),
    ({"concurrency": 100_001}, {"concurrency"}),
    ({"concurrency": True}, {"concurrency"}),
    ({"concurrency": "5"}, {"concurrency"}),
    ({"rate": {"count": 0, "per_ms": 1}}, {"rate.count"}),
    ({"rate": {"count": 1, "per_ms": 86_400_001}}, {"rate.per_ms"}),
    ({"rate": {"count": 1}}, {"rate.per_ms"}),
    ({"rate": [1, 1000]}, {"rate"}),
    ({"concurrency": 1, "burst": 3}, {"burst"}),
    ({"rate": {"count": 1, "per_ms": 1, "x": 0}}, {"rate.x"}),
]


@pytest.mark.parametrize(("body", "fields"), BAD_LIMITS, ids=[str(b)[:40] for b, _ in BAD_LIMITS])
def test_bad_limits_are_422_naming_the_field_and_change_nothing(
    db_dsn: str, client: Client, body: dict[str, Any], fields: set[str]
) -> None:
    with api_client(db_dsn) as http:
        http.put("/limits/k", json={"concurrency": 3})
        r = http.put("/limits/k", json=body)
        assert error_fields(r) == fields, r.text
        assert http.get("/limits/k").json()["concurrency"] == 3  # untouched


@pytest.mark.parametrize("key", ["has space", "x" * 129, "é", "a/b"])
def test_bad_keys_are_refused_everywhere(
    db_dsn: str,
    client: Client,
    key: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with api_client(db_dsn) as http:
        path = "/limits/" + key.replace("/", "%2F")
        for method in ("put", "get", "delete"):
            kwargs: dict[str, Any] = {"json": {"concurrency": 1}} if method == "put" else {}
            r = getattr(http, method)(path, **kwargs)
            assert r.status_code in (404, 422), (method, r.text)  # a '/' is another path
        r = http.post("/jobs", json={"type": "t", "limit_key": key})
        assert error_fields(r) == {"limit_key"}
    with pytest.raises(SpecError):
        client.set_limit(key, concurrency=1)
    with pytest.raises(SpecError):
        client.enqueue("t", limit_key=key)
    monkeypatch.setenv("DEADMAN_DATABASE_URL", db_dsn)
    assert main(["limits", "set", key, "--concurrency", "1"]) == 2
    assert capsys.readouterr().err.startswith("deadman: key: ")


def test_the_client_and_the_cli_set_the_same_limits(
    db_dsn: str,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = client.set_limit("k", concurrency=5, rate=(100, timedelta(minutes=1)))
    assert (got.concurrency, got.rate_count, got.rate_per_ms, got.available) == (5, 100, 60000, 100)
    assert [x.key for x in client.limits()] == ["k"]
    monkeypatch.setenv("DEADMAN_DATABASE_URL", db_dsn)
    capsys.readouterr()
    assert main(["limits", "set", "c", "--rate", "10/1000"]) == 0
    assert '"rate": {"count": 10, "per_ms": 1000}' in capsys.readouterr().out
    assert main(["limits", "ls"]) == 0
    assert '"key": "c"' in capsys.readouterr().out
    assert main(["limits", "rm", "c"]) == 0
    assert main(["limits", "rm", "c"]) == 1
    assert main(["limits", "set", "c", "--rate", "10"]) == 2
    assert "rate: must be COUNT/PER_MS" in capsys.readouterr().err
    assert main(["limits", "set", "c", "--concurrency", "0"]) == 2
    assert "concurrency: must be an integer from 1 to 100000" in capsys.readouterr().err
    assert main(["limits", "set", "c"]) == 2
    assert client.delete_limit("k") and not client.delete_limit("k")


# --------------------------------------------------------------------------- the claim


def test_concurrency_bounds_the_claim_and_frees_with_the_finish(
    db_dsn: str, client: Client
) -> None:
    client.set_limit("s", concurrency=2)
    for _ in range(5):
        client.enqueue("t", queue="lim", limit_key="s")
    client.enqueue("t", queue="lim")
    with connect(db_dsn) as conn:
        first = claim(conn)
        assert sorted(keys_of(first), key=str) == [None, "s", "s"]
        assert keys_of(claim(conn)) == []  # both slots held
        assert client.limit("s").running == 2  # type: ignore[union-attr]
        done = next(r for r in first if r["limit_key"] == "s")
        conn.execute(
            "UPDATE deadman.jobs SET state = 'succeeded', finished_at = now(), lease_token = NULL,"
            " lease_worker = NULL, lease_expires_at = NULL WHERE id = %s",
            [done["id"]],
        )
        assert keys_of(claim(conn)) == ["s"]  # the finished job's slot, and only it


def test_a_lapsed_lease_holds_its_slot_until_it_is_rescued(db_dsn: str, client: Client) -> None:
    client.set_limit("s", concurrency=1)
    client.enqueue("t", queue="lim", limit_key="s")
    client.enqueue("t", queue="lim", limit_key="s")
    with connect(db_dsn) as conn:
        [held] = claim(conn)
        expire_lease(conn, held["id"])
        assert claim(conn) == []  # lapsed but not rescued: the slot is still its lease's
        conn.execute(
            QUERIES["job_rescue_expired"], {"max_rescues": 100, "quarantine_at": 100, "limit": 100}
        )
        again = claim(conn)
        assert len(again) == 1


def test_keys_without_a_limit_run_unlimited_and_a_limit_applies_from_the_next_claim(
    db_dsn: str, client: Client
) -> None:
    for _ in range(6):
        client.enqueue("t", queue="lim", limit_key="free")
    with connect(db_dsn) as conn:
        assert len(claim(conn, limit=3)) == 3
        client.set_limit("free", concurrency=3)
        assert claim(conn) == []  # 3 running already: the new limit holds at once
        client.set_limit("free", concurrency=4)
        assert len(claim(conn)) == 1
        client.delete_limit("free")
        assert len(claim(conn)) == 2


def test_rate_bounds_starts_in_the_window(db_dsn: str, client: Client) -> None:
    client.set_limit("r", rate=(3, timedelta(hours=1)))
    for _ in range(5):
        client.enqueue("t", queue="lim", limit_key="r")
    with connect(db_dsn) as conn:
        assert len(claim(conn)) == 3
        assert claim(conn) == []
        assert client.limit("r").available == 0  # type: ignore[union-attr]


def _left(conn: psycopg.Connection[Any]) -> tuple[bool, float | None]:
    """What a claim left in the queue (job_claim_left): more, and the wait in seconds."""
    row = conn.execute(QUERIES["job_claim_left"], {"queue": "lim", "quarantine_at": 5}).fetchone()
    assert row is not None
    return bool(row["more"]), None if row["wait"] is None else row["wait"].total_seconds()


def test_an_idle_producer_wakes_when_a_rate_token_frees(db_dsn: str, client: Client) -> None:
    """job_claim_left's wait: at the oldest start of the window + per_ms; not for a key
    held by its concurrency (a finish frees that), nor for a key with nothing due."""
    client.set_limit("r", rate=(2, timedelta(seconds=30)))
    for _ in range(3):
        client.enqueue("t", queue="lim", limit_key="r")
    with connect(db_dsn) as conn:
        assert _left(conn) == (True, None)  # due, no start logged yet: nothing to wait for
        assert len(claim(conn)) == 2 and claim(conn) == []
        more, wait = _left(conn)
        assert more  # the third is due, held back by its rate: a claim takes nothing
        assert wait is not None and 29 < wait <= 30  # the first start leaves the window
        client.set_limit("r", concurrency=2, rate=(2, timedelta(seconds=30)))
        assert _left(conn)[1] is None  # at its concurrency: a finish, not a token
        conn.execute("DELETE FROM deadman.jobs WHERE limit_key = 'r' AND state = 'queued'")
        client.set_limit("r", rate=(2, timedelta(seconds=30)))
        assert _left(conn) == (False, None)  # nothing due behind the limit


def _window_starts(conn: psycopg.Connection[Any], key: str) -> int:
    """The starts of ``key`` still inside its rate window, by the database's clock."""
    row = conn.execute(
        "SELECT count(*) AS n FROM deadman.limit_starts s JOIN deadman.limits l USING (key)"
        " WHERE s.key = %s AND s.at > now() - l.rate_per_ms * interval '1 millisecond'",
        (key,),
    ).fetchone()
    assert row is not None
    return int(row["n"])


def _wait_until_window_holds(conn: psycopg.Connection[Any], key: str, n: int) -> None:
    wait_for(lambda: _window_starts(conn, key) <= n, 10, message=f"window of {key} to hold {n}")


def _wait_for_clock(conn: psycopg.Connection[Any], at: datetime) -> None:
    """Until the database's clock has passed ``at``."""
    wait_for(lambda: _scalar(conn, "SELECT clock_timestamp() > %s", (at,)), 5)


def _scalar(conn: psycopg.Connection[Any], sql: LiteralString, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return next(iter(row.values()))


def _last_start(conn: psycopg.Connection[Any], key: str) -> datetime:
    """When the newest start of ``key`` was logged."""
    at: datetime = _scalar(conn, "SELECT max(at) FROM deadman.limit_starts WHERE key = %s", (key,))
    return at


def test_a_token_that_frees_after_an_empty_claim_is_waited_for_briefly_not_for_the_poll(
    db_dsn: str, client: Client
) -> None:
    """The race behind a rate-limited queue falling behind by a poll (DECISIONS 96): a
    producer whose idle wait ended just before a token freed claims, finds the window
    still full and takes nothing, and by the look after it (job_claim_left) the
    window's starts have left it. The look must then say "claim again in 10 ms", not
    "nothing to wait for", which meant sleeping the whole poll with a token free and a
    job due."""
    client.set_limit("r", rate=(2, timedelta(milliseconds=400)))
    for _ in range(3):
        client.enqueue("t", queue="lim", limit_key="r")
    with connect(db_dsn) as conn:
        assert len(claim(conn)) == 2 and claim(conn) == []  # the window is full
        _wait_until_window_holds(conn, "r", 0)  # ... and then empty again
        more, wait = _left(conn)
        assert more
        assert wait is not None and wait <= 0.011, wait  # a token is free now


def test_a_freed_token_means_claim_again_only_for_a_job_the_claim_would_take(
    db_dsn: str, client: Client
) -> None:
    """The "claim again in 10 ms" of a just-freed token is for a key whose job the
    keyed claim would take: not in a paused queue, not for a quarantined job or one
    past its start_by, and not once the token has been free for over a second (then
    a row someone else held kept the claim empty, and its holder wakes the queue).
    Without these, a producer would claim every 10 ms for as long as such a job
    waits."""
    per = timedelta(milliseconds=200)
    client.set_limit("r", rate=(1, per))
    job = client.enqueue("t", queue="lim", limit_key="r")
    with connect(db_dsn) as conn:
        assert len(claim(conn)) == 1
        conn.execute(
            "UPDATE deadman.jobs SET state = 'retrying', lease_token = NULL,"
            " lease_worker = NULL, lease_expires_at = NULL WHERE id = %s",
            (job.id,),
        )
        _wait_until_window_holds(conn, "r", 0)
        assert _left(conn)[1] == 0.01  # the token just freed and the job is due
        conn.execute(QUERIES["queue_set_paused"], {"name": "lim", "paused": True})
        assert _left(conn)[1] is None
        conn.execute(QUERIES["queue_set_paused"], {"name": "lim", "paused": False})
        conn.execute("UPDATE deadman.jobs SET rescues = 5 WHERE id = %s", (job.id,))
        assert _left(conn)[1] is None  # quarantined: claimed alone, another way
        conn.execute(
            "UPDATE deadman.jobs SET rescues = 0, start_by = now() WHERE id = %s", (job.id,)
        )
        assert _left(conn)[1] is None  # too late to start: the rescuer ends it
        conn.execute("UPDATE deadman.jobs SET start_by = NULL WHERE id = %s", (job.id,))
        assert _left(conn)[1] == 0.01
        _wait_for_clock(conn, _last_start(conn, "r") + per + timedelta(seconds=1))
        assert _left(conn) == (True, None)  # free for over a second: not what held it


def test_a_token_freed_by_the_oldest_start_is_not_waited_for_until_the_next_leaves(
    db_dsn: str, client: Client
) -> None:
    """Two starts half a window apart at a rate of two: once the older one has left,
    a token is free now (the look used to wait for the younger one to leave too)."""
    per = timedelta(seconds=1)
    client.set_limit("r", rate=(2, per))
    for _ in range(3):
        client.enqueue("t", queue="lim", limit_key="r")
    with connect(db_dsn) as conn:
        assert len(claim(conn, limit=1)) == 1
        _wait_for_clock(conn, _last_start(conn, "r") + per / 2)
        assert len(claim(conn, limit=1)) == 1
        assert claim(conn) == []  # the window is full
        _wait_until_window_holds(conn, "r", 1)  # the older start has left it
        with conn.transaction():  # one now() for the look and the check after it
            more, wait = _left(conn)
            young = _window_starts(conn, "r")
        assert young == 1  # the younger start is still in the window
        assert more and wait is not None and wait <= 0.011, wait


def test_a_window_over_a_lowered_rate_frees_when_enough_starts_have_left(
    db_dsn: str, client: Client
) -> None:
    """Three starts in the window and a rate lowered to two: a token frees when the
    second newest start leaves, not the oldest (the oldest leaving still leaves two)."""
    per = timedelta(seconds=30)
    client.set_limit("r", rate=(3, per))
    for _ in range(4):
        client.enqueue("t", queue="lim", limit_key="r")
    apart = timedelta(milliseconds=300)
    with connect(db_dsn) as conn:
        for _ in range(3):
            assert len(claim(conn, limit=1)) == 1
            _wait_for_clock(conn, _last_start(conn, "r") + apart)
        stamps = [
            r["at"]
            for r in conn.execute(
                "SELECT at FROM deadman.limit_starts WHERE key = 'r' ORDER BY at"
            ).fetchall()
        ]
        client.set_limit("r", rate=(2, per))
        with conn.transaction():  # one now() for the look and the reference
            now = _scalar(conn, "SELECT now()")
            more, wait = _left(conn)
        assert more and wait is not None
        assert abs(wait - (stamps[1] + per - now).total_seconds()) < 0.001, (wait, stamps)


def test_keys_take_turns_within_a_priority(db_dsn: str, client: Client) -> None:
    """One tenant's backlog cannot starve another key in the same queue."""
    client.enqueue_many([client.job("t", queue="lim", limit_key="big") for _ in range(50)])
    client.enqueue_many([client.job("t", queue="lim", limit_key="small") for _ in range(2)])
    with connect(db_dsn) as conn:
        got = keys_of(claim(conn, limit=4))
    assert sorted(got, key=str) == ["big", "big", "small", "small"]


def test_keyed_jobs_never_block_unkeyed_ones(db_dsn: str, client: Client) -> None:
    client.set_limit("one", concurrency=1)
    client.enqueue_many([client.job("t", queue="lim", limit_key="one") for _ in range(2000)])
    client.enqueue_many([client.job("t", queue="lim") for _ in range(10)])
    with connect(db_dsn) as conn:
        got = keys_of(claim(conn, limit=20))
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + QUERIES["job_claim"],
            claim_params(ClaimParams("lim", "w", 20, 60_000)),
        ).fetchone()
    assert sorted(got, key=str) == [None] * 10 + ["one"]
    assert "jobs_claim_idx" in str(plan)


# --------------------------------------------------------------------------- races


def _in_transaction(
    db_dsn: str, sql: str, params: Any
) -> tuple[psycopg.Connection[Any], list[Any]]:
    conn = connect(db_dsn, autocommit=False)
    rows = conn.execute(sql, params).fetchall() if sql else []
    return conn, list(rows)


def _claim_in_thread(db_dsn: str, out: list[Any]) -> threading.Thread:
    def run() -> None:
        with connect(db_dsn) as conn:
            out.extend(claim(conn))

    t = threading.Thread(target=run)
    t.start()
    return t


def _blocked_on_the_limit(db_dsn: str) -> bool:
    with connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE %s",
            ["%job_claim_keyed%"],
        ).fetchone()
        return bool(row and row["n"])


@pytest.mark.parametrize("first_commits", [True, False], ids=["commit", "rollback"])
def test_two_claimers_race_for_the_last_slot(
    db_dsn: str, client: Client, first_commits: bool
) -> None:
    client.set_limit("s", concurrency=1)
    client.enqueue("t", queue="lim", limit_key="s")
    client.enqueue("t", queue="lim", limit_key="s")
    params = claim_params(ClaimParams("lim", "w-a", 10, 60_000))
    a, got_a = _in_transaction(db_dsn, QUERIES["job_claim"], params)
    assert len(got_a) == 1
    got_b: list[Any] = []
    t = _claim_in_thread(db_dsn, got_b)
    wait_for(lambda: _blocked_on_the_limit(db_dsn), timeout=10, message="B waits on the lock")
    (a.commit if first_commits else a.rollback)()
    a.close()
    t.join(10)
    assert len(got_b) == (0 if first_commits else 1)
    with connect(db_dsn) as conn:
        running = conn.execute(
            "SELECT count(*) AS n FROM deadman.jobs WHERE limit_key = 's' AND state = 'running'"
        ).fetchone()
    assert running is not None and running["n"] == 1


@pytest.mark.parametrize("new_concurrency", [1, 3])
def test_a_claim_waits_for_a_limit_change_and_obeys_it(
    db_dsn: str, client: Client, new_concurrency: int
) -> None:
    client.set_limit("s", concurrency=2)
    for _ in range(4):
        client.enqueue("t", queue="lim", limit_key="s")
    a, _ = _in_transaction(
        db_dsn,
        QUERIES["limit_put"],
        {"key": "s", "concurrency": new_concurrency, "rate_count": None, "rate_per_ms": None},
    )
    got: list[Any] = []
    t = _claim_in_thread(db_dsn, got)
    wait_for(lambda: _blocked_on_the_limit(db_dsn), timeout=10, message="the claim waits")
    a.commit()
    a.close()
    t.join(10)
    assert len(got) == new_concurrency


@pytest.mark.parametrize("how", ["finish", "rescue"])
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "in-flight"])
def test_a_claim_against_the_finish_or_rescue_that_frees_the_slot(
    db_dsn: str, client: Client, how: str, committed: bool
) -> None:
    """The slot frees when the statement that ends the attempt commits, and not
    before: an in-flight finish or rescue (its row lock held, not committed) leaves
    the slot taken; the claim after its commit gets it."""
    client.set_limit("s", concurrency=1)
    client.enqueue("t", queue="lim", limit_key="s")
    client.enqueue("t", queue="lim", limit_key="s")
    with connect(db_dsn) as conn:
        [held] = claim(conn)
        if how == "rescue":
            expire_lease(conn, held["id"])
    if how == "finish":
        sql = QUERIES["job_finish_many"]
        params: Any = finish_params(
            [Finish(held["id"], held["lease_token"], JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)]
        )
    else:
        sql = QUERIES["job_rescue_expired"]
        params = {"max_rescues": 100, "quarantine_at": 100, "limit": 100}
    ender, ended = _in_transaction(db_dsn, sql, params)
    assert len(ended) == 1
    with connect(db_dsn) as conn:
        if committed:
            ender.commit()
            assert len(claim(conn)) == 1
        else:
            assert claim(conn) == []  # still running, as far as any snapshot can see
            ender.commit()
            assert len(claim(conn)) == 1
    ender.close()
