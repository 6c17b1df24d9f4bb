"""The limits scenario's verifier: the named queries of ``verify_limits.sql``, run over
the attempt history, and judged against the limits the harness set (never against
what the database says its limits are, nor against its own counters of them).

Three checks: no key's attempts overlapped past its concurrency; no window of a
key's rate held more starts than its count; every keyed job acknowledged is stored
with its key and succeeded, and every key ran. Whether a limit was also *reached*
is a figure, not a check: the recorded intervals are a little shorter than the
slots were held (verify_limits.sql says why), and a slow machine may never fill a
window, so nothing guarantees a peak equal to the limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from deadman.chaos.limits import KeyLimit
from deadman.chaos.verify import Check
from deadman.db.queries import parse

VERIFY_LIMITS_SQL = (
    resources.files("deadman.chaos").joinpath("verify_limits.sql").read_text(encoding="utf-8")
)
LIMIT_SQL: dict[str, LiteralString] = parse(VERIFY_LIMITS_SQL)

CONCURRENCY = "limits: no key's attempts overlapped past its concurrency (attempt history)"
RATE = "limits: no window of a key's rate held more starts than its count (attempt history)"
RAN = "limits: every keyed job acknowledged is stored with its key and succeeded"

#: What a figure row shows in the report, in this order.
SHOWN = (
    "jobs",
    "succeeded",
    "attempts",
    "rescues",
    "jobs_run_more_than_once",
    "duplicate_invocations",
    "peak_running",
    "most_starts_in_window",
)


def peaks_params(keys: Sequence[KeyLimit]) -> dict[str, Any]:
    """limit_peaks's parameters: the limits set, one array element per key."""
    return {
        "keys": [k.key for k in keys],
        "concurrency": [k.concurrency for k in keys],
        "rate_count": [None if k.rate is None else k.rate[0] for k in keys],
        "rate_per_ms": [None if k.rate is None else k.rate[1] for k in keys],
    }


def jobs_params(keys: Sequence[KeyLimit]) -> dict[str, Any]:
    """limit_jobs's parameters."""
    return {"keys": [k.key for k in keys]}


def limit_figures(dsn: str, keys: Sequence[KeyLimit]) -> dict[str, dict[str, Any]]:
    """By key: its limit, its peaks (limit_peaks) and its jobs (limit_jobs); and, for a
    key whose peak passed its concurrency, the attempts open at that peak."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        peaks = conn.execute(LIMIT_SQL["limit_peaks"], peaks_params(keys)).fetchall()
        jobs = {r["key"]: r for r in conn.execute(LIMIT_SQL["limit_jobs"], jobs_params(keys))}
        out: dict[str, dict[str, Any]] = {}
        for row in peaks:
            key = row["key"]
            figures = {**row, **jobs[key]}
            if row["concurrency"] is not None and row["peak_running"] > row["concurrency"]:
                figures["open_at_peak"] = conn.execute(
                    LIMIT_SQL["limit_open_at"], open_at_params(key, row["peak_running_at"])
                ).fetchall()
            out[key] = figures
    return out


def open_at_params(key: str, at: Any) -> dict[str, Any]:
    """limit_open_at's parameters: a key and an instant."""
    return {"key": key, "at": at}


def limit_checks(f: dict[str, dict[str, Any]], acked: dict[str, int]) -> list[Check]:
    """The three checks, from the figures and the acknowledged keyed jobs by key."""
    slots = [r for r in f.values() if r["concurrency"] is not None]
    rated = [r for r in f.values() if r["rate_count"] is not None]
    backwards = sum(int(r["backwards"]) for r in f.values())
    over = [r for r in slots if r["peak_running"] > r["concurrency"]]
    lost = [
        r
        for r in f.values()
        if r["jobs"] != acked.get(r["key"], 0)
        or r["succeeded"] != r["jobs"]
        or r["jobs"] == 0
        or r["peak_running"] == 0
    ]
    return [
        Check(
            CONCURRENCY,
            bool(slots) and not over and backwards == 0,
            "; ".join(f"{r['key']} peak {r['peak_running']} of {r['concurrency']}" for r in slots)
            + f"; attempts ending at or before their start: {backwards}"
            + "".join(_open_at(r) for r in over),
        ),
        Check(
            RATE,
            bool(rated) and all(r["most_starts_in_window"] <= r["rate_count"] for r in rated),
            "; ".join(
                f"{r['key']} at most {r['most_starts_in_window']} starts in {r['rate_per_ms']} "
                f"ms (count {r['rate_count']})"
                for r in rated
            ),
        ),
        Check(
            RAN,
            bool(f) and not lost,
            "; ".join(
                f"{r['key']} acknowledged {acked.get(r['key'], 0)}, stored {r['jobs']}, "
                f"succeeded {r['succeeded']}, peak running {r['peak_running']}"
                for r in f.values()
            ),
        ),
    ]


def _open_at(r: dict[str, Any]) -> str:
    rows = r.get("open_at_peak") or []
    return f"; {r['key']} open at {r['peak_running_at']}: " + ", ".join(
        f"token {o['lease_token']} job {o['job_id']} {o['worker'][-12:]} "
        f"[{o['started_at']:%H:%M:%S.%f}, "
        f"{'running' if o['finished_at'] is None else format(o['finished_at'], '%H:%M:%S.%f')})"
        f" {o['outcome']}"
        for o in rows
    )


def summary(f: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """By key, what the report shows: its limit, the figures of SHOWN, whether the
    peaks reached the limit."""
    out: dict[str, dict[str, Any]] = {}
    for key, r in f.items():
        row: dict[str, Any] = {"concurrency": r["concurrency"]}
        if r["rate_count"] is not None:
            row["rate"] = f"{r['rate_count']}/{r['rate_per_ms']} ms"
        row.update({k: int(r[k]) for k in SHOWN})
        if r["concurrency"] is not None:
            row["concurrency_reached"] = r["peak_running"] == r["concurrency"]
        if r["rate_count"] is not None:
            row["rate_reached"] = r["most_starts_in_window"] == r["rate_count"]
        out[key] = row
    return out


def sql_text() -> str:
    """verify_limits.sql as shipped, for the report."""
    return VERIFY_LIMITS_SQL
