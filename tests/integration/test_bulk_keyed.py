"""A bulk enqueue of keyed jobs, COPYed straight into the jobs table (DECISIONS 92),
against other transactions taking the same keys: the COPY runs under a savepoint, and
when a key it did not see taken is taken meanwhile (the COPY waits on that insert,
then is refused), or the two deadlock, it is rolled back to the savepoint and the
batch goes the staged way (``ON CONFLICT`` skips the taken keys). Nothing the
caller's transaction did before is lost, and one job holds each key.

The interleavings are forced: the other side holds its key in an open transaction,
and the bulk enqueue runs in a thread until its backend waits on a lock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from deadman import AsyncClient
from deadman.client import Client
from deadman.errors import DuplicateKey, InvalidJob
from deadman.store import NewJob, plans
from deadman.store.plan import Copy, Plan, Query, Refused, Steps, run_sync
from tests.factories import run_async
from tests.helpers import wait_for
from tests.helpers.workflows import lock_waiters

Conn = psycopg.Connection[DictRow]


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn) as c:
        yield c


def _holders(dsn: str, key: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id FROM deadman.jobs WHERE idempotency_key = %s", (key,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _keys_of(dsn: str, ids: list[int]) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT idempotency_key FROM deadman.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
        ).fetchall()
    return [str(r[0]) for r in rows]


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # reported in the test's thread
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _blocked(thread: threading.Thread, observer: Conn) -> None:
    """Wait until the bulk enqueue in ``thread`` waits on a lock (nothing else in these
    tests can): the interleaving is forced, never hoped for."""
    wait_for(
        lambda: lock_waiters(observer) or not thread.is_alive(),
        timeout=10.0,
        interval=0.002,
        message="the bulk enqueue to wait on the key's lock",
    )
    assert thread.is_alive(), "the bulk enqueue did not wait for the key's holder"


@pytest.mark.parametrize("holder_ends", ["commit", "rollback"])
def test_a_key_taken_meanwhile_makes_the_copy_wait_then_go_staged(
    client: Client, db_dsn: str, holder_ends: str
) -> None:
    """The holder's key is invisible to the bulk enqueue's look-up (uncommitted), so
    the COPY starts and waits on its index entry. Committed: the COPY is refused,
    rolled back to its savepoint, and the staged insert skips the key; the job the
    caller enqueued before, in the same transaction, is kept. Rolled back: the COPY
    simply goes on."""
    with (
        psycopg.connect(db_dsn) as holder,
        psycopg.connect(db_dsn, row_factory=dict_row) as caller,
        psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as observer,
    ):
        held = client.enqueue("t", {"by": "holder"}, idempotency_key="m-key", conn=holder)
        before = client.enqueue("t", {"by": "caller, first"}, conn=caller)
        jobs = [client.job("t", {"n": i}, idempotency_key=k) for i, k in enumerate("zma")]
        jobs[1] = client.job("t", {"n": 1}, idempotency_key="m-key")
        thread, result = _in_thread(lambda: client.enqueue_many(jobs, conn=caller))
        _blocked(thread, observer)
        holder.commit() if holder_ends == "commit" else holder.rollback()
        thread.join(10.0)
        assert not thread.is_alive() and "error" not in result, result.get("error")
        caller.commit()
    ids: list[int] = result["value"]
    assert _holders(db_dsn, "z") and _holders(db_dsn, "a")
    if holder_ends == "commit":
        assert _keys_of(db_dsn, ids) == ["z", "a"]  # m-key skipped: the holder's
        assert _holders(db_dsn, "m-key") == [held.id]
    else:
        assert sorted(_keys_of(db_dsn, ids)) == ["a", "m-key", "z"]
        assert len(_holders(db_dsn, "m-key")) == 1 and ids[1] in _holders(db_dsn, "m-key")
    assert client.get(before.id) is not None  # the caller's earlier work survived


def test_a_deadlock_with_another_inserter_goes_staged(client: Client, db_dsn: str) -> None:
    """The bulk enqueue takes k1, then waits on k2 (held); the holder then asks for
    k1: a deadlock. The bulk enqueue waited first, so its backend finds it and is
    refused (the holder's own check is pushed back where the role may do so); rolled
    back to its savepoint it releases k1, the holder goes on and commits, and the
    staged insert skips both keys."""
    with (
        psycopg.connect(db_dsn) as holder,
        psycopg.connect(db_dsn, row_factory=dict_row) as caller,
        psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as observer,
    ):
        try:
            holder.execute("SET deadlock_timeout = '30s'")
        except psycopg.errors.InsufficientPrivilege:
            holder.rollback()  # a role that may not: the bulk enqueue waited first anyway
        client.enqueue("t", idempotency_key="k2", conn=holder)
        jobs = [client.job("t", idempotency_key=k) for k in ("k2", "k1")]
        thread, result = _in_thread(lambda: client.enqueue_many(jobs, conn=caller))
        _blocked(thread, observer)
        client.enqueue("t", idempotency_key="k1", conn=holder)  # waits, then goes on
        holder.commit()
        thread.join(10.0)
        assert not thread.is_alive() and "error" not in result, result.get("error")
        caller.commit()
    assert result["value"] == []  # both keys are the holder's
    assert len(_holders(db_dsn, "k1")) == len(_holders(db_dsn, "k2")) == 1


def test_the_async_client_falls_back_the_same_way(client: Client, db_dsn: str) -> None:
    """AsyncClient's driver runs the same plan: refused, rolled back to the savepoint,
    staged."""
    with (
        psycopg.connect(db_dsn) as holder,
        psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as observer,
    ):
        held = client.enqueue("t", idempotency_key="held", conn=holder)

        async def bulk() -> list[int]:
            async with AsyncClient(db_dsn) as aclient:
                jobs = [aclient.job("t", idempotency_key=k) for k in ("free", "held")]
                return await aclient.enqueue_many(jobs)

        thread, result = _in_thread(lambda: run_async(bulk))
        _blocked(thread, observer)
        holder.commit()
        thread.join(10.0)
    assert not thread.is_alive() and "error" not in result, result.get("error")
    assert _keys_of(db_dsn, result["value"]) == ["free"]
    assert _holders(db_dsn, "held") == [held.id]


def test_a_row_postgres_refuses_in_the_keyed_copy_stores_nothing(
    client: Client, db_dsn: str
) -> None:
    """A refusal that is not a taken key (a NUL in a payload, found by the server in the
    middle of the COPY) is the caller's error, InvalidJob, not a reason to stage: no
    job of the batch is stored, and the client's connection goes on."""
    jobs = [client.job("t", {"n": i}, idempotency_key=f"nul-{i}") for i in range(300)]
    jobs[150] = client.job("t", {"text": "nul\x00byte"}, idempotency_key="nul-150")
    with pytest.raises(InvalidJob):
        client.enqueue_many(jobs)
    assert not any(_holders(db_dsn, f"nul-{i}") for i in (0, 149, 150, 299))
    assert len(client.enqueue_many(jobs[:150])) == 150


def test_a_tentative_step_rolls_back_to_its_savepoint_and_the_plan_decides(
    db_dsn: str,
) -> None:
    """The driver's side, on a COPY refused by a key twice in its own rows: a plan that
    catches Refused goes on in the same transaction (its next statement runs, its
    result is returned); one that does not gets the server's error, as an untentative
    step would (DuplicateKey), and nothing is stored either way."""
    jobs = [NewJob("t", idempotency_key="twice"), NewJob("t", idempotency_key="twice")]

    def copy_twice(catch: bool) -> Steps[str]:
        (row,) = yield Query("job_ids_reserve", {"n": 2, "queues": ["default"]})
        rows = plans._direct_keyed(row["ids"], jobs, 5)
        try:
            yield Copy("job_copy_direct_keyed", rows, tentative=True)
        except Refused as refused:
            if not catch:
                raise
            assert refused.constraint == plans.IDEMPOTENCY_KEY_INDEX
            (now,) = yield Query("db_now", {})
            return f"refused, then read the clock at {now['now']:%Y}"
        return "copied"

    with psycopg.connect(db_dsn) as conn:
        said = run_sync(conn, Plan(lambda: copy_twice(catch=True), atomic=True))
        assert said.startswith("refused, then read the clock")
        with pytest.raises(DuplicateKey):
            run_sync(conn, Plan(lambda: copy_twice(catch=False), atomic=True))
        conn.rollback()
    assert _holders(db_dsn, "twice") == []
