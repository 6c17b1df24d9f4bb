"""Generic plans for the worker's own statements: a DSN whose sessions plan each
prepared statement once.

Postgres plans a prepared statement afresh for its first five executions and keeps
doing so whenever the generic plan's estimated cost looks worse than the custom
plans' average, which for the claim (a CTE over two functions) it always did: every
claim was planned again, ~0.5 ms of server CPU per statement on this machine, as much
as executing it. The worker's statements are written to go through their indexes
whatever the parameters (DECISIONS 25 and 45), so their generic plan is the plan,
provided it is made while Postgres knows the table is not empty: a generic plan made
when the jobs table had been analyzed empty (a new deployment, or every job pruned)
scanned the whole table and sorted it, and kept doing so as the table filled, until
the next ANALYZE replaced it. Hence ``enable_seqscan=off`` too (DECISIONS 60): every
worker statement has its index, and a table without one is still scanned.

Set as a startup option (``-c plan_cache_mode=force_generic_plan``) rather than a
``SET``: no session state to leak through a transaction-mode PgBouncer, which drops
or refuses startup options (see README, PgBouncer); there the statements are not
prepared at all (``DEADMAN_PREPARE=off``), and the option is not sent: the plan
cache mode only governs prepared statements, and PgBouncer 1.18 (Debian bookworm's)
refuses every connection that carries it ("unsupported startup parameter: options").
"""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from deadman.db.pool import prepare_threshold

#: and no JIT: a worker statement is short by design, and an estimate inflated by a
#: stale ANALYZE once made every claim compile its plan with LLVM (185 ms of a 205 ms
#: claim after 200,000 completions: DECISIONS 47, migration 0015)
#: and no sequential scan where an index serves (above)
GENERIC = "-c plan_cache_mode=force_generic_plan -c jit=off -c enable_seqscan=off"


def generic_plans(dsn: str, prepare: bool | None = None) -> str:
    """``dsn`` with the generic-plan option added to any ``options`` it already has;
    ``dsn`` as it is when statements are not prepared (``prepare``, None:
    DEADMAN_PREPARE)."""
    if prepare_threshold(prepare) is None:
        return dsn
    params = conninfo_to_dict(dsn)
    current = str(params.get("options") or "").strip()
    if GENERIC in current:
        return dsn
    return make_conninfo(dsn, options=f"{current} {GENERIC}".strip())
