"""The one-off fault episodes and the thread that runs them, one after another, while
the tick loop goes on killing workers: zombie, Postgres restart (fast, immediate) and
partition. Each waits on conditions read from the database, with deadlines, never
for a fixed time, and returns what it saw; the harness turns that into checks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, LiteralString

from deadman.chaos.faults import Applied, FaultPlan
from deadman.chaos.hosts import Hosts
from deadman.chaos.hosts_scenario import LeaseWatch, cut_slot, skewed_workers
from deadman.chaos.netns import Partition
from deadman.chaos.probe import Db
from deadman.chaos.workers import WorkerPool
from deadman.devdb import Cluster


@dataclass
class Context:
    """What episodes share with the tick loop."""

    db: Db
    pool: WorkerPool
    plan: FaultPlan
    applied: list[Applied]
    clock: Callable[[], float]  # seconds since the run began
    ttl_s: float
    cluster: Cluster | None
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards the pool
    #: Set when the run is over: episodes stop waiting.
    stop: threading.Event = field(default_factory=threading.Event)
    #: Slots the tick loop must leave alone (a zombie must live to write late).
    protected: set[int] = field(default_factory=set)
    #: Set while an episode needs the whole fleet up (a Postgres restart): no kills.
    quiet: threading.Event = field(default_factory=threading.Event)

    def record(self, kind: str, target: str, **detail: Any) -> None:
        self.applied.append(Applied(self.clock(), kind, target, detail))

    def wait(self, predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
        """Poll until predicate() is truthy; returns it, or None at the deadline/stop."""
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                return None
            self.stop.wait(interval)
        return None


def fleet_up(ctx: Context, timeout: float = 60.0) -> bool:
    """Wait until every live worker has registered: a worker still booting when
    Postgres goes down fails its schema check and exits, which is not what a restart
    scenario is about (running workers must ride it out)."""

    def registered() -> bool:
        pids = sorted(ctx.pool.pids().values())
        n = ctx.db.value("workers_registered", {"pids": pids})
        return bool(pids) and n is not None and int(n) >= len(pids)

    return bool(ctx.wait(registered, timeout, 0.05))


def _holding(ctx: Context, slot: int) -> tuple[int, str, int, int] | None:
    """Wait until the slot's worker holds a live lease whose handler has begun (recorded
    its invocation); (pid, worker id, live leases, begun ones). Waiting for any lease
    was not enough: a cut right after a claim met 32 leases and no begun handler, and
    then nothing ran twice."""
    found: list[tuple[int, str, int, int]] = []

    def holding() -> bool:
        pid = ctx.pool.pids().get(slot)
        if pid is None:
            return False
        worker = ctx.db.value("worker_id_of_pid", {"pid": pid})
        if worker is None:
            return False
        row = ctx.db.row("leases_held", {"worker": worker})
        if row is None or int(row["begun"]) == 0:
            return False
        found.append((pid, str(worker), int(row["live"]), int(row["begun"])))
        return True

    return found[-1] if ctx.wait(holding, 60.0, 0.05) else None


def _cut_off(
    ctx: Context, slot: int, cut: Callable[[], Any], heal: Callable[[], Any], how: str
) -> dict[str, Any]:
    """Cut off a worker running a leased job (``cut``) until every one of its leases has
    lapsed and the rescuer handed at least one on, then let it back (``heal``): its
    late writes must be refused, or given up on waking (it stands down from leases
    it can no longer trust), and either recorded."""
    ctx.protected.add(slot)
    try:
        deadline = time.monotonic() + 120.0
        while True:
            got = _holding(ctx, slot)
            if got is None or time.monotonic() > deadline:
                return _never_held(ctx, slot)
            pid, worker, held, begun = got
            with ctx.lock:
                # A kill may have replaced the process between the look and now: cut
                # off exactly the process whose leases we saw, or look again.
                if ctx.pool.pids().get(slot) == pid:
                    cut()
                    break
        cut_at = time.monotonic()
        ctx.record(f"{how}-begin", f"w{slot}", pid=pid, worker=worker, leases=held, begun=begun)
        # Counted from now on: the same process may have been through an earlier
        # episode, and its old refusals prove nothing about this one.
        rescued_before = _count(ctx, "rescued_from", worker)
        refused_before = _count(ctx, "refused_of", worker)

        def lapsed_and_rescued() -> bool:
            row = ctx.db.row("leases_held", {"worker": worker})
            rescued = _count(ctx, "rescued_from", worker)
            return row is not None and int(row["live"]) == 0 and rescued > rescued_before

        rescued_in_time = bool(ctx.wait(lapsed_and_rescued, ctx.ttl_s * 4 + 30.0))
        with ctx.lock:
            heal()
        cut_s = time.monotonic() - cut_at
        ctx.record(f"{how}-end", f"w{slot}", worker=worker, cut_s=round(cut_s, 2))
        # After a partition TCP retransmits on a backed-off timer: allow for it.
        refused = ctx.wait(
            lambda: max(0, _count(ctx, "refused_of", worker) - refused_before), 60.0, 0.1
        )
        rescued = _count(ctx, "rescued_from", worker) - rescued_before
        return {
            "ok": bool(refused) and rescued_in_time,
            "slot": slot,
            "worker": worker,
            "leases_at_cut": held,
            "begun_at_cut": begun,
            "cut_s": round(cut_s, 2),
            "rescued_from_it": rescued,
            "refused_writes": int(refused or 0),
        }
    finally:
        ctx.protected.discard(slot)


def _never_held(ctx: Context, slot: int) -> dict[str, Any]:
    """The episode's verdict when its worker never held a lease whose handler began:
    with the jobs left, whether that worker registered, and its stacks (it may be
    stuck, not idle)."""
    left = (ctx.db.row("progress") or {}).get("outstanding")
    pid = ctx.pool.pids().get(slot)
    registered = None if pid is None else ctx.db.value("worker_id_of_pid", {"pid": pid})
    return {
        "ok": False,
        "reason": f"the chosen worker never held a lease whose handler began ({left} jobs "
        f"were left: too few --jobs for the episodes to find work?; its process {pid}, "
        f"registered as {registered})",
        "stacks": "" if pid is None else ctx.pool.stacks(slot)[-8000:],
    }


def _count(ctx: Context, name: LiteralString, worker: str) -> int:
    return int(ctx.db.value(name, {"worker": worker}) or 0)


def zombie(ctx: Context) -> dict[str, Any]:
    """SIGSTOP a lease-holding worker past its lease, then SIGCONT it."""
    slot = ctx.plan.episode_slot("zombie")
    return _cut_off(
        ctx, slot, lambda: ctx.pool.pause(slot), lambda: ctx.pool.resume(slot), "sigstop"
    )


def partition(ctx: Context, net: Partition, slot: int) -> dict[str, Any]:
    """Take the partitioned worker's link down past its lease, then bring it back."""
    return _cut_off(ctx, slot, net.cut, net.heal, "partition")


def hosts_cut(ctx: Context, hosts: Hosts) -> dict[str, Any]:
    """Cut the first worker host off (every slot on it) past a watched worker's
    leases, then heal it; just before the heal, while the skewed host runs what was
    rescued, read how its leases stand on the database's clock."""
    slot = cut_slot(ctx.pool, ctx.plan.episode_slot("partition"))
    host, seen = hosts.workers[0], {}

    watch = LeaseWatch(ctx.db.dsn, lambda: skewed_workers(ctx.pool), ctx.ttl_s)

    def cut() -> None:
        host.cut()
        watch.start()  # while the skewed host runs what is rescued

    def heal() -> None:
        seen.update(watch.stop())
        host.heal()

    result = _cut_off(ctx, slot, cut, heal, "host-cut")
    ok = bool(result.get("ok")) and bool(seen.get("leases_ok"))
    return {**result, **seen, "ok": ok, "host": host.name}


def pg_restart(ctx: Context, mode: str) -> dict[str, Any]:
    """Restart Postgres under the fleet; then every worker that was running must
    send a heartbeat again on its own (no worker may die of it)."""
    if ctx.cluster is None:
        return {"skipped": "needs the private cluster (not with --database-url)"}
    cluster = ctx.cluster
    exits_before = len(ctx.pool.unexpected)
    # Kills pause for the episode: the point is that *running* workers ride out the
    # restart, so every slot must hold a registered worker when Postgres goes down.
    ctx.quiet.set()
    try:
        if not fleet_up(ctx):
            return {"ok": False, "error": "the workers never all registered"}
        with ctx.lock:
            ctx.pool.respawn = False  # a worker started while Postgres is down would fail
            pids = sorted(ctx.pool.pids().values())
        before = ctx.db.row("progress") or {}
        t = time.monotonic()
        ctx.record("pg-stop", "postgres", mode=mode)
        try:
            cluster.restart(mode)
        finally:
            with ctx.lock:
                ctx.pool.respawn = True
        down_s = time.monotonic() - t
        ctx.record("pg-start", "postgres", mode=mode, down_s=round(down_s, 2))
        return _reconnected(ctx, mode, pids, before, down_s, exits_before)
    finally:
        ctx.quiet.clear()


def _reconnected(
    ctx: Context,
    mode: str,
    pids: list[int],
    before: dict[str, Any],
    down_s: float,
    exits_before: int,
) -> dict[str, Any]:
    since = ctx.db.value("db_now")
    back = time.monotonic()

    def all_beat_again() -> bool:
        live = [p for p in pids if p in ctx.pool.pids().values()]
        n = ctx.db.value("heartbeats_since", {"pids": live, "since": since})
        return n is not None and int(n) >= len(live)

    reconnected = bool(ctx.wait(all_beat_again, 60.0, 0.1))
    reconnect_s = time.monotonic() - back
    died = ctx.pool.unexpected[exits_before:]
    return {
        "ok": reconnected and not died,
        "mode": mode,
        "down_s": round(down_s, 2),
        "workers_reconnected": reconnected,
        "reconnect_s": round(reconnect_s, 2),
        "workers_before": len(pids),
        "outstanding_at_stop": before.get("outstanding"),
        "running_at_stop": before.get("running"),
        "workers_died": [{"slot": e.slot, "code": e.code, "log_tail": e.log_tail} for e in died],
    }


class EpisodeRunner(threading.Thread):
    """Runs the chosen episodes one after another, once the whole fleet registered,
    until the run stops; an episode that raises is reported as failed. ``results``:
    by episode name, what it saw (or why it was skipped)."""

    def __init__(
        self,
        ctx: Context,
        episodes: list[str],
        skipped: dict[str, str],
        net: Partition | None,
        partition_slot: int,
        hosts: Hosts | None = None,
    ) -> None:
        super().__init__(name="chaos-episodes", daemon=True)
        self.ctx = ctx
        self.net = net
        self.partition_slot = partition_slot
        self.hosts = hosts
        self.episodes = episodes
        self.results: dict[str, dict[str, Any]] = {
            name: {"skipped": why} for name, why in skipped.items()
        }
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            # No wait for the whole fleet first: under kills every slot is rarely
            # registered at once. In a fresh-clone suite the zombie episode began only
            # at 34.6 s, and its worker found no job left (DECISIONS 97). Each
            # episode waits for what it needs: its worker holding leases (_holding),
            # or, for a restart, the fleet up with kills paused (pg_restart).
            for name in self.episodes:
                if self.ctx.stop.is_set():
                    break
                try:
                    if name == "zombie":
                        self.results[name] = zombie(self.ctx)
                    elif name == "partition" and self.net is not None:
                        self.results[name] = partition(self.ctx, self.net, self.partition_slot)
                    elif name == "hosts" and self.hosts is not None:
                        self.results[name] = hosts_cut(self.ctx, self.hosts)
                    elif name.startswith("pg-restart-"):
                        self.results[name] = pg_restart(self.ctx, name.removeprefix("pg-restart-"))
                except Exception as exc:  # report it as the episode's failure
                    self.results[name] = {"ok": False, "error": repr(exc)}
        finally:
            self.finished.set()
