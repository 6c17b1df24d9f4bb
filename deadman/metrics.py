"""Prometheus metrics of one process (worker or API). Names start with ``deadman_``."""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class LoopHistogram(Collector):
    """A histogram that one thread observes (the worker's event loop), exposed exactly
    as ``prometheus_client.Histogram`` exposes one (buckets, count, sum, created).

    ``Histogram.observe`` takes a lock for the bucket and another for the sum and
    walks the buckets in Python: ~0.66 us a call, two calls a job, ~7 % of the
    worker's busy samples at the best setting (DECISIONS 81). Here an observation is
    one ``bisect`` and two additions (~0.12 us). Not for observations from more than
    one thread: ``+=`` on a list slot is not atomic across threads. A scrape (the
    metrics server's thread) reads the counts while the loop adds to them; like
    ``Histogram``'s, its buckets are not one atomic snapshot."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != float("inf"):
            bounds.append(float("inf"))
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(bounds)
        self._labels = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        self._counts = [0] * len(bounds)
        self._sum = 0.0
        self._created = time.time()
        if registry is not None:
            registry.register(self)

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose upper bound it does not exceed."""
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def collect(self) -> Iterator[Metric]:
        counts, total = list(self._counts), self._sum
        metric = Metric(self._name, self._documentation, "histogram")
        running = 0
        for le, n in zip(self._labels, counts, strict=True):
            running += n
            metric.add_sample(self._name + "_bucket", {"le": le}, float(running))
        metric.add_sample(self._name + "_count", {}, float(running))
        metric.add_sample(self._name + "_sum", {}, total)
        metric.add_sample(self._name + "_created", {}, self._created)
        yield metric

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, "histogram")]


JOBS_CLAIMED = Counter("deadman_jobs_claimed", "Jobs claimed by this worker", ["queue"])
JOBS_HANDED = Counter(
    "deadman_jobs_handed",
    "Jobs an enqueue handed straight to this worker's parked slots (not claimed)",
    ["queue"],
)
JOBS_FINISHED = Counter(
    "deadman_jobs_finished", "Attempts ended by this worker, by outcome", ["queue", "outcome"]
)
LEASES_LOST = Counter(
    "deadman_leases_lost",
    "Leases this worker found it no longer held (heartbeat refused or trust expired)",
)
STALE_WRITES_REFUSED = Counter(
    "deadman_stale_writes_refused",
    "Fenced writes the database refused because the lease token was stale",
    ["action"],
)
JOBS_RESCUED = Counter(
    "deadman_jobs_rescued", "Expired leases handed back by this process's rescuer", ["to"]
)
JOBS_PRUNED = Counter("deadman_jobs_pruned", "Finished jobs deleted by retention")
JOBS_VACUUMS = Counter("deadman_jobs_vacuums", "VACUUMs of deadman.jobs run by this process")
START_LATENCY = LoopHistogram(
    "deadman_job_start_latency_seconds",
    "From run_at (or enqueue) to handler start",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RUN_TIME = LoopHistogram(
    "deadman_job_run_seconds",
    "Handler run time",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800),
)


def serve(base_port: int) -> WSGIServer:
    """Serve this process's metrics over HTTP (``deadman worker --metrics-port``) on a
    daemon thread; returns the server (``server_port``, ``shutdown()``). Child ``i`` of
    a fleet (``--processes N``, which sets DEADMAN_FLEET_INDEX) gets ``base_port + i``,
    so every process keeps its own counters and Prometheus scrapes each one. A port
    already taken fails start-up loudly (OSError) rather than leaving a worker that is
    silently unobservable."""
    port = base_port + int(os.environ.get("DEADMAN_FLEET_INDEX", "0"))
    server, _thread = start_http_server(port)
    return server
