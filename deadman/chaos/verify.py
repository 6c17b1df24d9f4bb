"""The verifier: run the named queries of ``verify.sql`` and judge them.

The figures come only from the database, through the SQL in ``verify.sql`` (printed
in the report so anyone can re-run it in psql). What the harness itself observed
(faults applied, workers that died on their own, peak memory) is judged alongside,
as separate checks, and says so in its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from deadman.db.queries import parse

VERIFY_SQL = resources.files("deadman.chaos").joinpath("verify.sql").read_text(encoding="utf-8")
QUERIES: dict[str, LiteralString] = parse(VERIFY_SQL)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


def figures(dsn: str, prefix: str, acked: int) -> dict[str, dict[str, int]]:
    """Every verifier query's single row, by query name."""
    return run_queries(dsn, QUERIES, {"prefix": prefix, "acked": acked})


def run_queries(
    dsn: str, queries: dict[str, LiteralString], params: dict[str, Any]
) -> dict[str, dict[str, int]]:
    """Run named queries of one row of counts each; {query name: {column: count}}."""
    out: dict[str, dict[str, int]] = {}
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        for name, query in queries.items():
            row = conn.execute(query, params).fetchone()
            assert row is not None, f"verifier query {name} returned no row"
            out[name] = {k: int(v or 0) for k, v in row.items()}
    return out


def database_checks(f: dict[str, dict[str, int]], acked: int, faults: bool) -> list[Check]:
    """The checks the issue lists, from the database's figures alone."""
    sub, st, eff = f["submissions"], f["states"], f["effects"]
    inv, att = f["invocations"], f["attempts"]
    checks = [
        Check(
            "acknowledged submissions = jobs, one job per key",
            sub["jobs"] == acked
            and sub["acknowledged_missing"] == 0
            and sub["distinct_keys"] == sub["jobs"]
            and sub["jobs_without_key"] == 0,
            f"acknowledged {acked}, jobs {sub['jobs']}, distinct keys {sub['distinct_keys']}, "
            f"acknowledged but missing {sub['acknowledged_missing']}",
        ),
        Check(
            "every job succeeded, none outstanding",
            st["succeeded"] == sub["jobs"] and st["outstanding"] == 0,
            f"succeeded {st['succeeded']}, outstanding {st['outstanding']}, "
            f"dead {st['dead']}, cancelled {st['cancelled']}",
        ),
        Check(
            "effects: exactly one per job, none missing, none doubled",
            eff["exactly_once"] == sub["jobs"]
            and eff["missing"] == 0
            and eff["doubled_jobs"] == 0
            and eff["orphaned"] == 0
            and eff["effect_rows"] == sub["jobs"],
            f"rows {eff['effect_rows']} for {sub['jobs']} jobs: "
            f"exactly once {eff['exactly_once']}, "
            f"missing {eff['missing']}, doubled {eff['doubled_jobs']} "
            f"(+{eff['extra_rows']} extra rows), orphaned {eff['orphaned']}",
        ),
        Check(
            "effects written under the succeeding attempt's lease",
            f["effects_fenced"]["outside_fence"] == 0 and att["succeeded_twice"] == 0,
            f"effects outside the fence {f['effects_fenced']['outside_fence']}, "
            f"jobs with two succeeded attempts {att['succeeded_twice']}",
        ),
        Check(
            "every succeeded job's handler ran",
            inv["succeeded_never_invoked"] == 0,
            f"succeeded without an invocation record {inv['succeeded_never_invoked']}",
        ),
    ]
    if faults:
        checks.append(
            Check(
                "duplicate executions observed (else the faults hit nothing)",
                inv["jobs_run_more_than_once"] > 0,
                f"invocations {inv['invocations']} for {inv['jobs_invoked']} jobs; "
                f"{inv['jobs_run_more_than_once']} jobs ran more than once "
                f"(+{inv['duplicate_invocations']} invocations, at most "
                f"{inv['most_runs_of_one_job']} runs of one job)",
            )
        )
    return checks


def sql_text() -> str:
    """verify.sql as shipped, for the report."""
    return VERIFY_SQL
