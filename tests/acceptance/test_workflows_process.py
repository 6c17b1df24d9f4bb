"""A fan-out/fan-in workflow of 100 nodes run by several real worker processes, one
of them SIGKILLed mid-run: every node succeeds exactly once (one succeeded attempt,
one effect) and the workflow is finalised exactly once."""

from __future__ import annotations

import signal

import pytest

from deadman.client import Client
from tests.helpers import wait_for
from tests.helpers.api import api_client
from tests.helpers.processes import (
    SpawnWorker,
    sql_all,
    sql_value,
    wait_registered,
)

pytestmark = pytest.mark.slow

FINAL_LOG = """
CREATE TABLE public.wf_final (workflow_id bigint, state text);
CREATE FUNCTION public.log_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.wf_final VALUES (NEW.id, NEW.state); RETURN NULL; END $$;
CREATE TRIGGER log_final AFTER UPDATE ON deadman.workflows FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION public.log_final();
"""


def test_fan_out_fan_in_survives_a_killed_worker(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    sql_all(db_dsn, FINAL_LOG)
    middle = [f"m{i:02d}" for i in range(98)]
    # side-effect: a sync handler writing its effect in ctx.transaction(), slow enough
    # (150 ms) that the kill lands while nodes are running
    node = {"type": "side-effect", "payload": {"sleep_ms": 150}}
    body = {
        "name": "fan",
        "nodes": [
            {"name": "root", **node},
            *({"name": m, **node} for m in middle),
            {"name": "sink", **node},
        ],
        "edges": [
            *({"from": "root", "to": m} for m in middle),
            *({"from": m, "to": "sink"} for m in middle),
        ],
    }
    workers = [spawn_worker(db_dsn, concurrency=4) for _ in range(3)]
    ids = {wait_registered(db_dsn, w.pid): w for w in workers}
    with api_client(db_dsn) as c:
        r = c.post("/workflows", json=body)
        assert r.status_code == 201, r.text
        wf = int(r.json()["id"])

    # kill a worker while it holds middle nodes and others have already finished some
    def victim() -> str | None:
        done = sql_value(
            db_dsn,
            "SELECT count(*) FROM deadman.jobs WHERE workflow_id = %s AND state = 'succeeded'",
            (wf,),
        )
        holder = sql_value(
            db_dsn,
            "SELECT lease_worker FROM deadman.jobs"
            " WHERE workflow_id = %s AND state = 'running' AND node <> 'root' LIMIT 1",
            (wf,),
        )
        return holder if done >= 10 and holder in ids else None

    holder = wait_for(victim, timeout=30, interval=0.01, message="a worker mid-workflow")
    ids[holder].send(signal.SIGKILL)

    wait_for(
        lambda: (
            sql_value(db_dsn, "SELECT state FROM deadman.workflows WHERE id = %s", (wf,))
            != "running"
        ),
        timeout=90,
        interval=0.1,
        message="the workflow to finish",
    )
    assert sql_value(db_dsn, "SELECT state FROM deadman.workflows WHERE id = %s", (wf,)) == (
        "succeeded"
    )
    assert sql_all(db_dsn, "SELECT state FROM public.wf_final") == [{"state": "succeeded"}]
    rows = sql_all(
        db_dsn,
        "SELECT j.node, j.state,"
        " (SELECT count(*) FROM deadman.attempts a"
        "   WHERE a.job_id = j.id AND a.outcome = 'succeeded') AS ok,"
        " (SELECT count(*) FROM deadman.effects e WHERE e.job_id = j.id) AS effects"
        " FROM deadman.jobs j WHERE j.workflow_id = %s",
        (wf,),
    )
    assert len(rows) == 100
    assert {(r["state"], r["ok"], r["effects"]) for r in rows} == {("succeeded", 1, 1)}
    # the kill really interrupted work: some attempt ended with the lease expiring
    rescued = sql_value(
        db_dsn,
        "SELECT count(*) FROM deadman.attempts a JOIN deadman.jobs j ON j.id = a.job_id"
        " WHERE j.workflow_id = %s AND a.outcome = 'lease_expired'",
        (wf,),
    )
    assert rescued >= 1
    # the sink ran after every middle node
    sink_started = sql_value(
        db_dsn,
        "SELECT min(a.started_at) FROM deadman.attempts a JOIN deadman.jobs j"
        " ON j.id = a.job_id WHERE j.workflow_id = %s AND j.node = 'sink'",
        (wf,),
    )
    last_middle = sql_value(
        db_dsn,
        "SELECT max(a.finished_at) FROM deadman.attempts a JOIN deadman.jobs j"
        " ON j.id = a.job_id WHERE j.workflow_id = %s AND j.node LIKE 'm%%'"
        " AND a.outcome = 'succeeded'",
        (wf,),
    )
    assert sink_started >= last_middle
    with Client(db_dsn) as client:
        assert client.get(0) is None  # the client still works against this schema
