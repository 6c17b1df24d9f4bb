"""Three hosts, each a network namespace this test makes (deadman/chaos/hosts.py, the
partition scenario's namespaces: loopback, a veth pair to the machine, a forwarder to
Postgres): ``deadman serve`` on the first, a ``deadman worker`` on each of the other
two, the last one's clock three hours ahead (libfaketime). Jobs go in through the API
on host 1 and run on hosts 2 and 3.

Then, first with the skewed host alone (so that every maintenance decision is its
own): its leases, its schedule's ticks, start_by and deadline, and retention all
follow the database's clock. Then host 2 joins, is cut off while it holds jobs and
is healed: the skewed host rescues its jobs within the lease bound (measured on the
database's clock: neither early nor late), host 2's late writes are refused by the
fence, no job is lost and no effect (written in ``ctx.transaction()``) doubled.

Needs root (or CAP_NET_ADMIN) for ``ip netns`` and Debian's ``faketime`` package:
without either the test fails and says so (``make faketime-deps`` installs it); it
never skips, since a skipped test proves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from deadman.chaos import netns
from deadman.chaos.hosts import SKEW, Host, Hosts, faketime_missing
from deadman.chaos.hosts_app import SCHEDULE, TICK_QUEUE
from deadman.maintenance.scheduler import tick_key
from tests.factories import connect, insert_job
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    START_TIMEOUT_S,
    Proc,
    Spawner,
    all_succeeded,
    db_now,
    sql_all,
    sql_value,
    wait_registered,
)

#: Longer than the acceptance tests' 2 s: a healthy lease must never lapse on this
#: loaded machine (the test asserts that none does), and a cut-off host's must lapse
#: within the test's budget. The heartbeat at a fifth of it may be late thrice.
TTL_S = 5.0
HEARTBEAT_S = 1.0
RESCUE_S = 0.5
#: Retention of succeeded jobs on the skewed host: two hours, less than its skew, so
#: a cleaner that read its own clock would prune a job that finished a minute ago.
RETENTION_S = 2 * 3600
SKEW_S = 3 * 3600
#: The cut-off run's handlers: long enough that a cut lands mid-handler.
HANDLER_MS = 2500
API_PORT = 8080  # the API host's own namespace: nothing else listens there
HOST_ENV = {
    "DEADMAN_LEASE_TTL_S": str(TTL_S),
    "DEADMAN_HEARTBEAT_S": str(HEARTBEAT_S),
    "DEADMAN_RESCUE_S": str(RESCUE_S),
}
#: Worker starts: Python, imports, the netns hop and libfaketime, on a loaded machine.
START_S = 2 * START_TIMEOUT_S


@pytest.fixture
def hosts(db_dsn: str) -> Iterator[Hosts]:
    """The three namespaces; the test fails (never skips) where they cannot be made."""
    reason = netns.available()
    if reason is not None:
        pytest.fail(
            f"the many-hosts test needs network namespaces (root or CAP_NET_ADMIN and "
            f"`ip netns`): {reason}"
        )
    missing = faketime_missing()
    if missing is not None:
        pytest.fail(f"the skewed host needs libfaketime: {missing} (make faketime-deps)")
    made = Hosts(db_dsn)
    try:
        made.setup()
    except RuntimeError as exc:
        pytest.fail(f"could not make the hosts' namespaces: {exc}")
    try:
        yield made
    finally:
        made.teardown()


def start_on(
    spawner: Spawner, host: Host, dsn: str, args: list[str], name: str, **env: str
) -> Proc:
    """Run ``deadman <args>`` on ``host`` (its namespace, its clock), reaching the
    database through the host's link. The spawner kills it at teardown and prints
    its log if the test failed."""
    url = {"DEADMAN_DATABASE_URL": host.dsn(dsn)}
    return spawner.start(args, name, {**HOST_ENV, **env, **url}, prefix=host.prefix())


def worker_on(spawner: Spawner, host: Host, dsn: str, app: str, name: str, **env: str) -> Proc:
    args = ["worker", "--processes", "1", "--concurrency", "8", "--app", app]
    return start_on(spawner, host, dsn, args, name, **env)


def submit(api: httpx.Client, jobs: list[dict[str, Any]]) -> list[int]:
    """POST /jobs/batch on host 1; the new jobs' ids."""
    answer = api.post("/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 201, answer.text
    return [int(j["id"]) for j in answer.json()["jobs"]]


def at(moment: datetime) -> str:
    return moment.isoformat()


def ticks(dsn: str) -> list[datetime]:
    """The seconds the schedule's ticks were for, read from their idempotency keys."""
    prefix = f"schedule:{SCHEDULE}:"
    rows = sql_all(
        dsn,
        "SELECT idempotency_key FROM deadman.jobs WHERE queue = %s AND idempotency_key LIKE %s",
        (TICK_QUEUE, prefix + "%"),
    )
    keys = [r["idempotency_key"].removeprefix(prefix).replace("Z", "+00:00") for r in rows]
    return sorted(datetime.fromisoformat(k) for k in keys)


def log_clock(proc: Proc) -> datetime:
    """The clock a process logs with (its own, not the database's)."""
    stamps = [json.loads(line)["timestamp"] for line in proc.log_text().splitlines() if "{" in line]
    return datetime.fromisoformat(stamps[-1].replace("Z", "+00:00"))


def lease_margins(dsn: str, worker: str) -> list[float]:
    """For each lease ``worker`` holds: seconds until it lapses, on the database's clock."""
    rows = sql_all(
        dsn,
        "SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8 AS left_s"
        " FROM deadman.jobs WHERE state = 'running' AND lease_worker = %s",
        (worker,),
    )
    return [float(r["left_s"]) for r in rows]


def running_handlers(dsn: str, worker: str) -> int:
    """How many of ``worker``'s leases have a handler that began less than a second
    ago (its completion, HANDLER_MS later, is still to come)."""
    n = sql_value(
        dsn,
        "SELECT count(*) FROM deadman.jobs j JOIN deadman.chaos_invocations i"
        " ON i.lease_token = j.lease_token"
        " WHERE j.state = 'running' AND j.lease_worker = %s"
        " AND i.at > clock_timestamp() - interval '1 second'",
        (worker,),
    )
    return int(n)


def rescues(dsn: str, worker: str) -> list[datetime]:
    """When (database clock) the rescuer took each of ``worker``'s lapsed leases."""
    rows = sql_all(
        dsn,
        "SELECT finished_at FROM deadman.attempts WHERE worker = %s"
        " AND outcome = 'lease_expired' ORDER BY finished_at",
        (worker,),
    )
    return [r["finished_at"] for r in rows]


@pytest.fixture
def api(hosts: Hosts, _spawner: Spawner, db_dsn: str) -> Iterator[httpx.Client]:
    """``deadman serve`` on host 1, and a client of it from the machine."""
    host = hosts.api
    args = ["serve", "--host", host.address, "--port", str(API_PORT)]
    start_on(_spawner, host, db_dsn, args, "api-host1")
    with httpx.Client(base_url=f"http://{host.address}:{API_PORT}", timeout=10) as client:
        wait_for(lambda: _ready(client), START_S, 0.1, "the API on host 1 to be ready")
        yield client


def test_three_hosts_one_cut_off_one_hours_off_follow_the_database_clock(
    hosts: Hosts, _spawner: Spawner, api: httpx.Client, db_dsn: str
) -> None:
    plain, skewed = hosts.workers
    assert skewed.skew == SKEW

    # -- retention: one job finished three hours ago (database clock), one an hour ago
    with connect(db_dsn) as conn:
        old = insert_job(conn, state="succeeded", type="chaos-effect", finished_ago_s=3 * 3600)
        recent = insert_job(conn, state="succeeded", type="chaos-effect", finished_ago_s=3600)
    began = db_now(db_dsn)

    # -- phase 1: the skewed host alone; every lease, tick, expiry and prune is its own
    w3 = worker_on(
        _spawner,
        skewed,
        db_dsn,
        "deadman.chaos.hosts_app:registry",
        "worker-host3-skewed",
        DEADMAN_RETENTION_SUCCEEDED_S=str(RETENTION_S),
    )
    id3 = wait_registered(db_dsn, w3.pid, START_S)
    # The skew is real: the process logs with a clock three hours ahead.
    ahead = (log_clock(w3) - db_now(db_dsn)).total_seconds()
    assert SKEW_S - 60 < ahead < SKEW_S + 60, ahead

    now = db_now(db_dsn)
    later = now + timedelta(seconds=3)
    long_ids = submit(api, [{"type": "chaos-effect", "payload": {"ms": 3000}}] * 4)
    far, start_by_job, deadline_job = submit(
        api,
        [
            # its own clock says this deadline passed hours ago: it must still run
            {
                "type": "chaos-effect",
                "payload": {"ms": 0},
                "deadline": at(now + timedelta(seconds=60)),
            },
            # due after their start_by / deadline: must end dead, but only once the
            # database's clock passes it (the skewed clock passed it at once)
            {
                "type": "chaos-effect",
                "run_at": at(later),
                "start_by": at(now + timedelta(seconds=1.5)),
            },
            {
                "type": "chaos-effect",
                "run_at": at(later),
                "deadline": at(now + timedelta(seconds=1.5)),
            },
        ],
    )
    # Leases are granted for TTL on the database's clock, not three hours off.
    margins = wait_for(
        lambda: lease_margins(db_dsn, id3) or None, 15, 0.05, "host 3 to hold leases"
    )
    assert all(0 < m <= TTL_S for m in margins), margins

    def dead(job: int) -> dict[str, Any] | None:
        return _row_if(db_dsn, job, "dead")

    expired = wait_for(lambda: dead(start_by_job), 10 + LATE_S, 0.05, "start_by to expire it")
    past = wait_for(lambda: dead(deadline_job), 10 + LATE_S, 0.05, "the deadline to end it")
    assert expired["last_error"] == "expired" and past["last_error"] == "deadline"
    assert expired["attempt"] == 0 and past["attempt"] == 0  # never started
    for row, bound in ((expired, "start_by"), (past, "deadline")):
        late = (row["finished_at"] - row[bound]).total_seconds()
        assert 0 <= late <= RESCUE_S + LATE_S, (bound, late)

    # Ticks every second of the database's clock since the worker declared it.
    seen = wait_for(lambda: ticks(db_dsn) if len(ticks(db_dsn)) >= 3 else None, 15, 0.1)
    upto = db_now(db_dsn)
    assert len(seen) == len(set(seen))
    assert all(t.microsecond == 0 for t in seen)
    assert all(began - timedelta(seconds=1) <= t <= upto for t in seen), (began, seen, upto)
    next_fire = sql_value(
        db_dsn, "SELECT next_fire_at FROM deadman.schedules WHERE name = %s", (SCHEDULE,)
    )
    assert upto - timedelta(seconds=1) <= next_fire <= upto + timedelta(seconds=2 + LATE_S)
    assert tick_key(SCHEDULE, seen[0]) in _keys(db_dsn)

    # Retention by the database's clock: 3 h old goes, 1 h old stays (both are older
    # than two hours on the skewed clock).
    wait_for(lambda: _gone(db_dsn, old.id), 10 * RESCUE_S * 2 + LATE_S, 0.1, "the prune")
    assert not _gone(db_dsn, recent.id)
    wait_for(lambda: all_succeeded(db_dsn, [*long_ids, far]), 20, 0.1, "phase 1's jobs")
    assert not _gone(db_dsn, far)  # finished seconds ago: kept
    assert rescues(db_dsn, id3) == []  # no lease of its own judged lapsed

    # -- phase 2: host 2 joins; cut off while it holds jobs, healed later
    w2 = worker_on(_spawner, plain, db_dsn, "deadman.chaos.app:registry", "worker-host2")
    id2 = wait_registered(db_dsn, w2.pid, START_S)
    batch = submit(api, [{"type": "chaos-effect", "payload": {"ms": HANDLER_MS}}] * 48)
    wait_for(lambda: running_handlers(db_dsn, id2) > 0, 20, 0.02, "host 2 to run handlers")
    plain.cut()
    try:
        # Read once the link is down: no renewal can land after it, so these are the
        # moments host 2's leases lapse, on the database's clock.
        lapses = {
            r["id"]: r["lease_expires_at"]
            for r in sql_all(
                db_dsn,
                "SELECT id, lease_expires_at FROM deadman.jobs"
                " WHERE state = 'running' AND lease_worker = %s",
                (id2,),
            )
        }
        assert lapses, "host 2 held no lease when its link went down"
        wait_for(
            lambda: not lease_margins(db_dsn, id2) and bool(rescues(db_dsn, id2)),
            TTL_S + 10 * RESCUE_S + LATE_S,
            0.1,
            "the skewed host to rescue host 2's jobs",
        )
    finally:
        plain.heal()
    taken = {
        r["job_id"]: r["finished_at"]
        for r in sql_all(
            db_dsn,
            "SELECT job_id, finished_at FROM deadman.attempts"
            " WHERE worker = %s AND outcome = 'lease_expired'",
            (id2,),
        )
    }
    assert taken and set(taken) <= set(lapses), (taken, lapses)
    # Each lease judged lapsed neither early (before its expiry) nor late (past one
    # rescuer interval plus the machine's slack), on the database's clock, by a
    # rescuer whose own clock is three hours ahead.
    for job, when in taken.items():
        late = (when - lapses[job]).total_seconds()
        assert 0 <= late <= RESCUE_S + LATE_S, (job, late)
    refused = wait_for(
        lambda: (
            sql_value(
                db_dsn, "SELECT count(*) FROM deadman.lease_refusals WHERE worker = %s", (id2,)
            )
            or None
        ),
        30,
        0.1,
        "host 2's late writes to be refused",
    )
    wait_for(lambda: all_succeeded(db_dsn, batch), 40, 0.1, "every job of the cut-off run")

    # Nothing lost, nothing doubled; both worker hosts ran jobs, host 3 the rescued.
    every = [*long_ids, far, *batch]
    effects = sql_all(
        db_dsn,
        "SELECT j.id, count(e.id) AS n FROM deadman.jobs j"
        " LEFT JOIN deadman.effects e ON e.job_id = j.id WHERE j.id = ANY(%s) GROUP BY j.id",
        (every,),
    )
    assert len(effects) == len(every) and all(r["n"] == 1 for r in effects), effects
    ran_by = sql_all(
        db_dsn,
        "SELECT worker, count(*) AS n FROM deadman.attempts"
        " WHERE job_id = ANY(%s) AND outcome = 'succeeded' GROUP BY worker",
        (batch,),
    )
    assert {r["worker"] for r in ran_by} == {id2, id3}, ran_by
    rescued_ids = list(taken)
    finishers = sql_all(
        db_dsn,
        "SELECT DISTINCT worker FROM deadman.attempts"
        " WHERE job_id = ANY(%s) AND outcome = 'succeeded'",
        (rescued_ids,),
    )
    # Rescued while host 2 was cut off (only host 3 reached the database), then run
    # again: by host 3, or by host 2 once it was back, but once (the effects above).
    assert {r["worker"] for r in finishers} <= {id2, id3}, finishers
    assert int(refused) > 0
    # The cut landed mid-handler: a rescued job's handler ran on host 2, then again.
    runs = sql_all(
        db_dsn,
        "SELECT job_id, count(DISTINCT lease_token) AS n FROM deadman.chaos_invocations"
        " WHERE job_id = ANY(%s) GROUP BY job_id",
        (rescued_ids,),
    )
    assert any(r["n"] >= 2 for r in runs), runs
    assert rescues(db_dsn, id3) == []  # the skewed host lost no lease of its own


def _ready(api: httpx.Client) -> bool:
    try:
        return api.get("/ready").status_code == 200
    except httpx.HTTPError:
        return False


def _row_if(dsn: str, job: int, state: str) -> dict[str, Any] | None:
    rows = sql_all(dsn, "SELECT * FROM deadman.jobs WHERE id = %s AND state = %s", (job, state))
    return rows[0] if rows else None


def _gone(dsn: str, job: int) -> bool:
    return bool(sql_value(dsn, "SELECT count(*) FROM deadman.jobs WHERE id = %s", (job,)) == 0)


def _keys(dsn: str) -> set[str]:
    rows = sql_all(dsn, "SELECT idempotency_key FROM deadman.jobs WHERE queue = %s", (TICK_QUEUE,))
    return {r["idempotency_key"] for r in rows}
