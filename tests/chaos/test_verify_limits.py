"""The limits scenario's verifier, fed attempt histories built by hand: a history that
keeps every limit passes every check, and each limit broken on purpose fails its
check (and only that one). Real Postgres, the real verify_limits.sql; a few
milliseconds per case.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from deadman.chaos.limits import KeyLimit
from deadman.chaos.verify_limits import (
    CONCURRENCY,
    LIMIT_SQL,
    RAN,
    RATE,
    jobs_params,
    limit_checks,
    limit_figures,
    open_at_params,
    peaks_params,
)
from tests.factories import connect, insert_job

KEYS = (
    KeyLimit("k-c2", concurrency=2),
    KeyLimit("k-r3", rate=(3, 1000)),
    KeyLimit("k-both", concurrency=1, rate=(2, 500)),
    KeyLimit("k-free"),
)


@dataclass
class History:
    """Keyed jobs and their attempts, at seconds from the scene's start."""

    dsn: str
    conn: psycopg.Connection[Any]
    t0: datetime
    acked: dict[str, int] = field(default_factory=dict)

    def at(self, s: float) -> datetime:
        return self.t0 + timedelta(seconds=s)

    def job(self, key: str, state: str = "succeeded") -> int:
        """An acknowledged job with ``key`` in ``state``."""
        job = insert_job(self.conn, state=state)
        self.conn.execute("UPDATE deadman.jobs SET limit_key = %s WHERE id = %s", (key, job.id))
        self.acked[key] = self.acked.get(key, 0) + 1
        return job.id

    def attempt(self, key: str, start_s: float, end_s: float, outcome: str = "succeeded") -> int:
        """A job of ``key`` whose one ended attempt ran [start_s, end_s)."""
        job = self.job(key)
        self.conn.execute(
            "INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,"
            " finished_at, outcome) VALUES (nextval('deadman.lease_token_seq'), %s, 1,"
            " 'w-test', %s, %s, %s)",
            (job, self.at(start_s), self.at(end_s), outcome),
        )
        return job

    def starts(self, key: str, *at_s: float) -> None:
        """Attempts that start at these instants and last a microsecond."""
        for s in at_s:
            self.attempt(key, s, s + 0.000001)

    def running(self, key: str, start_s: float) -> int:
        """A job of ``key`` running since start_s (no attempt row yet)."""
        job = self.job(key, "running")
        self.conn.execute(
            "UPDATE deadman.jobs SET started_at = %s WHERE id = %s", (self.at(start_s), job)
        )
        return job

    def figures(self) -> dict[str, dict[str, Any]]:
        return limit_figures(self.dsn, KEYS)

    def failing(self) -> set[str]:
        return {c.name for c in limit_checks(self.figures(), self.acked) if not c.passed}


@pytest.fixture
def history(db_dsn: str) -> Iterator[History]:
    """Every limit reached and none exceeded: k-c2 holds 2 slots from 1 s to 3 s and
    hands one on at 3 s exactly; k-r3 has 3 starts in (0, 1] and its fourth 1 s after
    its first; k-both runs one at a time, 2 starts per 500 ms; k-free, unlimited, runs
    5 at once."""
    with connect(db_dsn) as conn:
        row = conn.execute("SELECT now() AS t").fetchone()
        assert row is not None
        h = History(db_dsn, conn, row["t"])
        h.attempt("k-c2", 0, 3)
        h.attempt("k-c2", 1, 3, "lease_expired")  # a rescued attempt: held till the rescue
        h.attempt("k-c2", 3, 5)
        h.attempt("k-c2", 3, 4)
        h.starts("k-r3", 0, 0.5, 0.9, 1.0)
        h.attempt("k-both", 0, 0.2)
        h.attempt("k-both", 0.2, 0.6)
        h.attempt("k-both", 0.7, 0.8)
        for _ in range(5):
            h.attempt("k-free", 0, 1)
        yield h


def test_a_history_within_every_limit_passes_every_check(history: History) -> None:
    f = history.figures()
    assert history.failing() == set(), limit_checks(f, history.acked)
    assert f["k-c2"]["peak_running"] == 2 and f["k-c2"]["rescues"] == 1
    assert f["k-r3"]["most_starts_in_window"] == 3
    assert (f["k-both"]["peak_running"], f["k-both"]["most_starts_in_window"]) == (1, 2)
    assert f["k-free"]["peak_running"] == 5 and f["k-free"]["most_starts_in_window"] == 0
    assert f["k-c2"]["peak_running_at"] == history.at(1)


def test_a_third_overlapping_attempt_exceeds_the_concurrency(history: History) -> None:
    job = history.attempt("k-c2", 2, 2.5)
    assert history.failing() == {CONCURRENCY}
    f = history.figures()
    assert f["k-c2"]["peak_running"] == 3 and f["k-c2"]["peak_running_at"] == history.at(2)
    detail = next(c.detail for c in limit_checks(f, history.acked) if c.name == CONCURRENCY)
    assert f"job {job} " in detail and "lease_expired" in detail


def test_a_job_still_running_holds_its_slot(history: History) -> None:
    """No attempt row yet: it counts as running to now (and later)."""
    history.running("k-c2", 3.5)
    assert CONCURRENCY in history.failing()
    assert history.figures()["k-c2"]["peak_running"] == 3


def test_a_start_before_the_rescue_ended_the_killed_attempt_exceeds(history: History) -> None:
    """The killed worker's slot is held until the rescue (its finished_at), not until
    the worker died: a start between the two overlaps it."""
    history.attempt("k-both", 1.0, 2.0, "lease_expired")
    history.attempt("k-both", 1.9, 2.1)
    assert history.failing() == {CONCURRENCY}


def test_a_slot_taken_at_the_rescues_instant_is_handed_on(history: History) -> None:
    history.attempt("k-both", 1.0, 2.0, "lease_expired")
    history.attempt("k-both", 2.0, 2.1)
    assert history.failing() == set()
    assert history.figures()["k-both"]["peak_running"] == 1


def test_an_attempt_ending_before_it_starts_fails(history: History) -> None:
    """It would close before it opens and hide an overlap from the sweep."""
    history.attempt("k-free", 20, 19)
    assert history.failing() == {CONCURRENCY}
    assert history.figures()["k-free"]["backwards"] == 1


def test_a_fourth_start_within_a_window_exceeds_the_rate(history: History) -> None:
    history.starts("k-r3", 0.95)
    assert history.failing() == {RATE}
    f = history.figures()
    assert f["k-r3"]["most_starts_in_window"] == 4
    assert f["k-r3"]["busiest_window_ends_at"] == history.at(0.95)


def test_starts_one_window_apart_and_one_microsecond_closer(history: History) -> None:
    """Both sides of the window's edge: (t - per_ms, t] holds a start at t - per_ms + 1 µs,
    not one at t - per_ms."""
    history.starts("k-both", 5.0, 5.25, 5.5)  # 5.0 has left the window ending at 5.5
    assert history.failing() == set()
    history.starts("k-both", 5.499999)  # 5.0 is still in (4.999999, 5.499999]
    assert history.failing() == {RATE}


def test_a_keyed_job_not_finished_or_not_stored_fails(history: History) -> None:
    history.job("k-r3", "queued")
    assert history.failing() == {RAN}


def test_an_acknowledged_keyed_job_missing_fails(history: History) -> None:
    history.acked["k-free"] += 1
    assert history.failing() == {RAN}


def test_a_key_without_jobs_proves_nothing(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        row = conn.execute("SELECT now() AS t").fetchone()
        assert row is not None
        empty = History(db_dsn, conn, row["t"])
        assert empty.failing() == {RAN}


def test_duplicate_executions_are_counted_by_key(history: History) -> None:
    job = history.attempt("k-free", 30, 31)
    for _ in range(3):
        history.conn.execute(
            "INSERT INTO deadman.chaos_invocations (job_id, lease_token, worker)"
            " VALUES (%s, 1, 'w')",
            (job,),
        )
    f = history.figures()["k-free"]
    assert (f["jobs_run_more_than_once"], f["duplicate_invocations"]) == (1, 2)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("limit_peaks", peaks_params(KEYS)),
        ("limit_jobs", jobs_params(KEYS)),
        ("limit_open_at", open_at_params("k", None)),
    ],
)
def test_each_query_gets_exactly_its_placeholders(name: str, params: dict[str, Any]) -> None:
    """As tests/unit/test_query_params.py does for queries.sql (it skips the harness):
    a key the query does not use would be ignored in silence."""
    assert set(params) == set(re.findall(r"%\(([a-z_]+)\)s", LIMIT_SQL[name]))
    assert set(LIMIT_SQL) == {"limit_peaks", "limit_jobs", "limit_open_at"}
