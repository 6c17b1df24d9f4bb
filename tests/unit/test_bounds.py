"""The id pattern of the OpenAPI document is exactly what the server accepts."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from deadman.bounds import ID_PATTERN, MAX_BIGINT, decimal_pattern

ID = re.compile(ID_PATTERN)

#: numbers near every digit boundary of the limit, and far from it on both sides
NEAR_LIMIT = st.integers(-5, 5).map(lambda d: MAX_BIGINT + d)
AROUND_POWERS = st.builds(lambda e, d: 10**e + d, st.integers(0, 21), st.integers(-3, 3))
NUMBERS = st.integers(-(10**21), 10**21) | NEAR_LIMIT | AROUND_POWERS


@given(NUMBERS)
def test_the_id_pattern_takes_exactly_1_to_bigint(n: int) -> None:
    assert bool(ID.fullmatch(str(n))) == (1 <= n <= MAX_BIGINT)


@given(st.integers(1, 10**6), st.integers(0, 10**7))
def test_decimal_pattern_for_any_limit(limit: int, n: int) -> None:
    assert bool(re.fullmatch(decimal_pattern(limit), str(n))) == (1 <= n <= limit)


def test_no_other_spelling_of_an_id() -> None:
    for raw in (
        "",
        "0",
        "01",
        "+1",
        " 1",
        "1 ",
        "1.0",
        "1\n",
        "1e3",
        "²",
        "٣",
        "9223372036854775808",
    ):
        assert ID.fullmatch(raw) is None, raw
