"""Hostile input over real HTTP: what a careless or malicious client can send to every
route, and what it must get back (an RFC 9457 problem with a 4xx status, never a 500)
with the database unchanged; and the request metrics, which every request touches
before authentication, staying a bounded set of series whatever is sent.

The sweep is a table: every route of the API crossed with every hostile value in
every place it can go (path parameter, query parameter, header, body). A new route
or a new kind of nasty value is one more row, not one more test.
"""

from __future__ import annotations

import json
import random
import re
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from deadman.api import (
    routes_jobs,
    routes_limits,
    routes_ops,
    routes_schedules,
    routes_workflows,
    ui,
)
from deadman.api.telemetry import LATENCY, REQUESTS
from tests.factories import connect, insert_job
from tests.helpers.api import (
    assert_problem,
    client,
    error_fields,
    make_app,
    new_job,
    serve,
)
from tests.helpers.workflows import DIAMOND

TOKEN = "hostile-test-token"
#: RFC 9110's methods: the only method labels a metric may carry, besides "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE"})
#: Every route template of the app, "-" for a request no route took.
ROUTES = frozenset(
    [
        r.path
        for r in (
            *routes_jobs.ROUTES,
            *routes_ops.ROUTES,
            *routes_workflows.ROUTES,
            *routes_limits.ROUTES,
            *routes_schedules.ROUTES,
        )
    ]
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


def test_pausing_and_resuming_invented_queues_leaves_no_series_behind(db_dsn: str) -> None:
    """A resume used to leave the queue's settings row behind, so every name ever
    paused stayed in /queues and in ~7 /metrics series each (62 -> 2,223 lines after
    300 invented names, no token needed when none is set)."""
    names = [f"invented-{i}" for i in range(60)]
    with serve(make_app(db_dsn)) as base, client(base) as c:
        # every route once first: the request metrics' own (bounded) series exist
        assert c.post("/queues/warm-up/pause").status_code == 200
        assert c.post("/queues/warm-up/resume").status_code == 200
        assert c.get("/queues").status_code == 200
        c.get("/metrics")
        before = len(c.get("/metrics").text.splitlines())
        for name in names:
            assert c.post(f"/queues/{name}/pause").json()["paused"] is True
            assert c.post(f"/queues/{name}/resume").json()["paused"] is False
        listed = {q["name"] for q in c.get("/queues").json()["queues"]}
        after = len(c.get("/metrics").text.splitlines())
        assert c.post("/queues/kept/pause").status_code == 200
        assert "kept" in {q["name"] for q in c.get("/queues").json()["queues"]}
    assert not listed & set(names)
    assert after == before, (before, after)


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


# ------------------------------------------------------------------------ the sweep

#: Values that are not an id, percent-encoded for a URL path or query string.
NOT_IDS = [
    "%C2%B2",  # '²': str.isdigit() says yes, int() raises
    "%D9%A3",  # '٣': isdigit() and int() both take it
    "1%C2%B2",
    "9" * 5000,  # more digits than int() converts
    "9223372036854775808",  # one past bigint
    "-1",
    "0",
    "007",
    "%2B1",
    "%201",
    "1%00",
    "%00",
    "%ED%A0%80",  # a lone surrogate as UTF-8 would encode it
    "%FF%FE",  # not UTF-8
    "1e3",
    "0x10",
    "x" * 10_000,
]
#: Text that is no queue name, type or state.
NOT_NAMES = [
    "%C2%B2",
    "%00",
    "a%00b",
    "%ED%A0%80",
    "%FF",
    "%0A",
    "a%20b",
    "x" * 129,
    "x" * 10_000,
    "%27%3B%20DROP%20TABLE%20deadman.jobs%3B--",
]
#: (route template, methods): every API route (the dashboard has its own module).
API_ROUTES: list[tuple[str, tuple[str, ...]]] = [
    ("/jobs", ("GET", "POST")),
    ("/jobs/batch", ("POST",)),
    ("/jobs/{id}", ("GET",)),
    ("/jobs/{id}/attempts", ("GET",)),
    ("/jobs/{id}/cancel", ("POST",)),
    ("/jobs/{id}/retry", ("POST",)),
    ("/workflows", ("POST",)),
    ("/workflows/{id}", ("GET",)),
    ("/workflows/{id}/cancel", ("POST",)),
    ("/queues", ("GET",)),
    ("/queues/{name}/pause", ("POST",)),
    ("/queues/{name}/resume", ("POST",)),
    ("/limits", ("GET",)),
    ("/limits/{name}", ("PUT", "GET", "DELETE")),  # {name}: swept as names are
    ("/schedules", ("GET",)),
    ("/schedules/{name}", ("PUT", "GET", "DELETE")),
    ("/schedules/{name}/pause", ("POST",)),
    ("/schedules/{name}/resume", ("POST",)),
    ("/workers", ("GET",)),
    ("/stats", ("GET",)),
    ("/health", ("GET",)),
    ("/ready", ("GET",)),
    ("/metrics", ("GET",)),
    ("/openapi.json", ("GET",)),
]
BODY_ROUTES = ["/jobs", "/jobs/batch", "/workflows"]
JSON_HEADERS = {"Content-Type": "application/json"}


def _as_body(route: str, job: bytes) -> bytes:
    """A job object (JSON text) as the body of ``route``."""
    if route == "/jobs/batch":
        return b'{"jobs": [' + job + b"]}"
    if route == "/workflows":
        node = b'{"name": "n", ' + job.removeprefix(b"{") if job.startswith(b"{") else job
        return b'{"name": "w", "nodes": [' + node + b"]}"
    return job


def _job(extra: bytes, type_: bytes = b'"noop"') -> bytes:
    """A job object with ``extra`` fields (JSON text after the type)."""
    return b'{"type": ' + type_ + extra + b"}"


def _deep(depth: int) -> bytes:
    return _job(b', "payload": ' + b"[" * depth + b"]" * depth)


#: (what, body, statuses): bodies no route may accept; each route wraps job objects.
BAD_JOBS: list[tuple[str, bytes, tuple[int, ...]]] = [
    ("nested 10,000 deep", _deep(10_000), (422,)),
    ("nested 100 deep", _deep(100), (422,)),
    ("NaN", _job(b', "payload": NaN'), (400,)),
    ("Infinity", _job(b', "payload": [Infinity]'), (400,)),
    ("-Infinity", _job(b', "payload": {"x": -Infinity}'), (400,)),
    ("1e400", _job(b', "payload": 1e400'), (422,)),
    ("5,000 digits", _job(b', "payload": ' + b"9" * 5000), (422,)),
    ("duplicate key", _job(b', "type": "other"'), (422,)),
    ("duplicate key in payload", _job(b', "payload": {"a": 1, "a": 2}'), (422,)),
    ("lone surrogate", _job(b', "payload": "\\ud800"'), (422,)),
    ("lone surrogate key", _job(b', "payload": {"\\udfff": 1}'), (422,)),
    ("NUL", _job(b', "payload": "a\\u0000b"'), (422,)),
    ("NUL type", _job(b"", b'"no\\u0000op"'), (422,)),
    ("unicode digit type", _job(b"", b'"\xc2\xb2"'), (422,)),
    ("overlong type", _job(b"", b'"' + b"x" * 5000 + b'"'), (422,)),
    ("type null", _job(b"", b"null"), (422,)),
    ("type number", _job(b"", b"1"), (422,)),
    ("overlong queue", _job(b', "queue": "' + b"q" * 129 + b'"'), (422,)),
    ("max_attempts '²'", _job(b', "max_attempts": "\xc2\xb2"'), (422,)),
    ("max_attempts huge", _job(b', "max_attempts": 1' + b"0" * 30), (422,)),
    ("max_attempts 0", _job(b', "max_attempts": 0'), (422,)),
    ("max_attempts -1", _job(b', "max_attempts": -1'), (422,)),
    ("max_attempts true", _job(b', "max_attempts": true'), (422,)),
    ("max_attempts NaN", _job(b', "max_attempts": NaN'), (400,)),
    ("priority 1e300", _job(b', "priority": 1e300'), (422,)),
    ("delay_ms huge", _job(b', "delay_ms": 99999999999999999999999'), (422,)),
    ("timeout_ms 0", _job(b', "timeout_ms": 0'), (422,)),
    ("run_at ²", _job(b', "run_at": "\xc2\xb2025-01-01T00:00:00Z"'), (422,)),
    ("run_at year 0", _job(b', "run_at": "0000-01-01T00:00:00Z"'), (422,)),
    ("run_at year 10000", _job(b', "run_at": "10000-01-01T00:00:00Z"'), (422,)),
    ("depends_on '²'", _job(b', "depends_on": ["\xc2\xb2"]'), (422,)),
    ("depends_on '\xd9\xa3'", _job(b', "depends_on": ["\xd9\xa3"]'), (422,)),
    ("depends_on huge", _job(b', "depends_on": [1' + b"0" * 40 + b"]"), (422,)),
    ("depends_on past bigint", _job(b', "depends_on": ["9223372036854775808"]'), (422,)),
    ("depends_on -1", _job(b', "depends_on": [-1]'), (422,)),
    ("depends_on 1.5", _job(b', "depends_on": [1.5]'), (422,)),
    ("backoff NaN", _job(b', "backoff": {"base_ms": NaN}'), (400,)),
    ("backoff huge", _job(b', "backoff": {"base_ms": 1e30}'), (422,)),
    ("idempotency_key NUL", _job(b', "idempotency_key": "a\\u0000"'), (422,)),
    ("idempotency_key 256", _job(b', "idempotency_key": "' + b"k" * 256 + b'"'), (422,)),
    ("unknown field", _job(b', "evil": 1'), (422,)),
]
#: (what, raw body, statuses): broken before any route-specific shape.
BAD_BODIES: list[tuple[str, bytes, tuple[int, ...]]] = [
    ("empty", b"", (400,)),
    ("spaces", b"   \r\n", (400,)),
    ("invalid UTF-8", b'{"type": "\xff\xfe"}', (400,)),
    ("UTF-16", '{"type": "noop"}'.encode("utf-16"), (400,)),
    ("BOM", b'\xef\xbb\xbf{"type": "noop"}', (400,)),
    ("truncated", b'{"type": "noop"', (400,)),
    ("trailing garbage", b'{"type": "noop"} x', (400,)),
    ("two documents", b'{"type": "noop"}{"type": "noop"}', (400,)),
    ("null", b"null", (422,)),
    ("array", b"[]", (422,)),
    ("string", b'"noop"', (422,)),
    ("number", b"1", (422,)),
    ("NaN alone", b"NaN", (400,)),
    ("nested 100,000 arrays", b"[" * 100_000 + b"]" * 100_000, (413, 422)),
    ("over the size limit", b'{"type": "noop", "payload": "' + b"x" * 70_000 + b'"}', (413,)),
]
BAD_CONTENT_TYPES: list[str | bytes | None] = [
    None,
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
    "application/json; charset=utf-16",
    "application/jsonx",
    "application/json, text/plain",
    b"\xc2\xb2",
]
BAD_KEYS: list[str | bytes] = [
    "",
    "k" * 256,
    "a\tb",
    b"\xff\xfe",
    b"\xc2\xb2",
]


class _Sweep:
    """One server over one seeded database; ``check`` records every deviation, so a
    single run lists all of them, and verifies the database did not change."""

    def __init__(self, base: str, dsn: str) -> None:
        self.base = base
        self.dsn = dsn
        self.failures: list[str] = []
        self.snapshot = _db_snapshot(dsn)
        self.sent = 0
        self.http = httpx.Client(base_url=base, timeout=30)

    def check(
        self,
        what: str,
        method: str,
        path: str,
        statuses: tuple[int, ...],
        *,
        content: bytes | None = None,
        headers: dict[str, Any] | None = None,
        valid_ok: bool = False,
    ) -> None:
        """``valid_ok``: the value may happen to be valid (generated ones): then any
        2xx, and whatever change it made, is accepted too."""
        self.sent += 1
        r = self.http.request(method, path, content=content, headers=headers)
        if valid_ok and r.status_code < 300:
            self.snapshot = _db_snapshot(self.dsn)
            return
        try:
            assert r.status_code in statuses, f"status {r.status_code}, wanted {statuses}"
            assert_problem(r, r.status_code)
        except AssertionError as exc:
            self.failures.append(f"{what}: {method} {path[:80]}: {exc}: {r.text[:200]}")
        if self.sent % 25 == 0 or self.failures:
            self.assert_unchanged(what)

    def control(self, method: str, path: str, content: bytes) -> None:
        """A valid request is accepted (so the hostile ones are refused for their
        hostility, not for a broken template); the database moves on with it."""
        r = self.http.request(method, path, content=content, headers=JSON_HEADERS)
        assert r.status_code == 201, (path, r.text)
        self.snapshot = _db_snapshot(self.dsn)

    def assert_unchanged(self, what: str) -> None:
        if _db_snapshot(self.dsn) != self.snapshot:
            self.failures.append(f"{what}: the database changed")
            self.snapshot = _db_snapshot(self.dsn)


@pytest.fixture
def sweep(db_dsn: str) -> Iterator[_Sweep]:
    with connect(db_dsn) as conn:
        for state in ("queued", "running", "dead", "cancelled", "succeeded"):
            insert_job(conn, state=state, idempotency_key=f"seed-{state}")
    with serve(make_app(db_dsn, max_payload_bytes=64 * 1024)) as base:
        with httpx.Client(base_url=base) as c:
            made = c.post("/workflows", json=DIAMOND, headers={"Idempotency-Key": "wf"})
            assert made.status_code == 201
        s = _Sweep(base, db_dsn)
        with s.http:
            yield s
        s.assert_unchanged("end")
    assert not s.failures, "\n".join(s.failures)


def test_hostile_path_parameters_on_every_route(sweep: _Sweep) -> None:
    for template, methods in API_ROUTES:
        for method in methods:
            if "{id}" in template:
                for value in NOT_IDS:
                    path = template.replace("{id}", value)
                    sweep.check("id", method, path, (404,))
            if "{name}" in template:
                for value in NOT_NAMES:
                    path = template.replace("{name}", value)
                    sweep.check("queue name", method, path, (404, 422))
    assert sweep.sent > 100


def test_hostile_query_parameters(sweep: _Sweep) -> None:
    for name in ("state", "type", "queue", "limit", "cursor"):
        for value in [*NOT_NAMES, *NOT_IDS]:
            if name in ("type", "queue") and value in ("0", "007", "1e3", "0x10", "-1"):
                continue  # those are valid names
            if name in ("type", "queue") and value.isascii() and value.isalnum():
                continue
            if name == "limit" and value == "007":
                continue  # 7: leading zeros are fine in a count
            sweep.check(f"query {name}", "GET", f"/jobs?{name}={value}", (422,))
        sweep.check(f"repeated {name}", "GET", f"/jobs?{name}=a&{name}=b", (422,))
    for value in ("0", "1001", "-1", "%C2%B2", "9" * 5000, "1.0", "%2B5", " 5"):
        sweep.check("limit", "GET", f"/jobs?limit={value}", (422,))


#: not 0..WAIT_MS_MAX in ASCII digits, given once
BAD_WAITS = [
    "-1",
    "1e9",
    "1000000000",
    "20001",
    "9" * 5000,
    "abc",
    "",
    "1.5",
    "%2B5",
    "%205",
    "0x10",
    "%C2%B2",
    "%D9%A3",
    "%00",
    "true",
]


def test_hostile_wait_ms(sweep: _Sweep) -> None:
    """GET /jobs/{id}?wait_ms=N: anything but one integer from 0 to 20000 is a 422
    naming wait_ms, answered at once (no wait) and before any job is flagged; on a
    job that exists and on one that does not."""
    with connect(sweep.dsn) as conn:
        row = conn.execute(
            "SELECT min(id) AS id FROM deadman.jobs WHERE state = 'queued'"
        ).fetchone()
    assert row is not None
    for job_id in (row["id"], 999_999):
        for value in BAD_WAITS:
            sweep.check("wait_ms", "GET", f"/jobs/{job_id}?wait_ms={value}", (422,))
        sweep.check("repeated wait_ms", "GET", f"/jobs/{job_id}?wait_ms=1&wait_ms=1", (422,))
    r = sweep.http.get(f"/jobs/{row['id']}", params={"wait_ms": "1e9"})
    assert error_fields(r) == {"wait_ms"}
    assert r.elapsed.total_seconds() < 2

    @given(text=st.text(max_size=30) | st.sampled_from(["9" * 4301, "\u00b2", "\ud800"]))
    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    def any_text(text: str) -> None:
        # on a job that does not exist: a valid wait is a 404 at once, never a wait
        value = quote(text, safe="", errors="surrogatepass")
        sweep.check("wait_ms text", "GET", f"/jobs/999999?wait_ms={value}", (404, 422))

    any_text()
    with connect(sweep.dsn) as conn:
        flagged = conn.execute("SELECT count(*) AS n FROM deadman.jobs WHERE waited").fetchone()
    assert flagged is not None and flagged["n"] == 0, "a refused long-poll flagged a job"


def test_hostile_bodies_on_every_creating_route(sweep: _Sweep) -> None:
    for route in BODY_ROUTES:
        sweep.control("POST", route, _as_body(route, _job(b', "payload": {"a": [1]}')))
        for what, job, statuses in BAD_JOBS:
            body = _as_body(route, job)
            sweep.check(what, "POST", route, statuses, content=body, headers=JSON_HEADERS)
        for what, body, statuses in BAD_BODIES:
            sweep.check(what, "POST", route, statuses, content=body, headers=JSON_HEADERS)
        for content_type in BAD_CONTENT_TYPES:
            headers = {} if content_type is None else {"Content-Type": content_type}
            good = _as_body(route, _job(b""))
            sweep.check(
                f"content type {content_type!r}",
                "POST",
                route,
                (415,),
                content=good,
                headers=headers,
            )


def test_hostile_idempotency_keys(sweep: _Sweep) -> None:
    for route in ("/jobs", "/workflows", "/jobs/batch"):
        for key in BAD_KEYS:
            headers = {**JSON_HEADERS, "Idempotency-Key": key}
            body = _as_body(route, _job(b""))
            sweep.check(f"key {key!r}", "POST", route, (422,), content=body, headers=headers)
    # a key already holding a job, sent with another body
    headers = {**JSON_HEADERS, "Idempotency-Key": "seed-dead"}
    sweep.check("key reused", "POST", "/jobs", (422,), content=_job(b""), headers=headers)


def test_unknown_and_invented_methods_on_every_route(sweep: _Sweep) -> None:
    for template, methods in API_ROUTES:
        path = template.replace("{id}", "1").replace("{name}", "q")
        for method in ("PUT", "PATCH", "DELETE", "TRACE", "FOO", "G\xc9T"[:1] + "ETX"):
            if method not in methods:
                sweep.check(f"method {method}", method, path, (405,))


def test_bad_bearer_tokens_on_every_route(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base:
        s = _Sweep(base, db_dsn)
        s.http.close()
        s.http = httpx.Client(base_url=base, timeout=30)
        for template, methods in API_ROUTES:
            if template == "/health":
                continue
            path = template.replace("{id}", "1").replace("{name}", "q")
            for method in methods:
                for auth in (
                    None,
                    "",
                    "Bearer",
                    f"Bearer {TOKEN}x",
                    f"Bearer {TOKEN[:-1]}",
                    f"Basic {TOKEN}",
                    f"Bearer {TOKEN} {TOKEN}",
                    "Bearer " + "x" * 10_000,
                    b"Bearer \xff\xfe",
                    b"Bearer \xc2\xb2",
                    f"Bearer\t{TOKEN}x",
                ):
                    headers = {} if auth is None else {"Authorization": auth}
                    body = _job(b"") if method == "POST" else None
                    s.check(
                        f"auth {auth!r:.30}",
                        method,
                        path,
                        (401,),
                        content=body,
                        headers={**headers, **JSON_HEADERS},
                    )
        s.http.close()
        s.assert_unchanged("end")
    assert not s.failures, "\n".join(s.failures)


def test_protocol_level_garbage_never_reaches_a_500(db_dsn: str) -> None:
    """Bytes no HTTP client library would send: the server (uvicorn's parser, or our
    middleware behind it) refuses them with a 4xx, and keeps serving."""
    requests = [
        b"GET /jobs/\xff HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /jobs?cursor=\xc2\xb2 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: \xc2\xb2\r\n\r\n{}",
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}",
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: -1\r\n\r\n{}",
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"GET /jobs HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        b"GET /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\r\n\r\n",
        # a Host that urlsplit cannot parse ("Invalid IPv6 URL")
        b"GET /nope HTTP/1.1\r\nHost: [\r\n\r\n",
        b"PUT /jobs HTTP/1.1\r\nHost: [::1\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\n\r\n",
        b"POST /ui/login HTTP/1.1\r\nHost: [\r\nOrigin: http://[\r\nContent-Length: 0\r\n\r\n",
    ]
    with serve(make_app(db_dsn, api_token=TOKEN)) as base:
        before = _db_snapshot(db_dsn)
        for raw in requests:
            # close after the answer, so reading to the end takes no keep-alive timeout
            head, _, body = raw.partition(b"\r\n\r\n")
            answer = _raw_request(base, head + b"\r\nConnection: close\r\n\r\n" + body)
            status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
            assert 400 <= status < 500, (raw[:60], answer[:200])
        with client(base) as c:
            assert c.get("/health").status_code == 200
        assert _db_snapshot(db_dsn) == before


def _route_templates() -> list[tuple[str, str]]:
    return [(m, t) for t, methods in API_ROUTES for m in methods if "{" in t or t == "/jobs"]


def test_any_text_in_any_path_or_query_parameter_is_a_4xx_problem(sweep: _Sweep) -> None:
    """Hypothesis over every parameterised route: any text (surrogates, controls,
    other scripts' digits, huge) in the path parameter or a query parameter of
    GET /jobs gets a 4xx problem, never a 500, and changes nothing."""
    routes = _route_templates()

    @given(
        route=st.sampled_from(routes),
        text=st.text(min_size=1, max_size=40) | st.sampled_from(["9" * 4301, "\u00b2", "\ud800"]),
        query=st.sampled_from(["state", "type", "queue", "limit", "cursor"]),
    )
    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    def run(route: tuple[str, str], text: str, query: str) -> None:
        method, template = route
        value = quote(text, safe="", errors="surrogatepass")
        if template == "/jobs" and method == "GET":
            path = f"/jobs?{query}={value}"
        elif template == "/jobs":
            return  # POST /jobs has no parameter outside its body
        else:
            path = template.replace("{id}", value).replace("{name}", value)
        # a PUT (a limit) with a well-formed key and no body: 415, the body is missing
        wanted = (404, 409, 415, 422) if method == "PUT" else (404, 409, 422)
        sweep.check("hypothesis", method, path, wanted, valid_ok=True)

    run()
    assert sweep.sent >= 100


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["\x00", "\ud800", "\udfff\ud800", "\u00b2", "\ufeff"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def test_any_json_payload_is_stored_or_refused_with_a_4xx(sweep: _Sweep) -> None:
    """Hypothesis: any JSON value (NaN, Infinity, 400-digit integers, NUL, lone
    surrogates, BOMs, as payload, as a field of the job, or as the whole body) on
    every creating route is a 201 or a 400/422 problem, never a 500."""

    @given(
        route=st.sampled_from(BODY_ROUTES),
        value=_JSON_VALUES,
        where=st.sampled_from(["payload", "max_attempts", "queue", "depends_on", "body"]),
    )
    @settings(max_examples=120, deadline=None, database=None, derandomize=True)
    def run(route: str, value: Any, where: str) -> None:
        text = json.dumps(value, allow_nan=True).encode()
        job = text if where == "body" else _job(b', "' + where.encode() + b'": ' + text)
        sweep.check(
            f"json {where}",
            "POST",
            route,
            (400, 422),
            content=_as_body(route, job) if where != "body" else text,
            headers=JSON_HEADERS,
            valid_ok=True,
        )

    run()


# ------------------------------------------------------------- trace context headers

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: traceparent headers W3C says to ignore: each job is created (201) without a context
BAD_TRACEPARENTS: list[str | bytes] = [
    "garbage",
    TRACEPARENT.upper(),
    TRACEPARENT[:-1],
    TRACEPARENT + "-extra",
    "ff" + TRACEPARENT[2:],
    "00-" + "0" * 32 + TRACEPARENT[35:],
    TRACEPARENT[:36] + "0" * 16 + "-01",
    TRACEPARENT.replace("-", "_"),
    "cc" + TRACEPARENT[2:] + "-" + "x" * 600,  # a later version, but over TRACEPARENT_MAX
    "x" * 8000,
    b"00-\xc2\xb2" + TRACEPARENT[5:].encode(),
    b"\xff\xfe" * 40,
    TRACEPARENT[:-2].encode() + "\u00b2\u00b2".encode(),  # '²²' as UTF-8
    "%00" + TRACEPARENT,
    "'; DROP TABLE deadman.jobs; --",
]
#: tracestate headers dropped whole beside a valid traceparent (which stays)
BAD_TRACESTATES: list[str | bytes] = [
    "a=1,a=2",
    "A=1",
    "a=",
    "=1",
    "a=1," * 33,
    "a=" + "x" * 300,
    ",".join(f"k{i}={'v' * 40}" for i in range(20)),
    b"a=\xff",
    "x" * 8000,
]


def _header(name: str, value: str | bytes) -> tuple[bytes, bytes]:
    return name.encode(), value if isinstance(value, bytes) else value.encode()


def _trace_contexts(dsn: str) -> list[Any]:
    with connect(dsn) as conn:
        rows = conn.execute("SELECT trace_context FROM deadman.jobs ORDER BY id").fetchall()
    return [r["trace_context"] for r in rows]


def test_a_malformed_traceparent_is_ignored_not_refused(db_dsn: str) -> None:
    """W3C: a traceparent that does not parse restarts the trace. The job is created
    as if the header were absent, on both creating routes; so is one sent twice, and a
    tracestate without a valid traceparent."""
    cases = [[_header("traceparent", v)] for v in BAD_TRACEPARENTS]
    cases += [
        [_header("traceparent", TRACEPARENT), _header("traceparent", TRACEPARENT)],
        [_header("tracestate", "a=1")],
        [_header("traceparent", "garbage"), _header("tracestate", "a=1")],
    ]
    with serve(make_app(db_dsn)) as base, client(base) as c:
        for headers in cases:
            one = c.post("/jobs", json=new_job(), headers=headers)
            batch = c.post("/jobs/batch", json={"jobs": [new_job()]}, headers=headers)
            assert (one.status_code, batch.status_code) == (201, 201), (headers, one.text)
            assert one.json()["trace_context"] is None, headers
            assert batch.json()["jobs"][0]["trace_context"] is None, headers
    assert _trace_contexts(db_dsn) == [None] * (2 * len(cases))


def test_a_malformed_tracestate_is_dropped_and_the_traceparent_kept(db_dsn: str) -> None:
    with serve(make_app(db_dsn)) as base, client(base) as c:
        for state in BAD_TRACESTATES:
            headers = [_header("traceparent", TRACEPARENT), _header("tracestate", state)]
            r = c.post("/jobs", json=new_job(), headers=headers)
            assert r.status_code == 201, (state, r.text)
            assert r.json()["trace_context"] == {"traceparent": TRACEPARENT}, state
    assert _trace_contexts(db_dsn) == [{"traceparent": TRACEPARENT}] * len(BAD_TRACESTATES)


def test_a_replay_from_another_trace_is_still_a_replay(db_dsn: str) -> None:
    """The trace context is not part of the request: the same key and body sent from
    another trace (or none) is the same job, which keeps the context it was made in."""
    key = {"Idempotency-Key": "traced"}
    other = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    with serve(make_app(db_dsn)) as base, client(base) as c:
        first = c.post("/jobs", json=new_job(), headers={**key, "traceparent": TRACEPARENT})
        again = c.post("/jobs", json=new_job(), headers={**key, "traceparent": other})
        bare = c.post("/jobs", json=new_job(), headers=key)
    assert first.status_code == 201 and (again.status_code, bare.status_code) == (200, 200)
    assert again.json() == bare.json() == first.json()
    assert first.json()["trace_context"] == {"traceparent": TRACEPARENT}


_VALID_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
#: what a client library can put in a header value: no controls but tab, no edge spaces
_HEADER_BYTES = st.binary(max_size=700).map(
    lambda b: bytes(c for c in b if c == 9 or (c >= 0x20 and c != 0x7F)).strip(b" \t")
)


def _mutated(text: str) -> st.SearchStrategy[bytes]:
    """``text`` with one character replaced by any byte a header may hold."""
    return st.builds(
        lambda i, c: (text[:i] + chr(c) + text[i + 1 :]).encode("latin-1").strip(b" \t"),
        st.integers(0, len(text) - 1),
        st.integers(0x20, 0xFF).filter(lambda c: c != 0x7F),
    )


def test_any_trace_header_is_stored_checked_or_not_at_all(db_dsn: str) -> None:
    """Hypothesis: any traceparent and tracestate bytes, random or one byte off a valid
    header, give a 201; what is stored is a well-formed context within its bounds, or
    nothing."""
    seen: list[bool] = []
    with serve(make_app(db_dsn)) as base, client(base) as c:

        @given(
            parent=_HEADER_BYTES | _mutated(TRACEPARENT),
            state=st.none() | _HEADER_BYTES | _mutated("rojo=00f067aa0ba902b7,congo=t61rc"),
        )
        @settings(max_examples=150, deadline=None, database=None, derandomize=True)
        def run(parent: bytes, state: bytes | None) -> None:
            headers = [_header("traceparent", parent)]
            headers += [] if state is None else [_header("tracestate", state)]
            r = c.post("/jobs", json=new_job(), headers=headers)
            assert r.status_code == 201, r.text
            stored = r.json()["trace_context"]
            seen.append(stored is not None)
            if stored is not None:
                assert _VALID_TRACEPARENT.fullmatch(stored["traceparent"]), stored
                assert set(stored) <= {"traceparent", "tracestate"}
                assert len(stored.get("tracestate", "")) <= 512

        run()
    assert True in seen and False in seen, "the examples never stored a context, or always"
