"""Bad input and hard times: every error is an RFC 9457 problem with the right status,
and none is a 500 (the test client fails any test that provokes one)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from deadman.api.routes_ops import READY_TIMEOUT_S
from tests.factories import connect, insert_job
from tests.helpers import wait_for
from tests.helpers.api import (
    JSON,
    api_client,
    assert_problem,
    client,
    error_fields,
    make_app,
    new_job,
    serve,
)

# ---------------------------------------------------------------------------- bodies


def test_malformed_json_is_400(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        for raw in (
            b"{",
            b"",
            b"   ",
            b'{"type": "noop",}',
            b"NaN",
            b'{"type": "noop", "payload": Infinity}',
            b'{"type": "noop", "payload": "\xff\xfe"}',  # not UTF-8
            b"\xef\xbb\xbf{}",  # a BOM: not JSON
        ):
            body = assert_problem(c.post("/jobs", content=raw, headers=JSON), 400, "malformed-json")
            assert body["detail"]
        assert_problem(c.post("/jobs/batch", content=b"[", headers=JSON), 400, "malformed-json")


def test_wrong_content_type_is_415_with_accept_post(db_dsn: str) -> None:
    body = json.dumps(new_job()).encode()
    with api_client(db_dsn) as c:
        for content_type in (
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json-patch+json",
            "application/json; charset=latin-1",
            None,
        ):
            headers = {"Content-Type": content_type} if content_type else {}
            r = c.post("/jobs", content=body, headers=headers)
            assert_problem(r, 415, "unsupported-media-type")
            assert r.headers["accept-post"] == "application/json"
        ok = c.post(
            "/jobs", content=body, headers={"Content-Type": "Application/JSON; charset=UTF-8"}
        )
        assert ok.status_code == 201
        assert_problem(
            c.post("/jobs/batch", content=b"{}", headers={"Content-Type": "text/csv"}), 415
        )


SCHEMA_VIOLATIONS: list[tuple[dict[str, Any], set[str]]] = [
    ({"payload": 1}, {"type"}),
    ({"type": ""}, {"type"}),
    ({"type": "has space"}, {"type"}),
    ({"type": "x" * 129}, {"type"}),
    ({"type": 5}, {"type"}),
    ({"type": "ok", "queue": "bad/queue"}, {"queue"}),
    ({"type": "ok", "queue": None}, {"queue"}),
    ({"type": "ok", "priority": 101}, {"priority"}),
    ({"type": "ok", "priority": -101}, {"priority"}),
    ({"type": "ok", "priority": "1"}, {"priority"}),
    ({"type": "ok", "priority": True}, {"priority"}),
    ({"type": "ok", "priority": 1.5}, {"priority"}),
    ({"type": "ok", "max_attempts": 0}, {"max_attempts"}),
    ({"type": "ok", "max_attempts": 101}, {"max_attempts"}),
    ({"type": "ok", "max_attempts": None}, {"max_attempts"}),
    ({"type": "ok", "backoff": "fast"}, {"backoff"}),
    ({"type": "ok", "backoff": {"strategy": "linear"}}, {"backoff.strategy"}),
    ({"type": "ok", "backoff": {"jitter": "half"}}, {"backoff.jitter"}),
    ({"type": "ok", "backoff": {"base_ms": -1}}, {"backoff.base_ms"}),
    ({"type": "ok", "backoff": {"base_ms": 500, "max_ms": 100}}, {"backoff.max_ms"}),
    ({"type": "ok", "backoff": {"factor": 2}}, {"backoff.factor"}),
    ({"type": "ok", "run_at": "2030-01-01T00:00:00"}, {"run_at"}),  # no offset
    ({"type": "ok", "run_at": "2030-01-01"}, {"run_at"}),
    ({"type": "ok", "run_at": "2030-02-30T00:00:00Z"}, {"run_at"}),
    ({"type": "ok", "run_at": "tomorrow"}, {"run_at"}),
    ({"type": "ok", "run_at": "0001-01-01T00:00:00+01:00"}, {"run_at"}),
    ({"type": "ok", "run_at": "2030-01-01T00:00:00Z", "delay_ms": 5}, {"delay_ms"}),
    ({"type": "ok", "delay_ms": -1}, {"delay_ms"}),
    ({"type": "ok", "delay_ms": 10**15}, {"delay_ms"}),
    ({"type": "ok", "timeout_ms": 0}, {"timeout_ms"}),
    ({"type": "ok", "timeout_ms": 2**31}, {"timeout_ms"}),
    ({"type": "ok", "idempotency_key": "k"}, {"idempotency_key"}),  # header only here
    ({"type": "ok", "surprise": 1}, {"surprise"}),
    ({"type": "ok", "payload": {"text": "nul \u0000 inside"}}, {"payload.text"}),
    ({"type": "ok", "payload": ["\ud800"]}, {"payload[0]"}),  # an unpaired surrogate
    ({"type": "ok", "payload": {"\u0000key": 1}}, {'payload["\\u0000key"]'}),
    ({"type": "ok", "payload": [1e999]}, {"payload[0]"}),  # overflows to infinity
    (
        {"type": "bad type", "priority": 500, "backoff": {"strategy": "x"}},
        {"type", "priority", "backoff.strategy"},
    ),
]


def test_schema_violations_are_422_naming_every_field(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        for body, fields in SCHEMA_VIOLATIONS:
            # json.dumps writes 1e999 as Infinity, which is not JSON; send the literal
            raw = json.dumps(body).replace("Infinity", "1e999").encode()
            r = c.post("/jobs", content=raw, headers=JSON)
            assert error_fields(r) == fields, (body, r.text)
            problem = r.json()
            assert problem["type"].endswith(":validation")
            assert all(e["message"] for e in problem["errors"])
        for not_an_object in (b"[]", b'"job"', b"1", b"null"):
            r = c.post("/jobs", content=not_an_object, headers=JSON)
            assert error_fields(r) == {"body"}
        assert error_fields(c.post("/jobs", content=b"1" * 5000, headers=JSON)) == {"body"}
        # integral floats are integers, as in JSON Schema
        assert c.post("/jobs", json=new_job(priority=5.0)).json()["priority"] == 5


def _nested(depth: int) -> bytes:
    return b'{"type": "noop", "payload": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_absurdly_deep_json_is_422_never_a_recursion_error(db_dsn: str) -> None:
    with api_client(db_dsn, max_payload_bytes=4 * 1024 * 1024) as c:
        assert c.post("/jobs", content=_nested(64), headers=JSON).status_code == 201
        for depth in (65, 5_000, 1_000_000):  # the last overflows Python's json parser
            r = c.post("/jobs", content=_nested(depth), headers=JSON)
            assert "nested deeper than 64 levels" in r.text
            assert_problem(r, 422, "validation")
        deep_batch = b'{"jobs": [' + _nested(70) + b"]}"
        assert_problem(c.post("/jobs/batch", content=deep_batch, headers=JSON), 422)


# ---------------------------------------------------------------------------- size


def _raw_exchange(base_url: str, request: bytes) -> bytes:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            if b"\r\n\r\n" in b"".join(chunks) and b"}" in data:
                break
        return b"".join(chunks)


def test_body_over_the_limit_is_413_before_it_is_read(db_dsn: str) -> None:
    with serve(make_app(db_dsn, max_payload_bytes=1024)) as base_url, client(base_url) as c:
        # A declared length over the limit is answered without sending any body at all:
        # the server cannot have waited for it.
        answer = _raw_exchange(
            base_url,
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n",
        )
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), answer
        assert b"application/problem+json" in head
        assert json.loads(body)["status"] == 413

        # A chunked body (no length) is counted as it streams and cut off at the limit.
        sent = 0

        def stream() -> Iterator[bytes]:
            nonlocal sent
            yield b'{"type": "noop", "payload": "'
            for _ in range(64):
                sent += 512
                yield b"x" * 512
            yield b'"}'

        r = c.post("/jobs", content=stream(), headers=JSON)
        assert_problem(r, 413, "content-too-large")
        ok = c.post("/jobs", json=new_job(payload="x" * 900))
        assert ok.status_code == 201
        assert_problem(c.post("/jobs", json=new_job(payload="x" * 1100)), 413)
        assert_problem(c.post("/jobs/batch", json={"jobs": [new_job(payload="x" * 1100)]}), 413)


# ---------------------------------------------------------------------------- auth


def test_bearer_token_guards_everything_but_health(
    db_dsn: str, capfd: pytest.CaptureFixture[str]
) -> None:
    token = "s3cr3t-token-value"
    with serve(make_app(db_dsn, api_token=token)) as base_url, client(base_url) as c:
        assert c.get("/health").status_code == 200
        for method, path in (
            ("GET", "/jobs"),
            ("POST", "/jobs"),
            ("GET", "/jobs/1"),
            ("POST", "/jobs/batch"),
            ("GET", "/queues"),
            ("GET", "/workers"),
            ("GET", "/stats"),
            ("GET", "/ready"),
            ("GET", "/metrics"),
            ("GET", "/openapi.json"),
            ("GET", "/no-such-route"),
        ):
            for auth in (None, "Bearer wrong", f"Basic {token}", "Bearer", f"bearer {token}x"):
                headers = {"Authorization": auth} if auth else {}
                r = c.request(method, path, headers=headers, json=new_job())
                assert_problem(r, 401, "unauthorized")
                assert r.headers["www-authenticate"].startswith("Bearer")
        good = {"Authorization": f"Bearer {token}"}
        assert c.post("/jobs", json=new_job(), headers=good).status_code == 201
        assert c.get("/jobs", headers=good).status_code == 200
        assert c.get("/jobs", headers={"Authorization": f"bearer {token}"}).status_code == 200
        spec = c.get("/openapi.json", headers=good).json()
        assert spec["security"] == [{"bearerAuth": []}]
    out, err = capfd.readouterr()
    assert token not in out + err


# ---------------------------------------------------------------------------- 429


def test_a_queue_at_its_cap_answers_429_with_retry_after(db_dsn: str) -> None:
    with api_client(db_dsn, max_queue_depth=2) as c:
        first = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": "first"})
        assert first.status_code == 201
        assert c.post("/jobs", json=new_job()).status_code == 201
        r = c.post("/jobs", json=new_job())
        assert_problem(r, 429, "queue-full")
        assert int(r.headers["retry-after"]) > 0
        batch = c.post("/jobs/batch", json={"jobs": [new_job(queue="other"), new_job()]})
        assert_problem(batch, 429, "queue-full")
        # other queues are not affected, and an acknowledged request replays
        assert c.post("/jobs", json=new_job(queue="other")).status_code == 201
        again = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": "first"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        # running and finished jobs do not count; cancelling one frees a place
        c.post(f"/jobs/{first.json()['id']}/cancel")
        assert c.post("/jobs", json=new_job()).status_code == 201
        assert_problem(c.post("/jobs", json=new_job()), 429)


# ---------------------------------------------------------------------------- 503


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_database_unreachable_is_503_and_the_server_still_starts() -> None:
    dsn = f"host=127.0.0.1 port={_closed_port()} dbname=nothing user=nobody connect_timeout=1"
    app = make_app(dsn, pool_timeout_s=0.3)
    with serve(app) as base_url, client(base_url) as c:
        assert c.get("/health").status_code == 200
        for method, path in (
            ("GET", "/ready"),
            ("POST", "/jobs"),
            ("POST", "/jobs/batch"),
            ("GET", "/jobs"),
            ("GET", "/jobs/1"),
            ("POST", "/jobs/1/cancel"),
            ("GET", "/queues"),
            ("GET", "/stats"),
        ):
            body = {"jobs": [new_job()]} if path == "/jobs/batch" else new_job()
            r = c.request(method, path, json=body)
            assert_problem(r, 503, "database-unavailable")
            assert int(r.headers["retry-after"]) > 0
        metrics = c.get("/metrics")
        assert metrics.status_code == 200
        assert "deadman_api_database_up 0.0" in metrics.text


def test_pool_exhausted_is_503_then_recovers(db_dsn: str) -> None:
    """One pooled connection, held by a cancel stuck behind a row lock: the next
    request cannot get a connection in time and is answered 503, not left hanging."""
    with connect(db_dsn) as conn:
        job = insert_job(conn, state="queued")
    result: dict[str, httpx.Response] = {}
    app = make_app(db_dsn, pool_max_size=1, pool_timeout_s=0.5)
    with serve(app) as base_url, client(base_url) as c, psycopg.connect(db_dsn) as locker:
        assert c.get("/ready").status_code == 200
        locker.execute("SELECT 1 FROM deadman.jobs WHERE id = %s FOR UPDATE", (job.id,))
        stuck = threading.Thread(
            target=lambda: result.setdefault("cancel", c.post(f"/jobs/{job.id}/cancel"))
        )
        stuck.start()
        with connect(db_dsn) as watcher:
            wait_for(
                lambda: watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone(),
                timeout=10,
                message="the cancel to hold the only connection",
            )
        with client(base_url) as other:
            r = other.get("/stats")
            assert_problem(r, 503, "database-unavailable")
            assert "retry-after" in r.headers
        locker.rollback()
        stuck.join(timeout=10)
        assert result["cancel"].status_code == 200
        assert c.get("/stats").status_code == 200


def test_ready_is_503_when_migrations_are_not_current(db_dsn: str) -> None:
    with api_client(db_dsn) as c, connect(db_dsn) as conn:
        ready = c.get("/ready")
        assert ready.status_code == 200
        current = ready.json()["schema_version"]
        conn.execute("DELETE FROM deadman.schema_migrations WHERE version = %s", (current,))
        assert_problem(c.get("/ready"), 503, "not-ready")
        conn.execute(
            "INSERT INTO deadman.schema_migrations (version, name) VALUES (%s, 'x'), (999, 'y')",
            (current,),
        )
        body = assert_problem(c.get("/ready"), 503, "not-ready")
        assert "999" in body["detail"]
        conn.execute("DELETE FROM deadman.schema_migrations WHERE version = 999")
        assert c.get("/ready").status_code == 200


def test_ready_answers_503_within_a_probe_timeout_while_the_database_is_down() -> None:
    """/ready used to wait the pool's whole timeout (30 s here) before its 503, past a
    probe's usual 1 s timeout: the probe saw a hung server, not an unready one. It now
    waits READY_TIMEOUT_S, under a second; the bound on the answer leaves room for a
    stall of the loaded test machine and is still far from the pool's timeout."""
    assert READY_TIMEOUT_S < 1.0
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres?connect_timeout=1"
    with api_client(dsn, pool_timeout_s=30.0) as c:
        started = time.monotonic()
        r = c.get("/ready")
        took = time.monotonic() - started
    assert_problem(r, 503, "database-unavailable")
    assert took < READY_TIMEOUT_S + 4.0, took


# ---------------------------------------------------------------------------- routes


def test_unknown_routes_and_methods_are_problems(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        assert_problem(c.get("/nope"), 404, "not-found")
        assert_problem(c.get("/jobs/1/nope"), 404, "not-found")
        r = c.delete("/jobs")
        assert_problem(r, 405, "method-not-allowed")
        assert set(r.headers["allow"].split(", ")) >= {"GET", "POST"}
        assert_problem(c.put("/jobs/1"), 405)
        assert_problem(c.get("/jobs/1/cancel"), 405)
        assert_problem(c.get("/queues/default/pause"), 405)


# ---------------------------------------------------------------------------- injection


def test_injection_attempts_get_422_404_or_nothing(db_dsn: str) -> None:
    attacks = [
        "x' OR '1'='1",
        "default; DROP TABLE deadman.jobs; --",
        "1 UNION SELECT * FROM pg_authid",
        "queued' --",
        "%' OR 1=1 --",
    ]
    with api_client(db_dsn) as c:
        made = c.post("/jobs", json=new_job(payload={"sql": attacks[1]})).json()
        for attack in attacks:
            for name in ("state", "type", "queue", "cursor", "limit"):
                assert name in error_fields(c.get("/jobs", params={name: attack}))
            path_attack = attack.replace("/", "%2F")
            assert_problem(c.get(f"/jobs/{path_attack}"), 404)
            assert_problem(c.post(f"/jobs/{path_attack}/cancel"), 404)
            r = c.post(f"/queues/{path_attack}/pause")
            assert r.status_code in (404, 422), r.text
        # names that are valid but match nothing: an empty page, not an error
        assert c.get("/jobs", params={"type": "x_OR_1"}).json()["jobs"] == []
        assert c.get(f"/jobs/{made['id']}").json()["payload"] == {"sql": attacks[1]}
    with connect(db_dsn) as conn:
        row = conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone()
        assert row is not None and row["n"] == 1


def test_no_request_takes_long_when_the_pool_is_healthy(db_dsn: str) -> None:
    """A sanity bound, not a benchmark: 50 submissions over keep-alive well within 10 s
    (a blocked event loop or a per-request connection would blow it)."""
    with api_client(db_dsn) as c:
        start = time.monotonic()
        for i in range(50):
            assert c.post("/jobs", json=new_job(payload=i)).status_code == 201
        assert time.monotonic() - start < 10
