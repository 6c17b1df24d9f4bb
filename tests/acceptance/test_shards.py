"""Queues across three Postgres clusters (deadman.shards): three throwaway clusters,
each migrated and given its shard's id range by ``deadman shards init``; one real
``deadman worker`` per cluster, started as an unsharded worker is (its cluster's
database URL and its queues: workers need nothing new). Jobs of each queue land on
their own cluster and run there only; with one cluster stopped (``pg_ctl stop -m
immediate``) its queues fail fast with ShardUnavailable while the others keep taking
and running jobs; started again, the jobs it held queued run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Iterator

import psycopg
import pytest

from deadman import devdb
from deadman.cli_shards import cmd_shards
from deadman.client import Client
from deadman.db.migrate import migrate
from deadman.errors import ConfigError
from deadman.shards import (
    AsyncShardedClient,
    CrossShard,
    ShardedClient,
    ShardMap,
    ShardUnavailable,
    id_range,
    shard_index_of,
)
from deadman.shards.ids import initialise
from tests.helpers import wait_for
from tests.helpers.processes import SpawnWorker, sql_all, sql_value, wait_registered

#: shard -> (index, queues); c also takes every queue no shard names ("*")
LAYOUT = {"a": (1, ["alpha"]), "b": (2, ["beta"]), "c": (0, ["gamma", "*"])}
RUN_S = 20.0


def _spec(clusters: dict[str, devdb.Cluster]) -> str:
    return json.dumps(
        {
            name: {"index": index, "url": clusters[name].dsn(), "queues": queues}
            for name, (index, queues) in LAYOUT.items()
        }
    )


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, devdb.Cluster]]:
    """Three migrated clusters, each initialised as its shard by the CLI step (which
    first reports them all uninitialised, then makes them so, then reports them fine)."""
    made: dict[str, devdb.Cluster] = {}
    try:
        for name in LAYOUT:
            made[name] = devdb.throwaway(prefix=f"deadman-shard-{name}-")
            migrate(made[name].dsn())
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DEADMAN_SHARDS", _spec(made))
            assert cmd_shards(argparse.Namespace(check_only=True)) == 1
            assert cmd_shards(argparse.Namespace(check_only=False)) == 0
            assert cmd_shards(argparse.Namespace(check_only=False)) == 0  # idempotent
            assert cmd_shards(argparse.Namespace(check_only=True)) == 0
        yield made
    finally:
        for cluster in made.values():
            cluster.destroy()


@pytest.fixture
def shard_env(
    clusters: dict[str, devdb.Cluster], monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """DEADMAN_SHARDS set for the three clusters; each shard's dsn by name."""
    monkeypatch.setenv("DEADMAN_SHARDS", _spec(clusters))
    return {name: clusters[name].dsn() for name in LAYOUT}


def _where(dsns: dict[str, str]) -> dict[str, dict[str, int]]:
    """Per cluster: its succeeded jobs by queue."""
    return {
        name: {
            r["queue"]: r["n"]
            for r in sql_all(
                dsn,
                "SELECT queue, count(*) AS n FROM deadman.jobs"
                " WHERE state = 'succeeded' GROUP BY queue",
            )
        }
        for name, dsn in dsns.items()
    }


def _succeeded(dsn: str, ids: list[int]) -> bool:
    n = sql_value(
        dsn,
        "SELECT count(*) FROM deadman.jobs WHERE id = ANY(%s) AND state = 'succeeded'",
        (ids,),
    )
    return bool(n == len(ids))


def test_queues_run_on_their_own_cluster_and_an_outage_stops_only_its_queues(
    clusters: dict[str, devdb.Cluster], shard_env: dict[str, str], spawn_worker: SpawnWorker
) -> None:
    workers = {}
    for name, (_, queues) in LAYOUT.items():
        served = ",".join(q for q in queues if q != "*") + (",other" if name == "c" else "")
        proc = spawn_worker(shard_env[name], queues=served, name=f"worker-{name}")
        workers[name] = (proc, served)
    worker_ids = {name: wait_registered(shard_env[name], p.pid) for name, (p, _) in workers.items()}

    with ShardedClient(timeout=2.0) as client:
        ids: dict[str, list[int]] = {name: [] for name in LAYOUT}
        for queue, shard in (("alpha", "a"), ("beta", "b"), ("gamma", "c"), ("other", "c")):
            for i in range(3):
                ids[shard].append(client.enqueue("noop", {"i": i}, queue=queue).id)
        batch = [client.job("noop", {"n": n}, queue="beta") for n in range(4)]
        ids["b"] += client.enqueue_many(batch)

        # every id is in its shard's range, so get/cancel/retry find their cluster
        for name, shard_ids in ids.items():
            first, last = id_range(LAYOUT[name][0])
            assert all(first <= i <= last for i in shard_ids), (name, shard_ids)
        every = [(shard_env[name], shard_ids) for name, shard_ids in ids.items()]
        wait_for(lambda: all(_succeeded(d, i) for d, i in every), RUN_S, 0.05, "every job")
        assert _where(shard_env) == {
            "a": {"alpha": 3},
            "b": {"beta": 7},
            "c": {"gamma": 3, "other": 3},
        }
        for name, dsn in shard_env.items():  # each ran by its own cluster's worker only
            ran_by = sql_all(dsn, "SELECT DISTINCT worker FROM deadman.attempts")
            assert [r["worker"] for r in ran_by] == [worker_ids[name]]
        got = client.get(ids["b"][0])
        assert got is not None and got.queue == "beta" and got.state.value == "succeeded"

        # what must stay within one shard is refused before anything is sent
        with pytest.raises(CrossShard, match="spans shards"):
            client.enqueue_many([client.job("noop", queue="alpha"), batch[0]])
        with pytest.raises(CrossShard, match="workflow w spans shards"):
            client.workflow(
                "w",
                {"x": client.job("noop", queue="alpha"), "y": client.job("noop", queue="gamma")},
            )
        with pytest.raises(CrossShard, match="cannot depend"):
            client.enqueue("noop", queue="alpha", depends_on=[ids["b"][0]])
        limit = client.set_limit("k", queue="beta", concurrency=2)
        assert limit.concurrency == 2
        assert sql_value(shard_env["b"], "SELECT count(*) FROM deadman.limits") == 1
        assert sql_value(shard_env["a"], "SELECT count(*) FROM deadman.limits") == 0

        # b goes down with jobs queued on it (due in a few seconds, after the stop)
        held = [client.enqueue("noop", {"held": n}, queue="beta", delay=4).id for n in range(3)]
        queued_at = time.monotonic()
        clusters["b"].stop("immediate")
        assert time.monotonic() - queued_at < 4, "the stop took longer than the delay"
        started = time.monotonic()
        with pytest.raises(ShardUnavailable, match="shard b"):
            client.enqueue("noop", queue="beta")
        assert time.monotonic() - started < 10  # fails fast, does not hang the caller
        started = time.monotonic()
        for _ in range(5):  # resting after that failure: refused at once (PAUSE_S)
            with pytest.raises(ShardUnavailable, match="next try in"):
                client.enqueue("noop", queue="beta")
        assert time.monotonic() - started < 1.0
        with pytest.raises(ShardUnavailable, match="shard b"):
            client.get(held[0])
        during = [client.enqueue("noop", queue=q).id for q in ("alpha", "gamma", "other")]
        wait_for(lambda: _succeeded(shard_env["a"], during[:1]), RUN_S, 0.05, "a while b is down")
        wait_for(lambda: _succeeded(shard_env["c"], during[1:]), RUN_S, 0.05, "c while b is down")

        clusters["b"].start()
        restarted = sql_value(shard_env["b"], "SELECT pg_postmaster_start_time()")
        wait_for(lambda: _succeeded(shard_env["b"], held), RUN_S, 0.05, "b's held jobs")
        starts = sql_all(
            shard_env["b"],
            "SELECT started_at FROM deadman.attempts WHERE job_id = ANY(%s)",
            (held,),
        )
        assert len(starts) == 3 and all(r["started_at"] > restarted for r in starts)
        assert client.enqueue("noop", queue="beta").queue == "beta"  # routed again
    for proc, _ in workers.values():  # the worker of b outlived its cluster's outage
        assert proc.poll() is None, proc.tail()


def test_a_shard_whose_ids_are_not_its_own_is_refused(
    clusters: dict[str, devdb.Cluster], shard_env: dict[str, str]
) -> None:
    """Two entries of the map with their urls swapped would route ids to the wrong
    cluster: the client checks each shard's range before its first call."""
    swapped = {
        "a": {"index": 1, "url": shard_env["b"], "queues": ["alpha"]},
        "b": {"index": 2, "url": shard_env["a"], "queues": ["beta"]},
    }
    client = ShardedClient(ShardMap.parse(json.dumps(swapped)), timeout=2.0)
    with client, pytest.raises(ConfigError, match="run `deadman shards init`"):
        client.enqueue("noop", queue="alpha")


def test_the_async_client_routes_as_the_sync_one(shard_env: dict[str, str]) -> None:
    """AsyncShardedClient against the same clusters: each call on its shard's tables."""

    async def main() -> tuple[int, int, list[int], int]:
        async with AsyncShardedClient(timeout=2.0) as client:
            a = await client.enqueue("noop", queue="alpha")
            c = await client.enqueue("noop", queue="unnamed")  # the '*' shard
            many = await client.enqueue_many([client.job("noop", queue="beta")] * 2)
            nodes = {"x": client.job("noop", queue="gamma"), "y": client.job("noop", queue="gamma")}
            wf = await client.workflow("async-wf", nodes, [("x", "y")])
            assert await client.get_workflow(wf.id) is not None
            assert (await client.cancel(c.id)).state.value == "cancelled"
            found = await client.get(a.id)
            assert found is not None and found.queue == "alpha"
            assert (await client.set_limit("ak", queue="gamma", concurrency=1)).concurrency == 1
            mixed = [client.job("noop", queue="alpha"), client.job("noop", queue="beta")]
            with pytest.raises(CrossShard, match="spans shards"):
                await client.enqueue_many(mixed)
            return a.id, c.id, many, wf.id

    a_id, c_id, many, wf_id = asyncio.run(main())
    one = "SELECT queue FROM deadman.jobs WHERE id = %s"
    assert sql_value(shard_env["a"], one, (a_id,)) == "alpha"
    assert sql_value(shard_env["c"], one, (c_id,)) == "unnamed"
    assert all(sql_value(shard_env["b"], one, (i,)) == "beta" for i in many)
    wf = "SELECT count(*) FROM deadman.workflows WHERE id = %s"
    assert sql_value(shard_env["c"], wf, (wf_id,)) == 1
    assert sql_value(shard_env["c"], "SELECT count(*) FROM deadman.limits WHERE key = 'ak'") == 1


def test_init_keeps_an_existing_database_s_ids_and_refuses_another_shard_s(
    clusters: dict[str, devdb.Cluster],
) -> None:
    """A single-primary database with jobs becomes shard 0 as it is (its ids go on
    from where they were); one whose ids are already in another shard's range is
    refused, and left as it was."""
    server = clusters["c"].dsn()
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS legacy WITH (FORCE)")
        conn.execute("CREATE DATABASE legacy")
    dsn = clusters["c"].dsn("legacy")
    migrate(dsn)
    with Client(dsn) as plain:
        before = [plain.enqueue("noop").id for _ in range(3)]
    initialise(dsn, 0)
    with Client(dsn) as plain:
        after = plain.enqueue("noop").id
    assert after == before[-1] + 1 and shard_index_of(after) == 0
    initialise(dsn, 2)  # now it hands out shard 2's ids...
    with Client(dsn) as plain:
        moved = plain.enqueue("noop").id
    assert moved == id_range(2)[0]
    with pytest.raises(ConfigError, match="past this shard's range"):
        initialise(dsn, 1)  # ...so it can no longer be shard 1
    initialise(dsn, 2, check_only=True)  # and the refused init changed nothing
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("DROP DATABASE legacy WITH (FORCE)")
