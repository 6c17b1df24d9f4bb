"""Prometheus metrics of one process (worker or API). Names start with ``deadman_``."""

from __future__ import annotations

import os
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Histogram, start_http_server

JOBS_CLAIMED = Counter("deadman_jobs_claimed", "Jobs claimed by this worker", ["queue"])
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
START_LATENCY = Histogram(
    "deadman_job_start_latency_seconds",
    "From run_at (or enqueue) to handler start",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RUN_TIME = Histogram(
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
