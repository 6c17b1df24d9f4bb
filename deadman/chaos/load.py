"""The load phase on one database: the fleet, the submitter and the episodes start;
the tick loop applies the fault plan and samples progress until injection stops, then
waits for the drain (or ``--timeout``); everything stops, and what was seen is handed
on to the verdict."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deadman import devdb
from deadman.chaos import hosts_scenario, netns
from deadman.chaos.faults import EPISODES, Applied, FaultPlan
from deadman.chaos.hosts import Hosts
from deadman.chaos.http import BATCH, ApiServer, HttpSubmitter
from deadman.chaos.kills import apply_tick
from deadman.chaos.limits import limited
from deadman.chaos.netns import Partition
from deadman.chaos.options import Options
from deadman.chaos.probe import Db
from deadman.chaos.scenarios import Context, EpisodeRunner
from deadman.chaos.submit import JOB_BACKOFF, JOB_MAX_ATTEMPTS, SubmitRun, Submitter
from deadman.chaos.workers import WorkerPool, children_of, vm_hwm_kib

AnySubmitter = Submitter | HttpSubmitter

#: Injection stops once this share of the jobs has succeeded (and the episodes ran):
#: the rest of the run shows the fleet draining on its own.
STOP_INJECTING_AT = 0.9
#: Which scenario each episode belongs to.
EPISODE_SCENARIO = {
    "zombie": "zombie",
    "pg-restart-fast": "pg-restart",
    "pg-restart-immediate": "pg-restart",
    "partition": "partition",
    "hosts": "hosts",
}


class RunClock:
    """Seconds since the run began; restarted when the load starts (set-up does not
    count)."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def restart(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.started


@dataclass
class Observed:
    """What the tick loop saw."""

    ticks: int = 0
    peak_depth: int = 0
    peak_outstanding: int = 0
    conn_kills: int = 0
    kills_withheld: int = 0  # drawn, but the slot was booting, protected or quiet
    stuck: dict[str, Any] | None = None  # diagnostics when the run did not drain
    faults_stopped_s: float | None = None
    drained_s: float | None = None
    timed_out: bool = False
    postgres_peak_rss_mib: float | None = None
    harness_peak_rss_mib: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LoadPhase:
    """One load phase on the database ``dsn``; once ``run`` returned, the record of
    what it saw, for the checks and the report. ``teardown`` removes its network
    namespace, whatever happened."""

    opts: Options
    dsn: str
    cluster: devdb.Cluster | None
    log_dir: Path
    clock: RunClock
    applied: list[Applied]
    obs: Observed = field(default_factory=Observed)
    #: by episode name: what each saw, or why it was skipped
    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    api: ApiServer | None = None
    api_exit: int | None = None
    net: Partition | None = None
    net_unavailable: str = "not requested"
    hosts: Hosts | None = None  # the hosts scenario's three namespaces
    submitter: AnySubmitter = field(init=False)  # made by run

    def __post_init__(self) -> None:
        o = self.opts
        plan = FaultPlan(
            o.seed, o.workers, o.kill_rate, "kill" in o.scenarios, "conn-kill" in o.scenarios
        )
        self.pool = WorkerPool(self.dsn, o.workers, o.worker_env(), self.log_dir)
        self.ctx = Context(
            Db(self.dsn), self.pool, plan, self.applied, self.clock, o.lease_ttl, self.cluster
        )

    def depth_cap(self) -> int:
        """The API's queue depth cap (all of the jobs without one)."""
        cap = self.api.depth_cap if self.api is not None else None
        return self.opts.jobs if cap is None else cap

    def run(self) -> None:
        o, ctx, pool = self.opts, self.ctx, self.pool
        partition_slot = ctx.plan.episode_slot("partition")
        if "partition" in o.scenarios:
            self._partition_setup(partition_slot)
        if "hosts" in o.scenarios:
            self.hosts = hosts_scenario.make(self.dsn)
            hosts_scenario.place(pool, self.hosts)
        deadline = time.monotonic() + o.timeout
        skipped = self._skipped()
        episodes = [e for e in EPISODES if EPISODE_SCENARIO[e] in o.scenarios and e not in skipped]
        runner = EpisodeRunner(ctx, episodes, skipped, self.net, partition_slot, self.hosts)
        self.episodes = runner.results
        self.submitter = submitter = self._submitter(deadline)
        self.clock.restart()
        pool.started_at = self.clock.started
        try:
            if self.api is not None:
                self.api.start()
            if "limits" in o.scenarios:
                # through the submission path, before any worker or job exists
                submitter.set_limits(limited())
            pool.start_all()
            submitter.start()
            runner.start()
            self._loop(submitter, runner, deadline)
            if self.obs.timed_out:
                # Look before the workers stop: a stuck job's holder is still there.
                self.obs.stuck = {
                    "jobs": ctx.db.rows("outstanding_sample"),
                    "backends": ctx.db.rows("backends_snapshot"),
                }
        finally:
            ctx.stop.set()
            with ctx.lock:
                pool.stop_all()
            for thread in (runner, submitter):
                if thread.ident is not None:  # never started: set-up failed before it
                    thread.join(timeout=30)
            if self.api is not None:
                self.api_exit = self.api.exit_code()
                self.api.stop()
        self._sample_postgres_rss()

    def teardown(self) -> None:
        if self.net is not None:
            self.net.teardown()
            self.net = None
        if self.hosts is not None:
            self.hosts.teardown()
            self.hosts = None

    # -- set-up ------------------------------------------------------------------------

    def _submitter(self, deadline: float) -> AnySubmitter:
        o = self.opts
        run = SubmitRun(
            o.jobs, o.seed, o.handler_ms, self.ctx.stop, deadline, "limits" in o.scenarios
        )
        if o.submit != "http":
            return Submitter(self.dsn, run)
        # A cap well below the run's size: submission meets 429 and has to wait for
        # the fleet, which is what "producers outrun consumers" is about over HTTP.
        cap = max(2 * BATCH, o.jobs // 5)
        if self.hosts is None:
            self.api = ApiServer(self.dsn, self.log_dir, depth_cap=cap)
        else:  # on the first host, reaching Postgres through its link
            host = self.hosts.api
            self.api = ApiServer(
                host.dsn(self.dsn), self.log_dir, cap, prefix=host.prefix(), host=host.address
            )
        return HttpSubmitter(
            self.api,
            run,
            job_fields={
                "type": "chaos-effect",
                "max_attempts": JOB_MAX_ATTEMPTS,
                "backoff": JOB_BACKOFF.to_json(),
            },
            faults="submit-faults" in o.scenarios,
        )

    def _partition_setup(self, slot: int) -> None:
        """Put one worker slot behind a link the harness can cut (if the kernel lets us)."""
        reason = netns.available()
        if reason is not None:
            self.net_unavailable = reason
            return
        pool = self.pool
        net = Partition.for_dsn(pool.dsn)
        try:
            net.setup()
        except RuntimeError as exc:
            self.net_unavailable = f"network namespace set-up failed: {exc}"
            return
        self.net = net
        pool.slots[slot].prefix = net.exec_prefix
        pool.slots[slot].dsn = net.dsn(pool.dsn)

    def _skipped(self) -> dict[str, str]:
        o, why = self.opts, {}
        if "pg-restart" in o.scenarios and self.cluster is None:
            reason = "skipped: needs the private cluster (not with --database-url)"
            why["pg-restart-fast"] = why["pg-restart-immediate"] = reason
        if "partition" in o.scenarios and self.net is None:
            why["partition"] = f"skipped: {self.net_unavailable}"
        if "submit-faults" in o.scenarios and o.submit != "http":
            why["submit-faults"] = "skipped: needs --submit http"
        if "outrun" in o.scenarios and o.submit != "http":
            why["outrun-429"] = "skipped: a depth cap answering 429 needs --submit http"
        return why

    # -- the tick loop -----------------------------------------------------------------

    def _loop(self, submitter: AnySubmitter, runner: EpisodeRunner, deadline: float) -> None:
        o, obs, ctx = self.opts, self.obs, self.ctx
        injecting = True
        next_tick = time.monotonic() + o.kill_interval
        sample_every = min(o.kill_interval, 1.0)
        next_sample = time.monotonic()
        outstanding: int | None = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                obs.timed_out = True
                return
            with ctx.lock:
                ctx.pool.reap()
            if now >= next_sample:
                next_sample = now + sample_every
                progress = ctx.db.row("progress")
                if progress is not None:
                    self._note(progress)
                    outstanding = int(progress["outstanding"])
                    if (
                        injecting
                        and submitter.finished.is_set()
                        and runner.finished.is_set()
                        and progress["succeeded"] >= STOP_INJECTING_AT * o.jobs
                    ):
                        injecting = False
                        obs.faults_stopped_s = round(self.clock(), 1)
                    if (
                        not injecting
                        and submitter.finished.is_set()
                        and outstanding == 0
                        and int(progress["jobs"]) >= submitter.acked
                    ):
                        obs.drained_s = round(self.clock(), 1)
                        return
                self._sample_rss(ctx.pool)
            if injecting and now >= next_tick:
                next_tick += o.kill_interval
                withheld, terminated = apply_tick(ctx, ctx.plan.tick(obs.ticks))
                obs.kills_withheld += withheld
                obs.conn_kills += terminated
                obs.ticks += 1
            ctx.stop.wait(0.05)

    def _note(self, progress: dict[str, Any]) -> None:
        self.obs.peak_depth = max(self.obs.peak_depth, int(progress["depth"]))
        self.obs.peak_outstanding = max(self.obs.peak_outstanding, int(progress["outstanding"]))
        self.obs.samples.append({"at_s": round(self.clock(), 2), **progress})

    def _sample_rss(self, pool: WorkerPool) -> None:
        pool.sample_rss()
        if self.api is not None:
            self.api.sample_rss()
        own = vm_hwm_kib(os.getpid())
        if own is not None:
            self.obs.harness_peak_rss_mib = round(own / 1024, 1)
        self._sample_postgres_rss()

    def _sample_postgres_rss(self) -> None:
        if self.cluster is None:
            return
        try:
            postmaster = int(
                (self.cluster.datadir / "postmaster.pid").read_text().split("\n", 1)[0]
            )
        except (OSError, ValueError):
            return
        peaks = [vm_hwm_kib(p) or 0 for p in [postmaster, *children_of(postmaster)]]
        peak = round(max(peaks) / 1024, 1)
        self.obs.postgres_peak_rss_mib = max(self.obs.postgres_peak_rss_mib or 0.0, peak)
