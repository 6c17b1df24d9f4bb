"""Hostile input over real HTTP: what a careless or malicious client can send to every
route, and what it must get back (an RFC 9457 problem with a 4xx status, never a 500)
with the database unchanged; and the request metrics, which every request touches
before authentication, staying a bounded set of series whatever is sent.

The sweep is a table: every route of the API crossed with every hostile value in
every place it can go (path parameter, query parameter, header, body). A new route
or a new kind of nasty value is one more row, not one more test.
"""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest
from starlette.routing import Route

from deadman.api import routes_jobs, routes_ops, routes_workflows, ui
from deadman.api.telemetry import LATENCY, REQUESTS
from tests.factories import connect, insert_job
from tests.integration.test_api_support import (
    assert_problem,
    client,
    make_app,
    new_job,
    serve,
)
from tests.integration.test_workflows import DIAMOND

TOKEN = "hostile-test-token"
#: RFC 9110's methods: the only method labels a metric may carry, besides "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE"})
#: Every route template of the app, "-" for a request no route took.
ROUTES = frozenset(
    [r.path for r in (*routes_jobs.ROUTES, *routes_ops.ROUTES, *routes_workflows.ROUTES)]
    + [ui.MOUNT.path + r.path for r in ui.MOUNT.routes if isinstance(r, Route)]
    + ["-"]
)
STATUSES = frozenset(str(s) for s in range(100, 600))
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _db_snapshot(dsn: str) -> tuple[Any, ...]:
    """Everything a refused request could have touched: jobs (with their state and
    attempt), workflows, queue settings and idempotency keys."""
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM deadman.workflows) AS w,"
            " (SELECT count(*) FROM deadman.queues) AS q,"
            " (SELECT COALESCE(jsonb_agg(jsonb_build_array(id, state, attempt, cancel_requested,"
            "   idempotency_key) ORDER BY id), '[]') FROM deadman.jobs) AS jobs"
        ).fetchone()
    assert row is not None
    return (row["w"], row["q"], row["jobs"])


# ------------------------------------------------------------------------ bug 8: metrics


def _series(*metrics: Any) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The label sets of every sample of these metrics (one entry per series)."""
    found = set()
    for metric in metrics:
        for family in metric.collect():
            for sample in family.samples:
                if sample.name.endswith(("_total", "_count")):
                    found.add((sample.name, tuple(sorted(sample.labels.items()))))
    return found


def _raw_request(base_url: str, request: bytes) -> bytes:
    """Send bytes as they are (no client library second-guesses them); the answer."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("token", [None, TOKEN], ids=["open", "token"])
def test_request_metrics_stay_bounded_under_invented_methods_and_paths(
    db_dsn: str, token: str | None
) -> None:
    """Bug 8: 2,000 requests with invented method tokens made 2,000 permanent series.
    300 invented methods on random paths (with and without the token), plus random
    paths under every route template, add at most the closed set of labels."""
    rng = random.Random(8)
    with serve(make_app(db_dsn, api_token=token)) as base, client(base) as c:
        c.get("/health")
        before = _series(REQUESTS, LATENCY)
        for i in range(300):
            method = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=8)) + str(i)
            path = f"/{rng.randrange(10**9)}/{method.lower()}"
            headers = AUTH if i % 2 else {}
            assert c.request(method, path, headers=headers).status_code in (401, 404, 405)
        for _ in range(100):
            n = rng.randrange(10**12)
            for path in (f"/jobs/{n}", f"/workflows/{n}", f"/queues/q{n}/pause", f"/ui/jobs/{n}"):
                assert c.get(path, headers=AUTH).status_code in (303, 401, 404, 405)
        after = _series(REQUESTS, LATENCY)
    added = after - before
    assert len(added) <= 40, sorted(added)[:20]
    for _name, labels in after:
        values = dict(labels)
        assert values.get("method", "GET") in METHODS | {"PATCH", "other"}, values
        assert values.get("route", "-") in ROUTES, values
        assert values.get("status", "200") in STATUSES, values
    # and what Prometheus scrapes says the same
    with serve(make_app(db_dsn)) as base, client(base) as c:
        lines = [
            ln
            for ln in c.get("/metrics").text.splitlines()
            if ln.startswith("deadman_api_requests_total{")
        ]
    methods = {ln.split('method="')[1].split('"')[0] for ln in lines}
    assert "other" in methods and methods <= METHODS | {"PATCH", "other"}, methods


def test_request_metrics_name_dashboard_routes_apart_from_api_routes(db_dsn: str) -> None:
    """/ui/jobs/{id} and /jobs/{id} are different routes; one label each."""
    with connect(db_dsn) as conn:
        job = insert_job(conn).id
    with serve(make_app(db_dsn)) as base, client(base) as c:
        assert c.get(f"/ui/jobs/{job}").status_code == 200
        assert c.get(f"/jobs/{job}").status_code == 200
    routes = {dict(labels).get("route") for _n, labels in _series(REQUESTS)}
    assert {"/ui/jobs/{id}", "/jobs/{id}"} <= routes, routes


# ------------------------------------------------------------------------ bug 9: replays at the cap


def test_a_replayed_batch_is_200_at_the_queue_cap(db_dsn: str) -> None:
    """Bug 9: a committed batch resent to a full queue got 429: its replayed items were
    counted as new. Only new jobs count against the depth."""
    batch = {"jobs": [new_job(idempotency_key=f"b{i}", payload=i) for i in range(3)]}
    with serve(make_app(db_dsn, max_queue_depth=3)) as base, client(base) as c:
        first = c.post("/jobs/batch", json=batch)
        assert first.status_code == 201, first.text
        snapshot = _db_snapshot(db_dsn)
        again = c.post("/jobs/batch", json=batch)
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        # two replays and one new job: the new one still finds the queue full
        mixed = {"jobs": [*batch["jobs"][:2], new_job(idempotency_key="new")]}
        assert_problem(c.post("/jobs/batch", json=mixed), 429, "queue-full")
        # a key reused for another request is still that 422, not a 429
        reused = {"jobs": [new_job(idempotency_key="b0", payload="other")]}
        assert_problem(c.post("/jobs/batch", json=reused), 422, "idempotency-key-reused")
        assert _db_snapshot(db_dsn) == snapshot


def test_a_replayed_workflow_is_200_at_the_queue_cap(db_dsn: str) -> None:
    key = {"Idempotency-Key": "wf-1"}
    with serve(make_app(db_dsn, max_queue_depth=3)) as base, client(base) as c:
        first = c.post("/workflows", json=DIAMOND, headers=key)
        assert first.status_code == 201, first.text
        snapshot = _db_snapshot(db_dsn)
        again = c.post("/workflows", json=DIAMOND, headers=key)
        assert again.status_code == 200, again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json()["id"] == first.json()["id"]
        other = c.post("/workflows", json={**DIAMOND, "name": "other"}, headers=key)
        assert_problem(other, 422, "idempotency-key-reused")
        assert_problem(c.post("/workflows", json=DIAMOND), 429, "queue-full")
        assert _db_snapshot(db_dsn) == snapshot


def test_a_replayed_job_is_200_at_the_queue_cap(db_dsn: str) -> None:
    key = {"Idempotency-Key": "one"}
    with serve(make_app(db_dsn, max_queue_depth=1)) as base, client(base) as c:
        first = c.post("/jobs", json=new_job(), headers=key)
        assert first.status_code == 201
        again = c.post("/jobs", json=new_job(), headers=key)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        assert_problem(c.post("/jobs", json=new_job(payload=2), headers=key), 422)
        assert_problem(c.post("/jobs", json=new_job()), 429, "queue-full")
