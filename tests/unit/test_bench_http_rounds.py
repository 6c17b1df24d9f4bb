"""bench.http_submit's rounds: each mode's figure is its median round, and a mode
verified only if every round did."""

from __future__ import annotations

from typing import Any

from bench.http_submit import median_round


def _round(jobs_per_s: float, ok: bool = True) -> dict[str, Any]:
    return {"mode": "keyed", "jobs_per_s": jobs_per_s, "acknowledged": int(jobs_per_s), "ok": ok}


def test_the_median_round_is_the_row_and_every_round_is_listed_in_order() -> None:
    row = median_round([_round(5_700), _round(7_300), _round(6_600)])
    assert row["jobs_per_s"] == 6_600 and row["acknowledged"] == 6_600
    assert row["rounds_jobs_per_s"] == [5_700, 7_300, 6_600]
    assert row["ok"] is True


def test_an_even_count_takes_the_lower_middle_round() -> None:
    assert median_round([_round(4_000), _round(3_000)])["jobs_per_s"] == 3_000


def test_one_round_that_failed_its_check_fails_the_mode() -> None:
    row = median_round([_round(5_000), _round(9_000, ok=False), _round(6_000)])
    assert row["jobs_per_s"] == 6_000 and row["ok"] is False
