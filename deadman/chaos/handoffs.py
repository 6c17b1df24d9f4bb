"""Handoffs under fire (``deadman chaos``'s ``handoffs`` scenario, in ``--all``).

The load phase keeps the fleet busy, so its workers never park a slot and no job there
is handed off at enqueue (DECISIONS 83). Here, in a database of its own, jobs go in
one at a time through the Python client (``Client.enqueue``, each its own transaction)
at a pace an idle fleet keeps up with, so most are handed straight to a parked slot,
while workers are SIGKILLed on the tick as in the load phase: a worker killed with
slots parked can take jobs into its lease until those slots lapse, and the rescuer
must hand them on. The verdict is verify.sql's (every acknowledged job once, effects
exactly once and under the succeeding attempt's lease) and verify_handoffs.sql's:
handoffs happened (their share, and the jobs handed to a worker that then died and
were rescued, are reported).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg

from deadman.chaos.faults import FaultPlan
from deadman.chaos.kills import kill_on_ticks
from deadman.chaos.operators import Outcome, OwnDatabasePhase, drain
from deadman.chaos.options import Options
from deadman.chaos.probe import Db
from deadman.chaos.submit import JOB_BACKOFF, JOB_MAX_ATTEMPTS
from deadman.chaos.verify import Check, database_checks, figures, run_queries
from deadman.chaos.workers import WorkerPool
from deadman.client import Client
from deadman.db.queries import parse
from deadman.errors import DeadmanError

VERIFY_SQL = (
    resources.files("deadman.chaos").joinpath("verify_handoffs.sql").read_text(encoding="utf-8")
)
#: Jobs a second: one at a time, well within what an idle fleet runs at once.
RATE = 100.0
#: Most jobs the scenario sends (20 s at RATE).
MAX_JOBS = 2000
#: How many attempts must have been handoffs, or the scenario tested nothing. Not a
#: share: how many jobs an idle fleet takes so depends on how often its workers are
#: killed and how busy the machine is (a 100,000-job run, a worker killed every ~7 s:
#: 92%; the small run in tests/chaos beside a fresh-clone suite, a worker killed every
#: second and still booting most of the time: 8% to 29%), so the share is reported.
MIN_HANDED = 1
#: Every GAP_EVERY jobs the trickle waits, at most GAP_MAX_S, until no job is due. An
#: enqueue hands nothing off behind an older due job (job_insert_handoff), so once one
#: job is queued, the next is queued too whenever waking a worker and its claim take
#: longer than the 10 ms between jobs: on a loaded box that chain can last the whole
#: phase (0 of 2,245 attempts handed off beside a busy test suite; on an idle box,
#: 342 jobs/s handed off 4 of 1,500 and 397 jobs/s none). The gap breaks it.
GAP_EVERY = 50
GAP_MAX_S = 2.0


@dataclass(frozen=True)
class HandoffsConfig:
    opts: Options
    jobs: int

    @property
    def prefix(self) -> str:
        return f"chaos-{self.opts.seed}-handoff-"

    @classmethod
    def of(cls, opts: Options) -> HandoffsConfig:
        return cls(opts, min(opts.jobs, MAX_JOBS))


class Trickle(threading.Thread):
    """Enqueues the jobs one by one at RATE; a failed enqueue is sent again under its
    idempotency key (a replay returns the job it made)."""

    def __init__(self, cfg: HandoffsConfig, dsn: str, deadline: float) -> None:
        super().__init__(name="chaos-trickle", daemon=True)
        self.cfg = cfg
        self.dsn = dsn
        self.deadline = deadline
        self.acked = 0
        self.resends = 0
        self.error: str | None = None
        self.submit_s = 0.0
        #: the gaps waited for the queue to empty (GAP_EVERY), and their seconds
        self.gaps = 0
        self.gap_s = 0.0

    def busy(self, wait_s: float) -> bool:
        """Still sending, after waiting up to ``wait_s`` for the last job to go in."""
        self.join(wait_s)
        return self.is_alive()

    def run(self) -> None:
        started = time.monotonic()
        db = Db(self.dsn)
        try:
            with Client(self.dsn) as client:
                base = started
                for n in range(self.cfg.jobs):
                    if n and n % GAP_EVERY == 0:
                        self._gap(db)
                        base = time.monotonic() - n / RATE  # no burst to catch up
                    next_at = base + n / RATE
                    time.sleep(max(0.0, next_at - time.monotonic()))
                    self._send(client, n)
                    self.acked += 1
        except DeadmanError as exc:
            self.error = str(exc)
        finally:
            self.submit_s = time.monotonic() - started

    def _gap(self, db: Db) -> None:
        """Wait until no job is due (or GAP_MAX_S, or the deadline)."""
        start = time.monotonic()
        until = min(start + GAP_MAX_S, self.deadline)
        while db.value("handoffs_due") != 0 and time.monotonic() < until:
            time.sleep(0.01)
        self.gaps += 1
        self.gap_s += time.monotonic() - start

    def _send(self, client: Client, n: int) -> None:
        delay = 0.05
        while True:
            try:
                client.enqueue(
                    "chaos-effect",
                    {"ms": n % (self.cfg.opts.handler_ms + 1)},
                    max_attempts=JOB_MAX_ATTEMPTS,
                    backoff=JOB_BACKOFF,
                    idempotency_key=f"{self.cfg.prefix}{n}",
                )
                return
            except (DeadmanError, psycopg.Error) as exc:
                if time.monotonic() > self.deadline:
                    raise DeadmanError(f"submission stopped: {exc}") from exc
                self.resends += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


class HandoffsPhase(OwnDatabasePhase):
    """The whole scenario on one (empty, migrated) database: start a fleet, trickle
    jobs in while kills go on, drain, verify."""

    def __init__(
        self, cfg: HandoffsConfig, dsn: str, log_dir: Path, clock: Callable[[], float]
    ) -> None:
        super().__init__(dsn, log_dir, clock)
        self.cfg = cfg

    def run(self) -> Outcome:
        o = self.cfg.opts
        started = time.monotonic()
        deadline = started + o.timeout
        pool = WorkerPool(self.dsn, o.workers, o.worker_env(), self.log_dir / "handoffs")
        plan = FaultPlan(o.seed, o.workers, o.kill_rate, True, False)
        trickle = Trickle(self.cfg, self.dsn, deadline)
        drained_s: float | None = None
        try:
            pool.start_all()
            trickle.start()
            applied, self.kills_withheld = kill_on_ticks(
                pool,
                self.db,
                plan,
                o.kill_interval,
                self.clock,
                trickle.busy,
                deadline,
            )
            self.applied += applied
            trickle.join(timeout=max(0.0, deadline - time.monotonic()))
            drained_s = drain(self.db, pool, deadline, started)
        finally:
            pool.stop_all()
        f = figures(self.dsn, self.cfg.prefix, trickle.acked)
        handed = run_queries(self.dsn, parse(VERIFY_SQL), {})["handoffs"]
        checks = [
            Check(f"handoffs: {c.name}", c.passed, c.detail)
            for c in database_checks(f, trickle.acked, faults=False)
        ] + self._checks(trickle, pool, drained_s, handed)
        report = {
            "jobs": self.cfg.jobs,
            "rate": RATE,
            "figures": {**f, "handoffs": handed},
            "fleet": pool.summary(),
            "kills_withheld": self.kills_withheld,
            "resends": trickle.resends,
            "gaps": trickle.gaps,
            "gap_s": round(trickle.gap_s, 2),
            "submit_s": round(trickle.submit_s, 2),
            "drained_s": drained_s,
            "wall_s": round(time.monotonic() - started, 1),
        }
        return Outcome(checks, report, self.applied)

    def _checks(
        self,
        trickle: Trickle,
        pool: WorkerPool,
        drained_s: float | None,
        h: dict[str, int],
    ) -> list[Check]:
        attempts = h["handed_attempts"] + h["claimed_attempts"]
        return [
            Check(
                "handoffs: every job acknowledged, drained (harness)",
                trickle.acked == self.cfg.jobs and trickle.error is None and drained_s is not None,
                f"{trickle.acked} of {self.cfg.jobs} in {trickle.submit_s:.1f} s "
                f"({trickle.resends} resent), drained at {drained_s} s, error {trickle.error}",
            ),
            Check(
                "handoffs: workers SIGKILLed and replaced, none exited on its own (harness)",
                pool.kills > 0 and not pool.unexpected,
                f"{pool.kills} SIGKILLs, {pool.spawns} worker starts, "
                f"{len(pool.unexpected)} unexpected exits",
            ),
            Check(
                "handoffs: attempts started at enqueue, handed to a parked slot",
                h["handed_attempts"] >= MIN_HANDED,
                f"{h['handed_attempts']} of {attempts} attempts handed off "
                f"({h['jobs_handed']} jobs; {h['handed_succeeded']} of them succeeded there, "
                f"{h['handed_rescued']} handed to a worker that died and were rescued)",
            ),
        ]


def text(out: Outcome) -> str:
    """The phase's report as printed."""
    r = out.report
    return "\n".join(
        [
            "handoffs figures (from verify.sql and verify_handoffs.sql):",
            *(
                f"  {name:<19} " + ", ".join(f"{k} {v}" for k, v in row.items())
                for name, row in r["figures"].items()
            ),
            f"  fleet            {r['fleet']['spawns']} worker starts, "
            f"{r['fleet']['sigkills']} SIGKILLs; submitted in {r['submit_s']} s "
            f"({r['gaps']} gaps for the queue to empty, {r['gap_s']} s), drained at "
            f"{r['drained_s']} s, phase {r['wall_s']} s",
            "handoffs checks:",
            *(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in out.checks),
        ]
    )
