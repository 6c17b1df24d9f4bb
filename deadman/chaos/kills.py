"""The kill schedule applied: a tick's SIGKILLs, only of workers that registered and
are not spared, and its connection kills (``pg_terminate_backend``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from deadman.chaos.faults import Applied, FaultPlan, Tick
from deadman.chaos.probe import Db
from deadman.chaos.scenarios import Context
from deadman.chaos.workers import WorkerPool


def kill_workers(
    pool: WorkerPool,
    db: Db,
    slots: Sequence[int],
    spared: set[int],
    clock: Callable[[], float],
) -> tuple[list[Applied], int]:
    """SIGKILL the workers of these slots (the caller holds the pool's lock), except
    the spared ones and any still booting: a worker that has not registered holds no
    lease, and killing it proves nothing. Returns the kills applied and the number
    withheld."""
    if not slots:
        return [], 0
    live = pool.pids()
    rows = db.rows("registered_pids", {"pids": sorted(live.values())})
    registered = {int(r["pid"]) for r in rows}
    applied: list[Applied] = []
    withheld = 0
    for slot in slots:
        if slot in spared or live.get(slot) not in registered:
            withheld += 1
            continue
        pid = pool.kill(slot)
        if pid is not None:
            applied.append(Applied(clock(), "sigkill", f"w{slot}", {"pid": pid}))
    return applied, withheld


def apply_tick(ctx: Context, tick: Tick) -> tuple[int, int]:
    """One tick of the plan: the SIGKILLs (under the pool's lock, the slots refilled at
    once so that capacity stays), then the connection kills, both sparing the slots an
    episode protects. What was applied goes into ``ctx.applied``; returns (kills
    withheld, backends terminated)."""
    with ctx.lock:
        # A zombie must live to write late: its episode protects the slot (read
        # under the lock, which the episode holds while it picks its process).
        protected = {s.index for s in ctx.pool.slots if s.stopped} | set(ctx.protected)
        if ctx.quiet.is_set():
            withheld = len(tick.kills)
        else:
            applied, withheld = kill_workers(ctx.pool, ctx.db, tick.kills, protected, ctx.clock)
            ctx.applied.extend(applied)
        ctx.pool.reap()  # refill at once: capacity stays
    terminated = 0
    if tick.conn_kills:
        names = {f"deadman-chaos-w{s}" for s in protected}
        backends = [
            int(r["pid"])
            for r in ctx.db.rows("worker_backends")
            if r["application_name"] not in names
        ]
        for pid in ctx.plan.pick(tick, backends, tick.conn_kills):
            if ctx.db.value("backend_terminate", {"pid": pid}):
                terminated += 1
                ctx.record("pg_terminate_backend", f"backend {pid}")
    return withheld, terminated


def kill_on_ticks(
    pool: WorkerPool,
    db: Db,
    plan: FaultPlan,
    interval_s: float,
    clock: Callable[[], float],
    busy: Callable[[float], bool],
    deadline: float,
) -> tuple[list[Applied], int]:
    """A scenario's kills: the plan's tick every ``interval_s`` for as long as
    ``busy(wait_s)`` (which may wait up to ``wait_s`` for the work to end) says the
    work goes on, until the deadline (monotonic). The kills applied, and withheld."""
    applied: list[Applied] = []
    withheld = 0
    tick = 0
    next_tick = time.monotonic() + interval_s
    while busy(0.05) and time.monotonic() < deadline:
        pool.reap()
        if time.monotonic() >= next_tick:
            next_tick += interval_s
            done, held = kill_workers(pool, db, plan.tick(tick).kills, set(), clock)
            tick += 1
            applied += done
            withheld += held
            pool.reap()
    return applied, withheld
