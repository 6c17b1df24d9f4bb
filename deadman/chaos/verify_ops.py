"""The operators scenario's verifier: the journal of acknowledged operator actions
goes into ``chaos.acks``, then the named queries of ``verify_ops.sql`` are run and
judged. Each check names the rule it holds the database to; tests/chaos/
test_verify_ops.py feeds each one a database that breaks its rule.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from datetime import datetime
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from deadman.chaos.app import OPS
from deadman.chaos.verify import Check, run_queries
from deadman.db.queries import parse

VERIFY_OPS_SQL = (
    resources.files("deadman.chaos").joinpath("verify_ops.sql").read_text(encoding="utf-8")
)
_ALL = parse(VERIFY_OPS_SQL)
#: One row of counts each: the figures the checks judge.
QUERIES: dict[str, LiteralString] = {k: v for k, v in _ALL.items() if k.startswith("ops_")}
#: Rows: what a failing check found, for the report.
EXAMPLES: dict[str, LiteralString] = {k: v for k, v in _ALL.items() if k.startswith("example_")}
#: Views over chaos.acks that the queries above share (CREATE OR REPLACE: made anew
#: at every load).
VIEWS: dict[str, LiteralString] = {k: v for k, v in _ALL.items() if k.startswith("view_")}


@dataclass(frozen=True)
class Ack:
    """One operator action as the harness saw it (a row of chaos.acks).

    ``kind``: cancel, retry, pause or resume; ``acked``: whether the answer came
    (cancels and pauses are only journalled when it did); ``via``: http, store-bulk
    (``deadman dlq replay``'s store call) or store-workflow (the workflow cancel);
    ``state``: the job's state in the answer (a cancel's 'running' or 'cancelled');
    ``token``: the lease token a cancel answered 202 named; ``db_lo``/``db_hi``: the
    database clock just before the request and just after the answer; ``token_lo``:
    the last lease token handed out, read with ``db_lo``. The fields are
    chaos.acks's columns, in order (operators_acks_copy)."""

    seq: int
    kind: str
    acked: bool
    via: str
    job_id: int | None
    queue: str | None
    state: str | None
    token: int | None
    db_lo: datetime
    token_lo: int
    db_hi: datetime | None
    at_s: float


def acks_load(dsn: str, acks: list[Ack]) -> None:
    """Write the journal into chaos.acks (installed by operators_instrument), and make
    the verifier's views over it."""
    with (
        psycopg.connect(dsn) as conn,
        conn.cursor() as cur,
        cur.copy(OPS["operators_acks_copy"]) as copy,
    ):
        for ack in acks:
            copy.write_row(astuple(ack))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for view in VIEWS.values():
            conn.execute(view)
        conn.execute(OPS["operators_analyze"])


@dataclass(frozen=True)
class Submitted:
    """What the scenario's submissions were acknowledged for: keys <prefix><n>."""

    prefix: str
    acked: int
    wf_prefix: str
    wf_acked: int


def operator_figures(dsn: str, s: Submitted) -> dict[str, dict[str, int]]:
    params: dict[str, Any] = {
        "prefix": s.prefix,
        "acked": s.acked,
        "wf_prefix": s.wf_prefix,
        "wf_acked": s.wf_acked,
    }
    return run_queries(dsn, QUERIES, params)


def examples(dsn: str) -> dict[str, list[dict[str, Any]]]:
    """Up to ten rows per example query (the violations behind a failed check)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return {
            name: [dict(r) for r in conn.execute(query).fetchall()]
            for name, query in EXAMPLES.items()
        }


def operator_checks(f: dict[str, dict[str, int]]) -> list[Check]:
    """The rules of operators under fire, from the database's figures alone."""
    sub, ret, rt = f["ops_submissions"], f["ops_retention"], f["ops_retries"]
    fence, out, fin = f["ops_cancel_fence"], f["ops_cancel_outcome"], f["ops_final"]
    paused, eff = f["ops_paused"], f["ops_effects"]
    return [
        Check(
            "operators: every acknowledged submission is a job, or was pruned finished",
            sub["missing"] == 0 and sub["workflows_missing"] == 0,
            f"{sub['jobs']} jobs ({sub['pruned']} pruned), missing {sub['missing']}, "
            f"workflows missing {sub['workflows_missing']}, keys reused after a prune "
            f"{sub['keys_reused']}",
        ),
        Check(
            "operators: retention deleted only finished jobs and workflows",
            ret["jobs_deleted_unfinished"] == 0 and ret["workflows_deleted_running"] == 0,
            f"jobs deleted unfinished {ret['jobs_deleted_unfinished']} (finished deleted: "
            f"{ret['succeeded_deleted']} succeeded, {ret['failed_deleted']} dead/cancelled), "
            f"workflows deleted running {ret['workflows_deleted_running']} of "
            f"{ret['workflows_deleted']}",
        ),
        Check(
            "operators: no job a retry/replay acknowledged was lost",
            rt["acknowledged"] > 0 and rt["lost"] == 0,
            f"{rt['acknowledged']} retries acknowledged for {rt['jobs']} jobs "
            f"({rt['by_bulk_replay']} by bulk replay, {rt['pruned_later']} pruned later); "
            f"lost {rt['lost']} ({rt['jobs_lost']} jobs)",
        ),
        Check(
            "operators: no attempt started after its cancel was acknowledged",
            fence["acknowledged"] > 0 and fence["attempts_after_cancel"] == 0,
            f"{fence['acknowledged']} cancels acknowledged ({fence['of_running_with_token']} "
            f"of running jobs, {fence['by_workflow_cancel']} by workflow cancel); attempts "
            f"after the cancel {fence['attempts_after_cancel']} ({fence['jobs']} jobs)",
        ),
        Check(
            "operators: a cancelled job ends cancelled (or its in-flight attempt won)",
            out["not_honoured"] == 0,
            f"{out['cancelled_last']} jobs last acted on by a cancel: "
            f"{out['ended_cancelled']} cancelled, {out['in_flight_attempt_won']} succeeded "
            f"in flight, not honoured {out['not_honoured']} ({out['vanished']} vanished)",
        ),
        Check(
            "operators: no attempt started in a paused queue",
            paused["pauses"] > 0 and paused["attempts_while_paused"] == 0,
            f"{paused['pauses']} pauses acknowledged; attempts started while paused "
            f"{paused['attempts_while_paused']}",
        ),
        Check(
            "operators: every job and workflow ended final, workflows agree with nodes",
            fin["jobs_unfinished"] == 0
            and fin["workflows_unfinished"] == 0
            and fin["workflows_stuck"] == 0
            and fin["workflows_nodes_missing"] == 0
            and fin["workflows_counter_wrong"] == 0
            and fin["workflows_verdict_wrong"] == 0,
            f"jobs unfinished {fin['jobs_unfinished']} (ended: {fin['succeeded']} succeeded, "
            f"{fin['dead']} dead, {fin['cancelled']} cancelled); {fin['workflows']} "
            f"workflows: unfinished {fin['workflows_unfinished']} (all nodes final "
            f"{fin['workflows_stuck']}), nodes missing {fin['workflows_nodes_missing']}, "
            f"counter wrong {fin['workflows_counter_wrong']}, verdict wrong "
            f"{fin['workflows_verdict_wrong']} ({fin['workflows_failed']} failed, "
            f"{fin['workflows_cancelled']} cancelled)",
        ),
        Check(
            "operators: at most one effect per job, each under a succeeded attempt's lease",
            eff["doubled_jobs"] == 0 and eff["outside_fence"] == 0,
            f"{eff['effects']} effects: doubled jobs {eff['doubled_jobs']}, outside the "
            f"fence {eff['outside_fence']}; {eff['attempts']} attempts, "
            f"{eff['rescues']} rescues",
        ),
    ]


def sql_text() -> str:
    return VERIFY_OPS_SQL
