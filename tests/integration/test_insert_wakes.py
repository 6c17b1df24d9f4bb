"""Every statement that inserts jobs wakes their queues itself (DECISIONS 84, migration
0022: no insert trigger any more). A worker idle on ``deadman_jobs`` must hear each
queue that got a job a claim could take (queued, or scheduled: it may be due sooner
than the worker's next look), once per queue and transaction, at commit and only if
the transaction commits; a job born waiting, cancelled or handed off wakes no one.

Each way in is driven through the code that uses it (Client, AsyncStore, the API's
group statement), and a listener on its own connection says what it heard. A new
statement that inserts jobs without waking anyone fails the first test.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.db.queries import QUERIES
from deadman.errors import InvalidJob
from deadman.store import NewJob
from deadman.store.submissions import grouped_order, grouped_params
from deadman.worker.parking import handoff_channel
from tests.factories import connect, with_store

Conn = psycopg.Connection[DictRow]

WAKE = "pg_notify('deadman_jobs'"
#: statements whose rows another statement of the same transaction wakes for
WOKEN_BY = {
    "job_copy_direct": "job_ids_reserve",
    "job_copy_direct_keyed": "job_ids_reserve_keyed",
}


def test_every_statement_that_inserts_jobs_wakes_their_queues() -> None:
    inserts = re.compile(r"\b(INSERT\s+INTO|COPY)\s+deadman\.jobs\b", re.IGNORECASE)
    inserting = sorted(n for n, sql in QUERIES.items() if inserts.search(sql))
    assert "job_insert" in inserting and "job_insert_handoff" in inserting
    silent = [n for n in inserting if WAKE not in QUERIES[WOKEN_BY.get(n, n)]]
    assert not silent, f"statements that insert jobs and wake no queue: {silent}"


@pytest.fixture
def heard(db_dsn: str) -> Iterator[Callable[[], list[str]]]:
    """What a listener on deadman_jobs has heard so far (each call drains it)."""
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN deadman_jobs")

        def drain() -> list[str]:
            # a notification is delivered at commit, before the committing call returns
            return sorted(n.payload for n in listener.notifies(timeout=0.3))

        yield drain


def test_an_enqueue_on_its_own_wakes_its_queue(db_dsn: str, heard: Callable[[], list[str]]) -> None:
    with Client(db_dsn) as client:
        client.enqueue("t", queue="a")  # job_insert_handoff, no slot parked: queued
        assert heard() == ["a"]
        client.enqueue("t", queue="b", delay=60)  # job_insert: scheduled
        assert heard() == ["b"]
        client.enqueue("t", queue="c", limit_key="k")  # job_insert: a keyed job
        assert heard() == ["c"]


def test_a_transactional_enqueue_wakes_at_commit_and_not_after_a_rollback(
    db_dsn: str, heard: Callable[[], list[str]]
) -> None:
    with Client(db_dsn) as client, psycopg.connect(db_dsn) as theirs:
        client.enqueue("t", queue="a", conn=theirs)
        client.enqueue("t", queue="a", conn=theirs)
        client.enqueue("t", queue="b", conn=theirs)
        assert heard() == []
        theirs.commit()
        assert heard() == ["a", "b"]
        client.enqueue("t", queue="c", conn=theirs)
        theirs.rollback()
        assert heard() == []


def test_jobs_born_waiting_cancelled_or_handed_off_wake_no_one(
    db_dsn: str, heard: Callable[[], list[str]]
) -> None:
    with Client(db_dsn) as client, connect(db_dsn) as conn:
        # not due: locking it as a dependency wakes no one (job_deps_lock wakes a due one)
        first = client.enqueue("t", queue="a", delay=60)
        assert heard() == ["a"]
        client.enqueue("t", queue="w", depends_on=[first.id])
        conn.execute("UPDATE deadman.jobs SET state = 'dead', finished_at = now() WHERE id = %s",
                     (first.id,))  # fmt: skip
        born_cancelled = client.enqueue("t", queue="w", depends_on=[first.id])
        assert born_cancelled.state.value == "cancelled"
        assert heard() == []
        conn.execute(
            QUERIES["worker_park"],
            {"worker": "p", "queues": ["h"], "channel": handoff_channel("p"), "ttl_ms": 30_000,
             "first": 0, "nonces": [1]},
        )  # fmt: skip
        assert client.enqueue("t", queue="h").state.value == "running"
        assert heard() == []


def test_bulk_enqueues_wake_each_queue_once(db_dsn: str, heard: Callable[[], list[str]]) -> None:
    with Client(db_dsn) as client:
        # COPYed straight in (job_ids_reserve wakes)
        client.enqueue_many([client.job("t", queue=q) for q in ("a", "b", "a")])
        assert heard() == ["a", "b"]
        # staged (a key), job_insert_staged; a scheduled job wakes too
        client.enqueue_many(
            [client.job("t", queue="c", idempotency_key="k1"), client.job("t", queue="d", delay=60)]
        )
        assert heard() == ["c", "d"]
        # every key taken, nothing inserted: the staged statement wakes from what was
        # staged, so the queue is woken for nothing (its documented cost)
        assert client.enqueue_many([client.job("t", queue="c", idempotency_key="k1")]) == []
        assert heard() == ["c"]


def test_a_refused_bulk_enqueue_wakes_no_one(db_dsn: str, heard: Callable[[], list[str]]) -> None:
    """The COPY fails after job_ids_reserve sent its NOTIFY: rolled back with it."""
    with Client(db_dsn) as client:
        with pytest.raises(InvalidJob):
            client.enqueue_many([client.job("t", queue="a"), client.job("t", {"s": "\x00"})])
        assert heard() == []


def test_the_apis_batch_and_group_statements_wake_their_queues(
    db_dsn: str, heard: Callable[[], list[str]]
) -> None:
    jobs = [NewJob("t", queue="a"), NewJob("t", queue="b", delay_ms=60_000),
            NewJob("t", queue="a", idempotency_key="g1")]  # fmt: skip
    with_store(db_dsn, lambda store: store.job_insert_many_returning(jobs, 5))
    assert heard() == ["a", "b"]
    group = [NewJob("t", queue="c"), NewJob("t", queue="d", idempotency_key="g2")]
    ordered = [group[i] for i in grouped_order(group)]
    with connect(db_dsn) as conn:
        rows = conn.execute(QUERIES["job_insert_grouped"], grouped_params(ordered, 5)).fetchall()
        assert len(rows) == 2
        assert heard() == ["c", "d"]
        # the same keyed job again: no row, no wake-up
        replay = [NewJob("t", queue="d", idempotency_key="g2")]
        again = conn.execute(QUERIES["job_insert_grouped"], grouped_params(replay, 5)).fetchall()
        assert again == [] and heard() == []


def test_a_workflow_wakes_the_queues_of_its_ready_nodes(
    db_dsn: str, heard: Callable[[], list[str]]
) -> None:
    with Client(db_dsn) as client:
        nodes: dict[str, Any] = {
            "extract": client.job("t", queue="etl"),
            "load": client.job("t", queue="load"),  # waits for extract: wakes no one yet
        }
        client.workflow("wf", nodes, [("extract", "load")])
        assert heard() == ["etl"]
