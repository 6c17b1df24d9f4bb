"""Operators under fire (``deadman chaos``'s ``operators`` scenario, in ``--all``).

What people do to a queue while it runs, done to a fleet whose workers are being
SIGKILLed and replaced, in a database of its own (retention here deletes finished
jobs after a second, which the other scenarios' exactly-once count cannot live with):

- jobs (``chaos-effect``, ``chaos-flaky``, the built-in ``fail``) and four-node
  workflows go in over HTTP, in three queues;
- one operator, one action at a time, as a person with the API would: list jobs in a
  state (``GET /jobs``), then cancel a queued, waiting, retrying or running one
  (``POST /jobs/{id}/cancel``), retry a dead or cancelled one (``POST /jobs/{id}/
  retry``), replay a queue's dead letters in bulk (the store call of ``deadman dlq
  replay``), cancel a workflow (the store call of ``POST /workflows/{id}/cancel``,
  which says which nodes the cancel took and in which state; the HTTP answer only
  shows the states afterwards), pause a queue and resume it;
- retention of one second for every finished state, run every second by a
  pruner of its own (the store calls of the rescuer's retention) besides the workers'
  rescuers, and also at the very moment of some bulk replays (the oldest dead letters,
  which a replay takes first, are the ones retention is deleting).

Every action is journalled with the database clock read just before the request
and just after the answer (``Ack``); at the end the journal goes into ``chaos.acks``
and ``verify_ops.sql`` judges the database against it. Deleted rows are kept by the
triggers of ``operators_instrument`` (ops.sql), so that a job retention took is
still accounted for.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from deadman.chaos.app import OPS
from deadman.chaos.checks import operators_checks
from deadman.chaos.faults import Applied, FaultPlan
from deadman.chaos.http import ApiServer
from deadman.chaos.kills import kill_on_ticks
from deadman.chaos.ops_config import QUEUES, RETENTION_MS, OperatorsConfig
from deadman.chaos.ops_journal import Journal
from deadman.chaos.ops_operator import Operator
from deadman.chaos.probe import Db
from deadman.chaos.verify import Check
from deadman.chaos.verify_ops import (
    Submitted,
    acks_load,
    examples,
    operator_checks,
    operator_figures,
)
from deadman.chaos.workers import WorkerPool


@dataclass
class Outcome:
    """The phase's checks (the database's and the harness's), its report, and the
    faults it applied."""

    checks: list[Check]
    report: dict[str, Any]
    applied: list[Applied] = field(default_factory=list)


class OwnDatabasePhase:
    """What a scenario run in a database of its own holds while it runs (the
    operators and handoffs scenarios): where, the run's clock, the faults applied."""

    def __init__(self, dsn: str, log_dir: Path, clock: Callable[[], float]) -> None:
        self.dsn = dsn
        self.log_dir = log_dir
        self.clock = clock
        self.db = Db(dsn)
        self.applied: list[Applied] = []
        self.kills_withheld = 0


class OperatorsPhase(OwnDatabasePhase):
    """The whole scenario on one (empty, migrated) database: instrument it, start an
    API server and a fleet, submit and act while kills go on, drain, verify."""

    def __init__(
        self, cfg: OperatorsConfig, dsn: str, log_dir: Path, clock: Callable[[], float]
    ) -> None:
        super().__init__(dsn, log_dir, clock)
        self.cfg = cfg
        self.journal = Journal(clock)

    def run(self) -> Outcome:
        cfg = self.cfg
        started = time.monotonic()
        deadline = started + cfg.opts.timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(OPS["operators_instrument"])
        env = {
            **cfg.opts.worker_env(),
            "DEADMAN_QUEUES": ",".join(QUEUES),
            "DEADMAN_RETENTION_SUCCEEDED_S": str(RETENTION_MS / 1000),
            "DEADMAN_RETENTION_FAILED_S": str(RETENTION_MS / 1000),
        }
        api = ApiServer(self.dsn, self.log_dir, depth_cap=None, name="operators-api")
        pool = WorkerPool(self.dsn, cfg.opts.workers, env, self.log_dir / "operators")
        plan = FaultPlan(cfg.opts.seed, cfg.opts.workers, cfg.opts.kill_rate, True, False)
        op = Operator(cfg, self.dsn, api, self.journal)
        drained_s: float | None = None
        api_exit: int | None = None
        try:
            api.start()
            pool.start_all()
            op.start()
            applied, self.kills_withheld = kill_on_ticks(
                pool,
                self.db,
                plan,
                cfg.opts.kill_interval,
                self.clock,
                lambda wait_s: not op.operated.wait(wait_s),
                deadline,
            )
            self.applied += applied
            drained_s = drain(self.db, pool, deadline, started)
        finally:
            op.stop.set()
            pool.stop_all()
            op.join(timeout=30)
            api_exit = api.exit_code()
            api.stop()
        acks_load(self.dsn, self.journal.acks)
        sub = op.submission
        submitted = Submitted(cfg.prefix, sub.acked_jobs, f"{cfg.prefix}wf-", sub.acked_workflows)
        figures = operator_figures(self.dsn, submitted)
        checks = operator_checks(figures) + operators_checks(cfg, op, pool, drained_s, api_exit)
        kinds = Counter(
            f"{a.kind}{'' if a.acked else ' (refused or unanswered)'}" for a in self.journal.acks
        )
        report = {
            "jobs": cfg.jobs,
            "workflows": cfg.workflows,
            "figures": figures,
            "examples": {k: v for k, v in examples(self.dsn).items() if v},
            "actions": dict(sorted(self.journal.statuses.items())),
            "journal": dict(sorted(kinds.items())),
            "pruned_by_scenario": op.pruned,
            "errors": self.journal.errors[:20],
            "fleet": pool.summary(),
            "kills_withheld": self.kills_withheld,
            "submit_s": round(sub.submit_s, 2),
            "drained_s": drained_s,
            "wall_s": round(time.monotonic() - started, 1),
        }
        return Outcome(checks, report, self.applied)


def drain(db: Db, pool: WorkerPool, deadline: float, started: float) -> float | None:
    """Wait until no job and no workflow is unfinished (or the deadline, monotonic);
    seconds since ``started``. The operators and handoffs scenarios end on it."""
    while time.monotonic() < deadline:
        pool.reap()
        left = db.row("operators_unfinished")
        if left is not None and int(left["jobs"]) == 0 and int(left["workflows"]) == 0:
            return round(time.monotonic() - started, 1)
        time.sleep(0.2)
    return None
