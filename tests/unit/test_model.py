"""The transition table, backoff policies and field validation.

The expected answers below are written out by hand from the lifecycle in
ARCHITECTURE.md, never derived from ``model.TRANSITIONS``: a test that reads the
table it checks cannot fail.
"""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deadman.errors import IllegalTransition, InvalidJob
from deadman.model import (
    DEFAULT_BACKOFF,
    JOB_COLUMNS,
    AttemptOutcome,
    Backoff,
    Job,
    JobReader,
    JobState,
    Lease,
    can_transition,
    check_transition,
    reader_for,
    validate_queue,
    validate_type,
)

# x: legal move, .: illegal. Rows are the source state, columns the destination.
# waiting -> scheduled is the dependency-finished case of a job whose run_at is still
# in the future (the diagram draws the due case, waiting -> queued). Not-yet-started
# states -> dead: start_by or deadline passed before the job started. dead/cancelled
# -> waiting: a retry while dependencies are unfinished (DECISIONS.md 22).
TABLE = """
             waiting  scheduled  queued  running  retrying  succeeded  dead  cancelled
waiting         .         x        x       .        .          .        x       x
scheduled       .         .        x       x        .          .        x       x
queued          .         .        .       x        .          .        x       x
running         .         .        x       .        x          x        x       x
retrying        .         .        x       x        .          .        x       x
succeeded       .         .        .       .        .          .        .       .
dead            x         .        x       .        .          .        .       .
cancelled       x         .        x       .        .          .        .       .
"""


def _expected() -> list[tuple[str, str, bool]]:
    header, *rows = TABLE.strip().splitlines()
    columns = header.split()
    cases = []
    for line in rows:
        src, *cells = line.split()
        for dst, cell in zip(columns, cells, strict=True):
            assert cell in ("x", "."), (src, cell)
            cases.append((src, dst, cell == "x"))
    return cases


CASES = _expected()


def test_the_expected_table_covers_all_64_pairs() -> None:
    assert len(CASES) == 64
    states = {s.value for s in JobState}
    assert {(s, d) for s, d, _ in CASES} == {(s, d) for s in states for d in states}


@pytest.mark.parametrize(
    ("src", "dst", "legal"),
    CASES,
    ids=[f"{s}->{d}-{'legal' if ok else 'illegal'}" for s, d, ok in CASES],
)
def test_transition(src: str, dst: str, legal: bool) -> None:
    s, d = JobState(src), JobState(dst)
    assert can_transition(s, d) is legal
    if legal:
        check_transition(s, d)
    else:
        with pytest.raises(IllegalTransition, match=f"from {src} to {dst}"):
            check_transition(s, d)


def test_terminal_states() -> None:
    assert {s.value for s in JobState if s.terminal} == {"succeeded", "dead", "cancelled"}


def test_attempt_outcomes_match_the_schema_check() -> None:
    assert {o.value for o in AttemptOutcome} == {
        "succeeded",
        "failed",
        "lease_expired",
        "released",
        "cancelled",
        "timed_out",
    }


# --------------------------------------------------------------------------- backoff


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [
        (1, 1000),
        (2, 2000),
        (3, 4000),
        (4, 8000),
        (8, 128_000),
        (9, 256_000),  # last one under the cap
        (10, 300_000),  # 512_000 capped
        (11, 300_000),
        (1000, 300_000),  # no overflow for absurd attempt numbers
    ],
)
def test_exponential_ceiling(attempt: int, ceiling: int) -> None:
    policy = Backoff(strategy="exponential", base_ms=1000, max_ms=300_000, jitter="none")
    assert policy.ceiling_ms(attempt) == ceiling
    assert policy.delay_ms(attempt) == ceiling


def test_exponential_ceiling_for_attempt_zero_is_the_base() -> None:
    policy = Backoff(base_ms=250, max_ms=10_000, jitter="none")
    assert policy.ceiling_ms(0) == 250
    assert policy.ceiling_ms(-3) == 250


def test_cap_equal_to_base_is_constant() -> None:
    policy = Backoff(base_ms=500, max_ms=500, jitter="none")
    assert [policy.delay_ms(a) for a in range(1, 6)] == [500] * 5


@pytest.mark.parametrize("attempt", [1, 2, 7, 50])
def test_fixed_is_the_base_every_time(attempt: int) -> None:
    policy = Backoff(strategy="fixed", base_ms=1500, max_ms=60_000, jitter="none")
    assert policy.ceiling_ms(attempt) == 1500
    assert policy.delay_ms(attempt) == 1500


def test_fixed_with_full_jitter_stays_under_the_base() -> None:
    policy = Backoff(strategy="fixed", base_ms=1500, max_ms=60_000, jitter="full")
    rng = random.Random(7)
    draws = [policy.delay_ms(a, rng) for a in range(1, 200)]
    assert all(0 <= d <= 1500 for d in draws)


def test_full_jitter_spreads_over_the_whole_range() -> None:
    # Full jitter, not "ceiling +- a little": retries of jobs that failed together
    # must spread out. Seeded, so this is deterministic.
    policy = Backoff(base_ms=1000, max_ms=300_000, jitter="full")
    rng = random.Random(42)
    draws = [policy.delay_ms(4, rng) for _ in range(500)]
    assert min(draws) < 8000 * 0.1
    assert max(draws) > 8000 * 0.9
    assert len(set(draws)) > 100


@st.composite
def backoffs(draw: st.DrawFn) -> Backoff:
    base = draw(st.integers(0, 86_400_000))
    cap = draw(st.integers(base, 86_400_000))
    strategies: list[Literal["exponential", "fixed"]] = ["exponential", "fixed"]
    strategy = draw(st.sampled_from(strategies))
    return Backoff(strategy=strategy, base_ms=base, max_ms=cap, jitter="full")


@settings(database=None, max_examples=300, deadline=None)
@given(policy=backoffs(), attempt=st.integers(-5, 10_000), rng=st.randoms(use_true_random=False))
def test_full_jitter_is_within_zero_and_the_ceiling(
    policy: Backoff, attempt: int, rng: random.Random
) -> None:
    ceiling = policy.ceiling_ms(attempt)
    assert 0 <= ceiling <= policy.max_ms
    if policy.strategy == "fixed":
        assert ceiling == policy.base_ms
    assert 0 <= policy.delay_ms(attempt, rng) <= ceiling


@settings(database=None, max_examples=200, deadline=None)
@given(policy=backoffs(), attempt=st.integers(1, 200))
def test_exponential_ceiling_never_decreases(policy: Backoff, attempt: int) -> None:
    assert policy.ceiling_ms(attempt) <= policy.ceiling_ms(attempt + 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "linear"},
        {"jitter": "half"},
        {"base_ms": -1},
        {"base_ms": 86_400_001, "max_ms": 86_400_001},
        {"base_ms": 5000, "max_ms": 4999},
        {"max_ms": 86_400_001},
    ],
    ids=["strategy", "jitter", "negative-base", "base-too-big", "cap-below-base", "cap-too-big"],
)
def test_invalid_backoff_is_rejected(kwargs: dict[str, Any]) -> None:
    """Backoff is checked where it comes in: the spec (HTTP, Client, CLI)."""
    from deadman.spec import JobSpec, SpecError, validate

    with pytest.raises(SpecError, match="backoff"):
        validate(JobSpec, {"type": "t", "backoff": kwargs})


def test_backoff_edges_are_accepted() -> None:
    from deadman.spec import BackoffSpec, validate

    assert validate(BackoffSpec, {"base_ms": 0, "max_ms": 0}).to_backoff() == Backoff(
        base_ms=0, max_ms=0
    )
    top = validate(BackoffSpec, {"base_ms": 86_400_000, "max_ms": 86_400_000})
    assert top.to_backoff().max_ms == 86_400_000


def test_backoff_json_round_trip() -> None:
    policy = Backoff(strategy="fixed", base_ms=10, max_ms=20, jitter="none")
    assert Backoff.from_json(policy.to_json()) == policy
    assert Backoff.from_json(None) == Backoff()
    assert Backoff.from_json({}) == Backoff()


@st.composite
def any_backoffs(draw: st.DrawFn) -> Backoff:
    """Every field free to be its default or not (backoffs() fixes the jitter)."""
    policy = draw(backoffs())
    jitters: list[Literal["full", "none"]] = ["full", "none"]
    base = draw(st.sampled_from([policy.base_ms, 1000]))
    return Backoff(
        strategy=policy.strategy,
        base_ms=base,
        max_ms=draw(st.sampled_from([max(policy.max_ms, base), max(300_000, base)])),
        jitter=draw(st.sampled_from(jitters)),
    )


@settings(database=None, max_examples=300, deadline=None)
@given(policy=any_backoffs())
def test_the_stored_backoff_reads_back_as_the_same_policy(policy: Backoff) -> None:
    """The jobs table keeps only the fields that differ from the defaults (DECISIONS 77),
    so the default policy is the column default '{}'; both read back the same."""
    stored = policy.stored()
    assert Backoff.from_json(stored) == policy
    assert Backoff.from_json(json.loads(policy.json_text)) == policy
    defaults = Backoff().to_json()
    assert all(stored[k] != defaults[k] for k in stored)
    assert set(stored) | {k for k, v in policy.to_json().items() if v == defaults[k]} == set(
        defaults
    )


def test_the_default_backoff_is_stored_as_the_column_default() -> None:
    assert Backoff().stored() == {}
    assert Backoff().json_text == "{}"
    assert Backoff(jitter="none").stored() == {"jitter": "none"}


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("name", ["a", "email.send", "A-Z_0:9", "x" * 128])
def test_valid_type_and_queue_names(name: str) -> None:
    assert validate_type(name) == name
    assert validate_queue(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "x" * 129, "has space", "slash/ed", "tab\t", "trailing\n", "é", "semi;colon"],
    ids=["empty", "too-long", "space", "slash", "tab", "newline", "non-ascii", "semicolon"],
)
def test_invalid_type_and_queue_names(name: str) -> None:
    with pytest.raises(InvalidJob, match="job type"):
        validate_type(name)
    with pytest.raises(InvalidJob, match="queue"):
        validate_queue(name)


def test_job_from_row_with_and_without_lease() -> None:
    now = datetime.now(UTC)
    row: dict[str, Any] = {
        "id": 7,
        "type": "t",
        "queue": "q",
        "priority": 3,
        "payload": {"a": 1},
        "state": "running",
        "attempt": 2,
        "max_attempts": 5,
        "rescues": 1,
        "backoff": {"strategy": "fixed", "base_ms": 5, "max_ms": 5, "jitter": "none"},
        "timeout_ms": 100,
        "run_at": now,
        "created_at": now,
        "lease_token": 42,
        "lease_worker": "w",
        "lease_expires_at": now,
    }
    job = Job.from_row(row)
    assert job.state is JobState.RUNNING
    assert job.lease is not None and job.lease.token == 42 and job.lease.worker == "w"
    assert job.backoff == Backoff(strategy="fixed", base_ms=5, max_ms=5, jitter="none")
    idle = Job.from_row({**row, "state": "queued", "lease_token": None})
    assert idle.lease is None
    assert idle.cancel_requested is False


def test_job_from_row_fills_every_field_as_init_would() -> None:
    """from_row fills the instance's __dict__ directly (speed): every dataclass field
    must be there, with the value __init__ would have stored, and the job must stay
    frozen and compare equal to one made by __init__."""
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": 9,
        "type": "t",
        "queue": "q",
        "priority": 1,
        "payload": [1],
        "state": JobState.RUNNING,
        "attempt": 1,
        "max_attempts": 3,
        "rescues": 2,
        "backoff": DEFAULT_BACKOFF,
        "timeout_ms": 50,
        "run_at": now,
        "created_at": now,
        "started_at": now,
        "finished_at": None,
        "idempotency_key": "k",
        "lease": Lease(worker="w", token=4, expires_at=now),
        "last_error": "e",
        "result": {"r": 1},
        "cancel_requested": True,
        "request_hash": "h",
        "workflow_id": 3,
        "node": "n",
        "pending_deps": 2,
        "start_by": now,
        "deadline": now,
        "heartbeat_timeout_ms": 10,
        "limit_key": "key",
        "trace_context": {"traceparent": "x"},
    }
    assert set(values) == {f.name for f in dataclasses.fields(Job)}
    row = {k: v for k, v in values.items() if k not in ("lease", "state", "backoff")}
    row.update(state="running", backoff=None, lease_token=4, lease_worker="w", lease_expires_at=now)
    job = Job.from_row(row)
    assert job == Job(**values)
    assert set(job.__dict__) == set(values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.id = 1  # type: ignore[misc]


def test_job_reader_reads_tuples_in_any_column_order_as_from_row_does() -> None:
    """The claims read their rows as tuples (JobReader, one per result's columns):
    the same Job as from_row gives for the same row as a dict, whatever the columns'
    order, with columns that are not the job's (the refill's ``finished``) ignored."""
    now = datetime.now(UTC)
    row: dict[str, Any] = {name: None for name in JOB_COLUMNS}
    row.update(
        id=11, type="t", queue="q", priority=-2, state="running", attempt=1,
        max_attempts=4, run_at=now, created_at=now, payload={"p": [1, 2]}, rescues=3,
        backoff={"strategy": "fixed", "base_ms": 7}, timeout_ms=9, started_at=now,
        idempotency_key="k", lease_token=88, lease_worker="w", lease_expires_at=now,
        cancel_requested=False, workflow_id=5, node="n", pending_deps=0, limit_key="lk",
        trace_context={"traceparent": "tp"}, finished="ignored",
    )  # fmt: skip
    names = list(row)
    for order in (names, names[::-1], names[5:] + names[:5]):
        values = tuple(row[name] for name in order)
        assert JobReader(order)(values) == Job.from_row(row)
    assert reader_for(tuple(names)) is reader_for(tuple(names))  # made once per shape


def test_job_reader_fills_left_out_columns_and_refuses_a_missing_required_one() -> None:
    now = datetime.now(UTC)
    required = dict(zip(JOB_COLUMNS[:9], (1, "t", "q", 0, "queued", 0, 3, now, now), strict=True))
    job = JobReader(list(required))(tuple(required.values()))
    assert job == Job.from_row(required)
    assert (job.payload, job.lease, job.rescues, job.pending_deps) == (None, None, 0, 0)
    assert job.backoff == DEFAULT_BACKOFF and job.cancel_requested is False
    for name in required:
        with pytest.raises(KeyError, match=name):
            JobReader([n for n in required if n != name])
