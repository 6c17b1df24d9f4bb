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
