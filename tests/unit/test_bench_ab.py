"""bench.ab alternates which side runs first (DECISIONS 82) and reports the rep-by-rep
ratio beside the ratio of medians."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from bench.ab import paired_ratio, rep_order


@given(st.integers(min_value=1, max_value=40))
def test_each_side_runs_first_in_alternate_reps(reps: int) -> None:
    orders = [rep_order(rep) for rep in range(reps)]
    assert all(sorted(o) == ["after", "before"] for o in orders)  # both sides every rep
    first = [o[0] for o in orders]
    assert first[0] == "before"
    assert all(a != b for a, b in itertools.pairwise(first))
    assert abs(first.count("before") - first.count("after")) <= 1


def test_paired_ratio_is_the_median_of_each_reps_ratio() -> None:
    # a slow second rep slows both sides: the medians' ratio would say 1.25x,
    # every rep says 1.1x
    assert paired_ratio([100.0, 50.0, 100.0], [110.0, 55.0, 110.0]) == 1.1
    assert paired_ratio([100.0, 200.0], [150.0, 200.0]) == 1.25  # even count: the mean of two
    assert paired_ratio([], []) is None
