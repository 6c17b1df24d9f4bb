"""A finish batch's ids go to Postgres as one array literal (DECISIONS 81), not as a
list psycopg adapts id by id; every finish's id is in it, in the batch's order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, finish_params
from deadman.store.leases import bigint_array

bigints = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@given(st.lists(bigints, max_size=50))
def test_the_literal_holds_every_id_in_order(ids: list[int]) -> None:
    literal = bigint_array(ids)
    assert literal[0] == "{" and literal[-1] == "}"
    inner = literal[1:-1]
    assert ([int(x) for x in inner.split(",")] if inner else []) == ids


def test_finish_params_sends_the_batch_ids_as_the_literal() -> None:
    finishes = [
        Finish(i, 100 + i, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED) for i in (7, 3, 12)
    ]
    assert finish_params(finishes)["ids"] == "{7,3,12}"
