"""The race matrix: every statement that changes a job's state, against every other
statement that can touch the same row, on two real connections, in both commit orders.

How one case runs (the technique that found the retention bug):
1. ``setup`` writes the rows as the queue would have left them (factories).
2. Connection A runs the first statement and keeps its transaction open: it now holds
   the row locks the statement took.
3. Connection B runs the second statement in a thread. We wait, with a deadline, until
   B either finished (a SKIP LOCKED statement passes the locked row by) or is blocked
   on a lock (``pg_stat_activity.wait_event_type = 'Lock'``): the interleaving is
   forced, never hoped for.
4. A commits; B completes (its re-test under READ COMMITTED sees A's row); B commits.
5. The invariants are checked against the database.

The invariants (checked after every case):
- no acknowledged job vanishes: a job a retry or replay returned still exists;
- no fenced write lands with a stale token: once a statement ended an attempt's lease
  (finish, rescue), no later fenced statement with that token is acknowledged;
- an acknowledged cancel is never followed by a new attempt: the job is cancelled,
  succeeded by the attempt in flight, or still running that attempt with the flag
  set, and no claim can take it;
- a pause is honoured by the next claim;
- workflows finalise once: their counters match their nodes' rows, and a workflow
  is finished exactly when all its nodes are;
- dependency counters match rows: a waiting job's pending_deps is the number of its
  dependencies that have not succeeded, and none of them is dead or cancelled;
- no lost wake-up: a waiter (deadman.waiting: LISTEN, then its flag) whose job has
  ended sees the end, in what its flag read back or in a notification;
- no lost claim wake-up: a claim that ran second and came back without the job,
  which a claim could take once both committed, was stepped past (SKIP LOCKED) while
  the first statement held the row, and an idle worker then sleeps until its poll: so
  the first statement must have notified the job's queue on deadman_jobs (a waiter's
  flag did not: a job enqueued and waited on at once sat queued for the whole poll).

``MATRIX`` below is the table: each row names a setup and two statements; both
orders run. ``test_every_state_changing_statement_has_a_row`` fails when a query in
queries.sql writes deadman.jobs and no row of the matrix runs it: adding a statement
means adding its rows.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow, dict_row

from deadman.db.queries import QUERIES
from deadman.model import AttemptOutcome, JobState
from deadman.store import (
    ClaimParams,
    Finish,
    HeartbeatParams,
    NewJob,
    claim_params,
    finish_params,
    heartbeat_params,
    plans,
    succeed_params,
)
from deadman.store.leases import refill_params
from deadman.store.plan import run_sync
from deadman.store.submissions import grouped_order, grouped_params
from deadman.worker.parking import handoff_channel
from tests.factories import insert_job
from tests.helpers import wait_for

QUEUE = "race"
OTHER_QUEUE = "race-other"
KEY = "race-key"
TTL_MS = 30_000
MAX_RESCUES = 5
QUARANTINE_AT = 5
WORKER = "race-worker"
DAY_MS = 24 * 3600 * 1000

Conn = psycopg.Connection[DictRow]


@dataclass
class World:
    """What a setup made: the job under test and its neighbours."""

    job: int
    token: int | None = None
    #: for dependency cases: the job `job` waits for
    upstream: int | None = None
    upstream_token: int | None = None
    workflow: int | None = None
    #: for submission cases: the job `job` holds the idempotency key IDEM
    key_held: bool = False
    #: for dependency cases: a job that waits for `job`
    downstream: int | None = None


@dataclass(frozen=True)
class Stmt:
    """One state-changing statement, as the code sends it."""

    name: str
    #: the named queries it runs (the coverage test reads these)
    queries: tuple[str, ...]
    run: Callable[[Conn, World], list[DictRow]]
    #: its acknowledgement: what the caller would answer 200/202 for, or a worker
    #: would take as "done"
    acked: Callable[[list[DictRow], World], bool]
    #: a write fenced by the world's lease token (heartbeat, finish)
    fenced: bool = False
    #: ends the attempt that holds the world's lease token (finish, rescue)
    ends_lease: bool = False
    #: after both commits, on its own connection: how it saw the end of the job
    #: ("read", "notified"; "lost": a lost wake-up), or None: the job has not ended.
    #: Waiters only.
    woken: Callable[[Conn, Conn, World, list[DictRow]], str | None] | None = None
    #: creates the job holding IDEM when acknowledged (submissions)
    inserts: bool = False


def _rows(conn: Conn, query: str, params: dict[str, Any], *, prepare: bool = True) -> list[DictRow]:
    cur = conn.execute(QUERIES[query], params, prepare=prepare)
    return cur.fetchall() if cur.description is not None else []


def _ids(rows: list[DictRow]) -> set[int]:
    return {int(r["id"]) for r in rows}


def _claim(conn: Conn, w: World) -> list[DictRow]:
    p = ClaimParams(QUEUE, WORKER + "-2", 10, TTL_MS, QUARANTINE_AT)
    return _rows(conn, "job_claim", claim_params(p))


def _limit_tighten(conn: Conn, w: World) -> list[DictRow]:
    """PUT /limits/{key}: the key's limit down to one slot."""
    return _rows(
        conn,
        "limit_put",
        {"key": KEY, "concurrency": 1, "rate_count": None, "rate_per_ms": None},
    )


def _claim_quarantined(conn: Conn, w: World) -> list[DictRow]:
    p = ClaimParams(QUEUE, WORKER + "-2", 1, TTL_MS, QUARANTINE_AT)
    return _rows(conn, "job_claim_quarantined", claim_params(p))


def _heartbeat(conn: Conn, w: World) -> list[DictRow]:
    assert w.token is not None
    p = HeartbeatParams(WORKER, "host", 1, [QUEUE], 10, TTL_MS, [(w.job, w.token)])
    return _rows(conn, "job_heartbeat_many", heartbeat_params(p))


def _finish(  # type: ignore[no-untyped-def]
    state: JobState,
    outcome: AttemptOutcome,
    *,
    on: str = "job",
    effect: bool = False,
    claim: bool = False,
):
    def run(conn: Conn, w: World) -> list[DictRow]:
        job, token = (w.job, w.token) if on == "job" else (w.upstream, w.upstream_token)
        assert job is not None and token is not None
        f = Finish(
            job,
            token,
            state,
            outcome,
            delay_ms=0,
            error=None if state is JobState.SUCCEEDED else f"{outcome.value} in the matrix",
            result={"ok": True} if state is JobState.SUCCEEDED else None,
        )
        if effect:  # ctx.transaction(): the effect and the fenced completion, one tx
            conn.execute(QUERIES["effect_insert"], {"job_id": job, "lease_token": token})
        if claim:  # the completer's refill: the finish and the next claim, one statement
            # (only the finish's rows are its acknowledgement: the claim may take the
            # very job a rescue put back, which is not this attempt's write landing)
            p = ClaimParams(QUEUE, WORKER + "-2", 10, TTL_MS, QUARANTINE_AT, keyed=False)
            both = _rows(conn, "job_finish_claim", refill_params([f], p))
            return [{"id": r["finished"]} for r in both if r["finished"] is not None]
        if effect:  # ctx.transaction()'s completion, which arms the idle limit as well
            return _rows(conn, "job_succeed_in", succeed_params(f, 60_000))
        return _rows(conn, "job_finish_many", finish_params([f]))

    return run


def _cancel(conn: Conn, w: World) -> list[DictRow]:
    return _rows(conn, "job_cancel", {"id": w.job})


def _retry(conn: Conn, w: World) -> list[DictRow]:
    return _rows(conn, "job_retry", {"id": w.job})


def _replay(conn: Conn, w: World) -> list[DictRow]:
    params = {"type": None, "queue": QUEUE, "after": None, "limit": 100}
    return [r for r in _rows(conn, "job_retry_dead_many", params, prepare=False) if r["replayed"]]


def _pause(conn: Conn, w: World) -> list[DictRow]:
    return _rows(conn, "queue_set_paused", {"name": QUEUE, "paused": True})


def _resume(conn: Conn, w: World) -> list[DictRow]:
    return _rows(conn, "queue_set_paused", {"name": QUEUE, "paused": False})


def _rescue(conn: Conn, w: World) -> list[DictRow]:
    """The rescuer's tick: the rescue, and the wake-up for the jobs it queued again
    (VerdictService.tick sends it just after the commit; sent here in the same
    transaction, it too reaches listeners at the commit)."""
    params = {"max_rescues": MAX_RESCUES, "quarantine_at": QUARANTINE_AT, "limit": 100}
    rows = _rows(conn, "job_rescue_expired", params)
    queued = sorted({r["queue"] for r in rows if r["state"] == "queued"})
    _rows(conn, "queue_notify", {"queues": queued})
    return rows


def _expire(conn: Conn, w: World) -> list[DictRow]:
    return _rows(conn, "job_expire", {"limit": 100})


def _prune(conn: Conn, w: World) -> list[DictRow]:
    params = {"succeeded_ms": DAY_MS, "failed_ms": DAY_MS, "limit": 100}
    return _rows(conn, "job_prune_finished", params)


def _workflow_cancel(conn: Conn, w: World) -> list[DictRow]:
    assert w.workflow is not None
    return _rows(conn, "workflow_cancel", {"id": w.workflow})


def _deps_lock(conn: Conn, w: World) -> list[DictRow]:
    """An enqueue with depends_on=[job] (in the caller's transaction): the new job's
    dependency is marked and locked until that transaction commits."""
    return _rows(conn, "job_deps_lock", {"ids": [w.job]})


def _retry_downstream(conn: Conn, w: World) -> list[DictRow]:
    """POST /jobs/{downstream}/retry: locks its dependency `job` FOR SHARE."""
    return _rows(conn, "job_retry", {"id": w.downstream})


def _replay_downstream(conn: Conn, w: World) -> list[DictRow]:
    """The bulk DLQ replay picking `downstream` (the queue's one dead job)."""
    return _replay(conn, World(job=w.downstream or 0))


def _retry_upstream(conn: Conn, w: World) -> list[DictRow]:
    return _rows(conn, "job_retry", {"id": w.upstream})


def _wait_flag(conn: Conn, w: World) -> list[DictRow]:
    """A waiter (deadman.waiting): it listens, flags the job, and reads it when the
    flag wrote nothing (flagged before). Here the LISTEN takes effect at the commit,
    with the flag; a statement that ends the job after seeing the flag commits later."""
    conn.execute(QUERIES["listen_done"])
    return _rows(conn, "job_wait_flag", {"id": w.job}) or _rows(conn, "job_get", {"id": w.job})


FINAL = ("succeeded", "dead", "cancelled")


def _woken(conn: Conn, observer: Conn, w: World, rows: list[DictRow]) -> str | None:
    """The waiter's side once both committed: its read showed the end, or the end is
    notified to it (the job ended after its flag). None: the job has not ended."""
    if any(r["state"] in FINAL for r in rows):
        return "read"
    row = observer.execute("SELECT state FROM deadman.jobs WHERE id = %s", (w.job,)).fetchone()
    if row is None or row["state"] not in FINAL:
        return None
    deadline = time.monotonic() + 5.0
    for note in conn.notifies(timeout=5.0):
        if note.channel == "deadman_done" and note.payload == str(w.job):
            return "notified"
        if time.monotonic() > deadline:
            break
    return "lost"


def _returned_job(rows: list[DictRow], w: World) -> bool:
    return w.job in _ids(rows)


def _returned_upstream(rows: list[DictRow], w: World) -> bool:
    return w.upstream in _ids(rows)


def _any(rows: list[DictRow], w: World) -> bool:
    return bool(rows)


#: the idempotency key the insert rows race on (setups "keyed_*" hold it already)
IDEM = "race-idem"


def _insert_single(conn: Conn, w: World) -> list[DictRow]:
    """POST /jobs without group commit (and Client.enqueue): one job with IDEM."""
    return _rows(conn, "job_insert", NewJob("race", queue=QUEUE, idempotency_key=IDEM).params(5))


def _insert_grouped(other: str) -> Callable[[Conn, World], list[DictRow]]:
    """POST /jobs under group commit: a group holding IDEM, the key ``other`` and a
    key-less job (in grouped_order, as deadman.store.submissions sends it). Two
    groups that share IDEM and ``zz-shared`` take them in the same (key) order."""

    def run(conn: Conn, w: World) -> list[DictRow]:
        jobs = [
            NewJob("race", queue=QUEUE, idempotency_key=other),
            NewJob("race", queue=QUEUE),
            NewJob("race", queue=QUEUE, idempotency_key="zz-shared"),
            NewJob("race", queue=QUEUE, idempotency_key=IDEM),
        ]
        ordered = [jobs[i] for i in grouped_order(jobs)]
        return _rows(conn, "job_insert_grouped", grouped_params(ordered, 5))

    return run


def _insert_copied(other: str) -> Callable[[Conn, World], list[DictRow]]:
    """Client.enqueue_many of keyed jobs (IDEM, the key ``other`` and ``zz-shared``):
    COPYed straight in under a savepoint when no key is taken (DECISIONS 92), staged
    when one is, or when the COPY met a key another transaction took meanwhile. The
    rows it made."""

    def run(conn: Conn, w: World) -> list[DictRow]:
        keys = (other, "zz-shared", IDEM)
        jobs = [NewJob("race", queue=QUEUE, idempotency_key=k) for k in keys]
        ids = run_sync(conn, plans.job_insert_many(jobs, 5))
        return conn.execute(
            "SELECT id, idempotency_key FROM deadman.jobs WHERE id = ANY(%s)", (ids,)
        ).fetchall()

    return run


#: the worker whose parked slot the handoff rows race on (DECISIONS 83)
PARKER = "race-parker"


def _park(conn: Conn, slot: int = 0) -> None:
    conn.execute(
        QUERIES["worker_park"],
        {
            "worker": PARKER,
            "queues": [QUEUE],
            "channel": handoff_channel(PARKER),
            "ttl_ms": TTL_MS,
            "first": slot,
            "nonces": [slot + 1],
        },
    )


def _handoff(key: str | None) -> Callable[[Conn, World], list[DictRow]]:
    """Client.enqueue on its own connection: job_insert_handoff."""

    def run(conn: Conn, w: World) -> list[DictRow]:
        new = NewJob("race", queue=QUEUE, idempotency_key=key)
        return _rows(conn, "job_insert_handoff", new.params(5))

    return run


def _unpark(conn: Conn, w: World) -> list[DictRow]:
    """The parker takes its slots back; the jobs handed into them as ``id``."""
    rows = _rows(conn, "job_unpark", {"worker": PARKER})
    return [{**r, "id": r["job_id"]} for r in rows if r["job_id"] is not None]


def _adopt(conn: Conn, w: World) -> list[DictRow]:
    """The parker's adoption of the job its notification named."""
    rows = _rows(conn, "job_adopt", {"worker": PARKER, "job_id": w.job})
    return [r for r in rows if r["id"] is not None]


def _made_idem(rows: list[DictRow], w: World) -> bool:
    """The insert created the job holding IDEM (else the caller reads it as a replay)."""
    return any(r["idempotency_key"] == IDEM for r in rows)


S = JobState
Out = AttemptOutcome
#: how each finish ends its attempt: the job's next state and the attempt's outcome
OUTCOMES = {
    "succeeded": (S.SUCCEEDED, Out.SUCCEEDED),
    "retrying": (S.RETRYING, Out.FAILED),
    "dead": (S.DEAD, Out.FAILED),
    "cancelled": (S.CANCELLED, Out.CANCELLED),
    "released": (S.QUEUED, Out.RELEASED),
}
STATEMENTS: dict[str, Stmt] = {
    s.name: s
    for s in [
        Stmt("claim", ("job_claim",), _claim, _returned_job),
        Stmt("limit_tighten", ("limit_put",), _limit_tighten, lambda rows, w: bool(rows)),
        Stmt("claim_quarantined", ("job_claim_quarantined",), _claim_quarantined, _returned_job),
        Stmt("heartbeat", ("job_heartbeat_many",), _heartbeat, _returned_job, fenced=True),
        # the finishes alone, and as the completer's refill sends two of them (DECISIONS
        # 45, 62): an outcome and the next claim in one statement
        *(
            Stmt(
                f"finish_{'claim_' if claim else ''}{name}",
                ("job_finish_claim",) if claim else ("job_finish_many",),
                _finish(st, o, claim=claim),
                _returned_job,
                fenced=True,
                ends_lease=True,
            )
            for claim, cases in [
                (False, ["succeeded", "retrying", "dead", "cancelled", "released"]),
                (True, ["succeeded", "retrying"]),
            ]
            for name in cases
            for st, o in [OUTCOMES[name]]
        ),
        Stmt(
            "finish_in_transaction",
            ("job_succeed_in", "effect_insert"),
            _finish(S.SUCCEEDED, Out.SUCCEEDED, effect=True),
            _returned_job,
            fenced=True,
            ends_lease=True,
        ),
        Stmt("cancel", ("job_cancel",), _cancel, _returned_job),
        Stmt("retry", ("job_retry",), _retry, _returned_job),
        Stmt("replay", ("job_retry_dead_many",), _replay, _returned_job),
        Stmt("pause", ("queue_set_paused",), _pause, _any),
        Stmt("resume", ("queue_set_paused",), _resume, _any),
        Stmt("rescue", ("job_rescue_expired",), _rescue, _returned_job, ends_lease=True),
        Stmt("expire", ("job_expire",), _expire, _returned_job),
        Stmt(
            "wait_flag",
            ("listen_done", "job_wait_flag", "job_get"),
            _wait_flag,
            _returned_job,
            woken=_woken,
        ),
        Stmt("prune", ("job_prune_finished",), _prune, _returned_job),
        Stmt("workflow_cancel", ("workflow_cancel",), _workflow_cancel, _returned_job),
        # the upstream of a waiting job ends: the trigger releases or cancels `job`
        Stmt(
            "release",
            ("job_finish_many",),
            _finish(S.SUCCEEDED, Out.SUCCEEDED, on="up"),
            _returned_upstream,
        ),
        Stmt(
            "cascade",
            ("job_finish_many",),
            _finish(S.DEAD, Out.FAILED, on="up"),
            _returned_upstream,
        ),
        # a dead upstream is retried: the trigger reopens `job`, cancelled because of it
        Stmt("retry_upstream", ("job_retry",), _retry_upstream, _returned_upstream),
        Stmt("deps_lock", ("job_deps_lock",), _deps_lock, _returned_job),
        Stmt("retry_downstream", ("job_retry",), _retry_downstream, _any),
        Stmt("replay_downstream", ("job_retry_dead_many",), _replay_downstream, _any),
        # submissions with an idempotency key (POST /jobs, one by one or grouped)
        Stmt("insert", ("job_insert",), _insert_single, _made_idem, inserts=True),
        *(
            Stmt(name, ("job_insert_grouped",), _insert_grouped(other), _made_idem, inserts=True)
            for name, other in [("insert_grouped", "race-a"), ("insert_grouped_2", "race-b")]
        ),
        # a bulk enqueue of keyed jobs: the straight COPY, or its fallback (DECISIONS 92)
        *(
            Stmt(
                name,
                ("job_ids_reserve_keyed", "job_copy_direct_keyed", "job_insert_staged"),
                _insert_copied(other),
                _made_idem,
                inserts=True,
            )
            for name, other in [("insert_copied", "race-c"), ("insert_copied_2", "race-d")]
        ),
        # handoffs at enqueue (DECISIONS 83): two enqueues for one parked slot, the
        # parker taking its slots back or adopting the job its notification named
        Stmt("handoff", ("job_insert_handoff",), _handoff(IDEM), _made_idem, inserts=True),
        Stmt("handoff_2", ("job_insert_handoff",), _handoff(None), _any),
        Stmt("unpark", ("job_unpark",), _unpark, _returned_job),
        Stmt("adopt", ("job_adopt",), _adopt, _returned_job),
    ]
}


# ----------------------------------------------------------------------------- setups


def _in_workflow(conn: Conn, job_ids: list[int], states: list[str]) -> int:
    unfinished = sum(1 for s in states if s not in ("succeeded", "dead", "cancelled"))
    done = unfinished == 0
    row = conn.execute(
        "INSERT INTO deadman.workflows (name, nodes, unfinished, failed, cancelled, state,"
        " finished_at) VALUES ('race', %s, %s, %s, %s, %s, CASE WHEN %s THEN now() END)"
        " RETURNING id",
        (
            len(job_ids),
            unfinished,
            states.count("dead"),
            states.count("cancelled"),
            "running"
            if not done
            else "failed"
            if "dead" in states
            else "cancelled"
            if "cancelled" in states
            else "succeeded",
            done,
        ),
    ).fetchone()
    assert row is not None
    for i, job in enumerate(job_ids):
        conn.execute(
            "UPDATE deadman.jobs SET workflow_id = %s, node = %s WHERE id = %s",
            (row["id"], f"n{i}", job),
        )
    return int(row["id"])


def _one(state: str, **kw: Any) -> Callable[[Conn], World]:
    def setup(conn: Conn) -> World:
        j = insert_job(conn, state=state, queue=QUEUE, **kw)
        wf = _in_workflow(conn, [j.id], [state])
        return World(job=j.id, token=j.lease_token, workflow=wf)

    return setup


def _waiting(conn: Conn) -> World:
    """`job` waits for `upstream`, which is running; both nodes of one workflow."""
    up = insert_job(conn, state="running", queue=QUEUE)
    down = insert_job(conn, state="waiting", queue=QUEUE)
    conn.execute(
        "UPDATE deadman.jobs SET pending_deps = 1, start_by = now() + interval '1 hour'"
        " WHERE id = %s",
        (down.id,),
    )
    conn.execute("UPDATE deadman.jobs SET has_dependents = true WHERE id = %s", (up.id,))
    conn.execute(
        "INSERT INTO deadman.job_deps (job_id, depends_on) VALUES (%s, %s)", (down.id, up.id)
    )
    wf = _in_workflow(conn, [up.id, down.id], ["running", "waiting"])
    return World(job=down.id, upstream=up.id, upstream_token=up.lease_token, workflow=wf)


def _expiring(conn: Conn) -> World:
    """A queued job whose start_by has just passed: the claim skips it, expire ends it."""
    w = _one("queued")(conn)
    conn.execute(
        "UPDATE deadman.jobs SET start_by = now() - interval '1 second' WHERE id = %s", (w.job,)
    )
    return w


def _cascaded(conn: Conn) -> World:
    """`upstream` ended dead long ago and took `job`, its dependent, down with it."""
    up = insert_job(conn, state="dead", queue=QUEUE, finished_ago_s=2 * 86400)
    down = insert_job(conn, state="cancelled", queue=QUEUE, finished_ago_s=2 * 86400)
    conn.execute("UPDATE deadman.jobs SET upstream_cancelled = true WHERE id = %s", (down.id,))
    conn.execute("UPDATE deadman.jobs SET has_dependents = true WHERE id = %s", (up.id,))
    conn.execute(
        "INSERT INTO deadman.job_deps (job_id, depends_on) VALUES (%s, %s)", (down.id, up.id)
    )
    wf = _in_workflow(conn, [up.id, down.id], ["dead", "cancelled"])
    return World(job=down.id, upstream=up.id, workflow=wf)


def _queued_upstream(conn: Conn) -> World:
    """`job` is queued and due; `downstream` depends on it and is dead (it ran after
    an earlier success of `job`, which an operator has since replayed)."""
    up = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
    down = insert_job(conn, state="dead", queue=QUEUE, finished_ago_s=60)
    conn.execute("UPDATE deadman.jobs SET has_dependents = true WHERE id = %s", (up.id,))
    conn.execute(
        "INSERT INTO deadman.job_deps (job_id, depends_on) VALUES (%s, %s)", (down.id, up.id)
    )
    return World(job=up.id, downstream=down.id)


def _cascaded_beside_queued(conn: Conn) -> World:
    """`downstream` depends on `upstream` and on `job`: `upstream` died and cancelled
    it, while `job` is queued and due. Retrying `upstream` reopens `downstream` and
    locks its other dependency, `job` (deadman.reopen_downstream). The two are in
    another queue: the retry's own wake-up is for that one."""
    w = _cascaded(conn)
    conn.execute(
        "UPDATE deadman.jobs SET queue = %s WHERE id IN (%s, %s)", (OTHER_QUEUE, w.job, w.upstream)
    )
    sibling = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
    conn.execute("UPDATE deadman.jobs SET has_dependents = true WHERE id = %s", (sibling.id,))
    conn.execute(
        "INSERT INTO deadman.job_deps (job_id, depends_on) VALUES (%s, %s)", (w.job, sibling.id)
    )
    return World(job=sibling.id, upstream=w.upstream, downstream=w.job, workflow=w.workflow)


def _paused(conn: Conn) -> World:
    w = _one("queued", run_in_s=-1)(conn)
    conn.execute("INSERT INTO deadman.queues (name, paused) VALUES (%s, true)", (QUEUE,))
    return w


def _keyed(running: bool, lapsed: bool = False) -> Callable[[Conn], World]:
    """Jobs of the key KEY under a limit of 2 slots (1 once limit_tighten ran): a
    queued one, and with ``running`` one holding a slot (``job``, the finishes' and the
    rescue's target) with a second queued behind it."""

    def setup(conn: Conn) -> World:
        conn.execute("INSERT INTO deadman.limits (key, concurrency) VALUES (%s, 2)", (KEY,))
        first = insert_job(
            conn,
            state="running" if running else "queued",
            queue=QUEUE,
            run_in_s=-1,
            lease_expires_in_s=-10 if lapsed else 30,
        )
        behind = [insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1) for _ in range(2)]
        conn.execute(
            "UPDATE deadman.jobs SET limit_key = %s WHERE id = ANY(%s)",
            (KEY, [first.id, *(b.id for b in behind)]),
        )
        if running:
            # a second slot taken by another worker's attempt: the key is full
            other = insert_job(conn, state="running", queue=QUEUE, lease_worker="other")
            conn.execute("UPDATE deadman.jobs SET limit_key = %s WHERE id = %s", (KEY, other.id))
        return World(job=first.id, token=first.lease_token)

    return setup


def _idem(state: str, **kw: Any) -> Callable[[Conn], World]:
    """The job holding IDEM, in ``state`` (None: no job holds it yet; ``job`` is then
    a bystander, queued)."""

    def setup(conn: Conn) -> World:
        j = insert_job(conn, state=state, queue=QUEUE, idempotency_key=IDEM, **kw)
        return World(job=j.id, token=j.lease_token, key_held=True)

    return setup


def _idem_free(conn: Conn) -> World:
    j = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
    return World(job=j.id)


def _parked(behind: bool) -> Callable[[Conn], World]:
    """A free parked slot of PARKER's for QUEUE; ``job``: with ``behind`` an older due
    job in QUEUE (no handoff may pass it), else a bystander in another queue."""

    def setup(conn: Conn) -> World:
        _park(conn)
        queue = QUEUE if behind else OTHER_QUEUE
        j = insert_job(conn, state="queued", queue=queue, run_in_s=-1)
        return World(job=j.id)

    return setup


def _handed(lapsed: bool) -> Callable[[Conn], World]:
    """``job`` was handed to PARKER's parked slot by a real enqueue; its notification
    is on its way (``lapsed``: so late that the lease has lapsed meanwhile)."""

    def setup(conn: Conn) -> World:
        _park(conn)
        (row,) = _handoff(None)(conn, World(job=0))
        assert row["state"] == "running", row
        if lapsed:
            conn.execute(
                "UPDATE deadman.jobs SET lease_expires_at = now() - interval '10 seconds'"
                " WHERE id = %s",
                (row["id"],),
            )
        return World(job=int(row["id"]), token=int(row["lease_token"]))

    return setup


SETUPS: dict[str, Callable[[Conn], World]] = {
    "parked": _parked(behind=False),
    "parked_behind": _parked(behind=True),
    "handed": _handed(lapsed=False),
    "handed_lapsed": _handed(lapsed=True),
    "idem_free": _idem_free,
    "idem_queued": _idem("queued", run_in_s=-1),
    "idem_dead_old": _idem("dead", finished_ago_s=2 * 86400),
    "idem_succeeded_old": _idem("succeeded", finished_ago_s=2 * 86400),
    "queued_keyed": _keyed(running=False),
    "running_keyed_full": _keyed(running=True),
    "running_keyed_lapsed": _keyed(running=True, lapsed=True),
    "queued": _one("queued", run_in_s=-1),
    "retrying_due": _one("retrying", run_in_s=-1),
    "quarantined": _one("queued", run_in_s=-1, rescues=QUARANTINE_AT),
    "expiring": _expiring,
    "running": _one("running"),
    "running_lapsed": _one("running", lease_expires_in_s=-10),
    "running_lapsed_last_attempt": _one("running", lease_expires_in_s=-10, attempt=5),
    # rescued once more than max_rescues allows, alone on its worker: the rescue ends it
    "running_lapsed_poison": _one("running", lease_expires_in_s=-10, rescues=MAX_RESCUES),
    "dead_old": _one("dead", finished_ago_s=2 * 86400),
    "cancelled_old": _one("cancelled", finished_ago_s=2 * 86400),
    "succeeded_old": _one("succeeded", finished_ago_s=2 * 86400),
    "waiting": _waiting,
    "queued_paused": _paused,
    "cascaded_old": _cascaded,
    "queued_upstream": _queued_upstream,
    "cascaded_beside_queued": _cascaded_beside_queued,
}

# ----------------------------------------------------------------------------- the table
# (setup, statement, statement): both commit orders run. Grouped by the row state the
# two statements meet on.
FINISHES = [
    "finish_succeeded",
    "finish_retrying",
    "finish_dead",
    "finish_cancelled",
    "finish_released",
    "finish_in_transaction",
    "finish_claim_succeeded",
    "finish_claim_retrying",
]
MATRIX: list[tuple[str, str, str]] = [
    # due work: claimers, cancellers, the expirer and pause meet on a queued row
    ("queued", "claim", "claim"),
    ("queued", "claim", "cancel"),
    ("queued", "claim", "workflow_cancel"),
    ("queued", "claim", "pause"),
    ("queued", "cancel", "cancel"),
    ("queued", "cancel", "workflow_cancel"),
    ("retrying_due", "claim", "cancel"),
    ("quarantined", "claim_quarantined", "cancel"),
    ("quarantined", "claim_quarantined", "claim"),
    ("quarantined", "claim_quarantined", "pause"),
    ("queued_paused", "claim", "resume"),
    ("queued_paused", "pause", "resume"),
    ("expiring", "expire", "cancel"),
    ("expiring", "expire", "claim"),
    ("expiring", "expire", "workflow_cancel"),
    # a running attempt: its worker's fenced writes against operators and each other
    *[("running", "heartbeat", f) for f in FINISHES],
    ("running", "heartbeat", "cancel"),
    ("running", "heartbeat", "workflow_cancel"),
    *[("running", "cancel", f) for f in FINISHES],
    *[("running", "workflow_cancel", f) for f in FINISHES],
    ("running", "cancel", "cancel"),
    # a lapsed lease: the rescuer against the late worker and operators
    *[("running_lapsed", "rescue", f) for f in FINISHES],
    ("running_lapsed", "rescue", "heartbeat"),
    ("running_lapsed", "rescue", "cancel"),
    ("running_lapsed", "rescue", "rescue"),
    ("running_lapsed", "rescue", "workflow_cancel"),
    ("running_lapsed_last_attempt", "rescue", "finish_dead"),
    # finished jobs: operators bring them back while retention deletes them
    ("dead_old", "retry", "prune"),
    ("dead_old", "replay", "prune"),
    ("dead_old", "retry", "replay"),
    ("dead_old", "retry", "retry"),
    ("dead_old", "replay", "replay"),
    ("dead_old", "retry", "cancel"),
    ("cancelled_old", "retry", "prune"),
    ("cancelled_old", "retry", "retry"),
    ("succeeded_old", "retry", "prune"),
    ("succeeded_old", "prune", "prune"),
    # a waiting dependent: its upstream's end releases or cancels it (the trigger)
    ("waiting", "release", "cancel"),
    ("waiting", "release", "workflow_cancel"),
    ("waiting", "release", "expire"),
    ("waiting", "cascade", "cancel"),
    ("waiting", "cascade", "workflow_cancel"),
    ("cascaded_old", "retry_upstream", "prune"),
    ("cascaded_old", "retry_upstream", "retry"),
    ("cascaded_old", "retry_upstream", "cancel"),
    # flow control: claimers of one key against each other, a limit change, and the
    # statements that free a slot (deadman.job_claim_keyed; DECISIONS 38)
    ("queued_keyed", "claim", "claim"),
    ("queued_keyed", "claim", "limit_tighten"),
    ("queued_keyed", "claim", "cancel"),
    ("queued_keyed", "claim", "pause"),
    *[("running_keyed_full", "claim", f) for f in FINISHES],
    ("running_keyed_full", "claim", "limit_tighten"),
    ("running_keyed_lapsed", "claim", "rescue"),
    # a waiter's flag (deadman.waiting) against what ends the job, claims and other
    # waiters: the end is in what the flag read back or notified, never lost
    *[("running", "wait_flag", f) for f in FINISHES],
    ("running", "wait_flag", "cancel"),
    ("running", "wait_flag", "heartbeat"),
    ("running", "wait_flag", "wait_flag"),
    ("running_lapsed", "wait_flag", "rescue"),
    ("running_lapsed_poison", "wait_flag", "rescue"),
    ("queued", "wait_flag", "cancel"),
    ("queued", "wait_flag", "claim"),
    ("queued", "wait_flag", "workflow_cancel"),
    ("expiring", "wait_flag", "expire"),
    ("waiting", "wait_flag", "cascade"),
    ("dead_old", "wait_flag", "retry"),
    ("succeeded_old", "wait_flag", "prune"),
    # submissions of one idempotency key (POST /jobs, group commit or not): the second
    # waits on the first's index entry and inserts nothing (its caller reads the job:
    # a replay); against what a key's job meets meanwhile: cancel, retry, retention
    ("idem_free", "insert_grouped", "insert"),
    ("idem_free", "insert_grouped", "insert_grouped_2"),
    ("idem_queued", "insert_grouped", "cancel"),
    ("idem_queued", "insert_grouped", "claim"),
    ("idem_dead_old", "insert_grouped", "retry"),
    ("idem_dead_old", "insert_grouped", "prune"),
    ("idem_succeeded_old", "insert_grouped", "prune"),
    ("idem_succeeded_old", "insert", "prune"),
    # ... and a bulk enqueue of keyed jobs, COPYed straight in: against a single and a
    # grouped insert and another such COPY of the same keys, it waits on the key's
    # index entry and then, refused, takes the staged path (ON CONFLICT); with the key
    # held already it is staged from the start
    ("idem_free", "insert_copied", "insert"),
    ("idem_free", "insert_copied", "insert_grouped"),
    ("idem_free", "insert_copied", "insert_copied_2"),
    ("idem_queued", "insert_copied", "cancel"),
    ("idem_queued", "insert_copied", "claim"),
    ("idem_dead_old", "insert_copied", "retry"),
    ("idem_dead_old", "insert_copied", "prune"),
    ("idem_succeeded_old", "insert_copied", "prune"),
    # what holds a due job's row for a moment without taking it: a claim meanwhile
    # steps past the job (SKIP LOCKED), so the holder must wake the queue (the claim
    # wake-up invariant); the waiter's flag and resume are above
    ("queued", "deps_lock", "claim"),
    ("queued", "deps_lock", "cancel"),
    ("queued_upstream", "retry_downstream", "claim"),
    ("queued_upstream", "replay_downstream", "claim"),
    ("cascaded_beside_queued", "retry_upstream", "claim"),
    # handoffs at enqueue (DECISIONS 83): one parked slot, two enqueues (one takes it,
    # SKIP LOCKED, the other queues); the parker unparking meanwhile (it waits for the
    # enqueue holding the slot, then gets the job); a pause; an older due job being
    # claimed (no handoff passes it); and a handed job, adopted once, by whichever of
    # adopt and unpark takes its slot's row, against a cancel and the rescuer
    ("parked", "handoff", "handoff_2"),
    ("parked", "handoff", "unpark"),
    ("parked", "handoff", "pause"),
    ("parked_behind", "handoff", "claim"),
    ("handed", "adopt", "adopt"),
    ("handed", "adopt", "unpark"),
    ("handed", "adopt", "cancel"),
    ("handed", "unpark", "cancel"),
    ("handed_lapsed", "adopt", "rescue"),
    ("handed_lapsed", "unpark", "rescue"),
]


@dataclass
class Outcome:
    order: list[str]
    acked: dict[str, bool] = field(default_factory=dict)
    blocked: bool = False
    #: each waiter's verdict (Stmt.woken), in order
    woken: list[str | None] = field(default_factory=list)
    #: a claim ran second, came back without the job, and a claim of its kind takes
    #: the job now: whether deadman_jobs was notified for its queue meanwhile
    claim_woken: bool | None = None
    #: what each statement returned, in order (a row may race a statement with itself)
    rows: list[tuple[str, list[DictRow]]] = field(default_factory=list)


# ----------------------------------------------------------------------------- running


def _pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    assert row is not None
    return int(row["pid"])


def _waits_on_lock(observer: Conn, pid: int) -> bool:
    row = observer.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"


def _finished_or_blocked(thread: threading.Thread, observer: Conn, pid: int, what: str) -> None:
    """Wait until the statement in ``thread`` finished (SKIP LOCKED passed the row
    by) or its backend waits on a lock: the interleaving is forced, never hoped for."""
    wait_for(
        lambda: not thread.is_alive() or _waits_on_lock(observer, pid),
        timeout=10.0,
        interval=0.002,
        message=f"{what} to finish or block on a lock",
    )


def run_case(dsn: str, setup: str, first: str, second: str) -> tuple[World, Outcome]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as admin:
        world = SETUPS[setup](admin)
    a_stmt, b_stmt = STATEMENTS[first], STATEMENTS[second]
    out = Outcome(order=[first, second])
    with (
        psycopg.connect(dsn, row_factory=dict_row) as a,
        psycopg.connect(dsn, row_factory=dict_row) as b,
        psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as observer,
        psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as listener,
    ):
        listener.execute(QUERIES["listen_jobs"])  # after the setup: its inserts are not heard
        a_rows = a_stmt.run(a, world)
        b_pid = _pid(b)
        b.commit()
        result: dict[str, Any] = {}

        def second_statement() -> None:
            try:
                result["rows"] = b_stmt.run(b, world)
            except BaseException as exc:  # reported in the main thread
                result["error"] = exc

        thread = threading.Thread(target=second_statement, daemon=True)
        thread.start()
        _finished_or_blocked(thread, observer, b_pid, second)
        out.blocked = thread.is_alive()
        a.commit()
        thread.join(10.0)
        assert not thread.is_alive(), f"{second} still blocked after {first} committed"
        if "error" in result:
            raise result["error"]
        b.commit()
        for conn, stmt, rows in ((a, a_stmt, a_rows), (b, b_stmt, result["rows"])):
            if stmt.woken is not None:
                out.woken.append(stmt.woken(conn, observer, world, rows))
        if second in CLAIMERS and not _returned_job(result["rows"], world):
            with observer.transaction(force_rollback=True):
                takes = _returned_job(STATEMENTS[second].run(observer, world), world)
            if takes:
                out.claim_woken = _queue_notified(listener)
    out.acked[first] = a_stmt.acked(a_rows, world)
    out.acked[second] = b_stmt.acked(result["rows"], world)
    out.rows = [(first, a_rows), (second, result["rows"])]
    return world, out


#: the statements an idle producer sends when woken (the refill runs only under load)
CLAIMERS = ("claim", "claim_quarantined")


def _queue_notified(listener: Conn) -> bool:
    """Whether ``listener`` (LISTENing on deadman_jobs) hears QUEUE within 5 s: the
    notification is delivered after the sender's commit, asynchronously."""
    deadline = time.monotonic() + 5.0
    for note in listener.notifies(timeout=5.0):
        if note.payload == QUEUE:
            return True
        if time.monotonic() > deadline:
            break
    return False


# ----------------------------------------------------------------------------- invariants


def check_invariants(conn: Conn, world: World, out: Outcome) -> None:
    job = conn.execute("SELECT * FROM deadman.jobs WHERE id = %s", (world.job,)).fetchone()
    acked = [name for name in out.order if out.acked[name]]

    # no acknowledged job vanishes
    for name in ("retry", "replay"):
        if name in acked:
            assert job is not None, f"{name} was acknowledged, then the job vanished"

    # no fenced write lands with a stale token
    ended = [n for n in out.order if STATEMENTS[n].ends_lease and out.acked[n]]
    if ended:
        after = out.order[out.order.index(ended[0]) + 1 :]
        stale = [n for n in after if STATEMENTS[n].fenced and out.acked[n]]
        assert not stale, f"{stale} acknowledged with a token {ended[0]} had ended"
    if world.token is not None:
        n = conn.execute(
            "SELECT count(*) AS n FROM deadman.attempts WHERE lease_token = %s", (world.token,)
        ).fetchone()
        assert n is not None and n["n"] <= 1, "one lease ended twice"
    # a succeeded attempt kept in its job's row (migration 0019) is in the history once,
    # as that job's one succeeded attempt, and nowhere in the attempt log
    if job is not None and job["finished_token"] is not None:
        assert job["state"] == "succeeded", job["state"]
        rows = conn.execute(
            "SELECT lease_token, outcome FROM deadman.attempts"
            " WHERE job_id = %s AND (lease_token = %s OR outcome = 'succeeded')",
            (world.job, job["finished_token"]),
        ).fetchall()
        assert [(r["lease_token"], r["outcome"]) for r in rows] == [
            (job["finished_token"], "succeeded")
        ], rows

    # an acknowledged cancel is never followed by a new attempt
    cancelled = [n for n in acked if n in ("cancel", "workflow_cancel")]
    revived = [n for n in acked if n in ("retry", "replay")]
    if (
        cancelled
        and job is not None
        and not (revived and out.order.index(revived[-1]) > out.order.index(cancelled[0]))
    ):
        assert job["state"] in ("cancelled", "succeeded", "running"), job["state"]
        if job["state"] == "succeeded":
            won = {"finish_succeeded", "finish_in_transaction", "finish_claim_succeeded"} & set(
                acked
            )
            assert won, "succeeded after a cancel, but no attempt in flight succeeded"
        if job["state"] == "running":
            assert job["cancel_requested"], "running after a cancel, flag lost"
            # the attempt in flight when the cancel was acknowledged: no new token
            # (unless a claim started one before the cancel: a refill's claim takes
            # the job when a rescue put it back first; since DECISIONS 62 it can no
            # longer take the job its own finish put back to retry, one snapshot)
            claimed = any(
                n in ("claim", "claim_quarantined", "finish_claim_retrying") for n in acked
            )
            if world.token is not None and not claimed:
                assert job["lease_token"] == world.token, "a new attempt started"
        _assert_not_claimable(conn, world.job)

    # a pause is honoured by the next claim (unless a resume committed after it)
    toggles = [n for n in out.order if n in ("pause", "resume")]
    if toggles and toggles[-1] == "pause":
        fresh = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
        _assert_not_claimable(conn, fresh.id)
        fresh_q = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1, rescues=QUARANTINE_AT)
        _assert_not_claimable(conn, fresh_q.id)

    if toggles and toggles[-1] == "pause":
        # ... and by the next enqueue that finds a parked slot (DECISIONS 83)
        with conn.transaction(force_rollback=True):
            _park(conn, slot=99)
            (fresh_h,) = _handoff(None)(conn, world)
            assert fresh_h["state"] == "queued", "handed off into a paused queue"

    if toggles and toggles[-1] == "resume":
        fresh = insert_job(conn, state="queued", queue=QUEUE, run_in_s=-1)
        with conn.transaction(force_rollback=True):
            assert fresh.id in _ids(_claim(conn, World(job=fresh.id))), "resumed, not claimable"

    # no lost wake-up
    assert "lost" not in out.woken, f"a waiter missed the end of the job ({out.woken})"
    assert out.claim_woken is not False, (
        f"{out.order[1]} stepped past a job {out.order[0]} held and nothing woke the queue"
    )

    _assert_one_job_per_key(conn, world, out)
    _assert_handoffs(conn, world, out)

    _assert_workflow_counters(conn, world)
    _assert_dependency_counters(conn)
    _assert_limits_held(conn, world, out)


def _assert_one_job_per_key(conn: Conn, world: World, out: Outcome) -> None:
    """Submissions of one key: at most one job holds it. With no job holding it
    before, exactly one insert made it, and it is there. With one holding it, no
    insert makes another, unless retention deleted that job (committed) first; a job
    pruned after an insert found it is gone, key and all, and that caller, reading
    no job, inserts again (deadman.api.idempotency)."""
    inserts = [n for n in out.order if STATEMENTS[n].inserts]
    if not inserts:
        return
    rows = conn.execute(
        "SELECT id FROM deadman.jobs WHERE idempotency_key = %s", (IDEM,)
    ).fetchall()
    assert len(rows) <= 1, f"{len(rows)} jobs hold one idempotency key"
    made = [n for n in inserts if out.acked[n]]
    if not world.key_held:
        assert len(made) == 1 and len(rows) == 1, (made, rows)
    elif made:
        pruned_first = out.acked.get("prune") and out.order.index("prune") < out.order.index(
            made[0]
        )
        assert pruned_first and len(made) == 1, f"{made} made a second job for a taken key"
    if made:
        assert rows, f"{made} was acknowledged, then its job vanished"


def _assert_handoffs(conn: Conn, world: World, out: Outcome) -> None:
    """Handoffs (DECISIONS 83): a parked row holds the job an enqueue handed into it
    under that job's lease; a handed job is taken (adopt or unpark) at most once, and
    one still running under the handoff's lease that nobody took is still in its row
    (never lost: the parker's next unpark finds it); a handoff never passes an older
    due job."""
    slots = conn.execute(
        "SELECT p.job_id, p.lease_token AS slot_token, j.lease_token, j.lease_worker, j.state"
        " FROM deadman.parked p LEFT JOIN deadman.jobs j ON j.id = p.job_id"
        " WHERE p.job_id IS NOT NULL"
    ).fetchall()
    for s in slots:
        if s["state"] == "running" and s["lease_token"] == s["slot_token"]:
            assert s["lease_worker"] == PARKER, s
    in_rows = {int(s["job_id"]) for s in slots}
    taken = [int(r["id"]) for n, rows in out.rows if n in ("adopt", "unpark") for r in rows]
    assert len(taken) == len(set(taken)), f"a handed job was taken twice: {taken}"
    handed = conn.execute(
        "SELECT id, lease_token FROM deadman.jobs WHERE lease_worker = %s AND state = 'running'"
        " AND started_at = created_at",
        (PARKER,),
    ).fetchall()
    for h in handed:
        assert h["id"] in in_rows or h["id"] in taken, f"handed job {h['id']} lost its slot"
        assert not (h["id"] in in_rows and h["id"] in taken), f"job {h['id']} taken and kept"
    made = [r for n, rows in out.rows if n.startswith("handoff") for r in rows]
    if any(r["state"] == "running" for r in made) and world.job is not None:
        older = conn.execute(
            "SELECT queue, state FROM deadman.jobs WHERE id = %s", (world.job,)
        ).fetchone()
        if older is not None and older["queue"] == QUEUE:
            assert older["state"] != "queued", "a handoff passed an older due job"


def _assert_limits_held(conn: Conn, world: World, out: Outcome) -> None:
    """No claim takes a slot past the limit in force when it claimed: 2 slots, or 1
    once limit_tighten committed before the claim (jobs already running when a limit
    is lowered keep their slots: it applies from the next claim)."""
    rows = conn.execute(
        "SELECT count(*) AS n FROM deadman.jobs WHERE limit_key = %s AND state = 'running'",
        (KEY,),
    ).fetchone()
    if rows is None or not conn.execute("SELECT 1 FROM deadman.limits").fetchone():
        return
    order = out.order
    lowered_first = (
        "limit_tighten" in order
        and "claim" in order
        and order.index("limit_tighten") < order.index("claim")
    )
    bound = 1 if lowered_first and world.token is None else 2
    assert rows["n"] <= bound, f"{rows['n']} jobs of the key run, the limit was {bound}"


def _assert_not_claimable(conn: Conn, job_id: int) -> None:
    with conn.transaction(force_rollback=True):
        got = _claim(conn, World(job=job_id)) + _claim_quarantined(conn, World(job=job_id))
    assert job_id not in _ids(got), "the job could be claimed again"


def _assert_workflow_counters(conn: Conn, world: World) -> None:
    if world.workflow is None:
        return
    wf = conn.execute("SELECT * FROM deadman.workflows WHERE id = %s", (world.workflow,)).fetchone()
    nodes = conn.execute(
        "SELECT state FROM deadman.jobs WHERE workflow_id = %s", (world.workflow,)
    ).fetchall()
    if wf is None:
        return
    states = [r["state"] for r in nodes]
    if len(states) < wf["nodes"]:
        # pruned nodes: only finished ones may go, and they must have been counted
        assert wf["unfinished"] == sum(s not in ("succeeded", "dead", "cancelled") for s in states)
        return
    assert wf["unfinished"] == sum(s not in ("succeeded", "dead", "cancelled") for s in states)
    assert wf["failed"] == states.count("dead")
    assert wf["cancelled"] == states.count("cancelled")
    assert (wf["state"] == "running") == (wf["unfinished"] > 0)


def _assert_dependency_counters(conn: Conn) -> None:
    rows = conn.execute(
        """
        SELECT j.id, j.pending_deps,
               count(u.id) FILTER (WHERE u.state <> 'succeeded') AS pending,
               bool_or(u.state IN ('dead', 'cancelled')) AS blocked
        FROM deadman.jobs j
        JOIN deadman.job_deps d ON d.job_id = j.id
        JOIN deadman.jobs u ON u.id = d.depends_on
        WHERE j.state = 'waiting'
        GROUP BY j.id, j.pending_deps
        """
    ).fetchall()
    for r in rows:
        assert r["pending_deps"] == r["pending"], f"job {r['id']} counts wrong"
        assert not r["blocked"], f"job {r['id']} waits for a job that will never succeed"


# ----------------------------------------------------------------------------- tests

CASES = [
    pytest.param(setup, x, y, id=f"{setup}:{x}>{y}")
    for setup, p, q in MATRIX
    for x, y in ([(p, q), (q, p)] if p != q else [(p, q)])  # a list: xdist needs one order
]


@pytest.mark.parametrize(("setup", "first", "second"), CASES)
def test_race(db_dsn: str, setup: str, first: str, second: str) -> None:
    world, out = run_case(db_dsn, setup, first, second)
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as conn:
        check_invariants(conn, world, out)


def test_retention_never_deletes_a_job_retry_just_put_back(db_dsn: str) -> None:
    """Bug 1, spelled out: retry holds the row (the client gets 200 at its commit)
    while the prune runs. The prune used to wait on the row and then delete it; now it
    passes the locked row by (and would re-test it if it had waited): the job must
    still be there, requeued."""
    world, out = run_case(db_dsn, "dead_old", "retry", "prune")
    assert not out.blocked, "the prune waited on the retry's row lock"
    assert out.acked == {"retry": True, "prune": False}
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT state FROM deadman.jobs WHERE id = %s", (world.job,)).fetchone()
    assert row is not None and row["state"] == "queued"


@pytest.mark.parametrize(
    ("outcome", "history"),
    [("finish_retrying", "failed"), ("finish_released", "released"), ("finish_dead", "failed")],
)
def test_a_cancel_acknowledged_while_running_is_never_lost(
    db_dsn: str, outcome: str, history: str
) -> None:
    """Bug 2: the cancel's 202 came first; the attempt then ends without success. The
    job ends cancelled and no claim takes it again."""
    world, out = run_case(db_dsn, "running", "cancel", outcome)
    assert out.acked == {"cancel": True, outcome: True}
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM deadman.jobs WHERE id = %s", (world.job,)).fetchone()
        assert row is not None and row["state"] == "cancelled", row
        assert row["finished_at"] is not None
        _assert_not_claimable(conn, world.job)
        rows = conn.execute(
            "SELECT outcome FROM deadman.attempts WHERE job_id = %s", (world.job,)
        ).fetchall()
    assert [r["outcome"] for r in rows] == [history]  # what the attempt itself did


def test_a_cancel_cannot_be_left_on_a_job_waiting_in_line(db_dsn: str) -> None:
    """The constraint behind bug 2: cancel_requested on a job that could be claimed
    again is a state Postgres refuses to store."""
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as conn:
        j = insert_job(conn, state="running", queue=QUEUE, cancel_requested=True)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "UPDATE deadman.jobs SET state = 'retrying', lease_token = NULL,"
                " lease_expires_at = NULL WHERE id = %s",
                (j.id,),
            )


#: (VACUUM of deadman.jobs, the query jobs_vacuum, is not a writer here: it changes
#: no job's state and locks no row; tests/integration/test_vacuumer.py runs claims and
#: finishes beside back-to-back vacuums and checks each job ran exactly once.)
_WRITES_JOBS = re.compile(
    r"\b(UPDATE\s+deadman\.jobs|DELETE\s+FROM\s+deadman\.jobs|INSERT\s+INTO\s+deadman\.jobs"
    r"|COPY\s+deadman\.jobs)\b",
    re.IGNORECASE,
)
#: statements that write deadman.jobs but cannot race an existing row: they create
#: rows (a new row has no other writer until its transaction commits) or only mark
#: a dependency (has_dependents, read by the trigger; the matrix's release/cascade
#: rows run on jobs marked so).
NOT_RACING_AN_EXISTING_ROW = {
    "job_insert": "creates the row",
    "job_insert_staged": "creates the rows",
    "job_copy_direct": "creates the rows (ids from job_ids_reserve)",
    "job_insert_many_returning": "creates the rows",
    "workflow_insert": "creates the rows",
}
#: what can lock a row of deadman.jobs (an update, a delete, FOR UPDATE/SHARE, or a
#: function that updates jobs)
_LOCKS_JOBS = re.compile(
    r"\bFOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE)\b|\bdeadman\.job_(rerun|start)\b"
    r"|\bUPDATE\s+deadman\.jobs\b|\bDELETE\s+FROM\s+deadman\.jobs\b",
    re.IGNORECASE,
)
#: statements that lock rows but never a due job's (a claim cannot be stepping past)
NEVER_HOLD_A_DUE_JOB = {
    **NOT_RACING_AN_EXISTING_ROW,
    "job_claim": "takes the job: it is running when the lock goes",
    "job_claim_quarantined": "takes the job: it is running when the lock goes",
    "job_heartbeat_many": "running rows of its lease only",
    "job_finish_many": "running rows of its lease only",
    "job_succeed_in": "the running row of its lease only",
    "job_finish_claim": "running rows of its lease, and the jobs its claim takes",
    "job_rescue_expired": "lapsed running rows; the rescuer wakes the queues it refilled",
    "job_prune_finished": "finished rows only",
    "workflow_prune_finished": "finished workflows, no job row",
    "schedule_due": "deadman.schedules rows, no job row",
    "job_adopt": "deadman.parked rows (FOR UPDATE OF its slot), no job row",
    "job_unpark": "deadman.parked rows (FOR UPDATE of its slots), no job row",
}


def test_every_state_changing_statement_has_a_row() -> None:
    writers = {name for name, sql in QUERIES.items() if _WRITES_JOBS.search(sql)}
    covered = {q for setup, p, r in MATRIX for n in (p, r) for q in STATEMENTS[n].queries}
    missing = sorted(writers - covered - set(NOT_RACING_AN_EXISTING_ROW))
    assert not missing, f"statements that change jobs without a row in MATRIX: {missing}"
    unused = sorted(set(STATEMENTS) - {n for _, p, r in MATRIX for n in (p, r)})
    assert not unused, f"statements defined but never raced: {unused}"


def test_every_statement_that_can_hold_a_due_job_meets_a_claim() -> None:
    """The method behind the claim wake-up invariant: a statement that can lock a due
    job races a claim in some row of MATRIX (in the order where it holds the row, the
    claim steps past it), so a missing wake-up fails there. Adding a statement that locks jobs
    means adding that row, or saying here why it never holds a due one."""
    lockers = {name for name, sql in QUERIES.items() if _LOCKS_JOBS.search(sql)}
    met = {  # both orders of a row run: either side may be the claim
        q
        for _, p, r in MATRIX
        for first, second in ((p, r), (r, p))
        if second in CLAIMERS
        for q in STATEMENTS[first].queries
    }
    missing = sorted(lockers - met - set(NEVER_HOLD_A_DUE_JOB))
    assert not missing, f"statements that can hold a due job, never raced by a claim: {missing}"


def test_retention_never_waits_on_a_row_an_operator_holds(db_dsn: str) -> None:
    """The deadlock the operators chaos scenario found: a DLQ replay holds a dead
    dependent (its `picked` FOR UPDATE) and then asks for the dependent's succeeded
    upstream (FOR SHARE); a prune deleting both had taken the upstream and waited on
    the dependent. Retention now passes a locked row by, so it never waits at all."""
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as admin:
        up = insert_job(admin, state="succeeded", queue=QUEUE, finished_ago_s=2 * 86400)
        down = insert_job(admin, state="dead", queue=QUEUE, finished_ago_s=2 * 86400)
        admin.execute("UPDATE deadman.jobs SET has_dependents = true WHERE id = %s", (up.id,))
        admin.execute(
            "INSERT INTO deadman.job_deps (job_id, depends_on) VALUES (%s, %s)", (down.id, up.id)
        )
    with (
        psycopg.connect(db_dsn, row_factory=dict_row) as replay,
        psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as pruner,
        psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as observer,
    ):
        replay.execute("SELECT id FROM deadman.jobs WHERE id = %s FOR UPDATE", (down.id,))
        pid = _pid(pruner)
        result: dict[str, Any] = {}

        def prune() -> None:
            try:
                result["rows"] = _prune(pruner, World(job=up.id))
            except psycopg.Error as exc:
                result["error"] = exc

        thread = threading.Thread(target=prune, daemon=True)
        thread.start()
        _finished_or_blocked(thread, observer, pid, "the prune")
        blocked = thread.is_alive()
        # the replay goes on to the upstream, as job_retry_dead_many's deps CTE does
        upstream = replay.execute(
            "SELECT id FROM deadman.jobs WHERE id = %s FOR SHARE", (up.id,)
        ).fetchall()
        replay.commit()
        thread.join(10.0)
    assert not blocked, "the prune waited on a row the replay held"
    assert "error" not in result, result.get("error")
    assert _ids(result["rows"]) == {up.id}  # the held row was left for the next round
    assert upstream == []  # gone, and nobody waited for anybody


@pytest.mark.parametrize(
    ("first", "second", "how"),
    [("wait_flag", "finish_succeeded", "notified"), ("finish_succeeded", "wait_flag", "read")],
)
def test_a_waiter_sees_the_end_by_its_read_or_by_notification(
    db_dsn: str, first: str, second: str, how: str
) -> None:
    """Both sides of the no-lost-wake-up check, spelled out: flagged first, the waiter
    read a running job and hears the end; flagged after the finish committed (it
    waited on the finish's row lock), it reads the end itself and nothing is sent."""
    world, out = run_case(db_dsn, "running", first, second)
    assert out.acked == {"wait_flag": True, "finish_succeeded": True}
    assert out.woken == [how]
    assert out.blocked
    with psycopg.connect(db_dsn, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute("SELECT waited FROM deadman.jobs WHERE id = %s", (world.job,)).fetchone()
    assert row is not None and row["waited"]
