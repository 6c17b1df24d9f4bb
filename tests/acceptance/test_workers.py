"""Real worker processes doing normal work: racing claimers, ordering, scheduling,
wake-ups and the fleet supervisor."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

from deadman import gcpolicy, stackdump
from deadman.client import Client
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    STEADY_TTL_S,
    SpawnWorker,
    attempts_of,
    parent_pid,
    pid_alive,
    sql_all,
    sql_value,
    states_of,
    wait_all_state,
    wait_held,
    wait_registered,
    wait_state,
    wait_workers,
    worker_rows,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("job_type", "count", "payload"),
    [("noop", 10_000, None), ("side-effect", 2_000, {"sleep_ms": 0})],
    ids=["noop", "side-effect"],
)
def test_eight_processes_race_every_job_runs_exactly_once(
    db_dsn: str, spawn_worker: SpawnWorker, job_type: str, count: int, payload: object
) -> None:
    # Eight separate processes, all idle and listening, then every job at once in one
    # COPY: one NOTIFY wakes all eight and they claim from the same rows together.
    # Half run on uvloop (the default), half on asyncio's own loop (DEADMAN_EVENT_LOOP);
    # across both, half with the tuned collector (the default), half with Python's own
    # (DEADMAN_GC, DECISIONS 78).
    policies = ["python" if (i // 2) % 2 else "tuned" for i in range(8)]
    workers = [
        spawn_worker(
            db_dsn,
            concurrency=8,
            DEADMAN_LEASE_TTL_S=STEADY_TTL_S,
            DEADMAN_EVENT_LOOP="asyncio" if i % 2 else "auto",
            DEADMAN_GC=policies[i],
        )
        for i in range(8)
    ]
    for w in workers:
        wait_registered(db_dsn, w.pid)
    with Client(db_dsn) as client:
        ids = client.enqueue_many(client.job(job_type, payload) for _ in range(count))
    assert len(ids) == count
    started = time.monotonic()
    wait_all_state(db_dsn, ids, "succeeded", timeout=60)
    elapsed = time.monotonic() - started

    assert states_of(db_dsn, ids) == {"succeeded": count}
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.jobs") == count
    # Exactly one attempt per job, the first, and it succeeded: no job ran twice.
    per_job = sql_all(
        db_dsn,
        "SELECT j.id, count(a.*) AS n, min(a.attempt) AS lo, max(a.attempt) AS hi,"
        " bool_and(a.outcome = 'succeeded') AS ok"
        " FROM deadman.jobs j LEFT JOIN deadman.attempts a ON a.job_id = j.id"
        " GROUP BY j.id HAVING count(a.*) <> 1 OR min(a.attempt) <> 1"
        " OR max(a.attempt) <> 1 OR NOT bool_and(a.outcome = 'succeeded')",
    )
    assert per_job == []
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.attempts") == count
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.jobs WHERE attempt <> 1") == 0
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.lease_refusals") == 0
    if job_type == "side-effect":
        # One effect per job, written under the token of the attempt that succeeded.
        bad = sql_all(
            db_dsn,
            "SELECT j.id, count(e.*) AS n FROM deadman.jobs j"
            " LEFT JOIN deadman.effects e ON e.job_id = j.id"
            " LEFT JOIN deadman.attempts a ON a.job_id = j.id AND a.lease_token = e.lease_token"
            " GROUP BY j.id HAVING count(e.*) <> 1 OR count(a.*) <> 1",
        )
        assert bad == []
        assert sql_value(db_dsn, "SELECT count(*) FROM deadman.effects") == count
    # Racing claimers and batched completions never deadlocked or crashed a task.
    for w in workers:
        assert w.poll() is None
        bad = [e for e in w.events() if e.get("level") in ("error", "critical")]
        assert bad == [], bad
    # Each ran the collector it was told to.
    for w, policy in zip(workers, policies, strict=True):
        gcs = [e for e in w.events() if e.get("event") == "gc_policy"]
        assert [e["policy"] for e in gcs] == [policy], gcs
        tuned = gcs[0]["thresholds"] == [gcpolicy.GEN0, gcpolicy.GEN1, gcpolicy.GEN2]
        assert tuned == (policy == "tuned") == (gcs[0]["frozen"] > 0), gcs
    # They really raced: the work is spread over the processes.
    by_worker = sql_all(
        db_dsn, "SELECT worker, count(*) AS n FROM deadman.attempts GROUP BY worker"
    )
    assert len(by_worker) >= 4, by_worker
    print(
        f"{count} {job_type} jobs on 8 processes: {elapsed:.2f}s "
        f"({count / elapsed:.0f}/s), per worker {sorted(r['n'] for r in by_worker)}"
    )


def test_strict_priority_then_fifo(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    priorities = [0, 10, -5, 100, 0, -5, 10, 100, 0, 10, -5, 100]
    with Client(db_dsn) as client:
        # One transaction each, so run_at (and id) grow in submission order.
        ids = [client.enqueue("noop", {"n": i}, priority=p).id for i, p in enumerate(priorities)]
    expected = [ids[i] for i in sorted(range(len(ids)), key=lambda i: (-priorities[i], i))]

    worker = spawn_worker(db_dsn, concurrency=1, DEADMAN_LEASE_TTL_S=STEADY_TTL_S)
    wait_all_state(db_dsn, ids, "succeeded", timeout=20)

    by_start = sql_all(
        db_dsn, "SELECT job_id FROM deadman.attempts ORDER BY started_at, lease_token"
    )
    by_token = sql_all(db_dsn, "SELECT job_id FROM deadman.attempts ORDER BY lease_token")
    assert [r["job_id"] for r in by_start] == expected
    assert [r["job_id"] for r in by_token] == expected
    assert worker.poll() is None


def test_delayed_job_starts_on_time_not_before(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    # A 30 s poll: only the producer's "sleep until the next run_at" can start it in time.
    worker = spawn_worker(db_dsn, DEADMAN_POLL_S=30)
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        job = client.enqueue("noop", delay=timedelta(seconds=2))
    assert job.state.value == "scheduled"
    row = wait_state(db_dsn, job.id, "succeeded", timeout=10)
    (attempt,) = attempts_of(db_dsn, job.id)
    late = (attempt["started_at"] - row["run_at"]).total_seconds()
    print(f"delayed job: started {late * 1000:.0f} ms after run_at")
    assert (row["run_at"] - row["created_at"]).total_seconds() == pytest.approx(2.0, abs=0.01)
    assert late >= 0, "started before its run_at"
    assert late < LATE_S


def test_notify_wakes_an_idle_worker(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    # A 30 s poll: a start within LATE_S can only come from LISTEN/NOTIFY.
    worker = spawn_worker(db_dsn, DEADMAN_POLL_S=30)
    wait_registered(db_dsn, worker.pid)
    latencies = []
    with Client(db_dsn) as client:
        # The listener's first act on connecting is one wake-up (for anything enqueued
        # before its LISTEN), which could explain one quick start, never four. Each job
        # is enqueued after the previous one finished, when the producer has gone back
        # to its 30 s sleep.
        for _ in range(4):
            job = client.enqueue("noop")
            row = wait_state(db_dsn, job.id, "succeeded", timeout=10)
            latencies.append((row["started_at"] - row["created_at"]).total_seconds())
    print(f"NOTIFY start latencies: {[f'{x * 1000:.0f} ms' for x in latencies]}")
    assert max(latencies) < LATE_S


def test_fleet_restarts_a_killed_child_and_stops_on_sigterm(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    fleet = spawn_worker(db_dsn, processes=3, concurrency=2)
    rows = wait_workers(db_dsn, 3)
    pids = {r["pid"] for r in rows}
    assert len(pids) == 3
    assert all(parent_pid(p) == fleet.pid for p in pids), "workers are the fleet's children"

    victim = sorted(pids)[0]
    old_ids = {r["id"] for r in rows}
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    new = wait_for(
        lambda: [r for r in worker_rows(db_dsn) if r["id"] not in old_ids] or None,
        15,
        message="a restarted child to register",
    )
    restart_s = time.monotonic() - killed_at
    (replacement,) = new
    assert replacement["pid"] not in pids
    assert parent_pid(replacement["pid"]) == fleet.pid
    assert not pid_alive(victim)
    fleet.wait_event("fleet_child_exited", 5, pid=victim, code=-signal.SIGKILL)
    print(f"fleet: killed child re-registered after {restart_s:.2f}s")

    # The restarted fleet still works.
    with Client(db_dsn) as client:
        ids = [client.enqueue("noop").id for _ in range(20)]
    wait_all_state(db_dsn, ids, "succeeded", timeout=15)

    live = (pids - {victim}) | {replacement["pid"]}
    fleet.send(signal.SIGTERM)
    assert fleet.wait_exit(15) == 0
    assert not any(pid_alive(p) for p in live), "a child outlived its supervisor"
    # Every live child deregistered; only the SIGKILLed one's row is left (for the
    # rescuer's stale-worker pruning).
    assert [r["pid"] for r in worker_rows(db_dsn)] == [victim]


def test_sigusr1_dumps_every_threads_stack_and_the_worker_carries_on(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """``kill -USR1``: a worker writes every thread's stack to its log, a handler
    asleep in its thread included, and goes on as before; so does a burst of them.
    A fleet's supervisor dumps its own (SIGUSR1 used to end it: the default action)."""
    worker = spawn_worker(db_dsn, concurrency=2)
    worker_id = wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        busy = client.enqueue("side-effect", {"sleep_ms": 3000})
        wait_held(db_dsn, busy.id, worker_id)

        # The lease can be written before the handler's thread starts (a job handed
        # to a parked slot at enqueue), and the pool's new thread can be in the handler
        # while the main thread, where the signal lands, is still in `_invoke` starting
        # it (seen once: the job's task then shows no await). Dump again until the
        # handler sleeps in its thread and the job's task waits for it.
        def with_handler() -> str | None:
            dump = worker.stacks()
            tasks = dump[dump.find("Event loop tasks") :]
            settled = "in side_effect" in dump and " in _invoke" in tasks
            return dump if settled else None

        dump = wait_for(with_handler, 10, message="a dump with the handler's thread")
        assert "Current thread" in dump, dump  # the main thread, where the signal landed
        assert "in side_effect" in dump, dump  # the handler's thread, mid-sleep
        # then the event loop's tasks, each in the coroutines it waits in: the
        # producer's loop and the job's task waiting for its thread (an idle loop's
        # thread stack alone shows none of them)
        tasks = dump[dump.index("Event loop tasks") :]
        assert tasks.rstrip().endswith(stackdump.END), dump
        assert "deadman/worker/producer.py" in tasks and " in _run" in tasks, tasks
        assert "deadman/worker/executor.py" in tasks and " in _invoke" in tasks, tasks
        for _ in range(20):
            worker.send(signal.SIGUSR1)
        ids = [client.enqueue("noop").id for _ in range(20)]
    wait_all_state(db_dsn, [busy.id, *ids], "succeeded", timeout=15)
    assert worker.poll() is None
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(15) == 0

    fleet = spawn_worker(db_dsn, processes=2, concurrency=2)
    children = {r["pid"] for r in wait_workers(db_dsn, 2)}
    assert "Current thread" in fleet.stacks()
    assert fleet.poll() is None
    assert {r["pid"] for r in worker_rows(db_dsn)} >= children
    fleet.send(signal.SIGTERM)
    assert fleet.wait_exit(15) == 0


def test_fleet_stopped_during_child_startup_exits_0(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    # The same happens to a child the fleet has just restarted after a crash.
    fleet = spawn_worker(db_dsn, processes=2)
    fleet.wait_event("fleet_child_started", 10, index=1)
    fleet.send(signal.SIGTERM)
    code = fleet.wait_exit(15)
    print(f"fleet stopped during child start-up: exit {code}")
    assert code == 0
