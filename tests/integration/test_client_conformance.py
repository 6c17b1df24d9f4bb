"""deadman.Client and deadman.AsyncClient cannot drift: every case runs on both, and
each must return the same thing, store the same rows and raise the same error in the
same words.

Both run the same code (deadman.clientcore: each call written once, bound to both);
what differs is the runner (blocking or awaited) and the connection ``conn=`` takes
(psycopg ``Connection`` or ``AsyncConnection``). These cases prove the runners and
the joined transactions behave alike.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from deadman import AsyncClient, Client, WaitTimeout
from deadman.config import Settings
from deadman.errors import Conflict, DuplicateKey, NotFound, UnsupportedConnection
from deadman.model import JobState, WorkflowState
from deadman.spec import SpecError
from deadman.store import InvalidWorkflow, UnknownDependency
from deadman.store.limits import Limit
from tests.factories import connect, insert_job, job_row
from tests.helpers import wait_for

WRITES = ["enqueue", "enqueue_many", "workflow", "set_limit", "set_schedule"]


class SyncSide:
    """A Client, and conn= a psycopg Connection."""

    name = "sync"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.client = Client(dsn, settings=Settings(max_attempts=3))

    def __call__(self, op: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.client, op)(*args, **kwargs)

    def joined(self, commit: bool, op: str, *args: Any, **kwargs: Any) -> Any:
        """``op`` with conn= a connection of the test's, in its transaction, then
        committed or rolled back."""
        with psycopg.connect(self.dsn) as conn:
            out = getattr(self.client, op)(*args, conn=conn, **kwargs)
            (conn.commit if commit else conn.rollback)()
        return out

    def close(self) -> None:
        self.client.close()


class AsyncSide:
    """An AsyncClient on an event loop of its own, and conn= an AsyncConnection."""

    name = "async"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.loop = asyncio.new_event_loop()
        self.client = AsyncClient(dsn, settings=Settings(max_attempts=3))

    def __call__(self, op: str, *args: Any, **kwargs: Any) -> Any:
        return self.loop.run_until_complete(getattr(self.client, op)(*args, **kwargs))

    def joined(self, commit: bool, op: str, *args: Any, **kwargs: Any) -> Any:
        async def main() -> Any:
            async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
                out = await getattr(self.client, op)(*args, conn=conn, **kwargs)
                await (conn.commit() if commit else conn.rollback())
            return out

        return self.loop.run_until_complete(main())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


Side = SyncSide | AsyncSide


@pytest.fixture(params=[SyncSide, AsyncSide], ids=["sync", "async"])
def side(request: pytest.FixtureRequest, db_dsn: str) -> Iterator[Side]:
    made: Side = request.param(db_dsn)
    try:
        yield made
    finally:
        made.close()


# -- shared by the conn= tests (test_async_client, test_sqlalchemy, test_django) ------


@pytest.fixture(name="listener")
def listener_fixture(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection LISTENing as idle workers do (deadman_jobs: a queue has work)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("LISTEN deadman_jobs")
        yield conn


def heard(listener: psycopg.Connection[Any], wait_s: float) -> list[str]:
    """What ``listener`` was told within ``wait_s`` seconds (the first note at most)."""
    return [n.payload for n in listener.notifies(timeout=wait_s, stop_after=1)]


def job_ids(dsn: str) -> list[int]:
    with connect(dsn) as conn:
        return [int(r["id"]) for r in conn.execute("SELECT id FROM deadman.jobs ORDER BY id")]


def _count(dsn: str, where: str = "true") -> int:
    with connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) AS n FROM deadman.jobs WHERE {where}").fetchone()
    assert row is not None
    return int(row["n"])


# -- the client's own pool -------------------------------------------------------------


def _pool_size(side: Side) -> int:
    if isinstance(side, SyncSide):
        return int(side.client._get_pool().get_stats()["pool_size"])
    pool = side.loop.run_until_complete(side.client._get_pool())
    return int(pool.get_stats()["pool_size"])


def test_one_caller_keeps_one_connection(side: Side) -> None:
    """The first call waits for the pool's first connection instead of queueing for
    it: psycopg_pool answers a queued request by opening another connection, and a
    caller then took turns between two (DECISIONS 58)."""
    side("get", 0)
    for i in range(20):
        side("enqueue", "t", {"i": i})
    assert _pool_size(side) == 1


# -- enqueue -------------------------------------------------------------------------


def test_enqueue_and_get(side: Side) -> None:
    job = side("enqueue", "t", {"a": [1]}, queue="q", priority=3, timeout=1.5)
    assert (job.type, job.queue, job.priority, job.payload) == ("t", "q", 3, {"a": [1]})
    assert (job.state, job.max_attempts, job.timeout_ms) == (JobState.QUEUED, 3, 1500)
    assert side("get", job.id) == job
    assert side("get", job.id + 1000) is None


def test_submit_takes_a_spec(side: Side) -> None:
    from deadman import JobSpec

    spec = JobSpec.model_validate({"type": "t", "priority": 5})
    job = side("submit", spec, idempotency_key="s1")
    assert (job.priority, job.idempotency_key) == (5, "s1")
    assert side("submit", spec, idempotency_key="s1").id == job.id


def test_idempotent_replay_and_key_conflict(side: Side, db_dsn: str) -> None:
    first = side("enqueue", "t", {"a": 1}, idempotency_key="k", delay=30)
    assert side("enqueue", "t", {"a": 1}, idempotency_key="k", delay=30).id == first.id
    with pytest.raises(DuplicateKey, match=f"different job request \\(job {first.id}\\)"):
        side("enqueue", "t", {"a": 2}, idempotency_key="k")
    assert _count(db_dsn) == 1


def test_dependencies(side: Side, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running").id
        done = insert_job(conn, state="succeeded").id
        dead = insert_job(conn, state="dead").id
    waiting = side("enqueue", "t", depends_on=[running, done])
    assert (waiting.state, waiting.pending_deps) == (JobState.WAITING, 1)
    born = side("enqueue", "t", depends_on=[done, dead])
    assert (born.state, born.last_error) == (JobState.CANCELLED, f"upstream job {dead} dead")
    with pytest.raises(UnknownDependency, match=str(10**12)):
        side("enqueue", "t", depends_on=[running, 10**12])
    assert _count(db_dsn) == 5  # the refused one left nothing behind


def test_enqueue_many(side: Side, db_dsn: str) -> None:
    taken = side("enqueue", "t", idempotency_key="a")
    job = side.client.job
    ids = side("enqueue_many", [job("t", {"i": i}, priority=i % 3) for i in range(20)])
    assert len(ids) == 20 and ids == sorted(ids)
    again = side("enqueue_many", [job("t", idempotency_key="a"), job("t", idempotency_key="b")])
    assert len(again) == 1 and taken.id not in again
    assert side("enqueue_many", []) == []
    with connect(db_dsn) as conn:
        assert [job_row(conn, i)["payload"] for i in ids] == [{"i": i} for i in range(20)]
    waits = side("enqueue_many", [job("t"), job("t", depends_on=[taken.id])])
    assert [side("get", i).state for i in waits] == [JobState.QUEUED, JobState.WAITING]


# -- workflows -----------------------------------------------------------------------


def test_workflow_its_replay_and_conflict(side: Side) -> None:
    job = side.client.job
    nodes = {"a": job("a"), "b": job("b")}
    wf = side("workflow", "w", nodes, [("a", "b")], idempotency_key="wk")
    assert wf.state is WorkflowState.RUNNING
    assert {n: j.state for n, j in wf.nodes.items()} == {
        "a": JobState.QUEUED,
        "b": JobState.WAITING,
    }
    assert side("workflow", "w", nodes, [("a", "b")], idempotency_key="wk").id == wf.id
    with pytest.raises(DuplicateKey, match=f"different workflow request \\(workflow {wf.id}\\)"):
        side("workflow", "w", nodes, [], idempotency_key="wk")
    got = side("get_workflow", wf.id)
    assert got is not None and got.nodes.keys() == {"a", "b"}
    assert side("get_workflow", wf.id + 1000) is None
    with pytest.raises(InvalidWorkflow, match="cycle"):
        side("workflow", "w", nodes, [("a", "b"), ("b", "a")])


# -- cancel and retry --------------------------------------------------------------------


def test_cancel(side: Side, db_dsn: str) -> None:
    queued = side("enqueue", "t")
    assert side("cancel", queued.id).state is JobState.CANCELLED
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running").id
    asked = side("cancel", running)
    assert (asked.state, asked.cancel_requested) == (JobState.RUNNING, True)
    with pytest.raises(Conflict, match=f"job {queued.id} already finished \\(cancelled\\)"):
        side("cancel", queued.id)
    with pytest.raises(NotFound, match="no job 999999"):
        side("cancel", 999999)


def test_retry(side: Side, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead").id
    again = side("retry", dead)
    assert (again.state, again.attempt) == (JobState.QUEUED, 0)
    with pytest.raises(Conflict, match="only dead or cancelled jobs can be retried"):
        side("retry", dead)
    with connect(db_dsn) as conn:
        upstream = insert_job(conn, state="dead").id
    downstream = side("enqueue", "t", depends_on=[upstream])
    assert downstream.state is JobState.CANCELLED
    with pytest.raises(Conflict, match=f"depends on job {upstream} \\(dead\\): retry that first"):
        side("retry", downstream.id)
    with pytest.raises(NotFound, match="no job 999999"):
        side("retry", 999999)


# -- waiting ---------------------------------------------------------------------------


def _finish_once_waited(dsn: str, job_id: int) -> None:
    """End the job once a wait has flagged it (what a worker's finish does to the row)."""
    with connect(dsn) as conn:
        wait_for(lambda: job_row(conn, job_id)["waited"], timeout=10, message="the wait's flag")
        conn.execute(
            "UPDATE deadman.jobs SET state = 'succeeded', finished_at = now(),"
            " result = '{\"answer\": 42}', lease_token = NULL, lease_worker = NULL,"
            " lease_expires_at = NULL WHERE id = %s",
            (job_id,),
        )


def test_wait_returns_the_ended_job_and_times_out_otherwise(side: Side, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running").id
    with pytest.raises(WaitTimeout, match=f"job {running} did not end within 0.2 s"):
        side("wait", running, 0.2)
    finisher = threading.Thread(target=_finish_once_waited, args=(db_dsn, running))
    finisher.start()
    done = side("wait", running, 20)
    finisher.join()
    assert (done.state, done.result) == (JobState.SUCCEEDED, {"answer": 42})
    assert side("wait", running, 0).state is JobState.SUCCEEDED  # ended: at once
    with pytest.raises(NotFound):
        side("wait", 999999, 1)


# -- limits and schedules -----------------------------------------------------------------


def test_limits(side: Side) -> None:
    put = side("set_limit", "k", concurrency=3, rate=(10, timedelta(seconds=1)))
    assert put == Limit("k", 3, 10, 1000, running=0, available=10)
    assert side("limit", "k") == put and side("limits") == [put]
    assert side("delete_limit", "k") is True and side("delete_limit", "k") is False
    assert side("limit", "k") is None
    with pytest.raises(SpecError) as refused:
        side("set_limit", "a b", concurrency=1)
    assert refused.value.errors[0]["field"] == "key"
    with pytest.raises(SpecError, match="body: set concurrency, rate or both"):
        side("set_limit", "k")


def test_schedules(side: Side) -> None:
    job = {"type": "report", "payload": {"n": 1}}
    made = side("set_schedule", "daily", cron="0 3 * * *", timezone="Europe/Berlin", job=job)
    assert (made.created, made.cron, made.timezone, made.job) == (
        True,
        "0 3 * * *",
        "Europe/Berlin",
        job,
    )
    replaced = side("set_schedule", "daily", every=timedelta(minutes=5), job=job)
    assert (replaced.created, replaced.cron, replaced.every_ms) == (False, None, 300_000)
    assert [s.name for s in side("schedules")] == ["daily"]
    assert side("pause_schedule", "daily").paused is True
    assert side("schedule", "daily").paused is True
    assert side("resume_schedule", "daily").paused is False
    assert side("delete_schedule", "daily") is True and side("delete_schedule", "daily") is False
    assert side("schedule", "daily") is None
    with pytest.raises(NotFound, match="no schedule daily"):
        side("pause_schedule", "daily")


def test_schedules_are_checked_as_put_schedules_checks_them(side: Side) -> None:
    with pytest.raises(SpecError) as refused:
        side("set_schedule", "s", job={"type": "t"})
    assert refused.value.errors == [
        {"field": "cron", "message": "give exactly one of cron and every_ms"}
    ]
    with pytest.raises(SpecError) as refused:
        side("set_schedule", "s", every=60, job={"type": "t", "run_at": "2030-01-01T00:00:00Z"})
    assert refused.value.errors == [
        {"field": "job.run_at", "message": "a scheduled job starts at its tick (use delay_ms)"}
    ]
    with pytest.raises(SpecError) as refused:
        side("set_schedule", "no spaces", every=60, job={"type": "t"})
    assert [e["field"] for e in refused.value.errors] == ["name"]


# -- conn= -----------------------------------------------------------------------------


def _write(side: Side, op: str, commit: bool) -> None:
    job = side.client.job
    args: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
        "enqueue": (("t",), {}),
        "enqueue_many": (([job("t"), job("t")],), {}),
        "workflow": (("w", {"a": job("a")}), {}),
        "set_limit": (("k",), {"concurrency": 2}),
        "set_schedule": (("s",), {"every": 60, "job": {"type": "t"}}),
    }
    positional, keywords = args[op]
    side.joined(commit, op, *positional, **keywords)


@pytest.mark.parametrize("op", WRITES)
def test_a_joined_write_commits_or_rolls_back_with_the_callers_transaction(
    side: Side, db_dsn: str, op: str
) -> None:
    def stored() -> int:
        with connect(db_dsn) as conn:
            jobs = conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone()
            limits = conn.execute("SELECT count(*) AS n FROM deadman.limits").fetchone()
            schedules = conn.execute("SELECT count(*) AS n FROM deadman.schedules").fetchone()
        assert jobs and limits and schedules
        return int(jobs["n"]) + int(limits["n"]) + int(schedules["n"])

    _write(side, op, commit=False)
    assert stored() == 0
    _write(side, op, commit=True)
    assert stored() > 0


def test_joined_cancel_and_retry(side: Side, db_dsn: str) -> None:
    job = side("enqueue", "t")
    side.joined(False, "cancel", job.id)
    assert side("get", job.id).state is JobState.QUEUED
    side.joined(True, "cancel", job.id)
    assert side("get", job.id).state is JobState.CANCELLED
    side.joined(False, "retry", job.id)
    assert side("get", job.id).state is JobState.CANCELLED
    side.joined(True, "retry", job.id)
    assert side("get", job.id).state is JobState.QUEUED


def test_a_connection_of_the_other_kind_is_refused(side: Side, db_dsn: str) -> None:
    with pytest.raises(UnsupportedConnection, match=r"cannot join a builtins\.str"):
        side("enqueue", "t", conn="dbname=x")
    if isinstance(side, AsyncSide):
        with (
            psycopg.connect(db_dsn) as sync_conn,
            pytest.raises(UnsupportedConnection, match=r"goes to deadman\.Client"),
        ):
            side("enqueue", "t", conn=sync_conn)
        return

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(db_dsn) as async_conn:
            with pytest.raises(UnsupportedConnection, match=r"goes to deadman\.AsyncClient"):
                side("enqueue", "t", conn=async_conn)

    asyncio.run(main())
    assert _count(db_dsn) == 0


def test_a_connection_to_another_database_is_refused(side: Side, pg_server_dsn: str) -> None:
    """The server's maintenance database: the same server, not the client's database."""
    if isinstance(side, SyncSide):
        with (
            psycopg.connect(pg_server_dsn) as elsewhere,
            pytest.raises(UnsupportedConnection, match="not to the client's own"),
        ):
            side("enqueue", "t", conn=elsewhere)
        return
    aclient = side.client

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_server_dsn) as there:
            with pytest.raises(UnsupportedConnection, match="not to the client's own"):
                await aclient.enqueue("t", conn=there)

    side.loop.run_until_complete(main())


def test_a_broken_job_is_refused_before_any_connection() -> None:
    for made in (SyncSide("host=/nonexistent dbname=nothing"), AsyncSide("dbname=nothing")):
        try:
            with pytest.raises(SpecError, match="priority: must be an integer from -100"):
                made("enqueue", "t", priority=101)
            assert made.client._pool is None
        finally:
            made.close()


def test_both_clients_have_the_same_calls() -> None:
    def calls(cls: type) -> dict[str, inspect.Signature]:
        return {n: inspect.signature(getattr(cls, n)) for n in dir(cls) if not n.startswith("_")}

    sync, async_ = calls(Client), calls(AsyncClient)
    assert set(sync) == set(async_) and set(WRITES) <= set(sync)
    assert inspect.iscoroutinefunction(AsyncClient.close)
    del sync["close"], async_["close"]
    assert sync == async_
