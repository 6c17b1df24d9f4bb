"""deadman.Client against a real database: enqueue, transactional enqueue,
idempotency, and COPY-based enqueue_many."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from deadman.client import Client
from deadman.config import Settings
from deadman.db import pool as pool_module
from deadman.errors import ConfigError, DuplicateKey, InvalidJob
from deadman.model import Backoff, JobState
from deadman.store import NewJob, plans
from tests.factories import connect, db_now, job_row
from tests.helpers import wait_for


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=Settings(max_attempts=3)) as c:
        yield c


def _count(dsn: str, where: str = "true") -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM deadman.jobs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


# ------------------------------------------------------------------------- enqueue


def test_enqueue_returns_a_queued_job(client: Client, db_dsn: str) -> None:
    backoff = Backoff(strategy="fixed", base_ms=10, max_ms=10, jitter="none")
    job = client.enqueue(
        "email.send", {"to": "a@b"}, queue="mail", priority=7, backoff=backoff, timeout=1.5
    )
    assert job.state is JobState.QUEUED
    assert (job.type, job.queue, job.priority) == ("email.send", "mail", 7)
    assert job.payload == {"to": "a@b"}
    assert job.attempt == 0 and job.rescues == 0
    assert job.max_attempts == 3  # from the client's settings
    assert job.backoff == backoff
    assert job.timeout_ms == 1500
    assert job.lease is None and job.finished_at is None
    fetched = client.get(job.id)
    assert fetched is not None and fetched.id == job.id and fetched.state is JobState.QUEUED
    assert client.get(job.id + 1000) is None


def test_enqueue_max_attempts_overrides_the_setting(client: Client) -> None:
    assert client.enqueue("t", max_attempts=9).max_attempts == 9


def test_enqueue_with_a_delay_is_scheduled(client: Client, db_dsn: str) -> None:
    delay: timedelta | float
    for delay in (timedelta(seconds=60), 60.0, 60):
        with connect(db_dsn) as conn:
            before = db_now(conn)
            job = client.enqueue("t", delay=delay)
            after = db_now(conn)
        assert job.state is JobState.SCHEDULED, delay
        assert before + timedelta(seconds=59) <= job.run_at <= after + timedelta(seconds=60)


def test_run_at_in_the_past_is_queued_in_the_future_scheduled(client: Client, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        now = db_now(conn)
    past = client.enqueue("t", run_at=now - timedelta(seconds=10))
    future = client.enqueue("t", run_at=now + timedelta(seconds=10))
    assert past.state is JobState.QUEUED
    assert past.run_at == now - timedelta(seconds=10)  # kept: it is older than new jobs
    assert future.state is JobState.SCHEDULED
    assert future.run_at == now + timedelta(seconds=10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"run_at": datetime(2030, 1, 1)}, "run_at: must carry a time zone"),
        (
            {"run_at": datetime(2030, 1, 1, tzinfo=UTC), "delay": 5},
            "delay_ms: give run_at or delay_ms, not both",
        ),
        ({"delay": -1}, "delay_ms: must be an integer from 0 to"),
        ({"priority": 101}, "priority: must be an integer from -100 to 100"),
        ({"queue": "no spaces"}, "queue: must be 1-128 characters"),
        ({"max_attempts": 0}, "max_attempts: must be an integer from 1 to 100"),
        ({"timeout": 0}, "timeout_ms: must be an integer from 1 to"),
        ({"idempotency_key": ""}, "idempotency_key: must be 1-255 characters"),
        ({"idempotency_key": "k" * 256}, "idempotency_key: must be 1-255 characters"),
    ],
    ids=[
        "naive-run_at",
        "run_at-and-delay",
        "negative-delay",
        "priority",
        "queue",
        "max_attempts",
        "timeout",
        "empty-key",
        "long-key",
    ],
)
def test_invalid_jobs_are_refused_before_sql(kwargs: dict[str, object], match: str) -> None:
    # The dsn leads nowhere: validation must fail before any connection is attempted.
    with Client("host=/nonexistent dbname=nothing", settings=Settings()) as nowhere:
        with pytest.raises(InvalidJob, match=match):
            nowhere.enqueue("t", **kwargs)  # type: ignore[arg-type]
        with pytest.raises(InvalidJob, match="type: must be 1-128 characters"):
            nowhere.enqueue("bad type!")
        assert nowhere._pool is None


def test_a_client_needs_a_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEADMAN_DATABASE_URL", raising=False)
    with pytest.raises(ConfigError, match="DEADMAN_DATABASE_URL"):
        Client()


# ------------------------------------------------------------ transactional enqueue


def test_transactional_enqueue_is_invisible_until_commit(client: Client, db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as mine, psycopg.connect(db_dsn, autocommit=True) as other:
        other.execute("LISTEN deadman_jobs")
        job = client.enqueue("t", {"n": 1}, conn=mine)
        assert mine.execute("SELECT count(*) FROM deadman.jobs").fetchone() == (1,)
        assert other.execute("SELECT count(*) FROM deadman.jobs").fetchone() == (0,)
        mine.commit()
        assert other.execute("SELECT id FROM deadman.jobs").fetchall() == [(job.id,)]
        # the insert's wake-up (DECISIONS 84) is delivered with the commit
        notes = wait_for(
            lambda: [n.payload for n in other.notifies(timeout=0.2, stop_after=1)] or None,
            timeout=5,
            message="a NOTIFY for the committed job",
        )
        assert notes == ["default"]


def test_transactional_enqueue_is_gone_after_rollback(client: Client, db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as mine:
        mine.execute("CREATE TABLE public.orders (id int)")
        mine.execute("INSERT INTO public.orders VALUES (1)")
        client.enqueue("t", conn=mine)
        mine.rollback()
    assert _count(db_dsn) == 0


def test_transactional_enqueue_inside_an_explicit_transaction_block(
    client: Client, db_dsn: str
) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as mine:
        with pytest.raises(RuntimeError, match="app failed"), mine.transaction():
            client.enqueue("t", conn=mine)
            raise RuntimeError("app failed")
        assert _count(db_dsn) == 0
        with mine.transaction():
            job = client.enqueue("t", conn=mine)
    assert job.id is not None and _count(db_dsn) == 1


# -------------------------------------------------------------------- idempotency


def test_same_key_same_request_returns_the_same_job(client: Client, db_dsn: str) -> None:
    first = client.enqueue("t", {"a": 1}, idempotency_key="order-1", delay=30)
    again = client.enqueue("t", {"a": 1}, idempotency_key="order-1", delay=30)
    assert again.id == first.id
    assert _count(db_dsn) == 1


def test_same_key_different_request_raises(client: Client, db_dsn: str) -> None:
    changes: list[dict[str, Any]] = [
        {"payload": {"a": 2}},
        {"queue": "other"},
        {"priority": 1},
        {"max_attempts": 4},
        {"delay": 5},
    ]
    for n, change in enumerate(changes):
        key = f"order-{n}"
        first = client.enqueue("t", {"a": 1}, idempotency_key=key)
        kwargs: dict[str, Any] = {"payload": {"a": 1}, **change}
        with pytest.raises(DuplicateKey, match=f"job {first.id}"):
            client.enqueue("t", idempotency_key=key, **kwargs)
    assert _count(db_dsn) == len(changes)


def test_concurrent_enqueues_of_one_key_make_one_job(client: Client, db_dsn: str) -> None:
    n = 20
    barrier = threading.Barrier(n)
    ids: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def enqueue() -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as own:
                barrier.wait(timeout=10)
                job = client.enqueue("t", {"same": True}, idempotency_key="race", conn=own)
            with lock:
                ids.append(job.id)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(ids) == n and len(set(ids)) == 1
    assert _count(db_dsn) == 1


def test_concurrent_enqueues_through_the_clients_pool(client: Client, db_dsn: str) -> None:
    client.get(0)
    n = 20
    barrier = threading.Barrier(n)
    ids: list[int] = []

    def enqueue() -> None:
        barrier.wait(timeout=10)
        ids.append(client.enqueue("t", idempotency_key="pooled").id)

    threads = [threading.Thread(target=enqueue) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(ids) == n and len(set(ids)) == 1
    assert _count(db_dsn) == 1


def test_first_use_from_many_threads_builds_one_pool(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[ConnectionPool[Any]] = []
    second = threading.Event()

    class CountingPool(ConnectionPool[Any]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            created.append(self)
            if len(created) == 1:
                # Hold the first builder until a second one shows up (or 2 s pass): a
                # client with a lock never builds twice and only loses these 2 s.
                second.wait(timeout=2)
            else:
                second.set()
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pool_module, "ConnectionPool", CountingPool)
    client = Client(db_dsn, settings=Settings())
    n = 8
    barrier = threading.Barrier(n)

    def enqueue() -> None:
        barrier.wait(timeout=10)
        client.enqueue("t")

    threads = [threading.Thread(target=enqueue) for _ in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        client.close()
        for pool in created:
            pool.close()
    assert len(created) == 1


# --------------------------------------------------------------------- enqueue_many


def test_enqueue_many_inserts_in_order(client: Client, db_dsn: str) -> None:
    jobs = [client.job("t", {"i": i}, priority=i % 3) for i in range(50)]
    ids = client.enqueue_many(jobs)
    assert len(ids) == 50
    assert ids == sorted(ids) and len(set(ids)) == 50
    with connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT id, payload, priority, state, max_attempts FROM deadman.jobs ORDER BY id"
        ).fetchall()
    assert [r["id"] for r in rows] == ids
    assert [r["payload"] for r in rows] == [{"i": i} for i in range(50)]
    assert [r["priority"] for r in rows] == [i % 3 for i in range(50)]
    assert {r["state"] for r in rows} == {"queued"}
    assert {r["max_attempts"] for r in rows} == {3}


def test_enqueue_many_of_nothing(client: Client) -> None:
    assert client.enqueue_many([]) == []


def test_enqueue_many_mixed_delays(client: Client, db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        now = db_now(conn)
    jobs = [
        client.job("t", {"k": "now"}),
        client.job("t", {"k": "delay"}, delay=60),
        client.job("t", {"k": "past"}, run_at=now - timedelta(seconds=5)),
        client.job("t", {"k": "future"}, run_at=now + timedelta(seconds=5)),
        client.job("t", {"k": "tiny-delay"}, delay=timedelta(milliseconds=1)),
    ]
    ids = client.enqueue_many(jobs)
    with connect(db_dsn) as conn:
        states = [job_row(conn, i)["state"] for i in ids]
        delayed = job_row(conn, ids[1])
    assert states == ["queued", "scheduled", "queued", "scheduled", "scheduled"]
    assert now + timedelta(seconds=59) <= delayed["run_at"]


def test_enqueue_many_skips_taken_idempotency_keys(client: Client, db_dsn: str) -> None:
    taken = client.enqueue("t", {"first": True}, idempotency_key="a")
    ids = client.enqueue_many(
        [
            client.job("t", {"n": 1}, idempotency_key="a"),
            client.job("t", {"n": 2}, idempotency_key="b"),
            client.job("t", {"n": 3}),
            client.job("t", {"n": 4}, idempotency_key="b"),  # twice in one batch
        ]
    )
    assert len(ids) == 2 and taken.id not in ids
    with connect(db_dsn) as conn:
        assert [job_row(conn, i)["payload"] for i in ids] == [{"n": 2}, {"n": 3}]
        assert job_row(conn, taken.id)["payload"] == {"first": True}
    assert _count(db_dsn) == 3


def test_enqueue_many_ten_thousand(client: Client, db_dsn: str) -> None:
    ids = client.enqueue_many(client.job("bulk", {"i": i}) for i in range(10_000))
    assert len(ids) == 10_000 and ids == sorted(ids)
    assert _count(db_dsn, "type = 'bulk' AND state = 'queued'") == 10_000


def test_enqueue_many_on_the_callers_transaction(client: Client, db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as mine:
        mine.execute("SELECT 1")  # the caller's transaction is open
        ids = client.enqueue_many([client.job("t"), client.job("t")], conn=mine)
        assert len(ids) == 2
        assert _count(db_dsn) == 0  # not visible outside yet
        mine.rollback()
    assert _count(db_dsn) == 0


def test_two_enqueue_many_calls_in_one_transaction(client: Client, db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as mine:
        mine.execute("SELECT 1")
        first = client.enqueue_many(
            [client.job("t", {"n": 1}), client.job("t", {"n": 2})], conn=mine
        )
        second = client.enqueue_many([client.job("t", {"n": 3})], conn=mine)
        mine.commit()
    assert len(first) == 2
    assert len(second) == 1
    assert _count(db_dsn) == 3


def test_enqueue_many_joins_a_fresh_callers_transaction(client: Client, db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as mine:
        client.enqueue_many([client.job("t")], conn=mine)
        mine.rollback()
    assert _count(db_dsn) == 0


def test_enqueue_after_enqueue_many_with_the_same_request(client: Client) -> None:
    (job_id,) = client.enqueue_many([client.job("t", {"a": 1}, idempotency_key="k")])
    assert client.enqueue("t", {"a": 1}, idempotency_key="k").id == job_id


#: what a row says beyond when and under which id it was written
_STORED = (
    "type, queue, priority, payload, state, attempt, max_attempts, backoff, timeout_ms,"
    " idempotency_key, request_hash, start_by, deadline, heartbeat_timeout_ms, limit_key,"
    " pending_deps, has_dependents, finished_at, trace_context, run_at <= created_at + '1 s'"
    " AS due_at_once"
)


def _stored(db_dsn: str, ids: list[int]) -> list[dict[str, Any]]:
    """The rows of ``ids``, in that order (one read)."""
    with connect(db_dsn) as conn:
        rows = conn.execute(
            f"SELECT {_STORED} FROM unnest(%s::bigint[]) WITH ORDINALITY AS i(id, n)"
            " JOIN deadman.jobs j USING (id) ORDER BY i.n",
            (ids,),
        ).fetchall()
    assert len(rows) == len(ids), f"{len(ids) - len(rows)} of the jobs are not stored"
    return [dict(r) for r in rows]


def test_enqueue_many_copied_straight_in_stores_what_the_other_paths_store(
    client: Client, db_dsn: str
) -> None:
    """A batch with no key, run_at or delay is COPYed into deadman.jobs under reserved
    ids (DECISIONS 68); the same jobs enqueued one by one (job_insert), and in a batch
    that takes the staging table (one keyed job in it), are the same rows."""
    with connect(db_dsn) as conn:
        now = db_now(conn)
    options: list[dict[str, Any]] = [
        {},
        {"queue": "q.2", "priority": -7, "max_attempts": 9, "timeout": 2.5},
        {
            "backoff": Backoff(strategy="fixed", base_ms=500, max_ms=9000),
            "heartbeat_timeout": 3,
            "limit_key": "k:1",
        },
        {"start_by": now + timedelta(minutes=5), "deadline": now + timedelta(hours=1)},
    ]
    payloads: list[Any] = [None, {"n": 1, "s": "é\u2028"}, [1, 2.5, True, None], "text"]
    jobs = [client.job("t.direct", p, **o) for p, o in zip(payloads, options, strict=True)]

    direct = client.enqueue_many(jobs)
    one_by_one = [
        client.enqueue("t.direct", p, **o).id for p, o in zip(payloads, options, strict=True)
    ]
    staged = client.enqueue_many([*jobs, client.job("t.direct", idempotency_key="forces-staging")])

    assert direct == sorted(direct) and len(set(direct)) == len(jobs)
    expected = _stored(db_dsn, one_by_one)
    assert _stored(db_dsn, direct) == expected
    assert _stored(db_dsn, staged[: len(jobs)]) == expected
    assert {r["state"] for r in expected} == {"queued"} and all(r["due_at_once"] for r in expected)


def test_enqueue_many_takes_the_straight_copy_only_without_key_run_at_or_delay(
    client: Client,
) -> None:
    """Which statements each kind of batch sends (the rows above would be the same
    whichever path ran, so this pins that the direct path is the one taken)."""

    def first_statements(jobs: list[Any]) -> list[str]:
        steps = plans.job_insert_many(jobs, 5).steps()
        names = [next(steps).name]
        names.append(steps.send([{"ids": list(range(len(jobs)))}]).name)
        return names

    now = datetime.now(UTC)
    assert first_statements([client.job("t"), client.job("t", limit_key="k")]) == [
        "job_ids_reserve",
        "job_copy_direct",
    ]
    for odd in ({"idempotency_key": "k"}, {"run_at": now}, {"delay": 1}):
        assert first_statements([client.job("t"), client.job("t", **odd)]) == [
            "job_stage_prepare",
            "job_stage_clear",
        ], odd


def test_enqueue_many_takes_the_keyed_copy_only_when_every_job_has_its_own_key(
    client: Client,
) -> None:
    """A batch in which every job has a key of its own, and none a run_at or a delay,
    is COPYed straight in after a look-up of its keys (DECISIONS 92); a key already
    taken, a key twice in the batch, a job without a key or one with a run_at: the
    staging table, as before."""

    def statements(jobs: list[Any], taken: list[str]) -> list[str]:
        steps = plans.job_insert_many(jobs, 5).steps()
        names = [next(steps).name]
        names.append(steps.send([{"ids": list(range(len(jobs))), "taken": taken}]).name)
        return names

    def keyed(*keys: str, **odd: Any) -> list[Any]:
        return [client.job("t", idempotency_key=k, **odd) for k in keys]

    direct = ["job_ids_reserve_keyed", "job_copy_direct_keyed"]
    staged = ["job_stage_prepare", "job_stage_clear"]
    assert statements(keyed("b", "a", "c"), []) == direct
    assert statements(keyed("b", "a", "c"), ["a"]) == ["job_ids_reserve_keyed", staged[0]]
    assert statements(keyed("a", "b", "a"), []) == staged
    assert statements([*keyed("a"), client.job("t")], []) == staged
    assert statements(keyed("a", "b", run_at=datetime.now(UTC)), []) == staged
    # Client.job refuses a key with a line break; a NewJob made by hand is staged
    # (job_ids_reserve_keyed reads the keys a line each)
    assert statements([*keyed("a"), NewJob("t", idempotency_key="b\nc")], []) == staged


def test_enqueue_many_of_keyed_jobs_copied_straight_in_stores_what_the_other_paths_store(
    client: Client, db_dsn: str
) -> None:
    """The keyed COPY writes what a keyed enqueue one by one (job_insert) and the
    staged path write: every column, the request's fingerprint included (it does not
    cover the key); the ids come back in the batch's order, whatever the COPY's."""
    options: list[dict[str, Any]] = [
        {},
        {"queue": "q.2", "priority": -7, "max_attempts": 9, "timeout": 2.5},
        {"backoff": Backoff(strategy="fixed", base_ms=500, max_ms=9000), "limit_key": "k:1"},
    ]
    payloads: list[Any] = [None, {"n": 1, "s": "é\u2028"}, [1, 2.5, True, None]]
    cases = list(zip(payloads, options, strict=True))
    # keys out of order, so the COPY's rows (in key order) are not the batch's
    direct = client.enqueue_many(
        [client.job("t.k", p, idempotency_key=f"d-{9 - i}", **o) for i, (p, o) in enumerate(cases)]
    )
    one_by_one = [
        client.enqueue("t.k", p, idempotency_key=f"s-{i}", **o).id for i, (p, o) in enumerate(cases)
    ]
    staged = client.enqueue_many(
        [
            *(
                client.job("t.k", p, idempotency_key=f"g-{i}", **o)
                for i, (p, o) in enumerate(cases)
            ),
            client.job("t.k"),  # no key: forces the staging table
        ]
    )

    def unkeyed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "idempotency_key"} for r in rows]

    assert direct == sorted(direct)
    expected = _stored(db_dsn, one_by_one)
    assert unkeyed(_stored(db_dsn, direct)) == unkeyed(expected)
    assert unkeyed(_stored(db_dsn, staged[: len(cases)])) == unkeyed(expected)
    assert [r["idempotency_key"] for r in _stored(db_dsn, direct)] == ["d-9", "d-8", "d-7"]
    for (p, o), row in zip(cases, _stored(db_dsn, direct), strict=True):
        made = client.job("t.k", p, idempotency_key="any", **o)
        assert row["request_hash"] == made.request_hash()
    # the same batch again: every key taken, a replay inserts nothing
    assert (
        client.enqueue_many(
            [
                client.job("t.k", p, idempotency_key=f"d-{9 - i}", **o)
                for i, (p, o) in enumerate(cases)
            ]
        )
        == []
    )


def test_enqueue_many_copied_straight_in_wakes_each_queue(client: Client, db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN deadman_jobs")
        client.enqueue_many([client.job("t", queue=q) for q in ("a", "b", "a", "c")])
        heard = sorted(n.payload for n in listener.notifies(timeout=5, stop_after=3))
    assert heard == ["a", "b", "c"]


def test_enqueue_many_copied_straight_in_stores_nothing_when_one_job_is_refused(
    client: Client, db_dsn: str
) -> None:
    """Postgres refuses a payload (a NUL in a string) in the middle of the COPY: an
    InvalidJob, and no job of the batch is stored."""
    jobs = [client.job("t"), client.job("t", {"text": "nul\x00byte"}), client.job("t")]
    with pytest.raises(InvalidJob):
        client.enqueue_many(jobs)
    assert _count(db_dsn) == 0
    assert len(client.enqueue_many([client.job("t")])) == 1  # the connection is usable


@pytest.mark.parametrize(
    "kwargs",
    [{"delay": 1e14}, {"payload": {"text": "nul\x00byte"}}, {"timeout": 1e10}],
    ids=["delay-beyond-the-calendar", "nul-in-payload", "timeout-over-int32"],
)
def test_values_postgres_refuses_are_invalid_jobs(
    client: Client, db_dsn: str, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidJob):
        client.enqueue("t", **kwargs)
