"""Group commit of POST /jobs (deadman/api/group_commit.py) through the real app, a
real uvicorn server and real Postgres: many requests at once, each gets exactly its
own answer, and the database holds exactly what was acknowledged.

Grouping is forced, not hoped for: a transaction on the side holds an idempotency
key uncommitted, so the group that inserts that key waits on it (ON CONFLICT waits
for the other inserter); every request sent meanwhile piles up for the next group,
and the test waits until they all have before it lets the first group go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from deadman.api.group_commit import GroupCommit
from tests.factories import connect
from tests.helpers import wait_for
from tests.helpers.api import JSON, assert_problem, client, make_app, new_job, serve

Send = Callable[[], httpx.Response]


@contextmanager
def served(dsn: str) -> Iterator[tuple[str, Starlette]]:
    app = make_app(dsn, pool_max_size=6)
    with serve(app) as base:
        yield base, app


def submitter(app: Starlette) -> GroupCommit:
    found = app.state.deadman.submitter
    assert isinstance(found, GroupCommit)
    return found


@contextmanager
def key_held(dsn: str, key: str) -> Iterator[psycopg.Connection[Any]]:
    """An uncommitted job holding ``key``: an insert of that key waits until the
    returned connection commits or rolls back (rolled back on exit)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO deadman.jobs (type, idempotency_key) VALUES ('holder', %s)", (key,)
        )
        try:
            yield conn
        finally:
            conn.rollback()


def backend_waiting_on_lock(dsn: str) -> int | None:
    """The pid of the API's backend that waits on a lock in job_insert_grouped, if
    any (pg_stat_activity keeps the query's first KiB: its opening comment)."""
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '-- POST /jobs under group commit%%'"
            " AND datname = current_database()"
        ).fetchone()
    return None if row is None else int(row["pid"])


class Burst:
    """Requests sent at once, each from its own thread and connection."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.responses: dict[str, httpx.Response] = {}
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def post(
        self, name: str, body: Any = None, key: str | None = None, raw: bytes | None = None
    ) -> None:
        headers = dict(JSON)
        if key is not None:
            headers["Idempotency-Key"] = key

        def run() -> None:
            try:
                with client(self.base) as c:
                    if raw is not None:
                        self.responses[name] = c.post("/jobs", content=raw, headers=headers)
                    else:
                        self.responses[name] = c.post("/jobs", json=body, headers=headers)
            except BaseException as exc:  # reported by join()
                self.errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> dict[str, httpx.Response]:
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), "a request did not finish"
        assert not self.errors, self.errors
        return self.responses


def _rows(dsn: str) -> dict[int, dict[str, Any]]:
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id, type, payload, idempotency_key FROM deadman.jobs WHERE type <> 'holder'"
        ).fetchall()
    return {int(r["id"]): dict(r) for r in rows}


def test_a_burst_of_mixed_submissions_each_gets_its_own_answer(db_dsn: str) -> None:
    """New jobs with and without keys, replays, a key reused for another body, one
    key twice in the burst (same body, then another body) and invalid bodies, all at
    once: each answer is what the request would have got alone, every 201 is stored
    once, and nothing else is."""
    with served(db_dsn) as (base, app):
        gc = submitter(app)
        with client(base) as c:
            replayed = c.post(
                "/jobs", json=new_job(payload={"r": 1}), headers={"Idempotency-Key": "r"}
            )
            reused = c.post(
                "/jobs", json=new_job(payload={"m": 1}), headers={"Idempotency-Key": "m"}
            )
        assert replayed.status_code == reused.status_code == 201
        with key_held(db_dsn, "hold") as holder:
            burst = Burst(base)
            burst.post("first", new_job(payload={"first": True}), key="hold")
            wait_for(
                lambda: backend_waiting_on_lock(db_dsn) is not None, 15, message="the held group"
            )
            for i in range(8):
                burst.post(f"plain-{i}", new_job(payload={"i": i}))
                burst.post(f"keyed-{i}", new_job(payload={"k": i}), key=f"new-{i}")
            for i in range(3):
                burst.post(f"replay-{i}", new_job(payload={"r": 1}), key="r")
            for i in range(2):
                burst.post(f"reused-{i}", new_job(payload={"m": 2 + i}), key="m")
            burst.post("twice-a", new_job(payload={"t": 1}), key="twice")
            burst.post("twice-b", new_job(payload={"t": 1}), key="twice")
            burst.post("other-a", new_job(payload={"o": 1}), key="other")
            burst.post("other-b", new_job(payload={"o": 2}), key="other")
            # refused before they reach a group: never counted among the waiting
            burst.post("bad-type", new_job(type=""))
            burst.post("bad-priority", new_job(priority=10**6), key="bad")
            burst.post("bad-json", raw=b'{"type": "noop",')
            burst.post("bad-dup-key", raw=b'{"type": "noop", "type": "other"}')
            reach_a_group = 16 + 3 + 2 + 4
            wait_for(
                lambda: gc.waiting == reach_a_group, 15, message="the burst to wait for a group"
            )
            groups_before, grouped_before = gc.groups, gc.grouped
            seen_before = group_sizes(base)
            holder.rollback()  # the first group goes on; the burst follows it
            got = burst.join()
            seen = group_sizes(base)

    first = got.pop("first")
    assert first.status_code == 201, first.text
    acked = {int(first.json()["id"])}
    for i in range(8):
        for name in (f"plain-{i}", f"keyed-{i}"):
            r = got.pop(name)
            assert r.status_code == 201, (name, r.text)
            assert r.headers["location"] == f"/jobs/{r.json()['id']}"
            assert r.json()["idempotency_key"] == (f"new-{i}" if name.startswith("k") else None)
            assert r.json()["payload"] == ({"k": i} if name.startswith("k") else {"i": i})
            acked.add(int(r.json()["id"]))
    for i in range(3):
        r = got.pop(f"replay-{i}")
        assert r.status_code == 200, r.text
        assert r.headers["idempotent-replayed"] == "true"
        assert r.json() == replayed.json()
    for i in range(2):
        body = assert_problem(got.pop(f"reused-{i}"), 422, "idempotency-key-reused")
        assert f"job {reused.json()['id']}" in body["detail"]
    # one key twice with the same body: one creates, the other replays it
    twice = sorted([got.pop("twice-a"), got.pop("twice-b")], key=lambda r: r.status_code)
    assert [r.status_code for r in twice] == [200, 201]
    assert twice[0].json()["id"] == twice[1].json()["id"]
    acked.add(int(twice[1].json()["id"]))
    # one key twice with different bodies: one creates, the other is refused
    other = sorted([got.pop("other-a"), got.pop("other-b")], key=lambda r: r.status_code)
    assert other[0].status_code == 201
    assert_problem(other[1], 422, "idempotency-key-reused")
    acked.add(int(other[0].json()["id"]))
    assert_problem(got.pop("bad-type"), 422, "validation")
    assert_problem(got.pop("bad-priority"), 422, "validation")
    assert_problem(got.pop("bad-json"), 400, "malformed-json")
    assert_problem(got.pop("bad-dup-key"), 422, "validation")
    assert not got

    rows = _rows(db_dsn)
    seeded = {int(replayed.json()["id"]), int(reused.json()["id"])}
    assert set(rows) == acked | seeded  # every 201 once, nothing else
    assert len(acked) == 1 + 16 + 2
    # the burst was written in few statements, not one per request: the first group,
    # then the 25 that waited (less the second of each repeated key, which waits for
    # the next group), then those two
    assert gc.groups - groups_before <= 4
    assert gc.grouped >= 1 + 16 + 3 + 2 + 2
    # /metrics shows the same groups: how many, how many submissions, and that the
    # burst's big group is above the smallest buckets
    assert seen["count"] - seen_before["count"] == gc.groups - groups_before
    assert seen["sum"] - seen_before["sum"] == gc.grouped - grouped_before
    assert seen["le=16"] - seen_before["le=16"] < seen["count"] - seen_before["count"]


def group_sizes(base: str) -> dict[str, float]:
    """deadman_api_group_commit_size as GET /metrics shows it: count, sum and the
    cumulative buckets by their bound ("le=16")."""
    with client(base) as c:
        text = c.get("/metrics").text
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "deadman_api_group_commit_size"
    ]
    found: dict[str, float] = {}
    for sample in family.samples:
        part = sample.name.removeprefix(family.name + "_")
        if part == "bucket":
            part = "le=" + sample.labels["le"].removesuffix(".0")
        found[part] = sample.value
    return found


def test_a_row_the_database_refuses_fails_only_its_own_request(db_dsn: str) -> None:
    """A constraint the API does not know refuses one row of a group: the group is
    written again row by row; that request gets its 422, every other one its 201."""
    with connect(db_dsn) as conn:
        conn.execute(
            "ALTER TABLE deadman.jobs ADD CONSTRAINT test_refused"
            " CHECK (payload IS NULL OR NOT payload ? 'refuse')"
        )
    with served(db_dsn) as (base, app):
        gc = submitter(app)
        with key_held(db_dsn, "hold") as holder:
            burst = Burst(base)
            burst.post("first", new_job(), key="hold")
            wait_for(
                lambda: backend_waiting_on_lock(db_dsn) is not None, 15, message="the held group"
            )
            for i in range(6):
                burst.post(f"ok-{i}", new_job(payload={"i": i}), key=None if i % 2 else f"k{i}")
            burst.post("refused", new_job(payload={"refuse": 1}), key="refused")
            burst.post("refused-plain", new_job(payload={"refuse": 2}))
            wait_for(lambda: gc.waiting == 8, 15, message="the burst to wait for a group")
            holder.rollback()
            got = burst.join()
    assert got.pop("first").status_code == 201
    for name in ("refused", "refused-plain"):
        body = assert_problem(got.pop(name), 422, "validation")
        assert "test_refused" in body["detail"]
    ids = set()
    for name, r in got.items():
        assert r.status_code == 201, (name, r.text)
        ids.add(int(r.json()["id"]))
    rows = _rows(db_dsn)
    assert len(ids) == 6 and ids <= set(rows)
    assert len(rows) == 7  # the six and the first; neither refused row
    with connect(db_dsn) as conn:
        gone = conn.execute(
            "SELECT count(*) AS n FROM deadman.jobs WHERE idempotency_key = 'refused'"
        ).fetchone()
    assert gone is not None and gone["n"] == 0


def _blocked_group(db_dsn: str, act: Callable[[int], None]) -> dict[str, httpx.Response]:
    """A group of six requests (one holds a key another transaction holds, five have
    no key) blocked inside its statement; ``act`` is given its backend's pid, then
    the other transaction rolls back."""
    with served(db_dsn) as (base, app):
        gc = submitter(app)
        with key_held(db_dsn, "hold-1") as first_holder, key_held(db_dsn, "hold-2"):
            burst = Burst(base)
            burst.post("first", new_job(), key="hold-1")
            wait_for(lambda: backend_waiting_on_lock(db_dsn) is not None, 15, message="group 1")
            burst.post("held", new_job(payload={"held": True}), key="hold-2")
            for i in range(5):
                burst.post(f"plain-{i}", new_job(payload={"i": i}))
            wait_for(lambda: gc.waiting == 6, 15, message="the burst to wait for group 2")
            first_holder.rollback()  # group 1 goes on; group 2 then waits on hold-2

            def second_blocked() -> bool:
                pid = backend_waiting_on_lock(db_dsn)
                return pid is not None and gc.waiting == 0 and gc.groups >= 1

            wait_for(second_blocked, 15, message="group 2 to wait on hold-2")
            pid = backend_waiting_on_lock(db_dsn)
            assert pid is not None
            act(pid)
        return burst.join()


def test_an_outcome_the_server_cannot_know_fails_the_whole_group_with_503(db_dsn: str) -> None:
    """The group's backend is terminated mid-statement: the server cannot tell whether
    it committed, so it writes nothing again (key-less jobs would be stored twice) and
    every request of the group gets 503 with Retry-After; nothing is stored for them."""

    def terminate(pid: int) -> None:
        with connect(db_dsn) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))

    got = _blocked_group(db_dsn, terminate)
    assert got.pop("first").status_code == 201
    for name, r in got.items():
        assert_problem(r, 503, "database-unavailable")
        assert r.headers["retry-after"], name
    assert len(_rows(db_dsn)) == 1


def test_a_cancelled_group_is_written_again_row_by_row(db_dsn: str) -> None:
    """A statement cancelled by the server (57014) committed nothing, so its rows are
    inserted again one by one: every request still gets its 201, each job once."""

    def cancel(pid: int) -> None:
        with connect(db_dsn) as conn:
            conn.execute("SELECT pg_cancel_backend(%s)", (pid,))

    # the row-by-row insert of the held key waits on it again; the holder rolls back
    got = _blocked_group(db_dsn, cancel)
    ids = set()
    for name, r in got.items():
        assert r.status_code == 201, (name, r.text)
        ids.add(int(r.json()["id"]))
    assert set(_rows(db_dsn)) == ids and len(ids) == 7
