"""Flow-control limits held by a fleet of real worker processes racing for keyed
jobs. Every check reads the attempt history (``deadman.attempts`` and the live
leases), never the implementation's own counters:

- concurrency: at no instant do more attempts of a key overlap than its limit, and
  the limit is reached (no under-use);
- rate: no window of ``per_ms`` holds more than ``count`` starts of a key, and over
  ten windows the start rate is within 10% of the limit;
- no head-of-line blocking: a deep backlog of a key limited to 1 does not hold back
  the unkeyed jobs queued behind it;
- a SIGKILLed worker's slot frees when its lease is rescued, not before.
"""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from typing import Any

from deadman.client import Client
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    STEADY_TTL_S,
    SpawnRescuer,
    SpawnWorker,
    sql_all,
    sql_value,
    wait_all_state,
    wait_registered,
)


def _intervals(dsn: str, key: str) -> list[tuple[datetime, datetime | None]]:
    """Every attempt of ``key``'s jobs as (start, end); a running one ends None."""
    rows = sql_all(
        dsn,
        "SELECT a.started_at, a.finished_at FROM deadman.attempts a"
        " JOIN deadman.jobs j ON j.id = a.job_id WHERE j.limit_key = %s"
        " UNION ALL SELECT started_at, NULL FROM deadman.jobs"
        " WHERE limit_key = %s AND state = 'running'",
        (key, key),
    )
    return [(r["started_at"], r["finished_at"]) for r in rows]


def peak_overlap(intervals: list[tuple[datetime, datetime | None]]) -> int:
    """The most intervals open at one instant (an end at t closes before a start at t:
    the finish that frees a slot commits before the claim that takes it)."""
    events: list[tuple[datetime, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        if end is not None:
            events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def _detail(dsn: str, key: str) -> str:
    """The attempts of ``key`` around its busiest instant, for a failure message."""
    rows = sql_all(
        dsn,
        "SELECT a.lease_token, a.job_id, a.worker, a.started_at, a.finished_at, a.outcome"
        " FROM deadman.attempts a JOIN deadman.jobs j ON j.id = a.job_id"
        " WHERE j.limit_key = %s ORDER BY a.started_at",
        (key,),
    )
    best, at = 0, None
    for r in rows:
        n = sum(1 for o in rows if o["started_at"] <= r["started_at"] < o["finished_at"])
        if n > best:
            best, at = n, r["started_at"]
    near = [
        f"{o['lease_token']} j{o['job_id']} {o['worker'][-12:]} {o['started_at']:%H:%M:%S.%f}"
        f" {o['finished_at']:%H:%M:%S.%f} {o['outcome']}"
        for o in rows
        if at is not None and o["started_at"] <= at < o["finished_at"]
    ]
    return "\n".join(near)


def test_peak_overlap_counts_what_it_should() -> None:
    t = datetime(2026, 1, 1)
    s = timedelta(seconds=1)
    assert peak_overlap([(t, t + s), (t + s, t + 2 * s)]) == 1  # back to back
    assert peak_overlap([(t, t + 2 * s), (t + s, t + 3 * s), (t + s, None)]) == 3


def _fleet(dsn: str, spawn_worker: SpawnWorker, n: int, concurrency: int, **env: Any) -> None:
    for w in [
        spawn_worker(dsn, concurrency=concurrency, DEADMAN_LEASE_TTL_S=STEADY_TTL_S, **env)
        for _ in range(n)
    ]:
        wait_registered(dsn, w.pid)


def test_concurrency_is_never_exceeded_and_is_reached(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """4 processes x 32 slots race for 500 jobs of a key limited to 5 (and 100 of a
    key limited to 2 beside them)."""
    with Client(db_dsn) as client:
        client.set_limit("stripe", concurrency=5)
        client.set_limit("mail", concurrency=2)
        ids = client.enqueue_many(
            [client.job("sleep", {"ms": 20}, limit_key="stripe") for _ in range(500)]
            + [client.job("sleep", {"ms": 20}, limit_key="mail") for _ in range(100)]
        )
    _fleet(db_dsn, spawn_worker, 4, 32)
    wait_all_state(db_dsn, ids, "succeeded", timeout=120)
    assert peak_overlap(_intervals(db_dsn, "stripe")) == 5, _detail(db_dsn, "stripe")
    assert peak_overlap(_intervals(db_dsn, "mail")) == 2, _detail(db_dsn, "mail")
    assert sql_value(db_dsn, "SELECT count(*) FROM deadman.attempts") == 600
    assert sql_value(db_dsn, "SELECT count(DISTINCT worker) FROM deadman.attempts") > 1


def test_rate_is_never_exceeded_in_any_window_and_holds_over_a_long_run(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """Ten windows' worth of a backlog: no window holds more than ``count`` starts,
    and the long-run start rate is within 10% of ``count`` per ``per_ms``: an idle
    worker wakes when a token frees, so there is no drift, even with a poll five
    windows long."""
    count, per_ms, windows = 30, 1000, 10
    with Client(db_dsn) as client:
        client.set_limit("api", rate=(count, timedelta(milliseconds=per_ms)))
        ids = client.enqueue_many(
            [client.job("noop", limit_key="api") for _ in range(count * windows)]
        )
    # one worker polling every 5 windows: only its wake-up when a token frees
    # (job_claim's wait) can keep the rate, not its poll; 64 slots, so that one claim
    # (half the slots) can take a whole window's tokens
    _fleet(db_dsn, spawn_worker, 1, 64, DEADMAN_POLL_S=5)
    wait_all_state(db_dsn, ids, "succeeded", timeout=60)
    starts = sorted(start for start, _ in _intervals(db_dsn, "api"))
    assert len(starts) == count * windows
    window = timedelta(milliseconds=per_ms)
    worst = max(sum(1 for s in starts if t - window < s <= t) for t in starts)
    assert worst == count  # reached, never exceeded
    # the rate from the first start to the last: the first window's starts came at
    # once, each later one had to wait for a token
    rate = (len(starts) - count) / ((starts[-1] - starts[0]) / window)
    assert 0.9 * count <= rate <= count, rate


def test_a_limited_backlog_does_not_hold_back_unkeyed_jobs(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    with Client(db_dsn) as client:
        client.set_limit("slow", concurrency=1)
        keyed = client.enqueue_many(
            [client.job("sleep", {"ms": 50}, limit_key="slow") for _ in range(10_000)]
        )
        unkeyed = client.enqueue_many([client.job("noop") for _ in range(1000)])
    _fleet(db_dsn, spawn_worker, 2, 16)
    wait_all_state(db_dsn, unkeyed, "succeeded", timeout=60)
    done_keyed = sql_value(
        db_dsn,
        "SELECT count(*) FROM deadman.jobs WHERE limit_key = 'slow' AND state = 'succeeded'",
    )
    # one keyed job at a time, 50 ms each: the unkeyed ones went past the backlog
    assert done_keyed < 500, done_keyed
    assert peak_overlap(_intervals(db_dsn, "slow")) == 1
    assert len(keyed) == 10_000


def test_a_killed_workers_slot_frees_when_its_lease_is_rescued(
    db_dsn: str, spawn_worker: SpawnWorker, spawn_rescuer: SpawnRescuer
) -> None:
    with Client(db_dsn) as client:
        client.set_limit("one", concurrency=1)
        first = client.enqueue("sleep", {"ms": 60_000}, limit_key="one")
        victim = spawn_worker(db_dsn, concurrency=4, no_rescuer=True)
        wait_for(
            lambda: sql_value(
                db_dsn, "SELECT state = 'running' FROM deadman.jobs WHERE id = %s", (first.id,)
            ),
            timeout=30,
            message="the first keyed job to start",
        )
        # ahead of the rescued one in the key's order, so it is what takes the freed slot
        second = client.enqueue("noop", limit_key="one", priority=10)
    victim.send(signal.SIGKILL)
    victim.wait_exit(10)
    spawn_worker(db_dsn, concurrency=4, no_rescuer=True)  # would take the slot if free
    rescuer = spawn_rescuer(db_dsn)
    wait_all_state(db_dsn, [second.id], "succeeded", timeout=30 + LATE_S)
    rescued_at = sql_value(
        db_dsn,
        "SELECT finished_at FROM deadman.attempts WHERE job_id = %s AND outcome = 'lease_expired'",
        (first.id,),
    )
    second_started = sql_value(
        db_dsn, "SELECT started_at FROM deadman.attempts WHERE job_id = %s", (second.id,)
    )
    assert rescued_at is not None and rescuer.poll() is None
    assert second_started >= rescued_at  # the slot was the lease's until the rescue
