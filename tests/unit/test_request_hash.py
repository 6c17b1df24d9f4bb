"""``NewJob.request_hash`` must stay byte for byte what stored hashes were made from:
a replay sent after an upgrade is told from a different request by it. Its encoder is
made once (DECISIONS 90); these pin it to the ``json.dumps`` call it replaced, and one
job's hash to its value."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from deadman.model import Backoff
from deadman.store.jobs import _HASH_JSON, NewJob

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300)
@given(_JSON)
def test_the_encoder_writes_what_json_dumps_wrote(value: Any) -> None:
    body = {"payload": value, "when": datetime(2026, 1, 2, tzinfo=UTC), "z": 1, "a": None}
    assert _HASH_JSON.encode(body) == json.dumps(
        body, sort_keys=True, separators=(",", ":"), default=str
    )


def test_one_jobs_hash_is_what_it_was() -> None:
    tz = timezone(timedelta(hours=2))
    job = NewJob(
        type="pay.card",
        payload={"amount": 12.5, "who": "é", "n": [1, 2]},
        queue="q",
        priority=3,
        max_attempts=7,
        backoff=Backoff(strategy="fixed", base_ms=500, max_ms=9000),
        timeout_ms=2500,
        idempotency_key="k",
        start_by=datetime(2026, 12, 6, 12, 0, tzinfo=tz),
        limit_key="acct:1",
    )
    body = {
        "type": "pay.card",
        "payload": {"amount": 12.5, "who": "é", "n": [1, 2]},
        "queue": "q",
        "priority": 3,
        "run_at": None,
        "delay_ms": 0,
        "max_attempts": 7,
        "backoff": Backoff(strategy="fixed", base_ms=500, max_ms=9000).to_json(),
        "timeout_ms": 2500,
        "start_by": "2026-12-06T10:00:00+00:00",
        "limit_key": "acct:1",
    }
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    assert job.request_hash() == hashlib.sha256(raw.encode()).hexdigest()
    # the value before the encoder was kept (computed at 327b0e0)
    assert job.request_hash() == "16d8eb64168e3279fa44e0b7b971b53856def76cb4b57efbc8146a38a5aa1383"


def _reference(job: NewJob) -> str:
    """request_hash as it was before the JSON around the payload was kept (DECISIONS
    93): the whole body through json.dumps, every time. (Which fields the body holds is
    pinned by the job above whose hash is fixed.)"""
    raw = json.dumps(job._hash_body(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


_WHEN = st.one_of(
    st.none(),
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-5))])),
)
_INT = st.one_of(st.none(), st.integers(min_value=0, max_value=10**6), st.booleans())
_JOBS = st.builds(
    NewJob,
    type=st.sampled_from(["t", "pay.card", "é"]),
    payload=_JSON,
    queue=st.sampled_from(["default", "q", "z" * 3]),
    priority=st.one_of(st.integers(min_value=-5, max_value=5), st.booleans()),
    run_at=_WHEN,
    delay_ms=st.sampled_from([0, 1, 500]),
    max_attempts=_INT,
    backoff=st.sampled_from(
        [Backoff(), Backoff(strategy="fixed", base_ms=500, max_ms=9000, jitter="none")]
    ),
    timeout_ms=_INT,
    idempotency_key=st.sampled_from([None, "k", "other"]),
    depends_on=st.sampled_from([(), (1,), (3, 2)]),
    start_by=_WHEN,
    deadline=_WHEN,
    heartbeat_timeout_ms=_INT,
    limit_key=st.sampled_from([None, "acct:1", "a"]),
)


@settings(max_examples=300)
@given(st.lists(_JOBS, min_size=1, max_size=6), st.lists(_JSON, min_size=1, max_size=3))
def test_the_hash_is_the_whole_bodys_whatever_was_hashed_before(
    jobs: list[NewJob], payloads: list[Any]
) -> None:
    """Jobs in a row, and the same jobs again with other payloads (what a bulk enqueue
    hashes: the JSON around the payload is found, not made): each hash is the one the
    whole body gives, for any fields (``True`` beside ``1``, time zones, dependencies)."""
    for job in jobs:
        assert job.request_hash() == _reference(job)
        for payload in payloads:
            again = NewJob(**{**job.__dict__, "payload": payload})
            assert again.request_hash() == _reference(again)
