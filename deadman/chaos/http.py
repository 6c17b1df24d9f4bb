"""``--submit http``: the jobs go through a real ``deadman serve`` process.

The harness owns one API server (its own process, on 127.0.0.1, with a queue depth
cap so that producers running ahead of the fleet meet 429) and submits with the
standard library's HTTP client, in ``POST /jobs/batch`` requests of 1000 jobs, each
job carrying its idempotency key. A batch counts as acknowledged when a 201 (or a
200 replay) came back. With the limits scenario the limits are set first, with
``PUT /limits/{key}``.

With the submission-faults scenario, chosen batches (seeded) also suffer:

- a client-side timeout: the request is sent whole, then the client stops waiting
  for the answer after a millisecond and sends it again. The first send usually
  committed; the resend must come back as a replay, never as new jobs;
- a duplicate: an acknowledged batch is sent again, and one of its jobs is sent again
  alone as ``POST /jobs`` with ``Idempotency-Key``: both must be answered as replays
  (200, ``Idempotent-Replayed: true``) with the same job ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from deadman.chaos.limits import KeyLimit
from deadman.chaos.submit import SubmitRun, SubmitterBase
from deadman.chaos.workers import vm_hwm_kib

BATCH = 1000  # the API's MAX_BATCH
#: Cap on honouring Retry-After (the API says 5 s after a 429): the run must not
#: sleep longer than the fleet needs to drain a batch.
MAX_RETRY_AFTER_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ApiServer:
    """``deadman serve`` on a free 127.0.0.1 port, owned by the harness; ``depth_cap``
    None: no DEADMAN_MAX_QUEUE_DEPTH."""

    def __init__(
        self,
        dsn: str,
        log_dir: Path,
        depth_cap: int | None,
        name: str = "api",
        prefix: Sequence[str] = (),
        host: str = "127.0.0.1",
    ) -> None:
        self.dsn = dsn
        # prefix/host: run it on another "host" (deadman/chaos/hosts.py), at its address
        self.prefix = tuple(prefix)
        self.host = host
        self.port = _free_port()
        self.log_path = log_dir / f"{name}.log"
        self.depth_cap = depth_cap
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_kib = 0

    def start(self, timeout: float = 30.0) -> None:
        env = dict(
            os.environ,
            DEADMAN_DATABASE_URL=make_conninfo(self.dsn, application_name="deadman-chaos-api"),
            DEADMAN_MAX_QUEUE_DEPTH="off" if self.depth_cap is None else str(self.depth_cap),
            DEADMAN_LOG_LEVEL="warning",
            DEADMAN_LOG_FORMAT="json",
        )
        argv = [*self.prefix, sys.executable, "-m", "deadman", "serve", "--host", self.host]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*argv, "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("GET", "/ready")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            time.sleep(0.1)
        raise RuntimeError(f"`deadman serve` did not become ready; see {self.log_path}")

    def sample_rss(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss_kib = max(self.peak_rss_kib, vm_hwm_kib(self.proc.pid) or 0)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.sample_rss()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class _Timeout(Exception):
    """The client stopped waiting for the answer on purpose."""


class ApiClient:
    """One keep-alive connection to the harness's API server (reopened after any
    trouble), counting the statuses it got. Not thread-safe: one per thread."""

    def __init__(self, port: int, timeout: float = 60.0, host: str = "127.0.0.1") -> None:
        self.port = port
        self.host = host
        self.timeout = timeout
        self.statuses: dict[int, int] = {}
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        give_up_after: float | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """(status, lower-cased headers, parsed JSON body or None). OSError and
        HTTPException propagate; ``give_up_after`` seconds without an answer raise
        _Timeout (the request itself was sent whole)."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        conn = self._conn
        try:
            conn.request(
                method, path, body, {"Content-Type": "application/json", **(headers or {})}
            )
            if give_up_after is not None and conn.sock is not None:
                conn.sock.settimeout(give_up_after)
            resp = conn.getresponse()
            data = resp.read()
        except TimeoutError as exc:
            self.close()
            raise _Timeout() from exc
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if give_up_after is not None and conn.sock is not None:
            conn.sock.settimeout(self.timeout)
        self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return resp.status, hdrs, parsed

    async def answer(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """From async code: ``body`` sent as JSON on a thread (the client blocks);
        (status, parsed body), status 0 when no answer came."""
        data = None if body is None else json.dumps(body).encode()
        try:
            status, _, parsed = await asyncio.to_thread(
                self.request, method, path, data, dict(headers or {})
            )
        except (OSError, http.client.HTTPException):
            return 0, None
        return status, parsed


class HttpSubmitter(SubmitterBase):
    """Submits every job through the API; same interface as the client Submitter."""

    def __init__(
        self,
        api: ApiServer,
        run: SubmitRun,
        *,
        job_fields: dict[str, Any],
        faults: bool,
    ) -> None:
        super().__init__("chaos-http-submitter", run)
        self.api = api
        self.job_fields = job_fields
        self.faults = faults
        self.client = ApiClient(api.port, host=api.host)
        self.statuses = self.client.statuses
        self.client_timeouts = 0
        self.duplicates_sent = 0
        self.replays_ok = 0
        self.replays_wrong: list[str] = []

    # -- HTTP ------------------------------------------------------------------------

    def _post(
        self, path: str, body: bytes, headers: dict[str, str], give_up_after: float | None = None
    ) -> tuple[int, dict[str, str], Any]:
        return self.client.request("POST", path, body, headers, give_up_after)

    def _send_until_acked(self, body: bytes) -> tuple[int, dict[str, str], Any]:
        """Send until 201/200; 429 and 503 wait (Retry-After), other trouble resends."""
        while True:
            if self.stop.is_set() or time.monotonic() > self.deadline:
                raise RuntimeError("submission stopped before every batch was acknowledged")
            try:
                status, hdrs, parsed = self._post("/jobs/batch", body, {})
            except (OSError, http.client.HTTPException, _Timeout):
                self.resends += 1
                time.sleep(0.2)
                continue
            if status in (200, 201):
                return status, hdrs, parsed
            if status in (429, 503):
                self.resends += 1
                wait = float(hdrs.get("retry-after", "1") or 1)
                self.stop.wait(min(wait, MAX_RETRY_AFTER_S))
                continue
            raise RuntimeError(f"POST /jobs/batch answered {status}: {parsed}")

    def set_limits(self, limits: Sequence[KeyLimit]) -> None:
        """Set each limit with ``PUT /limits/{key}`` (before any job is submitted);
        anything but 200 stops the run: its limits checks would judge nothing."""
        for lim in limits:
            body = json.dumps(lim.body()).encode()
            status, _, parsed = self.client.request("PUT", f"/limits/{lim.key}", body)
            if status != 200:
                raise RuntimeError(f"PUT /limits/{lim.key} answered {status}: {parsed}")
        self.client.close()  # the submitter thread opens its own connection

    # -- the run -----------------------------------------------------------------------

    def run(self) -> None:
        started = time.monotonic()
        rng = random.Random(f"{self.seed}:payload")
        faults = random.Random(f"{self.seed}:submit-faults")
        try:
            for first in range(0, self.jobs, BATCH):
                numbers = range(first, min(first + BATCH, self.jobs))
                keys = [self.key_of() for _ in numbers]
                items = [
                    {
                        **self.job_fields,
                        "payload": {"ms": rng.randint(0, self.handler_ms)},
                        "idempotency_key": f"{self.prefix}{n}",
                        **({} if key is None else {"limit_key": key}),
                    }
                    for n, key in zip(numbers, keys, strict=True)
                ]
                body = json.dumps({"jobs": items}).encode()
                # The first batch always gets both faults: a short run still exercises them.
                timeout_draw, dup_draw = faults.random(), faults.random()
                if first == 0:
                    timeout_draw = dup_draw = 0.0
                if self.faults and timeout_draw < 0.2:
                    with contextlib.suppress(_Timeout, OSError, http.client.HTTPException):
                        self._post("/jobs/batch", body, {}, give_up_after=0.001)
                    self.client_timeouts += 1
                _, _, parsed = self._send_until_acked(body)
                self._acknowledged(keys)
                if self.faults and dup_draw < 0.2:
                    self._duplicate(body, items, parsed)
        except Exception as exc:
            self.error = repr(exc)
        finally:
            self.client.close()
            self.duration_s = time.monotonic() - started
            self.finished.set()

    def _duplicate(self, body: bytes, items: list[dict[str, Any]], first: Any) -> None:
        """Resend an acknowledged batch, and one of its jobs alone: both replays."""
        ids = [j["id"] for j in first["jobs"]] if isinstance(first, dict) else []
        self.duplicates_sent += 1
        status, hdrs, parsed = self._send_until_acked(body)
        again = [j["id"] for j in parsed["jobs"]] if isinstance(parsed, dict) else []
        if status == 200 and hdrs.get("idempotent-replayed") == "true" and again == ids:
            self.replays_ok += 1
        else:
            self.replays_wrong.append(f"batch resend answered {status}, same ids: {again == ids}")
        one = dict(items[0])
        key = one.pop("idempotency_key")
        self.duplicates_sent += 1
        for _ in range(20):
            try:
                status, hdrs, parsed = self._post(
                    "/jobs", json.dumps(one).encode(), {"Idempotency-Key": key}
                )
            except (OSError, http.client.HTTPException, _Timeout):
                continue
            if status not in (429, 503):
                break
            self.stop.wait(0.5)
        same = isinstance(parsed, dict) and bool(ids) and parsed.get("id") == ids[0]
        if status == 200 and hdrs.get("idempotent-replayed") == "true" and same:
            self.replays_ok += 1
        else:
            self.replays_wrong.append(f"single resend answered {status}, same id: {same}")

    def summary(self) -> dict[str, Any]:
        return {
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "client_timeouts": self.client_timeouts,
            "duplicates_sent": self.duplicates_sent,
            "replays_ok": self.replays_ok,
            "replays_wrong": self.replays_wrong,
            "depth_cap": self.api.depth_cap,
            "api_peak_rss_mib": round(self.api.peak_rss_kib / 1024, 1),
            "api_exit_code": self.api.exit_code(),
        }
