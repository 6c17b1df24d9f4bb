"""``deadman worker --metrics-port N``: each process serves its own metrics, fleet
child i on N + i."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from deadman import metrics


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("index", [None, "2"])
def test_serves_the_worker_counters_on_base_plus_fleet_index(
    monkeypatch: pytest.MonkeyPatch, index: str | None
) -> None:
    base = _free_port() - (2 if index else 0)
    if index is None:
        monkeypatch.delenv("DEADMAN_FLEET_INDEX", raising=False)
    else:
        monkeypatch.setenv("DEADMAN_FLEET_INDEX", index)
    server = metrics.serve(base)
    try:
        assert server.server_port == base + int(index or 0)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics") as r:
            text = r.read().decode()
        for name in (
            "deadman_jobs_claimed",
            "deadman_jobs_finished",
            "deadman_jobs_rescued",
            "deadman_stale_writes_refused",
            "deadman_job_start_latency_seconds",
            "deadman_job_run_seconds",
        ):
            assert f"# HELP {name}" in text, name
    finally:
        server.shutdown()
        server.server_close()
