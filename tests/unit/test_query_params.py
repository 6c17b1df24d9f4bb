"""Every call that runs a named query passes exactly the query's placeholders.

psycopg raises when a placeholder has no value, but a key the query does not use is
ignored in silence: a renamed placeholder then leaves its value behind and the
query's own default (or NULL) goes to Postgres. So this test reads the package's
source (ast), finds every ``self._all("name", ...)`` / ``_once`` / ``_tuples``, every plan step
``Query("name", ...)`` (deadman.store.plan) and every ``execute(QUERIES["name"], ...)``,
and compares the keys passed with the
``%(placeholders)s`` of the query:
- a dict literal: its keys;
- a parameter builder (``claim_params(...)``, ``NewJob.params(...)``, ...): the keys
  it builds for a sample input, run here;
- anything else (a variable): listed in ``UNCHECKED`` with where it comes from, so a
  new unchecked call fails until someone looks at it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deadman.db.queries import QUERIES, parse
from deadman.model import AttemptOutcome, JobState
from deadman.store import (
    BatchInserted,
    ClaimParams,
    Finish,
    HeartbeatParams,
    NewJob,
    NewWorkflow,
    PruneParams,
    RescueParams,
    batch_edges,
    batch_params,
    claim_params,
    finish_params,
    heartbeat_params,
    maintenance,
    succeed_params,
    workflow_params,
)
from deadman.store.leases import quarantine_claim_params, refill_params
from deadman.store.limits import LimitParams, limit_params, list_params
from deadman.store.schedules import ScheduleParams, schedule_params
from deadman.store.submissions import grouped_params

PACKAGE = Path(__file__).resolve().parents[2] / "deadman"


#: packages with a query file of their own, read instead of deadman/db/queries.sql
#: (chaos/ is skipped: the harness also runs its own ops.sql by other means)
OWN_QUERIES = {"shards/": parse((PACKAGE / "shards" / "queries.sql").read_text("utf-8"))}


def placeholders(name: str, rel: str = "") -> set[str]:
    queries = next((q for prefix, q in OWN_QUERIES.items() if rel.startswith(prefix)), QUERIES)
    return set(re.findall(r"%\(([a-z_]+)\)s", queries[name]))


#: builders of parameters, by the name they are called with, run on a sample
BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    "claim_params": lambda: claim_params(ClaimParams("q", "w", 1, 1000)),
    "quarantine_claim_params": lambda: quarantine_claim_params(ClaimParams("q", "w", 1, 1000)),
    "refill_params": lambda: refill_params(
        [Finish(1, 1, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)], ClaimParams("q", "w", 1, 1000)
    ),
    "heartbeat_params": lambda: heartbeat_params(
        HeartbeatParams("w", "h", 1, ["q"], 1, 1000, [(1, 1)])
    ),
    "finish_params": lambda: finish_params(
        [Finish(1, 1, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)]
    ),
    "succeed_params": lambda: succeed_params(
        Finish(1, 1, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED), 100
    ),
    "params": lambda: NewJob("t", run_at=datetime.now(UTC)).params(5),
    "workflow_params": lambda: workflow_params(
        NewWorkflow("w", nodes=(("a", NewJob("t")),), edges=()), 5
    ),
    "batch_params": lambda: batch_params([NewJob("t")], 5, [(0, None)]),
    "batch_edges": lambda: batch_edges([], BatchInserted(jobs=(), created=())),
    "_rescue_args": lambda: maintenance._rescue_args(RescueParams(5)),
    "_prune_args": lambda: maintenance._prune_args(PruneParams(1, 1)),
    "_workflow_prune_args": lambda: maintenance._workflow_prune_args(PruneParams(1, 1)),
    "limit_params": lambda: limit_params(LimitParams("k", 5, None, None)),
    "list_params": list_params,
    "schedule_params": lambda: schedule_params(
        ScheduleParams("s", None, 1000, "UTC", {"type": "t"}, "latest", datetime.now(UTC))
    ),
}

#: calls whose parameters are a variable, and where that variable is built
UNCHECKED = {
    ("store/async_base.py", "<name>"): "_once(name, params): the caller's literal or builder",
    ("store/async_store.py", "job_insert_many_returning"): "params = batch_params(...)",
    ("store/async_store.py", "job_list"): "params: a dict literal built just above",
    ("store/async_store.py", "job_retry_dead_many"): "params: a dict literal in the loop",
    ("store/maintenance.py", "<name>"): "MaintenanceTx._all(name, params): as AsyncBase",
    ("store/plan.py", "<name>"): "the runners: step.params, each a Query(...) checked here",
    ("store/submissions.py", "job_insert_grouped"): "params = grouped_params(...)",
}


#: the store's methods that run a named query given as their first argument
RUNNERS = {"_all", "_once", "_tuples", "_once_tuples"}


def _args(call: ast.Call) -> list[ast.expr]:
    """The call's (name, params) arguments."""
    return call.args


def _query_name(call: ast.Call) -> str | None:
    args = _args(call)
    if not args:
        return None
    first = args[0]
    func = call.func
    is_step = isinstance(func, ast.Name) and func.id == "Query"
    if (
        (is_step or (isinstance(func, ast.Attribute) and func.attr in RUNNERS))
        and isinstance(first, ast.Constant)
        and isinstance(first.value, str)
    ):
        return first.value
    if isinstance(first, ast.Subscript) and getattr(first.value, "id", None) == "QUERIES":
        key = first.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return "<name>"
    if isinstance(func, ast.Attribute) and func.attr in RUNNERS:
        return "<name>"
    return None


def _passed(call: ast.Call) -> set[str] | str:
    """The keys the call passes, or a description of what could not be read."""
    args = _args(call)
    if len(args) < 2:
        return set()
    return _keys_of(args[1])


def _keys_of(arg: ast.expr) -> set[str] | str:
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.BitOr):  # a | b: both
        left, right = _keys_of(arg.left), _keys_of(arg.right)
        if isinstance(left, str) or isinstance(right, str):
            return f"union of {left!r} and {right!r}"
        return left | right
    if isinstance(arg, ast.Dict):
        keys = {k.value for k in arg.keys if isinstance(k, ast.Constant)}
        if len(keys) == len(arg.keys):
            return {str(k) for k in keys}
        return "dict with computed keys"
    if isinstance(arg, ast.Call):
        fname = (
            arg.func.attr if isinstance(arg.func, ast.Attribute) else getattr(arg.func, "id", "")
        )
        if fname in BUILDERS:
            return set(BUILDERS[fname]())
        return f"call to {fname}"
    return "variable"


def _calls() -> list[tuple[str, int, str, set[str] | str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("chaos/"):
            continue  # the harness runs its own ops.sql, not QUERIES
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _query_name(node)) is not None:
                found.append((rel, node.lineno, name, _passed(node)))
    return found


def test_every_call_passes_exactly_the_placeholders() -> None:
    calls = _calls()
    assert len(calls) > 50, "the scan found too few calls: the patterns went stale"
    wrong, unchecked = [], set()
    for rel, line, name, passed in calls:
        if isinstance(passed, str) or name == "<name>":
            unchecked.add((rel, name))
            continue
        if passed != placeholders(name, rel):
            takes = sorted(placeholders(name, rel))
            wrong.append(f"{rel}:{line} {name}: passes {sorted(passed)}, takes {takes}")
    assert wrong == []
    assert unchecked == set(UNCHECKED), "a call whose parameters this test cannot read"


def test_the_builders_match_their_queries() -> None:
    """The calls above that pass a variable get it from these builders."""
    assert set(BUILDERS["batch_params"]()) == placeholders("job_insert_many_returning")
    assert set(BUILDERS["params"]()) == placeholders("job_insert")
    assert set(BUILDERS["workflow_params"]()) == placeholders("workflow_insert")
    one = NewJob(type="t", queue="q")
    assert set(grouped_params([one], 5)) == placeholders("job_insert_grouped")


def test_a_wrong_key_is_caught() -> None:
    """The check itself can fail: a key too many is not the query's placeholders."""
    assert {"id", "extra"} != placeholders("job_get")
    assert {"id"} == placeholders("job_get")
