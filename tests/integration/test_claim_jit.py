"""Migration 0015: the keyed claim never JIT-compiles its plan.

Right after a burst of completions the planner, costing the keyed claim's recursive
key scan from statistics taken on a smaller table, estimated it above
jit_above_cost, and every claim spent ~185 ms compiling a plan that read 2 buffers
(bench/scale.py, 200,000 jobs: 205 ms per claim against 0.7 ms near-empty; the claim
now calls the function only when a keyed job waits, so one waits here). Here
every plan is made eligible (``jit_above_cost = 0``) and auto_explain reports each
statement's plan, nested ones included: the outer claim compiles, the function's
statements do not.
"""

from __future__ import annotations

import psycopg
import pytest

from deadman.db.queries import QUERIES
from deadman.devdb import Cluster
from deadman.store import ClaimParams, claim_params


def test_the_keyed_claim_runs_without_jit_even_when_every_plan_qualifies(
    db_dsn: str, pg_cluster: Cluster | None
) -> None:
    notices: list[str] = []
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT pg_jit_available()").fetchone()
        if not (row and row[0]):
            # Debian's postgresql-15 ships its LLVM provider: the suite's own cluster
            # has JIT, so its absence there is a broken install, not a reason to skip.
            assert pg_cluster is None, "the suite's own cluster has no JIT provider"
            pytest.skip("the given test server has no JIT provider: nothing to turn off")
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_nested_statements = on",
            "auto_explain.log_level = notice",
            "jit = on",
            "jit_above_cost = 0",
        ):
            conn.execute(f"SET {setting}")
        # a keyed job waiting: the claim calls job_claim_keyed only then
        conn.execute("INSERT INTO deadman.jobs (type) VALUES ('noop')")
        conn.execute("INSERT INTO deadman.jobs (type, limit_key) VALUES ('noop', 'k1')")
        claimed = conn.execute(
            QUERIES["job_claim"], claim_params(ClaimParams("default", "w", 10, 10_000))
        ).fetchall()
        conn.rollback()
    assert len(claimed) == 2  # the keyed one (no limit row: unbounded) and the other
    keyed = [n for n in notices if "WITH RECURSIVE k" in n]
    outer = [n for n in notices if "WITH keyed AS" in n]
    assert keyed and outer, notices
    assert all("JIT:" in n for n in outer)  # the harness does see JIT when it happens
    assert not any("JIT:" in n for n in keyed)
