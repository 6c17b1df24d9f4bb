"""The operators scenario's verifier, fed databases built by hand: a state that keeps
every rule passes every check, and each rule broken on purpose fails its check (and
only the rules it breaks). Real Postgres, the real instrumentation (ops.sql), the
real journal loader; a few milliseconds per case.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from deadman.chaos.app import OPS
from deadman.chaos.verify import Check
from deadman.chaos.verify_ops import (
    Ack,
    Submitted,
    acks_load,
    examples,
    operator_checks,
    operator_figures,
)
from tests.factories import connect, insert_job

PREFIX = "ops-test-"

RETRY_LOST = "operators: no job a retry/replay acknowledged was lost"
RETENTION = "operators: retention deleted only finished jobs and workflows"
FENCE = "operators: no attempt started after its cancel was acknowledged"
OUTCOME = "operators: a cancelled job ends cancelled (or its in-flight attempt won)"
PAUSED = "operators: no attempt started in a paused queue"
FINAL = "operators: every job and workflow ended final, workflows agree with nodes"
EFFECTS = "operators: at most one effect per job, each under a succeeded attempt's lease"
SUBMITTED = "operators: every acknowledged submission is a job, or was pruned finished"


@dataclass
class Scene:
    """A database the operators scenario could have left, and its journal."""

    dsn: str
    conn: psycopg.Connection[Any]
    t0: datetime  # the database clock when the scene began
    acks: list[Ack] = field(default_factory=list)
    keys: int = 0

    def at(self, s: float) -> datetime:
        return self.t0 + timedelta(seconds=s)

    def ack(self, kind: str, lo_s: float, hi_s: float | None, **kw: Any) -> None:
        """Journal an action; its token_lo is the sequence as it is now, so attempts
        made before this call are claims made before the request."""
        row = self.conn.execute("SELECT last_value AS t FROM deadman.lease_token_seq").fetchone()
        assert row is not None
        self.acks.append(
            Ack(
                seq=len(self.acks) + 1,
                kind=kind,
                acked=kw.pop("acked", True),
                via=kw.pop("via", "http"),
                job_id=kw.pop("job_id", None),
                queue=kw.pop("queue", None),
                state=kw.pop("state", None),
                token=kw.pop("token", None),
                db_lo=self.at(lo_s),
                token_lo=int(row["t"]),
                db_hi=None if hi_s is None else self.at(hi_s),
                at_s=lo_s,
            )
        )

    def job(self, state: str, **kw: Any) -> int:
        """A submitted job (key <PREFIX><n>) in ``state``."""
        kw.setdefault("queue", "ops-a")
        job = insert_job(self.conn, state=state, idempotency_key=f"{PREFIX}{self.keys}", **kw)
        self.keys += 1
        return job.id

    def attempt(
        self, job_id: int, started_s: float, outcome: str = "failed", token: int | None = None
    ) -> int:
        """An ended attempt's row (a fresh token unless given)."""
        row = self.conn.execute(
            "INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,"
            " outcome) VALUES (COALESCE(%s, nextval('deadman.lease_token_seq')), %s, 1, 'w',"
            " %s, %s) RETURNING lease_token",
            (token, job_id, self.at(started_s), outcome),
        ).fetchone()
        assert row is not None
        return int(row["lease_token"])

    def token(self) -> int:
        """A lease token drawn now (as a claim would)."""
        row = self.conn.execute("SELECT nextval('deadman.lease_token_seq') AS t").fetchone()
        assert row is not None
        return int(row["t"])

    def checks(self) -> dict[str, Check]:
        self.conn.execute("TRUNCATE chaos.acks")  # the journal as it is now
        acks_load(self.dsn, self.acks)
        f = operator_figures(self.dsn, Submitted(PREFIX, self.keys, f"{PREFIX}wf-", 0))
        return {c.name: c for c in operator_checks(f)}

    def failing(self) -> set[str]:
        return {name for name, c in self.checks().items() if not c.passed}


@pytest.fixture
def scene(db_dsn: str) -> Iterator[Scene]:
    """A state that keeps every rule, each check with something to judge: a queued
    job cancelled (200), a running one cancelled (202) whose attempt in flight won, a
    dead job retried that then succeeded and was pruned, a paused and resumed queue
    in which nothing started, and a finished one-node workflow."""
    with connect(db_dsn) as conn:
        conn.execute(OPS["operators_instrument"])
        row = conn.execute("SELECT now() AS t").fetchone()
        assert row is not None
        s = Scene(db_dsn, conn, row["t"])
        cancelled = s.job("cancelled")
        s.ack("cancel", 1, 2, job_id=cancelled, state="cancelled")
        won = s.job("succeeded")
        token = s.attempt(won, 0.5, "succeeded")  # the attempt in flight won
        s.ack("cancel", 1, 2, job_id=won, state="running", token=token)
        retried = s.job("succeeded")
        s.attempt(retried, 0.0)
        s.ack("retry", 3, 4, job_id=retried, state="queued")
        s.attempt(retried, 5, "succeeded")
        conn.execute("UPDATE deadman.jobs SET finished_at = %s WHERE id = %s", (s.at(5.5), retried))
        conn.execute("DELETE FROM deadman.jobs WHERE id = %s", (retried,))  # pruned
        s.ack("pause", 6, 7, queue="ops-b")
        s.ack("resume", 9, 10, queue="ops-b")
        wf = conn.execute(
            "INSERT INTO deadman.workflows (name, nodes, unfinished, state, finished_at)"
            " VALUES ('w', 1, 0, 'succeeded', now()) RETURNING id"
        ).fetchone()
        assert wf is not None
        node = s.job("succeeded")
        conn.execute(
            "UPDATE deadman.jobs SET workflow_id = %s, node = 'a' WHERE id = %s", (wf["id"], node)
        )
        yield s


def test_a_state_that_keeps_every_rule_passes_every_check(scene: Scene) -> None:
    checks = scene.checks()
    assert set(checks) >= {RETRY_LOST, RETENTION, FENCE, OUTCOME, PAUSED, FINAL, EFFECTS}
    assert scene.failing() == set(), {n: c.detail for n, c in checks.items()}


def test_a_retried_job_that_retention_deleted_while_queued_is_lost(scene: Scene) -> None:
    """Bug 1's shape: the prune's DELETE took the row after the retry requeued it."""
    job = scene.job("dead")
    scene.ack("retry", 20, 21, job_id=job, state="queued")
    scene.conn.execute(
        "UPDATE deadman.jobs SET state = 'queued', finished_at = NULL WHERE id = %s", (job,)
    )
    scene.conn.execute("DELETE FROM deadman.jobs WHERE id = %s", (job,))
    assert scene.failing() == {RETRY_LOST, RETENTION}
    lost = examples(scene.dsn)["example_retries_lost"]
    assert [(r["job_id"], r["deleted_in_state"]) for r in lost] == [(job, "queued")]


def test_a_retried_job_that_vanished_without_trace_is_lost(scene: Scene) -> None:
    scene.ack("retry", 20, 21, job_id=10**12, state="queued")
    assert scene.failing() == {RETRY_LOST}


def test_an_attempt_with_a_larger_token_after_a_202_cancel_fails_the_fence(scene: Scene) -> None:
    """Bug 2's shape: the attempt in flight ended retrying and the job ran again."""
    job = scene.job("cancelled")
    in_flight = scene.token()
    scene.attempt(job, 15, token=in_flight)  # the attempt in flight ended retrying
    scene.ack("cancel", 20, None, job_id=job, state="running", token=in_flight)  # no hi
    again = scene.attempt(job, 22)
    assert again > in_flight
    assert scene.failing() == {FENCE}
    found = examples(scene.dsn)["example_attempts_after_cancel"]
    assert again in {r["lease_token"] for r in found}


def test_an_effect_alone_is_evidence_of_an_attempt_after_a_cancel(scene: Scene) -> None:
    """The attempt row can be missing (its job was deleted while running); the effect
    (or invocation) it wrote still carries its token."""
    job = scene.job("cancelled")
    in_flight = scene.token()
    scene.ack("cancel", 20, 21, job_id=job, state="running", token=in_flight)
    scene.conn.execute(
        "INSERT INTO deadman.chaos_invocations (job_id, lease_token, worker) VALUES (%s, %s, 'w')",
        (job, scene.token()),
    )
    assert FENCE in scene.failing()


def test_an_attempt_claimed_after_a_200_cancel_fails_the_fence_by_time(scene: Scene) -> None:
    job = scene.job("cancelled")
    scene.ack("cancel", 20, 21, job_id=job, state="cancelled")
    scene.attempt(job, 21.5)
    assert scene.failing() == {FENCE}


def test_an_attempt_before_the_cancel_or_after_a_later_retry_is_allowed(scene: Scene) -> None:
    """Both sides of the window: claimed before db_hi (in flight), claimed after the
    next retry's db_lo (a new life); an unanswered retry ends the window too."""
    job = scene.job("succeeded")
    scene.ack("cancel", 20, 21, job_id=job, state="cancelled")
    scene.attempt(job, 20.5)
    scene.ack("retry", 30, None, job_id=job, acked=False)
    scene.attempt(job, 31, "succeeded")
    assert FENCE not in scene.failing()


def test_an_attempt_drawn_after_the_retry_was_sent_belongs_to_the_retry(scene: Scene) -> None:
    """Its started_at may say "before the retry" (a claim's now() can precede its
    snapshot by a descheduling); its token, drawn after the retry's token_lo, says
    the claim saw the retried job."""
    job = scene.job("succeeded")
    scene.ack("cancel", 20, 21, job_id=job, state="cancelled")
    scene.ack("retry", 30, 31, job_id=job, state="queued")
    scene.attempt(job, 29.9, "succeeded")
    assert scene.failing() == set()


def test_an_attempt_between_cancel_and_retry_fails_the_fence(scene: Scene) -> None:
    job = scene.job("succeeded")
    scene.ack("cancel", 20, 21, job_id=job, state="cancelled")
    scene.attempt(job, 25)  # after the cancel, before the retry was even asked for
    scene.ack("retry", 30, 31, job_id=job, state="queued")
    scene.attempt(job, 32, "succeeded")
    assert scene.failing() == {FENCE}


def test_a_job_cancelled_while_queued_that_ended_succeeded_is_not_honoured(scene: Scene) -> None:
    job = scene.job("succeeded")
    scene.ack("cancel", 20, 21, job_id=job, state="cancelled")
    assert scene.failing() == {OUTCOME}


def test_a_job_cancelled_while_running_that_ended_dead_is_not_honoured(scene: Scene) -> None:
    """Only a success of the attempt in flight may overrule an acknowledged cancel."""
    job = scene.job("dead")
    scene.ack("cancel", 20, 21, job_id=job, state="running", token=scene.token())
    assert scene.failing() == {OUTCOME}


def test_an_attempt_claimed_in_a_paused_queue_fails(scene: Scene) -> None:
    scene.ack("pause", 30, 31, queue="ops-b")
    job = scene.job("succeeded", queue="ops-b")
    scene.attempt(job, 32, "succeeded")  # claimed before the resume was even sent
    scene.ack("resume", 35, 36, queue="ops-b")
    assert scene.failing() == {PAUSED}
    found = examples(scene.dsn)["example_attempts_while_paused"]
    assert [r["job_id"] for r in found] == [job]


def test_attempts_just_outside_a_pause_or_in_another_queue_are_allowed(scene: Scene) -> None:
    """Claimed before the pause's db_hi (the pause may not have committed yet), after
    the resume was sent (its token is larger than the resume's token_lo, even though
    started_at says "before": the claim's snapshot may be later than its now()), or
    in a queue that was not paused."""
    scene.ack("pause", 30, 31, queue="ops-b")
    scene.attempt(scene.job("succeeded", queue="ops-b"), 30.5, "succeeded")
    scene.attempt(scene.job("succeeded", queue="ops-a"), 32, "succeeded")
    scene.ack("resume", 35, 36, queue="ops-b", acked=False)  # no answer: ends it too
    scene.attempt(scene.job("succeeded", queue="ops-b"), 34.9, "succeeded")
    assert scene.failing() == set()


def test_a_job_left_unfinished_fails(scene: Scene) -> None:
    scene.job("queued")
    assert scene.failing() == {FINAL}


def test_a_workflow_left_running_with_every_node_final_fails(scene: Scene) -> None:
    """What a node deleted under a retry leaves behind: the counter never reaches 0."""
    wf = scene.conn.execute(
        "INSERT INTO deadman.workflows (name, nodes, unfinished) VALUES ('w2', 1, 1) RETURNING id"
    ).fetchone()
    assert wf is not None
    node = scene.job("succeeded")
    scene.conn.execute(
        "UPDATE deadman.jobs SET workflow_id = %s, node = 'a' WHERE id = %s", (wf["id"], node)
    )
    assert scene.failing() == {FINAL}


def test_a_finished_workflow_whose_verdict_disagrees_with_its_nodes_fails(scene: Scene) -> None:
    wf = scene.conn.execute(
        "INSERT INTO deadman.workflows (name, nodes, unfinished, state, finished_at)"
        " VALUES ('w3', 1, 0, 'succeeded', now()) RETURNING id"
    ).fetchone()
    assert wf is not None
    node = scene.job("dead")
    scene.conn.execute(
        "UPDATE deadman.jobs SET workflow_id = %s, node = 'a' WHERE id = %s", (wf["id"], node)
    )
    assert scene.failing() == {FINAL}


def test_two_effects_of_one_job_fail(scene: Scene) -> None:
    job = scene.job("succeeded")
    token = scene.attempt(job, 1, "succeeded")
    for _ in range(2):
        scene.conn.execute(
            "INSERT INTO deadman.effects (job_id, lease_token) VALUES (%s, %s)", (job, token)
        )
    assert scene.failing() == {EFFECTS}


def test_an_acknowledged_submission_that_is_gone_fails(scene: Scene) -> None:
    scene.keys += 1  # acknowledged, never stored
    assert scene.failing() == {SUBMITTED}


def test_no_cancel_retry_or_pause_at_all_proves_nothing(db_dsn: str) -> None:
    """A run in which the operator never got an action acknowledged must not pass."""
    with connect(db_dsn) as conn:
        conn.execute(OPS["operators_instrument"])
        row = conn.execute("SELECT now() AS t").fetchone()
        assert row is not None
        assert Scene(db_dsn, conn, row["t"]).failing() == {RETRY_LOST, FENCE, PAUSED}
