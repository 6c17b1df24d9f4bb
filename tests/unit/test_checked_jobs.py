"""``Client.job`` remembers the jobs it checked (deadman.clientcore.options.new_job,
DECISIONS 64): a job whose type and options were accepted before is built from the
remembered one, with its own payload. These tests hold the remembered path to the
checking path: the same job for every input both accept, the same refusal for every
input the checks refuse, whatever was remembered before, and values that are equal
in Python but not to the spec (``True`` and ``1``, ``1.0`` and ``1``) never share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deadman.clientcore import options as opts
from deadman.model import Backoff
from deadman.spec import SpecError
from deadman.store import NewJob

NAMES = st.sampled_from(["noop", "a.b:c-d_1", "", "x" * 129, "bad name", "é"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["default", "q", "", "bad queue", "x" * 200]),
    st.timedeltas(min_value=timedelta(days=-2), max_value=timedelta(days=400)),
)
#: idempotency keys: plain ones (set on a remembered job), refused ones, and ones the
#: spec takes that are not plain (non-ASCII): those are checked every time
KEYS = st.one_of(
    st.none(),
    st.sampled_from(["k", "order-1", "a b", "~!", "", "x" * 255, "x" * 256, "a\nb", "a\x7fb"]),
    st.sampled_from(["\x00", "é", "k\u2028", "\t"]),
    st.text(max_size=6),
    st.integers(),
)
OPTIONS = st.tuples(
    st.dictionaries(
        st.sampled_from(sorted(opts._REMEMBERED_OPTIONS - {"backoff"})), SCALARS, max_size=4
    ),
    st.booleans(),
    KEYS,
).map(lambda t: {**t[0], "idempotency_key": t[2]} if t[1] else t[0])
PAYLOADS = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers()))


def checked(type_: Any, payload: Any, options: dict[str, Any]) -> NewJob | str:
    """new_job's answer with nothing remembered: the job, or the refusal's errors."""
    saved = dict(opts._CHECKED)
    opts._CHECKED.clear()
    try:
        return opts.new_job(type_, payload, options)  # type: ignore[arg-type]
    except (SpecError, TypeError, ValueError, OverflowError) as exc:
        return refusal(exc)
    finally:
        opts._CHECKED.clear()
        opts._CHECKED.update(saved)


def answer(type_: Any, payload: Any, options: dict[str, Any]) -> NewJob | str:
    """new_job's answer with whatever is remembered now."""
    try:
        return opts.new_job(type_, payload, options)  # type: ignore[arg-type]
    except (SpecError, TypeError, ValueError, OverflowError) as exc:
        return refusal(exc)


def refusal(exc: Exception) -> str:
    """A refusal as a comparable text: a SpecError's field errors, or what a duration
    that is no number raised (deadman.clientcore.options.to_ms)."""
    return repr(exc.errors) if isinstance(exc, SpecError) else f"{type(exc).__name__}: {exc}"


@pytest.fixture(autouse=True)
def _forget() -> None:
    opts._CHECKED.clear()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(NAMES, PAYLOADS, OPTIONS), min_size=1, max_size=8))
def test_a_remembered_job_is_the_job_its_check_builds(
    calls: list[tuple[str, Any, dict[str, Any]]],
) -> None:
    """Calls in a row (each may remember what the next one finds): each answer is the
    one new_job gives with nothing remembered."""
    opts._CHECKED.clear()
    for type_, payload, options in calls:
        assert answer(type_, payload, options) == checked(type_, payload, options)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"priority": 1}, {"priority": True}),
        ({"max_attempts": 1}, {"max_attempts": True}),
        ({"priority": 0}, {"priority": False}),
        ({"priority": 1}, {"priority": 1.0}),
        ({"timeout": 1}, {"timeout": True}),
        ({"delay": 0}, {"delay": False}),
    ],
)
def test_values_equal_in_python_are_not_the_same_option(
    first: dict[str, Any], then: dict[str, Any]
) -> None:
    """1 == True == 1.0 and they hash alike; the key holds each value's exact type."""
    assert isinstance(answer("noop", None, first), NewJob)  # remembered
    assert answer("noop", None, then) == checked("noop", None, then)


def test_a_refusal_is_never_remembered() -> None:
    with pytest.raises(SpecError):
        opts.new_job("noop", None, {"priority": 10**9})
    assert not opts._CHECKED


def test_the_remembered_job_carries_its_own_payload_and_no_one_elses() -> None:
    backoff = Backoff("fixed", 500, 500, "none")
    a = opts.new_job("noop", {"n": 1}, {"queue": "q", "backoff": backoff, "timeout": 2.5})
    b = opts.new_job("noop", [2], {"queue": "q", "backoff": backoff, "timeout": 2.5})
    assert len(opts._CHECKED) == 1
    assert (a.payload, b.payload) == ({"n": 1}, [2])
    assert b == checked("noop", [2], {"queue": "q", "backoff": backoff, "timeout": 2.5})
    assert opts._CHECKED[next(iter(opts._CHECKED))].payload is None


def test_options_with_behaviour_or_per_job_values_are_checked_every_time() -> None:
    """Timestamps (their time zone is code), dependencies, and keys that are not plain
    (not printable ASCII, or refused): never remembered."""
    at = datetime(2031, 1, 1, tzinfo=UTC)
    for options in (
        {"run_at": at},
        {"start_by": at},
        {"deadline": at},
        {"idempotency_key": "é"},
        {"idempotency_key": "a\nb"},
        {"idempotency_key": ""},
        {"depends_on": [1]},
        {"queue": ["not", "hashable"]},
    ):
        answer("noop", None, options)
    assert not opts._CHECKED


def test_a_plain_key_is_set_on_the_remembered_job_not_remembered_with_it() -> None:
    """Bulk enqueue with a key per job (DECISIONS 93): the options are checked once,
    each job gets its own key, and what is remembered holds none."""
    jobs = [
        opts.new_job("noop", {"n": i}, {"queue": "q", "idempotency_key": f"k-{i}"})
        for i in range(3)
    ]
    assert [j.idempotency_key for j in jobs] == ["k-0", "k-1", "k-2"]
    assert len(opts._CHECKED) == 1
    assert opts._CHECKED[next(iter(opts._CHECKED))].idempotency_key is None
    assert jobs[2] == checked("noop", {"n": 2}, {"queue": "q", "idempotency_key": "k-2"})
    assert opts.new_job("noop", None, {"queue": "q"}).idempotency_key is None


def test_what_is_remembered_stays_bounded() -> None:
    for i in range(opts._CHECKED_MAX + 10):
        opts.new_job(f"t{i}", None, {"priority": 1})
    assert 0 < len(opts._CHECKED) <= opts._CHECKED_MAX
