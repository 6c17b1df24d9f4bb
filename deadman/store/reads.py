"""Listing and counting parameters for the API, the CLI and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

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
