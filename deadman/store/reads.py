"""Listing and counting parameters for the API, the CLI and the dashboard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from deadman.model import (
    JobState,
)


def _ms(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds() * 1000.0


#: Finished jobs of one state are counted exactly up to this many, then estimated.
FINISHED_COUNT_CAP = 10_000


@dataclass(frozen=True)
class ListParams:
    """One page of the job listing: filters (None: any) and the keyset cursor."""

    limit: int
    state: JobState | None = None
    type: str | None = None
    queue: str | None = None
    before_id: int | None = None  # only jobs with a smaller id (the previous page's last)


def throughput_series(rows: Sequence[Mapping[str, Any]], minutes: int) -> dict[str, list[int]]:
    """throughput_recent's rows as succeeded jobs per minute per queue, oldest first,
    ``minutes`` points each (the dashboard's sparklines and `deadman top`)."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    series: dict[str, list[int]] = {}
    for r in rows:
        if r["state"] != "succeeded":
            continue
        back = int((now - r["minute"]).total_seconds() // 60)
        if 0 <= back < minutes:
            series.setdefault(r["queue"], [0] * minutes)[minutes - 1 - back] += int(r["jobs"])
    return series
