"""Schedules on real Postgres: the HTTP contract and hostile input, the scheduler's
tick (each due tick enqueued once, with its key), two schedulers firing the same
tick at once (the race-matrix row: schedule_due/job_insert/schedule_fired against
themselves, in both orders), a job that already carries the tick's key, catch-up
after downtime, and Registry.periodic's declaration."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from deadman.config import Settings
from deadman.maintenance.leadership import Leadership
from deadman.maintenance.scheduler import Scheduler, tick_key
from deadman.registry import Registry
from deadman.spec import SpecError
from deadman.store import AsyncStore
from tests.factories import async_store, connect, run_async
from tests.helpers.api import api_client, assert_problem, error_fields

EVERY = {"every_ms": 1000, "job": {"type": "noop", "queue": "cron"}}


def _backdate(db_dsn: str, name: str, seconds: float) -> datetime:
    """Make ``name``'s next tick ``seconds`` ago on a whole second; returns it."""
    with connect(db_dsn) as conn:
        row = conn.execute(
            "UPDATE deadman.schedules SET next_fire_at ="
            " date_trunc('second', now()) - %s * interval '1 second'"
            " WHERE name = %s RETURNING next_fire_at",
            [seconds, name],
        ).fetchone()
    assert row is not None
    due: datetime = row["next_fire_at"]
    return due


def _tick_jobs(db_dsn: str, name: str) -> list[dict[str, Any]]:
    with connect(db_dsn) as conn:
        return conn.execute(
            "SELECT id, idempotency_key, queue FROM deadman.jobs"
            " WHERE idempotency_key LIKE %s ORDER BY idempotency_key",
            [f"schedule:{name}:%"],
        ).fetchall()


def _db_now(db_dsn: str) -> datetime:
    with connect(db_dsn) as conn:
        row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


def _ticks_due(due: datetime, before: datetime, after: datetime) -> range:
    """How many one-second ticks from ``due`` (a whole second) a tick run between
    ``before`` and ``after`` may find due: the clock may cross a second meanwhile."""
    return range(
        (before - due) // timedelta(seconds=1) + 1, (after - due) // timedelta(seconds=1) + 2
    )


def _tick(db_dsn: str, schedulers: int = 1) -> list[int]:
    """Run ``schedulers`` scheduler ticks at once, each on its own store (its own
    connections, its own leadership): as many processes would."""

    async def main() -> list[int]:
        stores = [
            AsyncStore.create(db_dsn, min_size=1, max_size=2, retry_s=0) for _ in range(schedulers)
        ]
        for s in stores:
            await s.open(wait=True, timeout=10)
        try:
            ticks = [Scheduler(s, Settings(), Leadership(s)).tick() for s in stores]
            return list(await asyncio.gather(*ticks))
        finally:
            for s in stores:
                await s.close()

    return run_async(main)


# --------------------------------------------------------------------------- contract


def test_put_get_list_pause_resume_delete(db_dsn: str) -> None:
    with api_client(db_dsn) as http:
        r = http.put(
            "/schedules/report",
            json={
                "cron": "0 2 * * *",
                "timezone": "Europe/Berlin",
                "job": {"type": "report.daily"},
            },
        )
        assert r.status_code == 201, r.text
        body = r.json()
        assert (body["name"], body["cron"], body["every_ms"], body["catch_up"]) == (
            "report",
            "0 2 * * *",
            None,
            "latest",
        )
        assert body["next_fire_at"].endswith(":00:00.000000Z")  # 02:00 Berlin, in UTC
        assert (body["paused"], body["last_fire_at"], body["last_job_id"]) == (False, None, None)
        assert http.post("/schedules/report/pause").json()["paused"] is True
        r = http.put("/schedules/report", json={**EVERY, "catch_up": "none"})
        assert r.status_code == 200 and r.json()["paused"] is True  # replaced, still paused
        assert r.json()["every_ms"] == 1000 and r.json()["cron"] is None
        assert http.post("/schedules/report/resume").json()["paused"] is False
        assert [s["name"] for s in http.get("/schedules").json()["schedules"]] == ["report"]
        assert http.get("/schedules/report").json()["job"] == {"type": "noop", "queue": "cron"}
        assert http.delete("/schedules/report").status_code == 204
        for method, path in [
            ("delete", "/schedules/report"),
            ("get", "/schedules/report"),
            ("post", "/schedules/report/pause"),
        ]:
            assert_problem(getattr(http, method)(path), 404)


BAD = [
    ({"job": {"type": "t"}}, {"cron"}),
    ({"cron": "* * * * *", "every_ms": 1000, "job": {"type": "t"}}, {"cron"}),
    ({"cron": "61 * * * *", "job": {"type": "t"}}, {"cron"}),
    ({"cron": "x" * 300, "job": {"type": "t"}}, {"cron"}),
    ({"cron": 5, "job": {"type": "t"}}, {"cron"}),
    ({"every_ms": 99, "job": {"type": "t"}}, {"every_ms"}),
    ({"every_ms": True, "job": {"type": "t"}}, {"every_ms"}),
    ({"every_ms": 1000, "timezone": "Mars/Olympus", "job": {"type": "t"}}, {"timezone"}),
    ({"every_ms": 1000, "timezone": "../../etc/passwd", "job": {"type": "t"}}, {"timezone"}),
    (
        {"every_ms": 1000, "job": {"type": "bad type", "priority": 500}},
        {"job.type", "job.priority"},
    ),
    ({"every_ms": 1000, "job": {"type": "t", "depends_on": ["1"]}}, {"job.depends_on"}),
    ({"every_ms": 1000}, {"job"}),
    ({"every_ms": 1000, "job": {"type": "t", "run_at": "2030-01-01T00:00:00Z"}}, {"job.run_at"}),
    (
        {"every_ms": 1000, "job": {"type": "t", "deadline": "2030-01-01T00:00:00Z"}},
        {"job.deadline"},
    ),
    ({"every_ms": 1000, "job": {"type": "t"}, "catch_up": "all"}, {"catch_up"}),
    ({"every_ms": 1000, "job": {"type": "t"}, "jitter": 1}, {"jitter"}),
]


@pytest.mark.parametrize(("body", "fields"), BAD, ids=[str(b)[:50] for b, _ in BAD])
def test_bad_schedules_are_422_naming_the_field(
    db_dsn: str, body: dict[str, Any], fields: set[str]
) -> None:
    with api_client(db_dsn) as http:
        r = http.put("/schedules/s", json=body)
        assert error_fields(r) == fields, r.text
        assert_problem(http.get("/schedules/s"), 404)  # nothing stored


@pytest.mark.parametrize("name", ["has space", "x" * 129, "é"])
def test_bad_schedule_names_are_422(db_dsn: str, name: str) -> None:
    with api_client(db_dsn) as http:
        assert error_fields(http.put(f"/schedules/{name}", json=EVERY)) == {"name"}
        assert error_fields(http.get(f"/schedules/{name}")) == {"name"}


# --------------------------------------------------------------------------- firing


def test_each_due_tick_is_enqueued_once_with_its_key(db_dsn: str) -> None:
    with api_client(db_dsn) as http:
        http.put("/schedules/s", json=EVERY)
    due = _backdate(db_dsn, "s", 2)
    before = _db_now(db_dsn)
    [fired] = _tick(db_dsn)  # due, due+1 s, due+2 s (and due+3 s if a second passed)
    assert fired in _ticks_due(due, before, _db_now(db_dsn)) and fired >= 3  # late, not missed
    again = _tick(db_dsn)  # nothing fired twice: only a tick due since, if any
    keys = [j["idempotency_key"] for j in _tick_jobs(db_dsn, "s")]
    assert keys == [tick_key("s", due + timedelta(seconds=i)) for i in range(fired + again[0])]
    assert keys[0] == "schedule:s:" + due.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    with api_client(db_dsn) as http:
        shown = http.get("/schedules/s").json()
    assert shown["last_job_id"] == str(_tick_jobs(db_dsn, "s")[-1]["id"])


@pytest.mark.parametrize("schedulers", [2, 4])
def test_schedulers_firing_at_once_enqueue_each_tick_once(db_dsn: str, schedulers: int) -> None:
    with api_client(db_dsn) as http:
        for name in ("a", "b", "c"):
            http.put(f"/schedules/{name}", json=EVERY)
    dues = {name: _backdate(db_dsn, name, 1) for name in ("a", "b", "c")}
    fired = _tick(db_dsn, schedulers)
    assert fired.count(0) >= schedulers - 1  # one leader
    jobs = {name: _tick_jobs(db_dsn, name) for name in ("a", "b", "c")}
    assert sum(fired) == sum(len(j) for j in jobs.values())  # each enqueued once
    for name, due in dues.items():
        assert len(jobs[name]) >= 2  # due-1 s and due
        keys = [j["idempotency_key"] for j in jobs[name]]
        assert keys == [tick_key(name, due + timedelta(seconds=i)) for i in range(len(keys))]


def test_a_tick_whose_key_is_taken_is_not_enqueued_again(db_dsn: str) -> None:
    """A scheduler that fired a tick and lost its transaction's outcome, or a second
    leader after a lost lock: the key decides, not the schedule row."""
    with api_client(db_dsn) as http:
        http.put("/schedules/s", json={**EVERY, "every_ms": 3_600_000})  # one tick due
        due = _backdate(db_dsn, "s", 0)
        existing = http.post(
            "/jobs", json={"type": "noop"}, headers={"Idempotency-Key": tick_key("s", due)}
        ).json()
    assert _tick(db_dsn) == [1]
    jobs = _tick_jobs(db_dsn, "s")
    assert [j["id"] for j in jobs] == [int(existing["id"])]
    with api_client(db_dsn) as http:
        assert http.get("/schedules/s").json()["last_job_id"] == existing["id"]


@pytest.mark.parametrize(("catch_up", "jobs"), [("latest", 1), ("none", 0)])
def test_after_downtime_latest_fires_once_and_none_skips(
    db_dsn: str, catch_up: str, jobs: int
) -> None:
    with api_client(db_dsn) as http:
        http.put("/schedules/s", json={**EVERY, "catch_up": catch_up})
    _backdate(db_dsn, "s", 120)
    _tick(db_dsn)
    assert len(_tick_jobs(db_dsn, "s")) == jobs
    with api_client(db_dsn) as http:
        nxt = datetime.fromisoformat(http.get("/schedules/s").json()["next_fire_at"])
    with connect(db_dsn) as conn:
        now = conn.execute("SELECT now() AS now").fetchone()
    assert now is not None and nxt > now["now"] - timedelta(seconds=1)  # moved on


def test_a_paused_schedule_fires_nothing(db_dsn: str) -> None:
    with api_client(db_dsn) as http:
        http.put("/schedules/s", json=EVERY)
        http.post("/schedules/s/pause")
    _backdate(db_dsn, "s", 2)
    assert _tick(db_dsn) == [0]
    assert _tick_jobs(db_dsn, "s") == []


def test_registry_periodic_is_checked_and_declared(db_dsn: str) -> None:
    registry = Registry()
    registry.periodic(timedelta(seconds=1), "noop", {"x": 1}, name="tick", queue="cron")
    with pytest.raises(SpecError):
        registry.periodic("not cron", "noop", name="bad")
    with pytest.raises(SpecError):
        registry.periodic(timedelta(milliseconds=1), "noop", name="fast")

    async def declare() -> list[datetime]:
        async with async_store(db_dsn) as store:
            spec = registry.periodics()["tick"]
            first = await store.schedule_declare(spec.params("tick", await store.db_now()))
            later = await store.schedule_declare(
                spec.params("tick", await store.db_now() + timedelta(seconds=30))
            )
            return [first.next_fire_at, later.next_fire_at]

    first, later = run_async(declare)
    assert first == later  # the same definition keeps its next tick
