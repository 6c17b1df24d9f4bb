"""Creating workflows from Python (``Client.workflow``) and with an Idempotency-Key
over HTTP: replays, a key reused for another workflow, concurrent identical
requests, the caller's transaction, and invalid graphs refused before any SQL."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from deadman.client import Client
from deadman.errors import DuplicateKey
from deadman.model import JobState, WorkflowState
from deadman.store import InvalidWorkflow
from tests.factories import connect
from tests.helpers.api import api_client, assert_problem, post_together
from tests.helpers.worker import SETTINGS
from tests.helpers.workflows import DIAMOND, nodes, run


@pytest.fixture
def dm(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=SETTINGS) as c:
        yield c


def counts(dsn: str) -> tuple[int, int, int]:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM deadman.workflows) AS w,"
            " (SELECT count(*) FROM deadman.jobs) AS j,"
            " (SELECT count(*) FROM deadman.job_deps) AS d"
        ).fetchone()
    assert row is not None
    return int(row["w"]), int(row["j"]), int(row["d"])


def diamond(dm: Client, **kwargs: Any) -> Any:
    return dm.workflow(
        "diamond",
        {
            "a": dm.job("noop"),
            "b": dm.job("noop", {"n": 1}),
            "c": dm.job("noop", queue="other"),
            "d": dm.job("noop"),
        },
        [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
        **kwargs,
    )


def test_client_workflow_creates_the_graph_and_runs_it(db_dsn: str, dm: Client) -> None:
    wf = diamond(dm)
    assert wf.state is WorkflowState.RUNNING
    assert {k: j.state for k, j in wf.nodes.items()} == {
        "a": JobState.QUEUED,
        "b": JobState.WAITING,
        "c": JobState.WAITING,
        "d": JobState.WAITING,
    }
    assert (wf.nodes["c"].queue, wf.nodes["d"].pending_deps) == ("other", 2)
    assert dm.get_workflow(wf.id) == wf
    assert dm.get_workflow(123456789) is None
    with connect(db_dsn) as conn:
        for name in "abcd":
            run(conn, nodes(conn, wf.id)[name]["id"])
    done = dm.get_workflow(wf.id)
    assert done is not None and done.state is WorkflowState.SUCCEEDED
    assert done.finished_at is not None


@pytest.mark.parametrize(
    ("node_names", "edges", "message"),
    [
        (["a", "b"], [("a", "b"), ("b", "a")], "cycle: a -> b -> a"),
        (["a"], [("a", "zz")], r"edges\[0\]\.to: must name a node"),
        (["a"], [("a", "a")], "itself"),
        (["a", "b"], [("a", "b"), ("a", "b")], r"edges\[1\]: repeats an earlier edge"),
        (["a b"], [], "node name"),
        ([], [], "1 to 1000 nodes"),
    ],
)
def test_client_workflow_refuses_a_bad_graph_before_sending_it(
    db_dsn: str, dm: Client, node_names: list[str], edges: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(InvalidWorkflow, match=message):
        dm.workflow("bad", {n: dm.job("noop") for n in node_names}, edges)
    assert counts(db_dsn) == (0, 0, 0)


def test_client_workflow_refuses_depends_on_in_a_node(dm: Client) -> None:
    a = dm.enqueue("noop")
    with pytest.raises(InvalidWorkflow, match="use edges"):
        dm.workflow("bad", {"x": dm.job("noop", depends_on=[a])})


def test_client_workflow_joins_the_callers_transaction(db_dsn: str, dm: Client) -> None:
    with connect(db_dsn, autocommit=False) as conn:
        wf = diamond(dm, conn=conn)
        assert counts(db_dsn) == (0, 0, 0)  # not visible before the commit
        conn.rollback()
    assert counts(db_dsn) == (0, 0, 0)
    with connect(db_dsn, autocommit=False) as conn:
        wf = diamond(dm, conn=conn)
        conn.commit()
    assert counts(db_dsn) == (1, 4, 4)
    assert dm.get_workflow(wf.id) is not None


def test_client_workflow_with_a_key_replays_and_refuses_a_different_graph(
    db_dsn: str, dm: Client
) -> None:
    first = diamond(dm, idempotency_key="nightly-2026-11-30")
    again = diamond(dm, idempotency_key="nightly-2026-11-30")
    assert again.id == first.id
    with pytest.raises(DuplicateKey, match="different workflow"):
        dm.workflow("diamond", {"a": dm.job("noop")}, idempotency_key="nightly-2026-11-30")
    assert counts(db_dsn) == (1, 4, 4)


def test_post_workflows_with_a_key_replays(db_dsn: str) -> None:
    headers = {"Idempotency-Key": "wf-1"}
    with api_client(db_dsn) as c:
        r1 = c.post("/workflows", json=DIAMOND, headers=headers)
        assert r1.status_code == 201, r1.text
        assert "idempotent-replayed" not in r1.headers
        r2 = c.post("/workflows", json=DIAMOND, headers=headers)
        assert r2.status_code == 200, r2.text
        assert r2.headers["idempotent-replayed"] == "true"
        assert r2.headers["location"] == r1.headers["location"]
        assert r2.json() == r1.json()
        other = c.post("/workflows", json={**DIAMOND, "name": "other"}, headers=headers)
        body = assert_problem(other, 422, "idempotency-key-reused")
        assert f"workflow {r1.json()['id']}" in body["detail"]
        bad = c.post("/workflows", json=DIAMOND, headers={"Idempotency-Key": ""})
        assert_problem(bad, 422)
    assert counts(db_dsn) == (1, 4, 4)


def test_twenty_concurrent_identical_workflow_requests_make_one_workflow(db_dsn: str) -> None:
    n = 20
    responses = post_together(db_dsn, "/workflows", [DIAMOND] * n, {"Idempotency-Key": "same"})
    assert Counter(r.status_code for r in responses) == {201: 1, 200: n - 1}
    assert len({r.json()["id"] for r in responses}) == 1
    assert counts(db_dsn) == (1, 4, 4)


def test_a_workflow_row_keeps_its_key_and_fingerprint(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        c.post("/workflows", json=DIAMOND, headers={"Idempotency-Key": "k"})
        c.post("/workflows", json=DIAMOND)
    with connect(db_dsn) as db:
        rows = db.execute(
            "SELECT idempotency_key, request_hash IS NOT NULL AS hashed"
            " FROM deadman.workflows ORDER BY id"
        ).fetchall()
    assert [(r["idempotency_key"], r["hashed"]) for r in rows] == [("k", True), (None, False)]
