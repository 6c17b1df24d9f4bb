"""``deadman chaos``: submit the jobs, run a fleet of real worker processes, inject
faults while the load runs, stop injecting, let the fleet drain, verify, and print a
verdict. Exit 0 only if every check passes.

The run goes in phases; this module runs them in order and gives the verdict, the
modules named in brackets do the work:

1. **Database** (``databases``): a private throwaway cluster (the Postgres restart
   scenario needs one it controls), or ``--database-url`` (an existing, empty,
   Deadman database).
2. **Load** (``load``, ``submit``, ``http``): ``--workers`` worker processes start; a
   submitter thread sends the jobs through ``deadman serve`` (``--submit http``, the
   default: batches of 1000, a queue depth cap, seeded submission faults) or the
   Python client (COPY batches), every job with the idempotency key
   ``chaos-<seed>-<n>``.
3. **Faults** (``load``, ``kills``, ``scenarios``): every ``--kill-interval`` a tick
   applies the seeded plan (SIGKILLs, connection kills). A kill is withheld from a
   worker that has not registered yet (it holds no lease: killing it proves nothing)
   and from a slot an episode uses. The episodes (zombie, Postgres restarts,
   partition) run one after another on their own thread; kills pause while Postgres
   restarts, so that every slot holds a running worker when it goes down. Injection
   stops once the episodes are done and 90% of the jobs have succeeded.
4. **Drain** (``load``): wait until nothing is outstanding (or ``--timeout``), stop
   the workers.
5. **Verify** (``verify``, ``checks``, ``report``): the SQL of ``verify.sql`` plus
   what the harness saw; with the ``limits`` scenario (``limits``: a seeded share of
   the jobs carry a limit key, the limits set before the load through the submission
   path) also ``verify_limits.sql``'s checks over the attempt history; report + JSON.
6. **Operators under fire** (``operators``, the ``operators`` scenario, in ``--all``):
   afterwards, in a database of its own (its one-second retention deletes the jobs
   the exactly-once count above needs), with a fleet and an API server of its own,
   scaled to a tenth of ``--jobs`` unless it runs alone; verified by
   ``verify_ops.sql`` against the journal of what the operator was told.
7. **Handoffs under fire** (``handoffs``, the ``handoffs`` scenario, in ``--all``):
   then, in a database of its own, jobs enqueued one at a time to an idle fleet, so
   that most are handed off at enqueue (DECISIONS 83), while workers are SIGKILLed;
   verified by ``verify.sql`` and ``verify_handoffs.sql``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deadman.chaos import report
from deadman.chaos.checks import load_checks
from deadman.chaos.databases import Databases
from deadman.chaos.faults import Applied
from deadman.chaos.handoffs import RATE, HandoffsConfig, HandoffsPhase
from deadman.chaos.handoffs import VERIFY_SQL as HANDOFFS_SQL
from deadman.chaos.handoffs import text as handoffs_text
from deadman.chaos.limits import KEYS
from deadman.chaos.load import LoadPhase, RunClock
from deadman.chaos.operators import OperatorsPhase, Outcome
from deadman.chaos.ops_config import RETENTION_MS, OperatorsConfig, scaled_jobs
from deadman.chaos.options import Options
from deadman.chaos.verify import database_checks, figures
from deadman.chaos.verify_limits import limit_checks, limit_figures
from deadman.chaos.verify_ops import sql_text as verify_ops_sql
from deadman.errors import DeadmanError


class Run:
    """One ``deadman chaos``: its phases in order, the verdict over all of them, and
    the clean-up whatever happens."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.applied: list[Applied] = []
        self.dbs = Databases(opts.database_url, opts.keep)
        self.clock = RunClock()
        self.log_dir = Path()

    def execute(self) -> int:
        """Run, verify, report; the cluster and namespace go away whatever happens.
        The operators scenario runs after the others, in a database of its own."""
        self.log_dir = Path(tempfile.mkdtemp(prefix="deadman-chaos-logs-"))
        try:
            result: dict[str, Any] | None = None
            if self.opts.scenarios - {"operators", "handoffs"}:
                result = self._load(self.dbs.load())
            if "operators" in self.opts.scenarios:
                result = self._operators(result)
            if "handoffs" in self.opts.scenarios:
                result = self._handoffs(result)
            assert result is not None
            return self._finish(result)
        finally:
            self.dbs.destroy()

    def _load(self, dsn: str) -> dict[str, Any]:
        """The load phase, then its verdict: verify.sql's checks and the harness's."""
        o = self.opts
        load = LoadPhase(o, dsn, self.dbs.cluster, self.log_dir, self.clock, self.applied)
        print(report.header(o, self.dbs.cluster is not None, self.log_dir), flush=True)
        try:
            load.run()
        finally:
            load.teardown()
        # Runs that kill things mid-handler must show duplicate executions; a Postgres
        # restart alone may or may not catch a handler between its two writes, nor may a
        # cut-off network (partition, hosts): the leases it cuts may be of jobs claimed
        # an instant before, whose handlers had not recorded their invocation yet (a
        # fresh-clone suite saw 16 leases cut, 16 rescued, no duplicate). Their own
        # checks prove the cut hit leases (rescued, late writes refused).
        faults = bool(o.scenarios & {"kill", "zombie", "conn-kill"})
        acked = load.submitter.acked
        f = figures(dsn, load.submitter.prefix, acked)
        checks = database_checks(f, acked, faults) + load_checks(load, f)
        limits = None
        if "limits" in o.scenarios:
            limits = limit_figures(dsn, KEYS)
            checks += limit_checks(limits, load.submitter.keyed)
        result = report.load_json(load, f, checks, self.clock(), dsn, limits)
        print(report.load_text(result, self.dbs.cluster))
        return result

    def _operators(self, result: dict[str, Any] | None) -> dict[str, Any]:
        """Run the operators scenario; its checks join the report's."""
        o = self.opts
        alone = result is None
        result, dsn = self._own_database("operators", result, self.dbs.operators)
        if dsn is None:
            return result
        began = time.monotonic()
        cfg = OperatorsConfig(o, scaled_jobs(o.jobs, alone))
        print(
            f"\noperators under fire: {cfg.jobs} jobs and {cfg.workflows} workflows, "
            f"{o.workers} workers, kill-rate {o.kill_rate} per {o.kill_interval} s, "
            f"retention {RETENTION_MS} ms",
            flush=True,
        )
        out = OperatorsPhase(cfg, dsn, self.log_dir, lambda: time.monotonic() - began).run()
        return self._joined("operators", result, out, verify_ops_sql(), report.operators_text(out))

    def _handoffs(self, result: dict[str, Any] | None) -> dict[str, Any]:
        """Run the handoffs scenario; its checks join the report's."""
        o = self.opts
        result, dsn = self._own_database("handoffs", result, self.dbs.handoffs)
        if dsn is None:
            return result
        began = time.monotonic()
        cfg = HandoffsConfig.of(o)
        print(
            f"\nhandoffs under fire: {cfg.jobs} jobs enqueued one by one at {RATE:g}/s, "
            f"{o.workers} workers, kill-rate {o.kill_rate} per {o.kill_interval} s",
            flush=True,
        )
        out = HandoffsPhase(cfg, dsn, self.log_dir, lambda: time.monotonic() - began).run()
        return self._joined("handoffs", result, out, HANDOFFS_SQL, handoffs_text(out))

    def _own_database(
        self,
        name: str,
        result: dict[str, Any] | None,
        database: Callable[[bool], str | None],
    ) -> tuple[dict[str, Any], str | None]:
        """The result so far (a fresh one when this scenario runs alone) and the
        scenario's own database; None (and the result says why) when it cannot have
        one (with --database-url it only runs alone)."""
        alone = result is None
        if result is None:
            o = self.opts
            result = {"options": {"seed": o.seed, "scenarios": sorted(o.scenarios)}, "checks": []}
            self.clock.restart()
        dsn = database(alone)
        if dsn is None:
            result[name] = {
                "skipped": f"needs the private cluster (with --database-url the {name} "
                "scenario runs alone: a database per run)"
            }
            print(f"{name}: {result[name]['skipped']}")
        return result, dsn

    def _joined(
        self, name: str, result: dict[str, Any], out: Outcome, sql: str, text: str
    ) -> dict[str, Any]:
        """A scenario's outcome joined to the result: its report, faults and checks."""
        self.applied += out.applied
        result[name] = {**out.report, "verifier_sql": sql}
        result["checks"] = result["checks"] + [c.to_json() for c in out.checks]
        print(text)
        return result

    def _finish(self, result: dict[str, Any]) -> int:
        """The verdict over every phase; the JSON report; the logs kept or removed."""
        o = self.opts
        passed = all(c["passed"] for c in result["checks"])
        result["verdict"] = "PASS" if passed else "FAIL"
        if "operators" in result or "handoffs" in result:
            n_ok = sum(1 for c in result["checks"] if c["passed"])
            print(
                f"verdict (every scenario): {result['verdict']} ({n_ok}/"
                f"{len(result['checks'])} checks passed) in {round(self.clock(), 1)} s"
            )
        if o.report is not None:
            o.report.parent.mkdir(parents=True, exist_ok=True)
            o.report.write_text(json.dumps(result, indent=2, default=str) + "\n")
            print(f"report written to {o.report}")
        if o.keep and self.dbs.cluster is not None and "operators" in result:
            print(f"operators database kept: psql '{self.dbs.cluster.dsn('chaos_operators')}'")
        if passed and not o.keep:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        else:
            print(f"worker logs kept in {self.log_dir}")
        return 0 if passed else 1


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
