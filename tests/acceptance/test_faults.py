"""Faults with real processes and real signals: a worker SIGKILLed mid-job, a zombie
worker (SIGSTOP, lease lost, SIGCONT), failing handlers and their backoff, a poison
pill that kills every worker touching it, and the standalone rescuer."""

from __future__ import annotations

import itertools
import signal
import time
import uuid
from typing import Any

import pytest

from deadman.client import Client
from deadman.model import Backoff
from deadman.store.leases import FINISH_IDLE_MS
from tests.helpers import wait_for
from tests.helpers.processes import (
    LATE_S,
    RESCUE_S,
    START_TIMEOUT_S,
    STEADY_TTL_S,
    TTL_S,
    Proc,
    SpawnRescuer,
    SpawnWorker,
    attempts_of,
    db_now,
    install_transition_log,
    job_row,
    process_state,
    sql_all,
    sql_value,
    states_of,
    transitions,
    wait_all_state,
    wait_fleet_ready,
    wait_held,
    wait_registered,
    wait_state,
    wait_workers,
)

pytestmark = pytest.mark.slow

#: How long a test waits for a takeover: the lease lapses at most TTL_S after the
#: victim's last renewal, the rescuer looks every RESCUE_S, and the rescue's NOTIFY
#: wakes the other worker at once; LATE_S of slack for each of the last two. The
#: bounds asserted are the same steps, each on the database's clock.
TAKEOVER_DEADLINE_S = TTL_S + RESCUE_S + 2 * LATE_S
#: How long the jobs of the kill test run.
JOB_MS = 2000
#: how long the zombie's handler sleeps before its transaction: the slack the test has
#: to freeze it mid-sleep after seeing it hold the job
ZOMBIE_SLEEP_MS = 3000
JOB_S = JOB_MS / 1000


def holder(dsn: str, job_id: int, workers: dict[str, Proc]) -> tuple[str, Proc, int]:
    """Wait until one of ``workers`` (by worker id) holds the job; returns (worker id,
    process, lease token)."""

    def check() -> tuple[str, Proc, int] | None:
        row = job_row(dsn, job_id)
        if row["state"] == "running" and row["lease_worker"] in workers:
            return row["lease_worker"], workers[row["lease_worker"]], row["lease_token"]
        return None

    return wait_for(check, 10, interval=0.01, message=f"a worker to claim job {job_id}")


def effects_of(dsn: str, job_id: int) -> list[dict[str, Any]]:
    return sql_all(dsn, "SELECT * FROM deadman.effects WHERE job_id = %s ORDER BY id", (job_id,))


@pytest.mark.parametrize(
    ("job_type", "payload"),
    [("sleep", {"ms": JOB_MS}), ("side-effect", {"sleep_ms": JOB_MS})],
    ids=["async-sleep", "sync-side-effect"],
)
def test_sigkill_mid_job_another_worker_finishes_it(
    db_dsn: str, spawn_worker: SpawnWorker, job_type: str, payload: dict[str, int]
) -> None:
    # Two idle workers; whichever claims the job is the victim, the other must take over.
    # A 30 s poll: only the rescuer's NOTIFY can wake the survivor in time.
    procs = [spawn_worker(db_dsn, name=f"w{i}", DEADMAN_POLL_S=30) for i in range(2)]
    workers = {wait_registered(db_dsn, p.pid): p for p in procs}
    with Client(db_dsn) as client:
        job = client.enqueue(job_type, payload)
    victim_id, victim, victim_token = holder(db_dsn, job.id, workers)
    (survivor_id,) = set(workers) - {victim_id}

    victim.send(signal.SIGKILL)
    killed_db = db_now(db_dsn)
    assert victim.wait_exit(5) == -signal.SIGKILL
    # Nobody renews the victim's lease any more: this is when it lapses.
    expiry = job_row(db_dsn, job.id)["lease_expires_at"]

    survivor_token = wait_held(db_dsn, job.id, survivor_id, timeout=TAKEOVER_DEADLINE_S)
    row = wait_state(db_dsn, job.id, "succeeded", timeout=JOB_S + 2 * LATE_S)

    lost, won = attempts_of(db_dsn, job.id)
    assert (lost["outcome"], lost["worker"], lost["lease_token"], lost["attempt"]) == (
        "lease_expired",
        victim_id,
        victim_token,
        1,
    )
    assert (won["outcome"], won["worker"], won["lease_token"], won["attempt"]) == (
        "succeeded",
        survivor_id,
        survivor_token,
        1,
    )
    # Both sides of the threshold, on the database's clock: not rescued before the
    # lease lapsed, rescued within a rescue interval of it, and claimed soon after the
    # rescue (the survivor polls every 30 s: only the rescue's NOTIFY wakes it so soon).
    rescue_s = (lost["finished_at"] - expiry).total_seconds()
    wake_s = (won["started_at"] - lost["finished_at"]).total_seconds()
    assert 0 <= rescue_s < RESCUE_S + LATE_S, rescue_s
    assert 0 <= wake_s < LATE_S, wake_s
    # ... and it then ran its full length once more on the survivor.
    ran_s = (won["finished_at"] - won["started_at"]).total_seconds()
    assert JOB_S <= ran_s < JOB_S + LATE_S, ran_s
    assert (row["attempt"], row["rescues"]) == (1, 1)
    if job_type == "side-effect":
        assert [e["lease_token"] for e in effects_of(db_dsn, job.id)] == [survivor_token]
    print(
        f"{job_type}: kill -> rescue {(lost['finished_at'] - killed_db).total_seconds():.2f}s"
        f" (expiry -> rescue {rescue_s:.2f}s), rescue -> survivor claim {wake_s:.2f}s,"
        f" ran {ran_s:.2f}s"
    )


def test_zombie_worker_late_write_is_refused(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    # debug: its job_started line says the handler has begun, which the lease alone
    # does not (a fresh-clone suite froze it after its claim committed and before the
    # job's task first ran; woken, it gave the untrusted lease up before the handler
    # began, so no write was attempted and none refused)
    zombie = spawn_worker(db_dsn, name="zombie", DEADMAN_LOG_LEVEL="debug")
    zombie_id = wait_registered(db_dsn, zombie.pid)
    with Client(db_dsn) as client:
        # Sync handler: sleeps in a thread, then writes its effect inside
        # ctx.transaction(). Frozen mid-sleep, the zombie wakes up with the write to do.
        job = client.enqueue("side-effect", {"sleep_ms": ZOMBIE_SLEEP_MS})
    zombie_token = wait_held(db_dsn, job.id, zombie_id)
    zombie.wait_event("job_started", 5, job_id=job.id)
    zombie.send(signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: process_state(zombie.pid) == "T", 5, message="the zombie to stop")
    # The test's premise: frozen before its sleep ended. Stopped inside the transaction
    # instead, the late write may fail without reaching the fence (its session ended by
    # the server's idle limit). With a 1.5 s sleep one run in five failed for a reason
    # not found; this check tells a late freeze apart from anything else.
    since_claim = sql_value(
        db_dsn,
        "SELECT extract(epoch FROM clock_timestamp() - started_at)::float8"
        " FROM deadman.jobs WHERE id = %s",
        (job.id,),
    )
    assert since_claim < ZOMBIE_SLEEP_MS / 1000, (
        f"the zombie was frozen {since_claim:.2f} s after its claim: its handler may be"
        " past its sleep, and this test no longer tests a late fenced write"
    )

    # Started after the freeze, so only a rescue can hand it the job.
    other = spawn_worker(db_dsn, name="other")
    other_id = wait_registered(db_dsn, other.pid)
    row = wait_state(db_dsn, job.id, "succeeded", timeout=TAKEOVER_DEADLINE_S + 10)
    print(f"zombie: job finished by the other worker {time.monotonic() - stopped:.2f}s after STOP")
    (effect,) = effects_of(db_dsn, job.id)
    lost, won = attempts_of(db_dsn, job.id)
    assert (lost["outcome"], lost["worker"], lost["lease_token"]) == (
        "lease_expired",
        zombie_id,
        zombie_token,
    )
    assert (won["outcome"], won["worker"]) == ("succeeded", other_id)
    assert effect["lease_token"] == won["lease_token"]

    zombie.send(signal.SIGCONT)
    resumed = time.monotonic()
    # Its handler thread wakes up and tries to commit effect + completion: refused.
    try:
        refusal = wait_for(
            lambda: (
                sql_all(
                    db_dsn,
                    "SELECT * FROM deadman.lease_refusals WHERE job_id = %s AND worker = %s"
                    " AND action = 'transaction'",
                    (job.id, zombie_id),
                )
                or None
            ),
            10,
            message="the zombie's transaction to be refused and recorded",
        )
    except AssertionError as exc:
        logged = [e for e in zombie.events() if e.get("job_id") == job.id]
        # Twice (one run in ~5 with 1.5 s; once with three pytest workers) this came
        # with no cause in the log, the second time with no line at all after CONT:
        # where its threads are, and whether it runs, say what the log cannot.
        state = process_state(zombie.pid)
        sessions = sql_all(
            db_dsn,
            "SELECT pid, application_name, state, wait_event_type, wait_event,"
            " pg_blocking_pids(pid) AS blocked_by, left(query, 100) AS query"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()",
        )
        raise AssertionError(
            f"{exc}; the zombie's log for the job: {logged}; its state: {state};"
            f" the database's sessions: {sessions};"
            f" its threads:\n{zombie.stacks() or '<no dump>'}"
        ) from None
    print(f"zombie: late write refused {time.monotonic() - resumed:.2f}s after CONT")
    assert [r["lease_token"] for r in refusal] == [zombie_token]
    refusals = sql_all(
        db_dsn, "SELECT action, lease_token, worker FROM deadman.lease_refusals ORDER BY id"
    )
    assert all(r["lease_token"] == zombie_token and r["worker"] == zombie_id for r in refusals)
    # 'abandoned': the woken worker also stood down from the lease it could no longer
    # trust (recorded as evidence, best effort)
    assert {r["action"] for r in refusals} <= {"transaction", "heartbeat", "finish", "abandoned"}
    # The thread's write is always refused. Whether the heartbeat also logs lease_lost
    # depends on which of the two runs first after SIGCONT (a heartbeat that finds the
    # completion already in flight leaves the verdict to it), so it is not asserted.
    zombie.wait_event("stale_write_refused", 5, job_id=job.id, action="transaction")
    # The freeze stopped its event loop too, and the woken worker says for how long
    # (deadman.loopwatch): the time it was stopped, within a tick or two.
    # (A loaded machine may have stalled it briefly before: look for the long one.)
    frozen_ms = (resumed - stopped) * 1000
    wait_for(
        lambda: any(
            e["blocked_ms"] >= frozen_ms - 500 for e in zombie.events("event_loop_blocked_for")
        ),
        5,
        message=f"the zombie to log its loop's {frozen_ms:.0f} ms standstill",
    )
    events = sorted({e["event"] for e in zombie.events() if e.get("job_id") == job.id})
    print(f"zombie: its log for the job: {events}, refusals {[r['action'] for r in refusals]}")

    # Exactly one effect, the other worker's; the job stays succeeded; no extra attempt.
    assert [e["lease_token"] for e in effects_of(db_dsn, job.id)] == [won["lease_token"]]
    assert job_row(db_dsn, job.id)["state"] == "succeeded"
    assert job_row(db_dsn, job.id)["finished_at"] == row["finished_at"]
    assert len(attempts_of(db_dsn, job.id)) == 2

    # The zombie recovered: it still works and shuts down cleanly.
    with Client(db_dsn) as client:
        ids = [client.enqueue("side-effect").id for _ in range(10)]
    wait_all_state(db_dsn, ids, "succeeded", timeout=10)
    zombie.send(signal.SIGTERM)
    assert zombie.wait_exit(10) == 0


#: Makes one worker's fenced completion of a job slow (test database only): its
#: backend sleeps inside job_succeed_in, so the test can freeze the worker between
#: that statement and its COMMIT.
SLOW_FINISH_SQL = """
CREATE TABLE public.slow_finish (worker text PRIMARY KEY);
CREATE FUNCTION public.slow_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.slow_finish WHERE worker = OLD.lease_worker) THEN
        PERFORM pg_sleep(%(sleep_s)s);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER slow_finish AFTER UPDATE OF state ON deadman.jobs
    FOR EACH ROW WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION public.slow_finish();
"""
#: how long the slowed completion sleeps on the server
SLOW_FINISH_S = 3.0


def test_a_worker_frozen_before_its_commit_does_not_keep_the_job(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """A worker frozen (SIGSTOP: a VM pause, a partition) after its fenced completion
    inside ctx.transaction() but before the COMMIT holds the job's row lock, and the
    rescuer's SKIP LOCKED passes over a locked row. The completion sets the session's
    idle-in-transaction limit (job_succeed_in, FINISH_IDLE_MS): the server ends the
    frozen session, its effect and completion roll back, and the job is handed on.
    Woken, the worker's COMMIT fails; one effect survives, the other worker's."""
    zombie = spawn_worker(db_dsn, name="zombie")
    zombie_id = wait_registered(db_dsn, zombie.pid)
    sql_all(db_dsn, SLOW_FINISH_SQL % {"sleep_s": SLOW_FINISH_S})
    sql_all(db_dsn, "INSERT INTO public.slow_finish VALUES (%s)", (zombie_id,))
    with Client(db_dsn) as client:
        job = client.enqueue("side-effect")
    # Its backend sleeps inside the completion: the fence has passed, the COMMIT is next.
    (backend,) = wait_for(
        lambda: (
            sql_all(
                db_dsn,
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event = 'PgSleep'",
            )
            or None
        ),
        10,
        interval=0.005,
        message="the zombie's completion to sleep",
    )
    zombie.send(signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: process_state(zombie.pid) == "T", 5, message="the zombie to stop")
    assert (
        sql_value(
            db_dsn, "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (backend["pid"],)
        )
        == "PgSleep"
    ), "the zombie was frozen after its completion had finished sleeping"

    other = spawn_worker(db_dsn, name="other")
    other_id = wait_registered(db_dsn, other.pid)
    # The server ends the frozen session FINISH_IDLE_MS after the completion returned;
    # until then the row is locked and no rescue can take it.
    deadline = SLOW_FINISH_S + FINISH_IDLE_MS / 1000 + TAKEOVER_DEADLINE_S
    row = wait_state(db_dsn, job.id, "succeeded", timeout=deadline)
    took = time.monotonic() - stopped
    print(f"frozen before commit: job finished by the other worker {took:.2f}s after STOP")
    assert (
        sql_value(db_dsn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend["pid"],))
        == 0
    ), "the frozen session should have been ended by the server"
    lost, won = attempts_of(db_dsn, job.id)
    assert (lost["outcome"], lost["worker"]) == ("lease_expired", zombie_id)
    assert (won["outcome"], won["worker"]) == ("succeeded", other_id)
    assert [e["lease_token"] for e in effects_of(db_dsn, job.id)] == [won["lease_token"]]

    zombie.send(signal.SIGCONT)
    # Its COMMIT meets a closed session: the handler raises, and the worker either
    # abandons the attempt (the lease it no longer trusts) or reports a failure that
    # the fence refuses. Either way nothing is written.
    outcome = wait_for(
        lambda: next(
            (
                e
                for e in zombie.events()
                if e.get("job_id") == job.id
                and e["event"] in ("job_abandoned_lease_lost", "stale_write_refused")
            ),
            None,
        ),
        10,
        message="the woken zombie to give the job up",
    )
    print(f"frozen before commit: the zombie's verdict {outcome}")
    assert [e["lease_token"] for e in effects_of(db_dsn, job.id)] == [won["lease_token"]]
    assert job_row(db_dsn, job.id)["state"] == "succeeded"
    assert job_row(db_dsn, job.id)["finished_at"] == row["finished_at"]
    assert len(attempts_of(db_dsn, job.id)) == 2

    # The zombie recovered: its handler connections work again, and it stops cleanly.
    other.send(signal.SIGTERM)
    assert other.wait_exit(10) == 0
    with Client(db_dsn) as client:
        ids = [client.enqueue("side-effect").id for _ in range(5)]
    wait_all_state(db_dsn, ids, "succeeded", timeout=10)
    zombie.send(signal.SIGTERM)
    assert zombie.wait_exit(10) == 0


def test_fixed_backoff_gaps_then_dead(db_dsn: str, spawn_worker: SpawnWorker) -> None:
    message = f"kaboom-{uuid.uuid4().hex[:8]}"
    worker = spawn_worker(db_dsn, DEADMAN_LEASE_TTL_S=STEADY_TTL_S)
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        job = client.enqueue(
            "fail",
            {"message": message},
            max_attempts=3,
            backoff=Backoff(strategy="fixed", base_ms=500, jitter="none"),
        )
    row = wait_state(db_dsn, job.id, "dead", timeout=15)
    attempts = attempts_of(db_dsn, job.id)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]
    assert all(message in a["error"] for a in attempts)
    assert message in row["last_error"]
    assert row["attempt"] == 3
    gaps = [
        (b["started_at"] - a["finished_at"]).total_seconds()
        for a, b in itertools.pairwise(attempts)
    ]
    print(f"fixed 500 ms backoff: gaps {[f'{g:.3f}s' for g in gaps]}")
    assert all(0.5 <= g < 0.5 + LATE_S for g in gaps), gaps


def test_exponential_full_jitter_never_exceeds_ceiling(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    install_transition_log(db_dsn)
    backoff = Backoff(strategy="exponential", base_ms=200, max_ms=800, jitter="full")
    worker = spawn_worker(db_dsn, DEADMAN_LEASE_TTL_S=STEADY_TTL_S)
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        ids = client.enqueue_many(
            client.job("fail", max_attempts=5, backoff=backoff) for _ in range(10)
        )
    wait_all_state(db_dsn, ids, "dead", timeout=20)

    delays = [t for t in transitions(db_dsn) if t["new_state"] == "retrying"]
    assert len(delays) == 10 * 4
    ratios = []
    for d in delays:
        ceiling = backoff.ceiling_ms(d["attempt"]) / 1000
        assert 0 <= d["delay_s"] <= ceiling, d
        ratios.append(d["delay_s"] / ceiling)
    # Jitter is really applied: full jitter is uniform over [0, ceiling].
    assert min(ratios) < 0.5 < max(ratios), ratios
    # And the worker honoured each delay: never early, and not left for ever.
    by_job = {(d["job_id"], d["attempt"]): d["delay_s"] for d in delays}
    for job_id in ids:
        attempts = attempts_of(db_dsn, job_id)
        assert [a["outcome"] for a in attempts] == ["failed"] * 5
        for a, b in itertools.pairwise(attempts):
            gap = (b["started_at"] - a["finished_at"]).total_seconds()
            delay = by_job[(job_id, a["attempt"])]
            assert delay <= gap < backoff.ceiling_ms(a["attempt"]) / 1000 + LATE_S
    print(
        f"full jitter: {len(ratios)} delays, "
        f"delay/ceiling in [{min(ratios):.2f}, {max(ratios):.2f}]"
    )


def test_poison_pill_goes_dead_and_other_jobs_keep_flowing(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    fleet = spawn_worker(db_dsn, processes=2, concurrency=4, DEADMAN_MAX_RESCUES=2)
    wait_workers(db_dsn, 2)
    with Client(db_dsn) as client:
        # after_ms: the jobs claimed in the same batch finish before the crash.
        jobs = [client.job("noop") for _ in range(200)]
        jobs.insert(100, client.job("poison", {"after_ms": 200}))
        ids = client.enqueue_many(jobs)
    poison_id = ids.pop(100)

    started = time.monotonic()
    row = wait_state(db_dsn, poison_id, "dead", timeout=60)
    print(f"poison pill dead after {time.monotonic() - started:.1f}s")
    assert row["rescues"] == 3
    assert "lease expired 3 times" in row["last_error"]
    assert [a["outcome"] for a in attempts_of(db_dsn, poison_id)] == ["lease_expired"] * 3
    crashes = fleet.events("fleet_child_exited")
    assert [c["code"] for c in crashes] == [1, 1, 1]

    wait_all_state(db_dsn, ids, "succeeded", timeout=20)
    last_noop = sql_value(
        db_dsn, "SELECT max(finished_at) FROM deadman.jobs WHERE id = ANY(%s)", (ids,)
    )
    assert last_noop < row["finished_at"], "the noops waited for the poison pill"
    assert states_of(db_dsn, ids) == {"succeeded": 200}

    wait_fleet_ready(db_dsn, fleet, 2)  # a crashed child may still be restarting
    fleet.send(signal.SIGTERM)
    assert fleet.wait_exit(15) == 0


def test_standalone_rescuer(
    db_dsn: str, spawn_worker: SpawnWorker, spawn_rescuer: SpawnRescuer
) -> None:
    # A 30 s poll: the standalone rescuer's NOTIFY must wake the survivor.
    procs = [
        spawn_worker(db_dsn, no_rescuer=True, name=f"w{i}", DEADMAN_POLL_S=30) for i in range(2)
    ]
    workers = {wait_registered(db_dsn, p.pid): p for p in procs}
    with Client(db_dsn) as client:
        job = client.enqueue("sleep", {"ms": 1000})
    victim_id, victim, victim_token = holder(db_dsn, job.id, workers)
    (survivor_id,) = set(workers) - {victim_id}
    victim.send(signal.SIGKILL)
    assert victim.wait_exit(5) == -signal.SIGKILL
    expiry = job_row(db_dsn, job.id)["lease_expires_at"]

    # No rescuer runs anywhere: well past its expiry the job is still the victim's.
    wait_for(
        lambda: sql_value(
            db_dsn, "SELECT now() > %s + %s * interval '1 second'", (expiry, 4 * RESCUE_S)
        ),
        TTL_S + 10,
        interval=0.05,
        message="the lease to be long expired",
    )
    row = job_row(db_dsn, job.id)
    assert (row["state"], row["lease_token"]) == ("running", victim_token)

    rescuer = spawn_rescuer(db_dsn)
    spawned = time.monotonic()
    wait_held(db_dsn, job.id, survivor_id, timeout=START_TIMEOUT_S)
    handed_s = time.monotonic() - spawned
    print(f"standalone rescuer: job handed on {handed_s:.2f}s after spawn")
    lost = attempts_of(db_dsn, job.id)[0]
    # Claimed right after the rescue (NOTIFY), not at the survivor's next poll.
    claimed = job_row(db_dsn, job.id)["started_at"]
    assert (claimed - lost["finished_at"]).total_seconds() < LATE_S
    wait_state(db_dsn, job.id, "succeeded", timeout=10)
    assert [(a["outcome"], a["worker"]) for a in attempts_of(db_dsn, job.id)] == [
        ("lease_expired", victim_id),
        ("succeeded", survivor_id),
    ]
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait_exit(10) == 0


def test_poison_pill_does_not_take_its_batch_mates_to_dead(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    fleet = spawn_worker(db_dsn, processes=2, concurrency=4, DEADMAN_MAX_RESCUES=2)
    wait_workers(db_dsn, 2)
    with Client(db_dsn) as client:
        # Crashes at once: the noops claimed in its batch die with it, every time.
        ids = client.enqueue_many([client.job("poison"), *(client.job("noop") for _ in range(50))])
    poison_id, noops = ids[0], ids[1:]
    wait_state(db_dsn, poison_id, "dead", timeout=60)
    wait_for(
        lambda: (
            "running" not in states_of(db_dsn, noops) and "queued" not in states_of(db_dsn, noops)
        ),
        30,
        message="every noop to finish",
    )
    dead = sql_all(
        db_dsn,
        "SELECT id, rescues, last_error FROM deadman.jobs WHERE id = ANY(%s) AND state = 'dead'",
        (noops,),
    )
    print(f"poison batch-mates sent to dead: {[(d['id'], d['rescues']) for d in dead]}")
    assert dead == []
    wait_fleet_ready(db_dsn, fleet, 2)  # a crashed child may still be restarting
    fleet.send(signal.SIGTERM)
    assert fleet.wait_exit(15) == 0


def test_a_handler_that_blocks_the_loop_is_named_in_the_log(
    db_dsn: str, spawn_worker: SpawnWorker
) -> None:
    """A real worker whose async handler blocks the event loop for 1.5 s logs, while it
    lasts, the loop's stack down to the handler's line (JSON: ``frames``), then how
    long it lasted; the blocked job and one queued beside it both succeed."""
    worker = spawn_worker(db_dsn, name="blocked")
    wait_registered(db_dsn, worker.pid)
    with Client(db_dsn) as client:
        blocking = client.enqueue("block-loop", {"ms": 1500})
        beside = client.enqueue("side-effect")

    def named() -> dict[str, Any] | None:  # a loaded machine may add stalls of its own
        for e in worker.events("event_loop_blocked"):
            if e["frames"] and e["frames"][-1].endswith(" block_loop"):
                return e
        return None

    seen = wait_for(named, 10, message="the worker to name the blocking handler")
    assert "poison_app.py" in seen["frames"][-1], seen["frames"]
    assert not seen["in_loop"] and seen["blocked_ms"] >= 500, seen
    wait_for(
        lambda: any(e["blocked_ms"] >= 1000 for e in worker.events("event_loop_blocked_for")),
        10,
        message="the worker to log how long its loop was blocked",
    )
    wait_all_state(db_dsn, [blocking.id, beside.id], "succeeded", timeout=10)
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(10) == 0
