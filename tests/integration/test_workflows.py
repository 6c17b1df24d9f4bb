"""Workflows and depends_on against a real database: creation (API), release on
success, transitive cancel on failure, every path that ends a job (completion,
rescuer, API cancel, workflow cancel), finalisation exactly once under concurrency,
and a depends_on insert racing its dependency's completion."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow

from deadman.client import Client
from deadman.config import Settings
from deadman.db.queries import QUERIES
from deadman.maintenance import Rescuer
from deadman.model import AttemptOutcome, JobState
from deadman.store import Finish, UnknownDependency, finish_params
from tests.factories import attempt_rows, connect, job_row, with_store
from tests.helpers import wait_for
from tests.helpers.api import api_client, assert_problem, error_fields
from tests.helpers.worker import SETTINGS, running_worker
from tests.helpers.workflows import (
    DIAMOND,
    claim,
    conn,
    create,
    finals,
    finish,
    lock_waiters,
    nodes,
    run,
    workflow,
)

__all__ = ["conn"]  # the fixture, used by name


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=SETTINGS) as c:
        yield c


# ------------------------------------------------------------------------- creation


def test_post_workflows_creates_every_node_and_waits_on_dependencies(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        r = c.post("/workflows", json=DIAMOND)
        assert r.status_code == 201, r.text
        body = r.json()
        assert r.headers["location"] == f"/workflows/{body['id']}"
        assert body["state"] == "running" and body["finished_at"] is None
        assert [(n["name"], n["state"]) for n in body["nodes"]] == [
            ("a", "queued"),
            ("b", "waiting"),
            ("c", "waiting"),
            ("d", "waiting"),
        ]
        assert c.get(f"/workflows/{body['id']}").json() == body
        job = c.get(f"/jobs/{body['nodes'][2]['job_id']}").json()
        assert (job["node"], job["workflow_id"], job["queue"]) == ("c", body["id"], "other")
    with connect(db_dsn) as conn:
        pending = {k: v["pending_deps"] for k, v in nodes(conn, int(body["id"])).items()}
        assert pending == {"a": 0, "b": 1, "c": 1, "d": 2}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"edges": [*DIAMOND["edges"], {"from": "d", "to": "a"}]}, "edges"),
        ({"edges": [{"from": "a", "to": "zz"}]}, "edges[0].to"),
        ({"edges": [{"from": "a", "to": "a"}]}, "edges[0]"),
        ({"nodes": [*DIAMOND["nodes"], {"name": "a", "type": "noop"}]}, "nodes[4].name"),
        ({"nodes": [{"name": "a", "type": "no pe"}]}, "nodes[0].type"),
        ({"nodes": [{"name": "a", "type": "noop", "depends_on": ["1"]}]}, "nodes[0].depends_on"),
        ({"nodes": []}, "nodes"),
        ({"name": ""}, "name"),
    ],
)
def test_a_bad_workflow_is_422_naming_the_field(
    db_dsn: str, change: dict[str, Any], field: str
) -> None:
    with api_client(db_dsn) as c:
        r = c.post("/workflows", json={**DIAMOND, **change})
        assert_problem(r, 422)
        assert field in error_fields(r), r.json()
    with connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM deadman.jobs").fetchone() == {"n": 0}


def test_a_cycle_is_named_in_the_error(db_dsn: str) -> None:
    body = {
        "name": "loop",
        "nodes": [{"name": n, "type": "noop"} for n in "xyz"],
        "edges": [{"from": "x", "to": "y"}, {"from": "y", "to": "z"}, {"from": "z", "to": "y"}],
    }
    with api_client(db_dsn) as c:
        r = c.post("/workflows", json=body)
        assert_problem(r, 422)
        assert "y -> z -> y" in r.text


def test_unknown_workflow_is_404(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        assert_problem(c.get("/workflows/999"), 404)
        assert_problem(c.get("/workflows/abc"), 404)
        assert_problem(c.post("/workflows/999/cancel"), 404)


# ------------------------------------------------------------------------- release


def test_success_releases_dependents_and_finalises_once(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    run(conn, n["a"]["id"])
    n = nodes(conn, wf)
    assert (n["b"]["state"], n["c"]["state"], n["d"]["state"]) == ("queued", "queued", "waiting")
    run(conn, n["b"]["id"])
    assert nodes(conn, wf)["d"]["pending_deps"] == 1
    assert nodes(conn, wf)["d"]["state"] == "waiting"
    run(conn, n["c"]["id"])
    assert nodes(conn, wf)["d"]["state"] == "queued"
    assert workflow(conn, wf)["state"] == "running"
    run(conn, n["d"]["id"])
    row = workflow(conn, wf)
    assert (row["state"], row["unfinished"]) == ("succeeded", 0)
    assert row["finished_at"] is not None
    assert finals(conn, wf) == ["succeeded"]


def test_a_dead_node_cancels_everything_downstream(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    run(conn, n["a"]["id"], JobState.DEAD)
    n = nodes(conn, wf)
    for name in "bcd":
        assert n[name]["state"] == "cancelled"
        assert n[name]["last_error"] == "upstream a dead"
        assert n[name]["finished_at"] is not None
    assert workflow(conn, wf)["state"] == "failed"
    assert finals(conn, wf) == ["failed"]


def test_a_failure_in_one_branch_leaves_the_other_running(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    n = nodes(conn, wf)
    run(conn, n["a"]["id"])
    run(conn, n["b"]["id"], JobState.DEAD)
    n = nodes(conn, wf)
    assert (n["c"]["state"], n["d"]["state"]) == ("queued", "cancelled")
    assert n["d"]["last_error"] == "upstream b dead"
    assert workflow(conn, wf)["state"] == "running"  # c is still to run
    run(conn, n["c"]["id"])
    assert workflow(conn, wf)["state"] == "failed"
    assert finals(conn, wf) == ["failed"]


def test_a_long_chain_cascades_in_one_statement(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    names = [f"n{i}" for i in range(300)]
    body = {
        "name": "chain",
        "nodes": [{"name": n, "type": "noop"} for n in names],
        "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(names)],
    }
    wf = create(db_dsn, body)
    run(conn, nodes(conn, wf)["n0"]["id"], JobState.DEAD)
    states = {r["state"] for name, r in nodes(conn, wf).items() if name != "n0"}
    assert states == {"cancelled"}
    assert workflow(conn, wf)["state"] == "failed"


# ------------------------------------------------------------- other paths that end a job


def test_api_cancel_of_a_node_cancels_downstream(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    a = nodes(conn, wf)["a"]["id"]
    with api_client(db_dsn) as c:
        assert c.post(f"/jobs/{a}/cancel").status_code == 200
        body = c.get(f"/workflows/{wf}").json()
    assert body["state"] == "cancelled"
    assert {n["name"]: n["last_error"] for n in body["nodes"]} == {
        "a": "cancelled",
        "b": "upstream a cancelled",
        "c": "upstream a cancelled",
        "d": "upstream a cancelled",
    }
    assert finals(conn, wf) == ["cancelled"]


def test_workflow_cancel_stops_running_nodes_and_finalises_when_they_end(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    wf = create(db_dsn, DIAMOND)
    a = nodes(conn, wf)["a"]["id"]
    token = claim(conn, a)
    with api_client(db_dsn) as c:
        r = c.post(f"/workflows/{wf}/cancel")
        assert r.status_code == 202, r.text
        assert [n["state"] for n in r.json()["nodes"]] == [
            "running",
            "cancelled",
            "cancelled",
            "cancelled",
        ]
        assert job_row(conn, a)["cancel_requested"] is True
        # the worker notices and ends the attempt cancelled
        ending = Finish(a, token, JobState.CANCELLED, AttemptOutcome.CANCELLED)
        done = conn.execute(QUERIES["job_finish_many"], finish_params([ending])).fetchall()
        assert [r["id"] for r in done] == [a]
        r = c.post(f"/workflows/{wf}/cancel")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert finals(conn, wf) == ["cancelled"]


def test_the_rescuers_dead_verdict_cancels_downstream(
    db_dsn: str, conn: psycopg.Connection[DictRow], client: Client
) -> None:
    a = client.enqueue("noop")
    b = client.enqueue("noop", depends_on=[a])
    assert b.state is JobState.WAITING and b.pending_deps == 1
    claim(conn, a.id)
    conn.execute(
        "UPDATE deadman.jobs SET lease_expires_at = now() - interval '10 seconds', rescues = 5"
        " WHERE id = %s",
        (a.id,),
    )
    report = with_store(db_dsn, lambda s: Rescuer(s, Settings(max_rescues=1)).tick())
    assert report.dead == [a.id]
    row = job_row(conn, b.id)
    assert (row["state"], row["last_error"]) == ("cancelled", f"upstream job {a.id} dead")


# ------------------------------------------------------------------------- depends_on


def test_depends_on_through_the_api(db_dsn: str, conn: psycopg.Connection[DictRow]) -> None:
    with api_client(db_dsn) as c:
        a = c.post("/jobs", json={"type": "noop"}).json()
        done = c.post("/jobs", json={"type": "noop"}).json()
        run(conn, int(done["id"]))
        r = c.post("/jobs", json={"type": "noop", "depends_on": [a["id"], done["id"]]})
        assert r.status_code == 201, r.text
        b = r.json()
        assert b["state"] == "waiting"
        assert job_row(conn, int(b["id"]))["pending_deps"] == 1
        run(conn, int(a["id"]))
        assert c.get(f"/jobs/{b['id']}").json()["state"] == "queued"
        # all dependencies already succeeded: due at once
        r = c.post("/jobs", json={"type": "noop", "depends_on": [a["id"]]})
        assert r.json()["state"] == "queued"
        # a dependency already dead: born cancelled
        dead = c.post("/jobs", json={"type": "noop"}).json()
        run(conn, int(dead["id"]), JobState.DEAD)
        r = c.post("/jobs", json={"type": "noop", "depends_on": [dead["id"]]})
        assert r.json()["state"] == "cancelled"
        assert r.json()["last_error"] == f"upstream job {dead['id']} dead"
        # unknown ids and bad values name the field
        r = c.post("/jobs", json={"type": "noop", "depends_on": ["999999"]})
        assert error_fields(assert_problem_422(r)) == {"depends_on"}
        r = c.post("/jobs", json={"type": "noop", "depends_on": ["x", a["id"], a["id"]]})
        assert error_fields(assert_problem_422(r)) == {"depends_on[0]", "depends_on[2]"}


def assert_problem_422(r: Any) -> Any:
    assert_problem(r, 422)
    return r


def test_client_enqueue_with_depends_on(
    db_dsn: str, conn: psycopg.Connection[DictRow], client: Client
) -> None:
    a = client.enqueue("noop")
    b = client.enqueue("noop", depends_on=[a.id])
    c = client.enqueue("noop", depends_on=[a, b])
    assert (b.state, c.state, c.pending_deps) == (JobState.WAITING, JobState.WAITING, 2)
    with pytest.raises(UnknownDependency):
        client.enqueue("noop", depends_on=[123456789])
    run(conn, a.id)
    assert job_row(conn, b.id)["state"] == "queued"
    run(conn, b.id)
    assert job_row(conn, c.id)["state"] == "queued"


@pytest.mark.parametrize("first", ["completion", "insert"])
def test_a_depends_on_insert_racing_the_completion_is_never_stranded(
    db_dsn: str, conn: psycopg.Connection[DictRow], client: Client, first: str
) -> None:
    """Both orders: whichever takes the dependency's row lock first, the dependent
    ends queued (never waiting forever on a dependency that already succeeded)."""
    a = client.enqueue("noop")
    token = claim(conn, a.id)
    result: dict[str, Any] = {}
    with (
        connect(db_dsn, autocommit=False) as tx_finish,
        connect(db_dsn, autocommit=False) as tx_ins,
    ):
        if first == "completion":
            finish(tx_finish, a.id, token, JobState.SUCCEEDED)

            def second() -> None:
                result["job"] = client.enqueue("noop", depends_on=[a.id], conn=tx_ins)
                tx_ins.commit()
        else:
            result["job"] = client.enqueue("noop", depends_on=[a.id], conn=tx_ins)

            def second() -> None:
                finish(tx_finish, a.id, token, JobState.SUCCEEDED)
                tx_finish.commit()

        t = threading.Thread(target=second)
        t.start()
        # the second one blocks on the dependency's row lock until the first commits
        wait_for(lambda: lock_waiters(conn), timeout=5, message="the second to wait on the lock")
        (tx_finish if first == "completion" else tx_ins).commit()
        t.join(timeout=10)
        assert not t.is_alive()
    b = result["job"]
    assert job_row(conn, b.id)["state"] == "queued"


# ------------------------------------------------------------------------- finalisation


@pytest.mark.parametrize("first", ["x", "y"])
def test_two_finishers_of_the_last_two_nodes_finalise_exactly_once(
    db_dsn: str, conn: psycopg.Connection[DictRow], first: str
) -> None:
    """Two transactions each end one of the last two nodes; neither has committed
    when the other runs its completion. Exactly one of them finalises."""
    wf = create(
        db_dsn,
        {"name": "pair", "nodes": [{"name": "x", "type": "noop"}, {"name": "y", "type": "noop"}]},
    )
    n = nodes(conn, wf)
    tokens = {k: claim(conn, n[k]["id"]) for k in "xy"}
    second = "y" if first == "x" else "x"
    with connect(db_dsn, autocommit=False) as t1, connect(db_dsn, autocommit=False) as t2:
        finish(t1, n[first]["id"], tokens[first], JobState.SUCCEEDED)

        def finish_second() -> None:
            finish(t2, n[second]["id"], tokens[second], JobState.SUCCEEDED)
            t2.commit()

        th = threading.Thread(target=finish_second)
        th.start()
        wait_for(lambda: lock_waiters(conn), timeout=5, message="the second finisher to wait")
        assert workflow(conn, wf)["state"] == "running"
        t1.commit()
        th.join(timeout=10)
        assert not th.is_alive()
    row = workflow(conn, wf)
    assert (row["state"], row["unfinished"]) == ("succeeded", 0)
    assert finals(conn, wf) == ["succeeded"]


def test_many_workflows_finalise_once_under_real_workers(
    db_dsn: str, conn: psycopg.Connection[DictRow]
) -> None:
    """Two workers, 40 workflows of two parallel nodes each plus a fan-in: the last
    two nodes often finish at the same moment on different workers."""
    body = {
        "name": "race",
        "nodes": [
            {"name": "l", "type": "noop"},
            {"name": "r", "type": "noop"},
            {"name": "j", "type": "noop"},
        ],
        "edges": [{"from": "l", "to": "j"}, {"from": "r", "to": "j"}],
    }
    ids = [create(db_dsn, body) for _ in range(40)]
    fast = Settings(**{**SETTINGS.__dict__, "concurrency": 2})
    with running_worker(db_dsn, fast), running_worker(db_dsn, fast):
        wait_for(
            lambda: all(workflow(conn, i)["state"] != "running" for i in ids),
            timeout=60,
            message="every workflow to finish",
        )
    for i in ids:
        assert workflow(conn, i)["state"] == "succeeded"
        assert finals(conn, i) == ["succeeded"]
        for node in nodes(conn, i).values():
            assert [a["outcome"] for a in attempt_rows(conn, node["id"])] == ["succeeded"]
