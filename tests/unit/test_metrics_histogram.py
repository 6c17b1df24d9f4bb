"""``metrics.LoopHistogram`` is exposed exactly as ``prometheus_client.Histogram``
exposes the same observations (DECISIONS 81): same buckets, counts and sum, and an
observation on a bucket's bound counted in that bucket."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from deadman import metrics

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CREATED = re.compile(rb"^(\w+_created) \S+$", re.MULTILINE)

amounts = st.lists(
    st.one_of(
        st.sampled_from(BUCKETS),  # exactly on a bound: that bucket, not the next
        st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    ),
    max_size=60,
)


def _exposed(observe: list[float], ours: bool) -> bytes:
    registry = CollectorRegistry()
    h: metrics.LoopHistogram | Histogram
    if ours:
        h = metrics.LoopHistogram("x_seconds", "doc", BUCKETS, registry=registry)
    else:
        h = Histogram("x_seconds", "doc", buckets=BUCKETS, registry=registry)
    for amount in observe:
        h.observe(amount)
    text = generate_latest(registry)
    assert len(CREATED.findall(text)) == 1  # both expose the _created gauge
    return CREATED.sub(rb"\1 <created>", text)


@given(amounts)
def test_exposes_what_prometheus_histogram_exposes(observe: list[float]) -> None:
    assert _exposed(observe, ours=True) == _exposed(observe, ours=False)


def test_counts_an_amount_on_a_bound_in_that_bucket() -> None:
    registry = CollectorRegistry()
    h = metrics.LoopHistogram("y_seconds", "doc", (0.1, 1), registry=registry)
    for amount in (0.1, 0.5, 1.0, 7.0):
        h.observe(amount)
    assert registry.get_sample_value("y_seconds_bucket", {"le": "0.1"}) == 1
    assert registry.get_sample_value("y_seconds_bucket", {"le": "1.0"}) == 3
    assert registry.get_sample_value("y_seconds_bucket", {"le": "+Inf"}) == 4
    assert registry.get_sample_value("y_seconds_count") == 4
    assert registry.get_sample_value("y_seconds_sum") == 8.6


def test_the_worker_histograms_are_loop_histograms_in_the_default_registry() -> None:
    from prometheus_client import REGISTRY

    for h in (metrics.START_LATENCY, metrics.RUN_TIME):
        assert isinstance(h, metrics.LoopHistogram)
    before = REGISTRY.get_sample_value("deadman_job_run_seconds_count") or 0.0
    metrics.RUN_TIME.observe(0.003)
    assert REGISTRY.get_sample_value("deadman_job_run_seconds_count") == before + 1
