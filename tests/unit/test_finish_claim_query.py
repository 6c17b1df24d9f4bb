"""job_finish_claim (the completer's refill in one statement, DECISIONS 62) is
job_finish_many and job_claim's unkeyed claim put together: their CTEs must stay
word for word the same, or the race matrix's rows for the finishes and the claim
would no longer describe what the refill sends."""

from __future__ import annotations

from deadman.db.queries import QUERIES


def _between(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i)]


def test_the_finish_ctes_are_job_finish_many_s() -> None:
    finish = _between(QUERIES["job_finish_many"], "WITH locked AS (", "SELECT id FROM done")
    assert finish.rstrip() in QUERIES["job_finish_claim"]


def test_the_candidates_cte_is_job_claim_s() -> None:
    candidates = _between(QUERIES["job_claim"], "candidates AS (", "), claimed AS (")
    assert candidates in QUERIES["job_finish_claim"]
    # and the claimed rows are started as every claim starts them
    assert "deadman.job_start(" in QUERIES["job_finish_claim"]


def test_it_claims_no_keyed_job() -> None:
    assert "job_claim_keyed" not in QUERIES["job_finish_claim"]
    assert "limit_key IS NULL" in QUERIES["job_finish_claim"]
