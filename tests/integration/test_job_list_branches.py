"""GET /jobs lists running jobs from a branch of its own (migration 0016: the listing
indexes hold no running job). The merged page must be exactly what one scan of the
table would give: every filter combination, every page, against a naive query."""

from __future__ import annotations

import itertools
import random

from deadman.db.queries import QUERIES
from tests.factories import ALL_STATES, connect, insert_job

STATES = (None, *ALL_STATES)
QUEUES = (None, "q1", "q2")
TYPES = (None, "t1", "t2")


def test_every_filter_and_page_matches_a_plain_scan(db_dsn: str) -> None:
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
            got: list[int] = []
            before = None
            while True:  # pages of 7, keyset by id as the API pages
                params = {
                    "state": state,
                    "type": type_,
                    "queue": queue,
                    "before": before,
                    "limit": 7,
                }
                page = [
                    int(r["id"]) for r in conn.execute(QUERIES["job_list"], params, prepare=False)
                ]
                got += page
                if len(page) < 7:
                    break
                before = page[-1]
            assert got == want, (state, queue, type_)
