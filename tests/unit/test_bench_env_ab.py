"""bench.env_ab's --variant parsing: what it accepts, and what it refuses before any
cluster is made (a variant that set nothing by mistake would measure the default
twice and report a ratio of nothing)."""

from __future__ import annotations

import argparse

import pytest

from bench.env_ab import parse_variant


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
