"""``deadman chaos``: submit the jobs, run a fleet of real worker processes, inject
faults while the load runs, stop injecting, let the fleet drain, verify, and print a
verdict. Exit 0 only if every check passes.

The run goes in phases:

1. **Database**: a private throwaway cluster (the Postgres restart scenario needs one
   it controls), or ``--database-url`` (an existing, empty, Deadman database).
2. **Load**: ``--workers`` worker processes start; a submitter thread sends the jobs
   through ``deadman serve`` (``--submit http``, the default: batches of 1000, a
   queue depth cap, seeded submission faults) or the Python client (COPY batches),
   every job with the idempotency key ``chaos-<seed>-<n>``.
3. **Faults**: every ``--kill-interval`` a tick applies the seeded plan (SIGKILLs,
   connection kills). A kill is withheld from a worker that has not registered yet
   (it holds no lease: killing it proves nothing) and from a slot an episode uses.
   The episodes (zombie, Postgres restarts, partition) run one after another on
   their own thread; kills pause while Postgres restarts, so that every slot holds
   a running worker when it goes down. Injection stops once the episodes are done
   and 90% of the jobs have succeeded.
4. **Drain**: wait until nothing is outstanding (or ``--timeout``), stop the workers.
5. **Verify**: the SQL of ``verify.sql`` plus what the harness saw; report + JSON.
6. **Operators under fire** (the ``operators`` scenario, in ``--all``): afterwards, in
   a database of its own (its one-second retention deletes the jobs the exactly-once
   count above needs), with a fleet and an API server of its own, scaled to a tenth
   of ``--jobs`` unless it runs alone; verified by ``verify_ops.sql`` against the
   journal of what the operator was told (``deadman/chaos/operators.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from deadman import devdb
from deadman.chaos import netns, scenarios
from deadman.chaos.app import UNSAFE_ENV
from deadman.chaos.faults import EPISODES, Applied, FaultPlan, Tick
from deadman.chaos.http import BATCH, ApiServer, HttpSubmitter
from deadman.chaos.netns import Partition
from deadman.chaos.operators import (
    RETENTION_MS,
    OperatorsConfig,
    OperatorsPhase,
    Outcome,
    scaled_jobs,
)
from deadman.chaos.scenarios import Context, Db
from deadman.chaos.submit import JOB_BACKOFF, JOB_MAX_ATTEMPTS, SubmitRun, Submitter
from deadman.chaos.verify import Check, database_checks, figures, sql_text
from deadman.chaos.verify_ops import sql_text as verify_ops_sql
from deadman.chaos.workers import WorkerPool, children_of, vm_hwm_kib
from deadman.db.migrate import migrate
from deadman.errors import DeadmanError

SCENARIOS = (
    "kill",
    "zombie",
    "pg-restart",
    "conn-kill",
    "outrun",
    "partition",
    "submit-faults",
    "operators",
)
#: Injection stops once this share of the jobs has succeeded (and the episodes ran):
#: the rest of the run shows the fleet draining on its own.
STOP_INJECTING_AT = 0.9
#: Bound for "memory stays bounded" in the outrun scenario: a worker holds at most
#: its concurrency in jobs however deep the queue is, so its peak RSS must not grow
#: with the backlog. Measured peaks are ~45-50 MiB; this leaves room for noise.
WORKER_RSS_LIMIT_MIB = 300.0


@dataclass(frozen=True)
class Options:
    jobs: int
    workers: int
    concurrency: int
    kill_rate: float
    kill_interval: float
    lease_ttl: float
    seed: int
    submit: str
    timeout: float
    database_url: str | None
    keep: bool
    unsafe_effects: bool
    handler_ms: int
    scenarios: frozenset[str]
    report: Path | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        chosen = {s for s in SCENARIOS if getattr(args, s.replace("-", "_"), False)}
        if args.all or not chosen:
            chosen = set(SCENARIOS)
        return cls(
            jobs=args.jobs,
            workers=args.workers,
            concurrency=args.concurrency or 32,
            kill_rate=args.kill_rate,
            kill_interval=args.kill_interval,
            lease_ttl=args.lease_ttl,
            seed=args.seed,
            submit=args.submit,
            timeout=args.timeout,
            database_url=args.database_url,
            keep=args.keep,
            unsafe_effects=args.unsafe_effects,
            handler_ms=args.handler_ms,
            scenarios=frozenset(chosen),
            report=Path(args.report) if args.report else None,
        )

    def validate(self) -> None:
        if self.jobs < 1 or self.workers < 1 or self.concurrency < 1:
            raise DeadmanError("--jobs, --workers and --concurrency must be at least 1")
        if not 0 <= self.kill_rate <= 1:
            raise DeadmanError("--kill-rate is a probability: 0..1")
        if self.kill_interval <= 0 or self.lease_ttl <= 0 or self.timeout <= 0:
            raise DeadmanError("--kill-interval, --lease-ttl and --timeout must be > 0")
        if self.handler_ms < 0:
            raise DeadmanError("--handler-ms must be >= 0")

    def worker_env(self) -> dict[str, str]:
        heartbeat = self.lease_ttl / 4  # a beat may be late once without losing the lease
        return {
            "DEADMAN_LEASE_TTL_S": str(self.lease_ttl),
            "DEADMAN_HEARTBEAT_S": str(heartbeat),
            "DEADMAN_RESCUE_S": str(min(1.0, heartbeat)),
            "DEADMAN_POLL_S": "1",
            "DEADMAN_CONCURRENCY": str(self.concurrency),
            "DEADMAN_SHUTDOWN_GRACE_S": "5",
            "DEADMAN_LOG_FORMAT": "json",
            # warnings and errors only: leases lost, refusals, reconnects, crashes
            "DEADMAN_LOG_LEVEL": "warning",
            UNSAFE_ENV: "1" if self.unsafe_effects else "0",
        }


AnySubmitter = Submitter | HttpSubmitter


class EpisodeRunner(threading.Thread):
    def __init__(
        self,
        ctx: Context,
        episodes: list[str],
        skipped: dict[str, str],
        net: Partition | None,
        partition_slot: int,
    ) -> None:
        super().__init__(name="chaos-episodes", daemon=True)
        self.ctx = ctx
        self.net = net
        self.partition_slot = partition_slot
        self.episodes = episodes
        self.results: dict[str, dict[str, Any]] = {
            name: {"skipped": why} for name, why in skipped.items()
        }
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            if self.episodes:
                scenarios.fleet_up(self.ctx)
            for name in self.episodes:
                if self.ctx.stop.is_set():
                    break
                try:
                    if name == "zombie":
                        self.results[name] = scenarios.zombie(self.ctx)
                    elif name == "partition" and self.net is not None:
                        self.results[name] = scenarios.partition(
                            self.ctx, self.net, self.partition_slot
                        )
                    elif name.startswith("pg-restart-"):
                        self.results[name] = scenarios.pg_restart(
                            self.ctx, name.removeprefix("pg-restart-")
                        )
                except Exception as exc:  # report it as the episode's failure
                    self.results[name] = {"ok": False, "error": repr(exc)}
        finally:
            self.finished.set()


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


class Run:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.applied: list[Applied] = []
        self.obs = Observed()
        self.cluster: devdb.Cluster | None = None
        self.ctx: Context | None = None
        self.net: Partition | None = None
        self.api: ApiServer | None = None
        self.api_exit: int | None = None
        self.net_unavailable = "not requested"
        self.log_dir = Path()
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def clock(self) -> float:
        return time.monotonic() - self.started

    # -- setup -----------------------------------------------------------------------

    def _database(self) -> str:
        if self.opts.database_url:
            dsn = self.opts.database_url
        else:
            # fsync off (devdb's fast mode): Postgres itself is crashed and restarted
            # here, not the OS, and a process crash loses nothing the OS has been
            # handed. synchronous_commit stays on.
            self.cluster = devdb.throwaway(prefix="deadman-chaos-")
            return self._create_database("chaos")
        return self._migrated(dsn)

    def _create_database(self, name: str) -> str:
        assert self.cluster is not None
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self._migrated(self.cluster.dsn(name))

    def _migrated(self, dsn: str) -> str:
        migrate(dsn)
        if not Db(dsn).value("database_is_empty"):
            raise DeadmanError(
                "the database already holds jobs, effects or chaos invocations; the "
                "verifier counts whole tables, so give the chaos run a database of its own"
            )
        return dsn

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

    # -- the run ---------------------------------------------------------------------

    def execute(self) -> int:
        """Run, verify, report; the cluster and namespace go away whatever happens.
        The operators scenario runs after the others, in a database of its own."""
        self.log_dir = Path(tempfile.mkdtemp(prefix="deadman-chaos-logs-"))
        try:
            report: dict[str, Any] | None = None
            if self.opts.scenarios - {"operators"}:
                report = self._execute(self._database())
            if "operators" in self.opts.scenarios:
                report = self._operators(report)
            assert report is not None
            return self._finish(report)
        finally:
            self._cleanup()

    def _finish(self, report: dict[str, Any]) -> int:
        o = self.opts
        passed = all(c["passed"] for c in report["checks"])
        report["verdict"] = "PASS" if passed else "FAIL"
        if "operators" in report:
            n_ok = sum(1 for c in report["checks"] if c["passed"])
            print(
                f"verdict (every scenario): {report['verdict']} ({n_ok}/"
                f"{len(report['checks'])} checks passed) in {round(self.clock(), 1)} s"
            )
        if o.report is not None:
            o.report.parent.mkdir(parents=True, exist_ok=True)
            o.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
            print(f"report written to {o.report}")
        if o.keep and self.cluster is not None and "operators" in report:
            print(f"operators database kept: psql '{self.cluster.dsn('chaos_operators')}'")
        if passed and not o.keep:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        else:
            print(f"worker logs kept in {self.log_dir}")
        return 0 if passed else 1

    def _operators(self, report: dict[str, Any] | None) -> dict[str, Any]:
        """Run the operators scenario; its checks join the report's."""
        o = self.opts
        alone = report is None
        if report is None:
            report = {"options": {"seed": o.seed, "scenarios": sorted(o.scenarios)}, "checks": []}
            self.started = time.monotonic()
        dsn = self._operators_database(alone)
        if dsn is None:
            report["operators"] = {
                "skipped": "needs the private cluster (with --database-url "
                "the operators scenario runs alone: a database per run)"
            }
            print(f"operators: {report['operators']['skipped']}")
            return report
        began = time.monotonic()
        cfg = OperatorsConfig(
            jobs=scaled_jobs(o.jobs, alone),
            workers=o.workers,
            kill_rate=o.kill_rate,
            kill_interval=o.kill_interval,
            seed=o.seed,
            handler_ms=o.handler_ms,
            timeout=o.timeout,
            worker_env=o.worker_env(),
        )
        print(
            f"\noperators under fire: {cfg.jobs} jobs and {cfg.workflows} workflows, "
            f"{o.workers} workers, kill-rate {o.kill_rate} per {o.kill_interval} s, "
            f"retention {RETENTION_MS} ms",
            flush=True,
        )
        out = OperatorsPhase(cfg, dsn, self.log_dir, lambda: time.monotonic() - began).run()
        self.applied += out.applied
        report["operators"] = {**out.report, "verifier_sql": verify_ops_sql()}
        report["checks"] = report["checks"] + [c.to_json() for c in out.checks]
        print(self._operators_text(out))
        return report

    def _operators_text(self, out: Outcome) -> str:
        r = out.report
        lines = [
            "operators figures (from verify_ops.sql):",
            *(
                f"  {name:<19} " + ", ".join(f"{k} {v}" for k, v in row.items())
                for name, row in r["figures"].items()
            ),
            f"  actions          {r['actions']}",
            f"  journal          {r['journal']}",
            f"  fleet            {r['fleet']['spawns']} worker starts, "
            f"{r['fleet']['sigkills']} SIGKILLs; submitted in {r['submit_s']} s, drained at "
            f"{r['drained_s']} s, phase {r['wall_s']} s",
            *(f"  e.g. {name}: {row}" for name, rows in r["examples"].items() for row in rows[:3]),
            "operators checks:",
            *(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in out.checks),
        ]
        return "\n".join(lines)

    def _operators_database(self, alone: bool) -> str | None:
        if self.opts.database_url:
            return self._database() if alone else None
        if self.cluster is None:
            self.cluster = devdb.throwaway(prefix="deadman-chaos-")
        return self._create_database("chaos_operators")

    def _execute(self, dsn: str) -> dict[str, Any]:
        o = self.opts
        log_dir = self.log_dir
        plan = FaultPlan(
            o.seed, o.workers, o.kill_rate, "kill" in o.scenarios, "conn-kill" in o.scenarios
        )
        pool = WorkerPool(dsn, o.workers, o.worker_env(), log_dir)
        partition_slot = plan.episode_slot("partition")
        if "partition" in o.scenarios:
            self._partition_setup(pool, partition_slot)
        db = Db(dsn)
        deadline = time.monotonic() + o.timeout
        ctx = Context(
            db=db,
            pool=pool,
            plan=plan,
            lock=self.lock,
            applied=self.applied,
            clock=self.clock,
            stop=self.stop,
            ttl_s=o.lease_ttl,
            cluster=self.cluster,
        )
        self.ctx = ctx
        skipped = self._skipped()
        wanted = {
            "zombie": "zombie",
            "pg-restart-fast": "pg-restart",
            "pg-restart-immediate": "pg-restart",
            "partition": "partition",
        }
        episodes = [e for e in EPISODES if wanted[e] in o.scenarios and e not in skipped]
        runner = EpisodeRunner(ctx, episodes, skipped, self.net, partition_slot)
        submitter = self._submitter(dsn, log_dir, deadline)
        print(self._header(dsn, log_dir), flush=True)
        self.started = time.monotonic()
        pool.started_at = self.started
        try:
            if self.api is not None:
                self.api.start()
            pool.start_all()
            submitter.start()
            runner.start()
            self._loop(plan, pool, db, submitter, runner, deadline)
            if self.obs.timed_out:
                # Look before the workers stop: a stuck job's holder is still there.
                self.obs.stuck = {
                    "jobs": db.rows("outstanding_sample"),
                    "backends": db.rows("backends_snapshot"),
                }
        finally:
            self.stop.set()
            with self.lock:
                pool.stop_all()
            runner.join(timeout=30)
            submitter.join(timeout=30)
            if self.api is not None:
                self.api_exit = self.api.exit_code()
                self.api.stop()
        self._sample_postgres_rss()
        return self._verify(dsn, submitter, runner, pool)

    def _submitter(self, dsn: str, log_dir: Path, deadline: float) -> AnySubmitter:
        o = self.opts
        run = SubmitRun(o.jobs, o.seed, o.handler_ms, self.stop, deadline)
        if o.submit != "http":
            return Submitter(dsn, run)
        # A cap well below the run's size: submission meets 429 and has to wait for
        # the fleet, which is what "producers outrun consumers" is about over HTTP.
        self.api = ApiServer(dsn, log_dir, depth_cap=max(2 * BATCH, o.jobs // 5))
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

    def _loop(
        self,
        plan: FaultPlan,
        pool: WorkerPool,
        db: Db,
        submitter: AnySubmitter,
        runner: EpisodeRunner,
        deadline: float,
    ) -> None:
        o = self.opts
        injecting = True
        next_tick = time.monotonic() + o.kill_interval
        sample_every = min(o.kill_interval, 1.0)
        next_sample = time.monotonic()
        outstanding: int | None = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                self.obs.timed_out = True
                return
            with self.lock:
                pool.reap()
            if now >= next_sample:
                next_sample = now + sample_every
                progress = db.row("progress")
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
                        self.obs.faults_stopped_s = round(self.clock(), 1)
                    if (
                        not injecting
                        and submitter.finished.is_set()
                        and outstanding == 0
                        and int(progress["jobs"]) >= submitter.acked
                    ):
                        self.obs.drained_s = round(self.clock(), 1)
                        return
                self._sample_rss(pool)
            if injecting and now >= next_tick:
                next_tick += o.kill_interval
                self._tick(plan.tick(self.obs.ticks), plan, pool, db)
                self.obs.ticks += 1
            self.stop.wait(0.05)

    def _tick(self, tick: Tick, plan: FaultPlan, pool: WorkerPool, db: Db) -> None:
        with self.lock:
            # A zombie must live to write late: its episode protects the slot (read
            # under the lock, which the episode holds while it picks its process).
            protected = {s.index for s in pool.slots if s.stopped} | (
                set(self.ctx.protected) if self.ctx else set()
            )
            if self.ctx and self.ctx.quiet.is_set():
                self.obs.kills_withheld += len(tick.kills)
            else:
                applied, withheld = scenarios.kill_workers(
                    pool, db, tick.kills, protected, self.clock
                )
                self.applied += applied
                self.obs.kills_withheld += withheld
            pool.reap()  # refill at once: capacity stays
        if tick.conn_kills:
            names = {f"deadman-chaos-w{s}" for s in protected}
            backends = [
                int(r["pid"])
                for r in db.rows("worker_backends")
                if r["application_name"] not in names
            ]
            for pid in plan.pick(tick, backends, tick.conn_kills):
                if db.value("backend_terminate", {"pid": pid}):
                    self.obs.conn_kills += 1
                    self.applied.append(
                        Applied(self.clock(), "pg_terminate_backend", f"backend {pid}", {})
                    )

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

    # -- verdict -----------------------------------------------------------------------

    def _verify(
        self, dsn: str, submitter: AnySubmitter, runner: EpisodeRunner, pool: WorkerPool
    ) -> dict[str, Any]:
        o = self.opts
        # Runs that kill things mid-handler must show duplicate executions; a Postgres
        # restart alone may or may not catch a handler between its two writes.
        faults = bool(o.scenarios & {"kill", "zombie", "conn-kill", "partition"})
        f = figures(dsn, submitter.prefix, submitter.acked)
        checks = database_checks(f, submitter.acked, faults)
        checks += self._harness_checks(f, submitter, runner, pool)
        passed = all(c.passed for c in checks)
        elapsed = self.clock()
        report = self._report_json(f, checks, submitter, runner, pool, passed, elapsed, dsn)
        print(self._report_text(report))
        return report

    def _harness_checks(
        self,
        f: dict[str, dict[str, int]],
        submitter: AnySubmitter,
        runner: EpisodeRunner,
        pool: WorkerPool,
    ) -> list[Check]:
        o, obs = self.opts, self.obs
        checks = [
            Check(
                "all submissions acknowledged (harness)",
                submitter.acked == o.jobs and submitter.error is None,
                f"acknowledged {submitter.acked} of {o.jobs} in {submitter.duration_s:.1f} s, "
                f"{submitter.resends} batch resends"
                + (f"; {submitter.error}" if submitter.error else ""),
            ),
            Check(
                "drained before --timeout (harness)",
                obs.drained_s is not None and not obs.timed_out,
                f"drained at {obs.drained_s:.1f} s"
                if obs.drained_s
                else f"timed out after {o.timeout:.0f} s",
            ),
            Check(
                "no worker exited on its own (harness)",
                not pool.unexpected,
                f"{len(pool.unexpected)} unexpected exits"
                + "".join(
                    f"; w{e.slot} pid {e.pid} code {e.code} at {e.at_s:.1f} s"
                    for e in pool.unexpected[:5]
                ),
            ),
        ]
        if "kill" in o.scenarios:
            att = f["attempts"]
            checks.append(
                Check(
                    "kill: workers SIGKILLed, replaced, their jobs rescued",
                    pool.kills > 0 and att["rescues"] > 0,
                    f"{pool.kills} SIGKILLs, {pool.spawns} worker starts, "
                    f"{att['rescues']} rescues of {att['jobs_rescued']} jobs",
                )
            )
        cut_keys = ["worker", "leases_at_cut", "cut_s", "rescued_from_it", "refused_writes"]
        episodes = [
            (
                "zombie",
                "zombie",
                "zombie: paused past its lease; late writes refused or given up",
                cut_keys,
            ),
            (
                "partition",
                "partition",
                "partition: cut off past its lease; late writes refused or given up",
                cut_keys,
            ),
            (
                "pg-restart",
                "pg-restart-fast",
                "postgres restart (fast): workers reconnected on their own",
                _RESTART_KEYS,
            ),
            (
                "pg-restart",
                "pg-restart-immediate",
                "postgres restart (immediate, crash recovery): workers reconnected",
                _RESTART_KEYS,
            ),
        ]
        for scenario, name, title, keys in episodes:
            r = runner.results.get(name, {"ok": False, "error": "did not run"})
            if scenario in o.scenarios and "skipped" not in r:
                checks.append(
                    Check(title, bool(r.get("ok")), _describe(r, [*keys, "reason", "error"]))
                )
        if "conn-kill" in o.scenarios:
            checks.append(
                Check(
                    "connection kills: backends terminated, fleet carried on",
                    obs.conn_kills > 0 and not pool.unexpected,
                    f"{obs.conn_kills} worker backends terminated",
                )
            )
        if "outrun" in o.scenarios:
            peak = pool.summary()["worker_peak_rss_mib_max"] or 0.0
            checks.append(
                Check(
                    "outrun: queue backlog built up, worker memory bounded",
                    obs.peak_depth >= min(o.jobs, self._cap()) // 2
                    and peak <= WORKER_RSS_LIMIT_MIB,
                    f"peak queue depth {obs.peak_depth} of {o.jobs} jobs; worker peak RSS "
                    f"{peak} MiB (limit {WORKER_RSS_LIMIT_MIB:.0f})",
                )
            )
        if isinstance(submitter, HttpSubmitter):
            checks += self._http_checks(submitter, pool)
        return checks

    def _cap(self) -> int:
        cap = self.api.depth_cap if self.api is not None else None
        return self.opts.jobs if cap is None else cap

    def _http_checks(self, sub: HttpSubmitter, pool: WorkerPool) -> list[Check]:
        o, obs = self.opts, self.obs
        assert self.api is not None
        checks = [
            Check(
                "api server stayed up through the run (harness)",
                self.api_exit is None,
                f"exit code {self.api_exit}; statuses {sub.summary()['statuses']}",
            )
        ]
        if "outrun" in o.scenarios:
            # Rescued jobs go back to queued on their own, past the cap's check.
            bound = self._cap() + BATCH + o.workers * o.concurrency
            checks.append(
                Check(
                    "outrun (http): a full queue answered 429, depth stayed near the cap",
                    sub.statuses.get(429, 0) > 0 and obs.peak_depth <= bound,
                    f"429 answers {sub.statuses.get(429, 0)}, cap {self.api.depth_cap}, "
                    f"peak depth {obs.peak_depth} (bound {bound}); api peak RSS "
                    f"{round(self.api.peak_rss_kib / 1024, 1)} MiB",
                )
            )
        if "submit-faults" in o.scenarios:
            checks.append(
                Check(
                    "submission faults: timed-out and repeated submissions were replays",
                    sub.client_timeouts > 0 and sub.duplicates_sent > 0 and not sub.replays_wrong,
                    f"{sub.client_timeouts} client timeouts resent, {sub.duplicates_sent} "
                    f"duplicates sent, {sub.replays_ok} answered as replays"
                    + "".join(f"; {w}" for w in sub.replays_wrong[:3]),
                )
            )
        return checks

    # -- report ----------------------------------------------------------------------

    def _header(self, dsn: str, log_dir: Path) -> str:
        o = self.opts
        where = "private cluster (fsync off)" if self.cluster else "--database-url"
        return (
            f"deadman chaos: seed {o.seed}, {o.jobs} jobs, {o.workers} workers x "
            f"concurrency {o.concurrency}, kill-rate {o.kill_rate} per {o.kill_interval} s, "
            f"lease TTL {o.lease_ttl} s, handler 0-{o.handler_ms} ms, "
            f"effects {'UNSAFE (outside the transaction)' if o.unsafe_effects else 'fenced'}\n"
            f"scenarios: {', '.join(s for s in SCENARIOS if s in o.scenarios)}\n"
            f"submit: {o.submit}; database: {where}; worker logs: {log_dir}"
        )

    def _report_json(
        self,
        f: dict[str, dict[str, int]],
        checks: list[Check],
        submitter: AnySubmitter,
        runner: EpisodeRunner,
        pool: WorkerPool,
        passed: bool,
        elapsed: float,
        dsn: str,
    ) -> dict[str, Any]:
        o, obs = self.opts, self.obs
        kinds: dict[str, int] = {}
        for a in self.applied:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        return {
            "verdict": "PASS" if passed else "FAIL",
            "wall_s": round(elapsed, 1),
            "options": {
                "jobs": o.jobs,
                "workers": o.workers,
                "concurrency": o.concurrency,
                "kill_rate": o.kill_rate,
                "kill_interval_s": o.kill_interval,
                "lease_ttl_s": o.lease_ttl,
                "seed": o.seed,
                "submit": o.submit,
                "timeout_s": o.timeout,
                "handler_ms": o.handler_ms,
                "unsafe_effects": o.unsafe_effects,
                "scenarios": sorted(o.scenarios),
                "database": "private cluster" if self.cluster else "--database-url",
            },
            "figures": f,
            "checks": [c.to_json() for c in checks],
            "episodes": runner.results,
            "fleet": pool.summary(),
            "http": submitter.summary() if isinstance(submitter, HttpSubmitter) else None,
            "observed": {
                "ticks": obs.ticks,
                "peak_queue_depth": obs.peak_depth,
                "peak_outstanding": obs.peak_outstanding,
                "conn_kills": obs.conn_kills,
                "kills_withheld": obs.kills_withheld,
                "faults_stopped_s": obs.faults_stopped_s,
                "drained_s": obs.drained_s,
                "submit_s": round(submitter.duration_s, 2),
                "postgres_peak_rss_mib": obs.postgres_peak_rss_mib,
                "harness_peak_rss_mib": obs.harness_peak_rss_mib,
                "throughput_jobs_per_s": round(o.jobs / obs.drained_s, 1)
                if obs.drained_s
                else None,
            },
            "stuck_at_timeout": obs.stuck,
            "faults_applied": {"counts": kinds, "events": [a.to_json() for a in self.applied]},
            "dsn": dsn if o.keep else None,
            "verifier_sql": sql_text(),
        }

    def _report_text(self, r: dict[str, Any]) -> str:
        f = r["figures"]
        lines = ["", "figures (from verify.sql):"]
        for name, row in f.items():
            lines.append(f"  {name:<15} " + ", ".join(f"{k} {v}" for k, v in row.items()))
        obs, fleet = r["observed"], r["fleet"]
        lines += [
            "observed by the harness:",
            f"  faults applied  {r['faults_applied']['counts'] or 'none'} "
            f"(kills withheld from booting/protected workers: {obs['kills_withheld']})",
            f"  fleet           {fleet['spawns']} worker starts, {fleet['sigkills']} SIGKILLs, "
            f"{len(fleet['unexpected_exits'])} unexpected exits",
            f"  memory          worker peak RSS max {fleet['worker_peak_rss_mib_max']} MiB "
            f"(median {fleet['worker_peak_rss_mib_median']}, {fleet['worker_processes_sampled']} "
            f"processes), postgres {obs['postgres_peak_rss_mib']} MiB, harness "
            f"{obs['harness_peak_rss_mib']} MiB",
            f"  queue           peak depth {obs['peak_queue_depth']}, submitted in "
            f"{obs['submit_s']} s, faults stopped at {obs['faults_stopped_s']} s, drained at "
            f"{obs['drained_s']} s ({obs['throughput_jobs_per_s']} jobs/s)",
        ]
        for name, ep in r["episodes"].items():
            if "skipped" in ep:
                lines.append(f"  {name:<15} {ep['skipped']}")
        stuck = r.get("stuck_at_timeout")
        if stuck:
            lines.append(f"  not drained: {len(stuck['jobs'])} outstanding jobs, e.g.:")
            lines += [f"    {j}" for j in stuck["jobs"][:5]]
        lines.append("checks:")
        for c in r["checks"]:
            lines.append(f"  {'PASS' if c['passed'] else 'FAIL'}  {c['name']}: {c['detail']}")
        n_ok = sum(1 for c in r["checks"] if c["passed"])
        lines.append(
            f"verdict: {r['verdict']} ({n_ok}/{len(r['checks'])} checks passed) in {r['wall_s']} s"
        )
        if r["dsn"]:
            lines.append(f"cluster kept running: psql '{r['dsn']}'")
            if self.cluster is not None:
                root = self.cluster.datadir.parent
                lines.append(f"stop it with: deadman devdb stop --dir {root} && rm -rf {root}")
        lines += ["", "verifier SQL (deadman/chaos/verify.sql):", r["verifier_sql"]]
        return "\n".join(lines)

    def _partition_setup(self, pool: WorkerPool, slot: int) -> None:
        """Put one worker slot behind a link the harness can cut (if the kernel lets us)."""
        reason = netns.available()
        if reason is not None:
            self.net_unavailable = reason
            return
        net = Partition.for_dsn(pool.dsn)
        try:
            net.setup()
        except RuntimeError as exc:
            self.net_unavailable = f"network namespace set-up failed: {exc}"
            return
        self.net = net
        pool.slots[slot].prefix = net.exec_prefix
        pool.slots[slot].dsn = net.dsn(pool.dsn)

    def _cleanup(self) -> None:
        if self.net is not None:
            self.net.teardown()
            self.net = None
        if self.cluster is not None and not self.opts.keep:
            self.cluster.destroy()


_RESTART_KEYS = [
    "down_s",
    "running_at_stop",
    "outstanding_at_stop",
    "workers_before",
    "workers_reconnected",
    "reconnect_s",
    "workers_died",
]


def _describe(result: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(
        f"{k} {result[k]}" for k in keys if k in result and result[k] not in (None, [])
    )


def main(args: argparse.Namespace) -> int:
    """Entry point of ``deadman chaos`` (see deadman/cli.py)."""
    if args.submit == "http" and importlib.util.find_spec("deadman.api") is None:
        raise DeadmanError("--submit http needs the HTTP API (deadman.api, `deadman serve`)")
    opts = Options.from_args(args)
    opts.validate()
    # The client's pool logs every failed reconnect while Postgres is down on purpose;
    # the submitter counts its resends itself and the report shows them.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    return Run(opts).execute()
