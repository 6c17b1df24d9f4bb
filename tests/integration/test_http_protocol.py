"""deadman.api.protocol on a real server, over raw sockets: what llhttp refuses still
gets the app's problem, on the same connection, however the bytes arrive. (Each of
these fails on uvicorn's own httptools protocol; the corked writes are
tests/unit/test_corked_transport.py's.)"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.factories import connect
from tests.helpers.api import make_app, serve


@contextmanager
def _connection(base_url: str) -> Iterator[socket.socket]:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        yield sock


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response: status, headers, body (to the close when it has no
    Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if "content-length" not in headers:
        while chunk := sock.recv(65536):
            body += chunk
        return status, headers, body
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    assert len(body) == length, "more bytes than the response's length"
    return status, headers, body


def _get_health(sock: socket.socket) -> None:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    status, _, _ = _read_response(sock)
    assert status == 200


def test_an_invented_method_gets_the_apps_problem_and_the_connection_goes_on(db_dsn: str) -> None:
    with serve(make_app(db_dsn)) as base, _connection(base) as sock:
        _get_health(sock)  # llhttp parsed this one
        for method in (b"FOO", b"PROPFIND", b"get", b"X" * 40):
            sock.sendall(method + b" /jobs HTTP/1.1\r\nHost: t\r\n\r\n")
            status, headers, body = _read_response(sock)
            assert status == 405, (method, status, body)
            assert headers["content-type"] == "application/problem+json", headers
            assert json.loads(body)["status"] == 405
            assert set(headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
            _get_health(sock)  # the same connection, now h11's, serves on


def test_a_method_that_is_no_token_is_a_bad_request_as_before(db_dsn: str) -> None:
    """Not a method at all (RFC 9110 tokens are ASCII): h11 refuses it, 400, closed."""
    with serve(make_app(db_dsn)) as base, _connection(base) as sock:
        sock.sendall(b"G\xc9T /jobs HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, _ = _read_response(sock)
        assert status == 400
        assert sock.recv(65536) == b"", "the connection is closed"


def test_a_method_sent_a_byte_at_a_time_is_still_judged_whole(db_dsn: str) -> None:
    with serve(make_app(db_dsn)) as base:
        for request in (
            b"FOO /jobs HTTP/1.1\r\nHost: t\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
        ):
            with _connection(base) as sock:
                for i in range(12):  # the request line's first bytes, one per send
                    sock.sendall(request[i : i + 1])
                    time.sleep(0.002)  # a gap, so each byte is its own chunk
                sock.sendall(request[12:])
                status, _, _ = _read_response(sock)
                assert status == (405 if request.startswith(b"FOO") else 200)


def test_an_invented_method_pipelined_behind_a_request_is_refused_not_misparsed(
    db_dsn: str,
) -> None:
    """Behind another message in one chunk, llhttp judges it: the request before it
    is answered, then the connection closes (no answer is cut off: uvicorn's own
    protocol wrote a 400 at once, even over a POST the app was storing)."""
    job = json.dumps({"type": "noop"}).encode()
    post = (
        b"POST /jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(job), job)
    )
    with serve(make_app(db_dsn)) as base, _connection(base) as sock:
        sock.sendall(post + b"FOO /jobs HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, body = _read_response(sock)
        assert status == 201, body
        stored = json.loads(body)["id"]
        assert sock.recv(65536) == b"", "closed after the answered request"
    with connect(db_dsn) as conn:
        row = conn.execute("SELECT type FROM deadman.jobs WHERE id = %s", (stored,)).fetchone()
    assert row is not None and row["type"] == "noop"
