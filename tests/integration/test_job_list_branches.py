"""GET /jobs lists running jobs from a branch of its own (migration 0016: the listing
indexes hold no running job), and a listing by queue or type that can reach succeeded
jobs reads a window of jobs per page (migration 0020). Followed cursor to cursor, the
pages must be exactly what one scan of the table would give: every filter combination,
with windows smaller than the table and larger, against a naive query."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from deadman import bounds
from deadman.model import JobState
from deadman.store import AsyncStore, ListParams
from tests.factories import ALL_STATES, connect, insert_job, with_store

STATES = (None, *ALL_STATES)
QUEUES = (None, "q1", "q2")
TYPES = (None, "t1", "t2")


async def _all_pages(store: AsyncStore, p: ListParams) -> tuple[list[int], list[int]]:
    """Every id the listing gives, following next_before; and each page's size."""
    got: list[int] = []
    sizes: list[int] = []
    before = None
    for _ in range(1000):  # bounded: 120 jobs in windows of 5 are ~25 pages
        page = await store.job_list(replace(p, before_id=before))
        got += [j.id for j in page.jobs]
        sizes.append(len(page.jobs))
        if page.next_before is not None and len(page.jobs) < p.limit:
            assert page.window_ended, "a short page with a cursor onward ended at its window"
        if page.window_ended:
            assert p.windowed and page.next_before is not None
        if page.next_before is None:
            return got, sizes
        assert page.next_before < (before or 2**63), "a cursor must move down"
        before = page.next_before
    raise AssertionError(f"the listing {p} did not end")


@pytest.mark.parametrize("window", [5, 37, 100_000])
def test_every_filter_and_page_matches_a_plain_scan(
    db_dsn: str, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounds, "LIST_WINDOW", window)
    rng = random.Random(16)
    with connect(db_dsn) as conn:
        for _ in range(120):
            insert_job(
                conn,
                state=rng.choice(ALL_STATES),
                queue=rng.choice(QUEUES[1:]),
                type=rng.choice(TYPES[1:]),
            )
        rows = conn.execute("SELECT id, state, queue, type FROM deadman.jobs").fetchall()
    assert {r["state"] for r in rows} == set(ALL_STATES)

    async def check(store: AsyncStore) -> list[int]:
        short_with_more = []
        for state, queue, type_ in itertools.product(STATES, QUEUES, TYPES):
            want = sorted(
                (
                    r["id"]
                    for r in rows
                    if (state is None or r["state"] == state)
                    and (queue is None or r["queue"] == queue)
                    and (type_ is None or r["type"] == type_)
                ),
                reverse=True,
            )
            p = ListParams(7, JobState(state) if state else None, type_, queue)
            got, sizes = await _all_pages(store, p)
            assert got == want, (state, queue, type_)
            if not p.windowed:  # served by an index: full pages until the last
                assert all(n == 7 for n in sizes[:-1]), (state, queue, type_, sizes)
            short_with_more += [n for n in sizes[:-1] if n < 7]
        return short_with_more

    short_with_more = with_store(db_dsn, check)
    if window < 120:  # the windows cut the table: some page came back short, not last
        assert short_with_more, "no windowed page was short"
    else:
        assert short_with_more == []


def test_which_listings_are_windowed() -> None:
    assert ListParams(50, queue="q").windowed
    assert ListParams(50, type="t", state=JobState.SUCCEEDED).windowed
    assert not ListParams(50, queue="q", state=JobState.DEAD).windowed
    assert not ListParams(50, state=JobState.SUCCEEDED).windowed
    assert not ListParams(50).windowed


def test_ids_left_empty_cost_no_pages(db_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window counts jobs, not ids: after retention deleted a long run of ids, a
    rare queue's listing still reaches its oldest job in a few pages."""
    monkeypatch.setattr(bounds, "LIST_WINDOW", 10)
    with connect(db_dsn) as conn:
        old = insert_job(conn, queue="rare", state="succeeded").id
        conn.execute("SELECT setval('deadman.jobs_id_seq', 1000000)")
        for _ in range(25):
            insert_job(conn, queue="busy", state="succeeded")
        new = insert_job(conn, queue="rare", state="succeeded").id

    async def pages(store: AsyncStore) -> tuple[list[int], list[int]]:
        return await _all_pages(store, ListParams(50, queue="rare"))

    got, sizes = with_store(db_dsn, pages)
    assert got == [new, old]
    assert len(sizes) == 3, sizes  # 27 jobs in windows of 10
