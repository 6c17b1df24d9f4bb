"""How the operator commands print: rich tables (and their cells) for people, JSON
for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from deadman.api.routes_ops import LIVE_STATES
from deadman.model import Job

SPARK = "▁▂▃▄▅▆▇█"


def console() -> Console:
    # A pipe or a test's captured stdout has no width; 160 keeps ids and times whole.
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def age(value: str | datetime | None) -> str:
    if value is None:
        return "-"
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    seconds = (datetime.now(UTC) - when).total_seconds()
    if seconds < 0:
        return f"in {span(-seconds)}"
    return f"{span(seconds)} ago"


def span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def short(text: str | None, width: int = 60) -> str:
    """The line that says what went wrong: a traceback's last line, not its first."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def jobs_table(jobs: Sequence[Job], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("id", "type", "queue", "state", "attempt", "run_at", "finished", "last error"):
        t.add_column(col, justify="right" if col == "id" else "left", no_wrap=col != "last error")
    for j in jobs:
        t.add_row(
            str(j.id),
            j.type,
            j.queue,
            j.state.value,
            f"{j.attempt}/{j.max_attempts}",
            age(j.run_at),
            age(j.finished_at),
            short(j.last_error),
        )
    return t


def queues_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title="queues (unfinished jobs, exact)", title_justify="left")
    t.add_column("queue")
    t.add_column("paused")
    for col in LIVE_STATES:
        t.add_column(col, justify="right")
    t.add_column("oldest due", justify="right")
    for q in rows:
        oldest = q["oldest_due_age_s"]
        t.add_row(
            q["name"],
            "PAUSED" if q["paused"] else "",
            *(str(q["counts"][s]) for s in LIVE_STATES),
            "-" if oldest is None else span(oldest),
        )
    return t


def workers_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title="workers", title_justify="left")
    for col in ("id", "host", "pid", "queues", "jobs", "alive", "last heartbeat"):
        t.add_column(col, justify="right" if col in ("pid", "jobs") else "left")
    for w in rows:
        t.add_row(
            w["id"],
            w["hostname"],
            str(w["pid"]),
            ",".join(w["queues"]),
            f"{w['jobs_held']}/{w['concurrency']}",
            "yes" if w["alive"] else "NO",
            age(w["last_heartbeat_at"]),
        )
    return t


def sparkline(values: Sequence[int]) -> str:
    """Unicode block sparkline, scaled to the largest value (all blank when idle)."""
    top = max(values, default=0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, v * (len(SPARK) - 1) // top)] for v in values)
