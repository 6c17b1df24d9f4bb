"""The operator endpoints: queues (and pausing them), workers, stats, health, ready,
metrics and the OpenAPI document."""

from __future__ import annotations

from typing import Any

from deadman.store import ClaimParams
from tests.factories import connect, insert_job, with_store
from tests.helpers import wait_for
from tests.helpers.api import api_client, error_fields, new_job

STATES = ["waiting", "scheduled", "queued", "running", "retrying", "succeeded", "dead", "cancelled"]


LIVE = ["waiting", "scheduled", "queued", "running", "retrying"]


def _zero(**counts: int) -> dict[str, int]:
    return {s: counts.get(s, 0) for s in STATES}


def _live(**counts: int) -> dict[str, int]:
    """A queue's counts: unfinished states only (finished ones are not per queue)."""
    return {s: counts.get(s, 0) for s in LIVE}


def _queue(name: str, paused: bool, age: float | None = None, **counts: int) -> dict[str, Any]:
    return {"name": name, "paused": paused, "counts": _live(**counts), "oldest_due_age_s": age}


def _claim(dsn: str, queue: str) -> int:
    params = ClaimParams(queue=queue, worker="w", limit=10, ttl_ms=60_000)
    return len(with_store(dsn, lambda store: store.job_claim(params)))


def test_queues_list_counts_and_pause_stops_claims(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn, state="queued", queue="q1", run_in_s=-60)
        insert_job(conn, state="queued", queue="q1", run_in_s=-30)
        insert_job(conn, state="scheduled", queue="q1", run_in_s=3600)  # not due: no age
        insert_job(conn, state="dead", queue="q1")
        insert_job(conn, state="running", queue="q2")
    with api_client(db_dsn) as c:
        # a queue can be paused before its first job
        early = c.post("/queues/later/pause")
        assert early.status_code == 200
        assert early.json() == _queue("later", True)
        body = c.get("/queues").json()
        age = body["queues"][1].pop("oldest_due_age_s")
        assert 60 <= age < 120  # the oldest due job, by the database clock
        assert body == {
            "queues": [
                _queue("later", True),
                {"name": "q1", "paused": False, "counts": _live(queued=2, scheduled=1)},
                _queue("q2", False, running=1),
            ]
        }
        paused = c.post("/queues/q1/pause").json()
        assert 60 <= paused.pop("oldest_due_age_s") < 120
        assert paused == {"name": "q1", "paused": True, "counts": _live(queued=2, scheduled=1)}
        assert c.post("/queues/q1/pause").status_code == 200  # idempotent
        assert _claim(db_dsn, "q1") == 0
        # a paused queue still accepts jobs
        assert c.post("/jobs", json=new_job(queue="q1")).status_code == 201
        resumed = c.post("/queues/q1/resume").json()
        assert resumed["paused"] is False and resumed["counts"]["queued"] == 3
        assert _claim(db_dsn, "q1") == 3
        for bad in ("has%20space", "x" * 129, "a;b"):
            assert error_fields(c.post(f"/queues/{bad}/pause")) == {"name"}


def test_workers_show_heartbeat_liveness_and_jobs_held(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        conn.execute(
            "INSERT INTO deadman.workers (id, hostname, pid, queues, concurrency,"
            " last_heartbeat_at) VALUES"
            " ('w-live', 'host-a', 101, '{default,mail}', 8, now()),"
            " ('w-gone', 'host-b', 102, '{default}', 4, now() - interval '1 hour')"
        )
        insert_job(conn, state="running", lease_worker="w-live")
        insert_job(conn, state="running", lease_worker="w-live")
        insert_job(conn, state="queued")
    with api_client(db_dsn, lease_ttl_s=10.0) as c:
        workers = c.get("/workers").json()["workers"]
    assert [w["id"] for w in workers] == ["w-gone", "w-live"]
    gone, live = workers
    assert (live["alive"], live["jobs_held"], live["queues"]) == (True, 2, ["default", "mail"])
    assert (live["hostname"], live["pid"], live["concurrency"]) == ("host-a", 101, 8)
    assert live["last_heartbeat_at"].endswith("Z") and live["started_at"].endswith("Z")
    assert (gone["alive"], gone["jobs_held"]) == (False, 0)


def _three_jobs(dsn: str) -> None:
    """One queued job in queue a, one succeeded in a and one in b."""
    with connect(dsn) as conn:
        insert_job(conn, state="queued", queue="a")
        insert_job(conn, state="succeeded", queue="a")
        insert_job(conn, state="succeeded", queue="b")


def test_stats_count_by_state_and_live_jobs_by_queue(db_dsn: str) -> None:
    _three_jobs(db_dsn)
    with api_client(db_dsn) as c:
        stats = c.get("/stats").json()
    assert stats == {
        "jobs": _zero(queued=1, succeeded=2),
        "total": 3,
        "estimated": [],  # few finished jobs: counted exactly
        "queues": {"a": _live(queued=1)},
    }


def test_health_and_ready(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        assert c.get("/health").json() == {"status": "ok"}
        ready = c.get("/ready").json()
    assert ready["status"] == "ready" and ready["schema_version"] >= 2


def test_metrics_expose_the_counts_and_the_requests(db_dsn: str) -> None:
    _three_jobs(db_dsn)
    with api_client(db_dsn) as c:
        assert c.get("/stats").status_code == 200  # one request for the request metrics
        metrics = c.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'deadman_jobs{queue="a",state="queued"} 1.0' in text
    assert 'deadman_jobs{queue="a",state="running"} 0.0' in text
    assert 'deadman_jobs_finished{state="succeeded"} 2.0' in text
    assert 'deadman_jobs_finished{state="dead"} 0.0' in text
    assert 'deadman_jobs_finished_estimated{state="succeeded"} 0.0' in text
    assert 'deadman_queue_paused{queue="a"} 0.0' in text
    assert 'deadman_queue_oldest_due_age_seconds{queue="a"}' in text
    assert "deadman_xmin_horizon_age_transactions " in text
    assert "ESTIMATE above" in text  # the help text says which numbers are estimates
    assert "deadman_api_database_up 1.0" in text
    assert 'deadman_api_requests_total{method="GET",route="/stats",status="200"}' in text


def test_the_openapi_document_names_every_path_and_operation(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        spec = c.get("/openapi.json").json()
    assert spec["openapi"] == "3.1.0"
    assert spec["security"] == []
    assert set(spec["paths"]) == {
        "/jobs",
        "/jobs/batch",
        "/jobs/{id}",
        "/jobs/{id}/attempts",
        "/jobs/{id}/cancel",
        "/jobs/{id}/retry",
        "/workflows",
        "/workflows/{id}",
        "/workflows/{id}/cancel",
        "/queues",
        "/queues/{name}/pause",
        "/queues/{name}/resume",
        "/workers",
        "/limits",
        "/limits/{key}",
        "/schedules",
        "/schedules/{name}",
        "/schedules/{name}/pause",
        "/schedules/{name}/resume",
        "/stats",
        "/health",
        "/ready",
        "/metrics",
        "/openapi.json",
    }
    assert spec["paths"]["/health"]["get"]["security"] == []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            assert op["operationId"] and op["responses"], (path, method)


def _horizon(text: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith("deadman_xmin_horizon_age"))
    return float(line.split()[-1])


def test_metrics_show_a_transaction_left_open(db_dsn: str) -> None:
    """The gauge to alert on: a transaction left open holds back vacuum (see the
    retention benchmark); it grows with every transaction since, and drops when the
    open one ends."""
    with api_client(db_dsn) as c, connect(db_dsn, autocommit=False) as open_tx:
        open_tx.execute("SELECT txid_current()")  # an xid: it holds the horizon
        with connect(db_dsn) as other:
            for _ in range(50):
                other.execute("SELECT txid_current()")  # 50 transactions later
        assert _horizon(c.get("/metrics").text) >= 50
        open_tx.rollback()
        # The horizon is the whole cluster's: a test running beside this one on the same
        # server may be inside a transaction for a moment, so wait for the drop.
        wait_for(lambda: _horizon(c.get("/metrics").text) < 50, 10, message="horizon drop")
