"""Values as the dashboard shows them: relative times, error lines, links, sparklines.

Plain text only: the templates escape all of it (autoescape), so nothing here may
build HTML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

#: The sparklines' span: one point per minute.
SPARK_MINUTES = 30


def ago(value: str | None) -> str:
    """``"5s ago"``, ``"in 2.0h"``: how far an ISO timestamp is from now."""
    if not value:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(value)).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 60:
        text = f"{seconds:.0f}s"
    elif seconds < 3600:
        text = f"{seconds / 60:.0f}m"
    elif seconds < 86400:
        text = f"{seconds / 3600:.1f}h"
    else:
        text = f"{seconds / 86400:.1f}d"
    return f"in {text}" if future else f"{text} ago"


def took(start: str | None, end: str | None) -> str:
    if not start or not end:
        return "-"
    return f"{(datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds():.3f}s"


def error_line(error: str | None, width: int = 120) -> str:
    """The line that says what went wrong: a traceback's last line, not its first."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return shorten(last, width)


def shorten(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def url(path: str, **query: object) -> str:
    """A path with its non-empty query parameters, urlencoded."""
    q = {k: str(v) for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urlencode(q) if q else "")


@dataclass(frozen=True)
class Spark:
    """An SVG polyline of per-minute counts, oldest first, scaled to the largest."""

    points: str
    label: str
    last: int
    width: int = 120
    height: int = 24


def spark(values: list[int], width: int = 120, height: int = 24) -> Spark:
    top = max(values, default=0) or 1
    n = max(len(values) - 1, 1)
    points = " ".join(
        f"{i * width / n:.1f},{height - 1 - v * (height - 2) / top:.1f}"
        for i, v in enumerate(values)
    )
    label = f"succeeded per minute, last {len(values)} minutes, peak {max(values, default=0)}"
    return Spark(points, label, values[-1] if values else 0, width, height)
