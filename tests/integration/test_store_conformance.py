"""SyncStore and AsyncStore cannot drift: the same cases run through both, and what
each stores and returns must be the same job rows.

Both run the same plans for what they share (deadman.store.plans: the statements,
their parameters and how their rows are read, written once), the sync store with
the sync runner on the caller's connection, the async one with the async runner on
a pooled connection; the fenced completion is each store's own. This suite proves
the runners and the code around them (transactions, replays, dependencies, the
fenced completion) behave alike. A method added to one store
that the other also has must be added to the table at the bottom.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from deadman.model import AttemptOutcome, Job, JobState
from deadman.store import (
    AsyncStore,
    ClaimParams,
    Finish,
    NewJob,
    NewWorkflow,
    SyncStore,
    UnknownDependency,
)
from deadman.store.limits import Limit, LimitParams
from tests.factories import async_store, connect, insert_job, run_async

DEFAULT_ATTEMPTS = 5
#: what a job row must agree on between the two stores (ids, times and tokens differ)
FIELDS = (
    "type",
    "queue",
    "priority",
    "payload",
    "state",
    "attempt",
    "max_attempts",
    "idempotency_key",
    "pending_deps",
    "last_error",
    "workflow_id",
    "node",
)


def _shape(job: Job | None) -> dict[str, Any] | None:
    if job is None:
        return None
    shape = {f: getattr(job, f) for f in FIELDS if f != "workflow_id"}
    shape["state"] = job.state.value
    return shape


class Sync:
    """The SyncStore, on a connection of the test's own (autocommit)."""

    name = "sync"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.store = SyncStore()

    def insert(self, job: NewJob) -> Job | None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return self.store.job_insert(conn, job, DEFAULT_ATTEMPTS)

    def get_by_key(self, key: str) -> Job | None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return self.store.job_get_by_idempotency_key(conn, key)

    def get(self, job_id: int) -> Job | None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return self.store.job_get(conn, job_id)

    def workflow(self, wf: NewWorkflow) -> list[dict[str, Any] | None] | None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            got = self.store.workflow_insert(conn, wf, DEFAULT_ATTEMPTS)
        return None if got is None else [_shape(j) for j in got.nodes.values()]

    def succeed_in(self, finish: Finish) -> bool:
        with psycopg.connect(self.dsn) as conn:
            self.store.effect_insert(conn, finish.id, finish.token)
            written = self.store.job_succeed_in(conn, finish)
            # as ctx.transaction() does: a refused completion takes the effect with it
            (conn.commit if written else conn.rollback)()
        return written

    def limits(self, key: str) -> tuple[Limit, Limit | None, list[Limit], bool, bool]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            put = self.store.limit_put(conn, LimitParams(key, 3, 10, 1000))
            return (
                put,
                self.store.limit_get(conn, key),
                self.store.limit_list(conn),
                self.store.limit_delete(conn, key),
                self.store.limit_delete(conn, key),
            )


class Async:
    """The AsyncStore, through its pool (and a connection for job_succeed_in)."""

    name = "async"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def _run(self, body: Callable[[AsyncStore], Any]) -> Any:
        async def main() -> Any:
            async with async_store(self.dsn) as store:
                return await body(store)

        return run_async(main)

    def insert(self, job: NewJob) -> Job | None:
        result: Job | None = self._run(lambda s: s.job_insert(job, DEFAULT_ATTEMPTS))
        return result

    def get_by_key(self, key: str) -> Job | None:
        result: Job | None = self._run(lambda s: s.job_get_by_idempotency_key(key))
        return result

    def get(self, job_id: int) -> Job | None:
        result: Job | None = self._run(lambda s: s.job_get(job_id))
        return result

    def limits(self, key: str) -> tuple[Limit, Limit | None, list[Limit], bool, bool]:
        async def body(s: AsyncStore) -> tuple[Limit, Limit | None, list[Limit], bool, bool]:
            put = await s.limit_put(LimitParams(key, 3, 10, 1000))
            return (
                put,
                await s.limit_get(key),
                await s.limit_list(),
                await s.limit_delete(key),
                await s.limit_delete(key),
            )

        result: tuple[Limit, Limit | None, list[Limit], bool, bool] = self._run(body)
        return result

    def workflow(self, wf: NewWorkflow) -> list[dict[str, Any] | None] | None:
        got = self._run(lambda s: s.workflow_insert(wf, DEFAULT_ATTEMPTS))
        return None if got is None else [_shape(j) for j in got[1]]

    def succeed_in(self, finish: Finish) -> bool:
        async def main() -> bool:
            conn = await psycopg.AsyncConnection.connect(self.dsn, row_factory=dict_row)
            async with conn, async_store(self.dsn) as store:
                await store.effect_insert(conn, finish.id, finish.token)
                written = await store.job_succeed_in(conn, finish)
                await (conn.commit() if written else conn.rollback())
                return written

        return run_async(main)


@pytest.fixture(params=[Sync, Async], ids=["sync", "async"])
def side(request: pytest.FixtureRequest, db_dsn: str) -> Sync | Async:
    cls: type[Sync] | type[Async] = request.param
    return cls(db_dsn)


def test_a_plain_job(side: Sync | Async) -> None:
    job = side.insert(NewJob("t", payload={"a": [1, "b"]}, queue="q", priority=3))
    assert _shape(job) == {
        "type": "t",
        "queue": "q",
        "priority": 3,
        "payload": {"a": [1, "b"]},
        "state": "queued",
        "attempt": 0,
        "max_attempts": DEFAULT_ATTEMPTS,
        "idempotency_key": None,
        "pending_deps": 0,
        "last_error": None,
        "node": None,
    }
    assert job is not None and _shape(side.get(job.id)) == _shape(job)


def test_a_keyed_job_and_its_replay(side: Sync | Async) -> None:
    first = side.insert(NewJob("t", idempotency_key="k1", max_attempts=2))
    assert first is not None and first.max_attempts == 2
    again = side.insert(NewJob("t", idempotency_key="k1", max_attempts=2))
    # a taken key inserts nothing; the caller reads the existing job by its key
    assert again is None
    existing = side.get_by_key("k1")
    assert existing is not None and existing.id == first.id


def test_dependencies_pending_done_and_failed(side: Sync | Async, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        running = insert_job(conn, state="running").id
        done = insert_job(conn, state="succeeded").id
        dead = insert_job(conn, state="dead").id
    waiting = side.insert(NewJob("t", depends_on=(running, done)))
    assert waiting is not None and (waiting.state, waiting.pending_deps) == (JobState.WAITING, 1)
    born = side.insert(NewJob("t", depends_on=(done, dead)))
    assert born is not None and born.state is JobState.CANCELLED
    assert born.last_error == f"upstream job {dead} dead"
    with pytest.raises(UnknownDependency):
        side.insert(NewJob("t", depends_on=(running, 10**12)))


def test_a_workflow_and_its_replay(side: Sync | Async) -> None:
    wf = NewWorkflow(
        "w",
        nodes=(("a", NewJob("a")), ("b", NewJob("b"))),
        edges=(("a", "b"),),
        idempotency_key="wk",
    )
    nodes = side.workflow(wf)
    assert nodes is not None and [(n or {})["state"] for n in nodes] == ["queued", "waiting"]
    assert side.workflow(wf) is None  # taken key: nothing inserted


def test_the_fenced_completion_in_the_handlers_transaction(side: Sync | Async, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn)

    async def claim() -> Job:
        async with async_store(db_dsn) as store:
            [job] = await store.job_claim(ClaimParams("default", "w", 1, 60_000))
            return job

    job = run_async(claim)
    assert job.lease is not None
    ok = Finish(job.id, job.lease.token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, result=7)
    assert side.succeed_in(ok) is True
    assert side.succeed_in(ok) is False  # the token is spent: refused, effect rolled back
    got = side.get(job.id)
    assert got is not None and got.state is JobState.SUCCEEDED and got.result == 7
    with connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM deadman.effects").fetchone()
    assert row is not None and row["n"] == 1


def test_limits_put_get_list_delete(side: Sync | Async) -> None:
    key = f"conf-{side.name}"
    put, got, listed, removed, again = side.limits(key)
    assert put == got == Limit(key, 3, 10, 1000, running=0, available=10)
    assert key in [x.key for x in listed]
    assert (removed, again) == (True, False)


#: methods both stores have: same name, same parameters (the sync one adds `conn`)
SHARED = [
    "limit_put",
    "limit_get",
    "limit_list",
    "limit_delete",
    "job_insert",
    "job_get",
    "job_get_by_idempotency_key",
    "workflow_insert",
    "workflow_get",
    "workflow_get_by_idempotency_key",
    "job_succeed_in",
    "effect_insert",
]


def test_the_shared_methods_take_the_same_parameters() -> None:
    both = {n for n in dir(SyncStore) if not n.startswith("_")} & {
        n for n in dir(AsyncStore) if not n.startswith("_")
    }
    assert both == set(SHARED), "a method both stores have belongs in SHARED (and a case)"
    for name in SHARED:
        sync = list(inspect.signature(getattr(SyncStore, name)).parameters)
        async_ = list(inspect.signature(getattr(AsyncStore, name)).parameters)
        assert [p for p in sync if p != "conn"] == [p for p in async_ if p != "conn"], name
