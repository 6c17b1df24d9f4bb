"""bench.env_ab's --variant parsing: what it accepts, and what it refuses before any
cluster is made (a variant that set nothing by mistake would measure the default
twice and report a ratio of nothing); and its turn order, rotated rep by rep."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.env_ab import parse_variant, rotated


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("base=", ("base", {})),
        ("c200=DEADMAN_CONCURRENCY=200", ("c200", {"DEADMAN_CONCURRENCY": "200"})),
        (
            "f3=DEADMAN_COMPLETER_FLUSHES=3,DEADMAN_CLAIM_BATCH=34",
            ("f3", {"DEADMAN_COMPLETER_FLUSHES": "3", "DEADMAN_CLAIM_BATCH": "34"}),
        ),
        ("url=DEADMAN_LISTEN_URL=postgresql://u@h/d?x=1", None),
    ],
)
def test_variants_parse(raw: str, expected: tuple[str, dict[str, str]] | None) -> None:
    name, env = parse_variant(raw)
    if expected is None:  # a value may itself hold '='
        assert (name, env) == ("url", {"DEADMAN_LISTEN_URL": "postgresql://u@h/d?x=1"})
    else:
        assert (name, env) == expected


@pytest.mark.parametrize(
    "raw",
    ["=DEADMAN_CONCURRENCY=1", "x=CONCURRENCY=1", "x=DEADMAN_CONCURRENCY", "x=PATH=/tmp", "x=,=1"],
)
def test_malformed_variants_are_refused(raw: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_variant(raw)


@given(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=30))
def test_the_turn_order_rotates_rep_by_rep(k: int, rep: int) -> None:
    names = [f"v{i}" for i in range(k)]
    order = rotated(names, rep)
    assert sorted(order) == names  # every variant runs in every rep
    assert order[0] == names[rep % k]
    # over k consecutive reps every variant runs first once
    assert sorted(rotated(names, r)[0] for r in range(rep, rep + k)) == names
