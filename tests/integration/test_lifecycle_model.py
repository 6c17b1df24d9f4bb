"""A model-based test of the job lifecycle: Hypothesis drives the real store (real
Postgres) with random sequences of submit, claim, quarantine claim, heartbeat,
finish (every outcome), stale finishes, cancel, retry, DLQ replay, pause/resume,
rescue after a lapsed lease and retention, and after every step compares every job
row with a pure model of the transition table (ARCHITECTURE.md, the job lifecycle).

The model is deliberately small and written from the rules, not from the SQL:
- a claim takes due, unpaused jobs (quarantined ones only through the quarantine
  claim), as many as asked and as there are; each claim is a new attempt and a new
  lease token, larger than every token before;
- a fenced write with a token that is not the job's current one changes nothing;
- a failure with attempts left is 'retrying', without is 'dead'; a release gives the
  attempt back; a rescue gives it back too and counts a rescue, ending the job dead
  when it was rescued too often while running alone;
- once a cancel is acknowledged on a running job, it ends cancelled unless that
  attempt succeeds;
- retry and replay reopen dead (retry: and cancelled) jobs with a fresh set of
  attempts; retention deletes finished jobs past their age, and only those.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.rows import DictRow, dict_row

from deadman.model import AttemptOutcome, JobState
from deadman.store import (
    AsyncStore,
    ClaimParams,
    Finish,
    HeartbeatParams,
    NewJob,
    PruneParams,
    RescueParams,
)
from tests.helpers.api import client, make_app, serve

T = TypeVar("T")
QUEUES = ("a", "b")
WORKER = "model-worker"
MAX_RESCUES = 2
QUARANTINE_AT = 2  # quarantine_at(MAX_RESCUES)
TTL_MS = 600_000
FINAL = ("succeeded", "dead", "cancelled")
#: invariant checks per example (the test asserts the machine really ran)
STEPS: list[int] = []


@dataclass
class M:
    """One job as the model sees it."""

    queue: str
    max_attempts: int
    state: str = "queued"
    attempt: int = 0
    rescues: int = 0
    token: int | None = None
    cancel_requested: bool = False
    attempts_ended: int = 0

    def cancel(self) -> None:
        """An acknowledged cancel: a running job keeps its attempt, flagged; a job
        waiting in line ends cancelled; a finished one is not changed."""
        if self.state == "running":
            self.cancel_requested = True
        elif self.state not in FINAL:
            self.state = "cancelled"

    def reopen(self) -> None:
        """An acknowledged retry or replay: due again, with a fresh set of attempts."""
        self.state, self.attempt, self.rescues, self.cancel_requested = "queued", 0, 0, False


class Lifecycle(RuleBasedStateMachine):
    dsn: str
    runner: asyncio.Runner

    def __init__(self) -> None:
        super().__init__()
        self.store = self.run(self._open())
        self.sql = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row)
        self.sql.execute(
            "TRUNCATE deadman.jobs, deadman.attempt_log, deadman.queues, deadman.effects,"
            " deadman.lease_refusals, deadman.workflows, deadman.workers CASCADE"
        )
        self.jobs: dict[int, M] = {}
        self.paused: set[str] = set()
        self.stale: list[tuple[int, int]] = []  # (job, a token it no longer holds)
        self.last_token = 0
        STEPS.append(0)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    async def _open(self) -> AsyncStore:
        store = AsyncStore.create(self.dsn, min_size=1, max_size=2, retry_s=0.0)
        await store.open(wait=True, timeout=10.0)
        return store

    def teardown(self) -> None:
        self.run(self.store.close())
        self.sql.close()

    # --------------------------------------------------------------- helpers

    def _in(self, *states: str) -> list[int]:
        return sorted(i for i, m in self.jobs.items() if m.state in states)

    def _due(self, queue: str, quarantined: bool) -> set[int]:
        if queue in self.paused:
            return set()
        return {
            i
            for i, m in self.jobs.items()
            if m.queue == queue
            and m.state in ("queued", "retrying")
            and (m.rescues >= QUARANTINE_AT) == quarantined
        }

    def _took(self, ids: list[int], tokens: dict[int, int]) -> None:
        for i in ids:
            m = self.jobs[i]
            assert tokens[i] > self.last_token, "a lease token did not grow"
            self.last_token = tokens[i]
            m.state, m.attempt, m.token = "running", m.attempt + 1, tokens[i]

    def _ended(self, m: M, state: str, job_id: int) -> None:
        assert m.token is not None
        self.stale.append((job_id, m.token))
        m.token, m.state, m.attempts_ended = None, state, m.attempts_ended + 1

    # --------------------------------------------------------------- rules

    @rule(queue=st.sampled_from(QUEUES), max_attempts=st.integers(1, 3))
    def submit(self, queue: str, max_attempts: int) -> None:
        job = self.run(
            self.store.job_insert(NewJob("t", queue=queue, max_attempts=max_attempts), 5)
        )
        assert job is not None
        self.jobs[job.id] = M(queue=queue, max_attempts=max_attempts)

    @rule(queue=st.sampled_from(QUEUES), limit=st.integers(1, 3))
    def claim(self, queue: str, limit: int) -> None:
        due = self._due(queue, quarantined=False)
        got = self.run(
            self.store.job_claim(ClaimParams(queue, WORKER, limit, TTL_MS, QUARANTINE_AT))
        )
        ids = [j.id for j in got]
        assert set(ids) <= due, f"claimed {set(ids) - due}, not claimable"
        assert len(ids) == min(limit, len(due)), "a short claim with due jobs left"
        self._took(ids, {j.id: j.lease.token for j in got if j.lease is not None})
        left = self.run(self.store.job_claim_left(queue, QUARANTINE_AT))
        # after it: 'more' says whether a due job is left for the next claim; nothing
        # here is ever scheduled for later, so there is never anything to wait for
        assert left.more == bool(due - set(ids)), "job_claim_left disagrees with the claim"
        assert left.wait_ms is None

    @rule(queue=st.sampled_from(QUEUES))
    def claim_quarantined(self, queue: str) -> None:
        due = self._due(queue, quarantined=True)
        p = ClaimParams(queue, WORKER, 1, TTL_MS, QUARANTINE_AT)
        got = self.run(self.store.job_claim_quarantined(p))
        pending = self.run(self.store.job_quarantine_pending([queue], QUARANTINE_AT))
        ids = [j.id for j in got]
        assert set(ids) <= due and len(ids) == min(1, len(due))
        # after the claim: pending says whether another suspect is left for it
        assert pending == bool(due - set(ids)), "quarantine_pending disagrees with the claim"
        self._took(ids, {j.id: j.lease.token for j in got if j.lease is not None})

    @precondition(lambda self: self._in("running"))
    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed", "released", "cancelled"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        job_id = data.draw(st.sampled_from(self._in("running")))
        m = self.jobs[job_id]
        assert m.token is not None
        if outcome == "succeeded":
            f = Finish(job_id, m.token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, result=1)
        elif outcome == "failed":
            dead = m.attempt >= m.max_attempts
            failed = JobState.DEAD if dead else JobState.RETRYING
            f = Finish(job_id, m.token, failed, AttemptOutcome.FAILED, error="boom")
        elif outcome == "released":
            f = Finish(job_id, m.token, JobState.QUEUED, AttemptOutcome.RELEASED)
            m.attempt -= 1
        else:
            f = Finish(job_id, m.token, JobState.CANCELLED, AttemptOutcome.CANCELLED)
        done = self.run(self.store.job_finish_many([f]))
        assert done == {job_id}, "a current token was refused"
        state = f.state.value
        if m.cancel_requested and state != "succeeded":
            state = "cancelled"
        self._ended(m, state, job_id)

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def stale_finish(self, data: st.DataObject) -> None:
        job_id, token = data.draw(st.sampled_from(self.stale))
        if job_id not in self.jobs:
            return
        f = Finish(job_id, token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, result=1)
        assert self.run(self.store.job_finish_many([f])) == set(), "a stale token was accepted"

    @precondition(lambda self: self._in("running"))
    @rule()
    def heartbeat(self) -> None:
        leases = [(i, self.jobs[i].token or 0) for i in self._in("running")]
        leases += [s for s in self.stale if s[0] in self.jobs][-2:]  # stale ones too
        p = HeartbeatParams(WORKER, "h", 1, list(QUEUES), 3, TTL_MS, leases)
        renewed = self.run(self.store.job_heartbeat_many(p))
        assert renewed == {i: self.jobs[i].cancel_requested for i in self._in("running")}

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        m = self.jobs[job_id]
        got = self.run(self.store.job_cancel(job_id))
        assert (got is not None) == (m.state not in FINAL)
        m.cancel()

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        m = self.jobs[job_id]
        got = self.run(self.store.job_retry(job_id))
        assert (got is not None) == (m.state in ("dead", "cancelled"))
        if got is not None:
            m.reopen()

    @rule(queue=st.sampled_from(QUEUES))
    def replay(self, queue: str) -> None:
        want = {i for i, m in self.jobs.items() if m.queue == queue and m.state == "dead"}
        got = self.run(self.store.job_retry_dead_many(None, queue, batch=2))
        assert set(got) == want
        for i in got:
            self.jobs[i].reopen()

    @rule(queue=st.sampled_from(QUEUES), paused=st.booleans())
    def pause(self, queue: str, paused: bool) -> None:
        row = self.run(self.store.queue_set_paused(queue, paused))
        assert row["paused"] is paused
        (self.paused.add if paused else self.paused.discard)(queue)

    @precondition(lambda self: self._in("running"))
    @rule(data=st.data())
    def lapse_and_rescue(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._in("running")))
        m = self.jobs[job_id]
        held = len(self._in("running"))  # every claim here is one worker's
        self.sql.execute(
            "UPDATE deadman.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
            (job_id,),
        )
        rescued = self.run(self.store.job_rescue_expired(RescueParams(MAX_RESCUES)))
        assert rescued is not None and [r.id for r in rescued] == [job_id]
        if m.cancel_requested:
            state = "cancelled"
        elif m.rescues + 1 > MAX_RESCUES and held == 1:
            state = "dead"
        else:
            state = "queued"
            m.attempt -= 1
        m.rescues += 1
        self._ended(m, state, job_id)
        assert rescued[0].state.value == state

    @precondition(lambda self: self._in(*FINAL))
    @rule(data=st.data())
    def prune(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self._in(*FINAL)))
        self.sql.execute(
            "UPDATE deadman.jobs SET finished_at = now() - interval '2 days' WHERE id = %s",
            (job_id,),
        )
        day = 24 * 3600 * 1000
        assert self.run(self.store.job_prune_finished(PruneParams(day, day))) == 1
        del self.jobs[job_id]

    # --------------------------------------------------------------- the check

    @invariant()
    def database_matches_the_model(self) -> None:
        STEPS[-1] += 1
        rows: dict[int, DictRow] = {
            int(r["id"]): r for r in self.sql.execute("SELECT * FROM deadman.jobs").fetchall()
        }
        assert set(rows) == set(self.jobs), "jobs appeared or vanished"
        counts = {
            int(r["job_id"]): int(r["n"])
            for r in self.sql.execute(
                "SELECT job_id, count(*) AS n FROM deadman.attempts GROUP BY job_id"
            ).fetchall()
        }
        for i, m in self.jobs.items():
            r = rows[i]
            seen = (r["state"], r["attempt"], r["rescues"], r["lease_token"], r["cancel_requested"])
            want = (m.state, m.attempt, m.rescues, m.token, m.cancel_requested)
            assert seen == want, f"job {i}: database {seen}, model {want}"
            assert counts.get(i, 0) == m.attempts_ended, f"job {i}: attempt history"


def _run(machine: type[Lifecycle], examples: int, steps: int) -> None:
    STEPS.clear()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    # the machine really ran: every example checked the database after each step
    assert len(STEPS) >= examples and sum(STEPS) >= examples * 10, STEPS


def test_the_store_follows_the_lifecycle_model(db_dsn: str) -> None:
    with asyncio.Runner() as runner:
        Lifecycle.dsn = db_dsn
        Lifecycle.runner = runner
        _run(Lifecycle, examples=100, steps=40)


class LifecycleOverHttp(Lifecycle):
    """The slower variant: the operator's steps (submit, cancel, retry, pause/resume)
    and a read of every job go through the HTTP API on a real server; the worker's
    steps still use the store, as a worker does. The same model must hold."""

    http: httpx.Client

    @rule(queue=st.sampled_from(QUEUES), max_attempts=st.integers(1, 3))
    def submit(self, queue: str, max_attempts: int) -> None:
        r = self.http.post(
            "/jobs", json={"type": "t", "queue": queue, "max_attempts": max_attempts}
        )
        assert r.status_code == 201, r.text
        self.jobs[int(r.json()["id"])] = M(queue=queue, max_attempts=max_attempts)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        m = self.jobs[job_id]
        r = self.http.post(f"/jobs/{job_id}/cancel")
        want = 409 if m.state in FINAL else 202 if m.state == "running" else 200
        assert r.status_code == want, (m.state, r.status_code, r.text)
        m.cancel()

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        m = self.jobs[job_id]
        r = self.http.post(f"/jobs/{job_id}/retry")
        assert r.status_code == (200 if m.state in ("dead", "cancelled") else 409), r.text
        if r.status_code == 200:
            assert r.json()["state"] == "queued"
            m.reopen()

    @rule(queue=st.sampled_from(QUEUES), paused=st.booleans())
    def pause(self, queue: str, paused: bool) -> None:
        r = self.http.post(f"/queues/{queue}/{'pause' if paused else 'resume'}")
        assert r.status_code == 200 and r.json()["paused"] is paused, r.text
        (self.paused.add if paused else self.paused.discard)(queue)

    @invariant()
    def the_api_shows_the_model(self) -> None:
        for i, m in self.jobs.items():
            body = self.http.get(f"/jobs/{i}").json()
            assert (body["state"], body["attempt"]) == (m.state, m.attempt), (i, body)


def test_the_api_follows_the_lifecycle_model(db_dsn: str) -> None:
    with (
        asyncio.Runner() as runner,
        serve(make_app(db_dsn)) as base_url,
        client(base_url) as http,
    ):
        LifecycleOverHttp.dsn = db_dsn
        LifecycleOverHttp.runner = runner
        LifecycleOverHttp.http = http
        _run(LifecycleOverHttp, examples=25, steps=25)
