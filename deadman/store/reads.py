"""Listing and counting parameters for the API, the CLI and the dashboard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from deadman.model import (
    Job,
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

    @property
    def windowed(self) -> bool:
        """Whether a page reads only the LIST_WINDOW jobs below its cursor (migration
        0020, job_list_floor): filtered by queue or type, and able to reach succeeded
        jobs, which no index holds by queue or type."""
        filtered = self.queue is not None or self.type is not None
        return filtered and self.state in (None, JobState.SUCCEEDED)


@dataclass(frozen=True)
class JobPage:
    """One page of the job listing, newest first, and where the next page starts."""

    jobs: list[Job]
    #: the cursor of the next page (its before_id); None: this was the last
    next_before: int | None
    #: the page ended at its window (migration 0020), not because it was full: it may
    #: be short, even empty, while older matching jobs exist
    window_ended: bool = False


def job_page(found: list[Job], limit: int, floor: int | None) -> JobPage:
    """A page from job_list's rows, fetched with ``limit + 1`` so that a row past the
    page says another exists. A windowed page that did not fill goes on below its
    window (``floor``, its lowest id): the next page reads the window under it, and may
    be short, or empty, while older matching jobs exist further down."""
    page = found[:limit]
    if len(found) > limit:
        return JobPage(page, page[-1].id)
    return JobPage(page, floor, window_ended=floor is not None)


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
