"""Operators under fire (``deadman chaos``'s ``operators`` scenario, in ``--all``).

What people do to a queue while it runs, done to a fleet whose workers are being
SIGKILLed and replaced, in a database of its own (retention here deletes finished
jobs after a second, which the other scenarios' exactly-once count cannot live with):

- jobs (``chaos-effect``, ``chaos-flaky``, the built-in ``fail``) and four-node
  workflows go in over HTTP, in three queues;
- one operator, one action at a time, as a person with the API would: list jobs in a
  state (``GET /jobs``), then cancel a queued, waiting, retrying or running one
  (``POST /jobs/{id}/cancel``), retry a dead or cancelled one (``POST /jobs/{id}/
  retry``), replay a queue's dead letters in bulk (the store call of ``deadman dlq
  replay``), cancel a workflow (the store call of ``POST /workflows/{id}/cancel``,
  which says which nodes the cancel took and in which state; the HTTP answer only
  shows the states afterwards), pause a queue and resume it;
- retention of one second for every finished state, run every second by a
  pruner of its own (the store calls of the rescuer's retention) besides the workers'
  rescuers, and also at the very moment of some bulk replays (the oldest dead letters,
  which a replay takes first, are the ones retention is deleting).

Every action is journalled with the database clock read just before the request
and just after the answer (``Ack``); at the end the journal goes into ``chaos.acks``
and ``verify_ops.sql`` judges the database against it. Deleted rows are kept by the
triggers of ``operators_instrument`` (ops.sql), so that a job retention took is
still accounted for.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from deadman.chaos.app import OPS
from deadman.chaos.faults import Applied, FaultPlan
from deadman.chaos.http import BATCH, ApiClient, ApiServer
from deadman.chaos.scenarios import Db, kill_workers
from deadman.chaos.verify import Check
from deadman.chaos.verify_ops import (
    Ack,
    Submitted,
    acks_load,
    examples,
    operator_checks,
    operator_figures,
)
from deadman.chaos.workers import WorkerPool
from deadman.errors import DeadmanError
from deadman.model import Backoff
from deadman.store import AsyncStore, PruneParams

log = logging.getLogger("deadman.chaos.operators")

QUEUES = ("ops-a", "ops-b", "ops-c")
PAUSABLE = ("ops-a", "ops-b")  # ops-c always runs: the fleet never idles completely
#: Retention for every finished state, and how often the scenario's pruner runs.
RETENTION_MS = 1000
PRUNE_EVERY_S = 1.0
#: The operator acts until the submissions are in and the fleet is nearly through
#: them (OPERATE_UNTIL_LEFT of the jobs unfinished), at least OPERATE_TAIL_S after
#: the last submission; replays keep feeding it work, so OPERATE_MAX_S at most.
OPERATE_TAIL_S = 3.0
OPERATE_UNTIL_LEFT = 0.02
OPERATE_MAX_S = 25.0
#: Pause between two operator actions (each is a list and an act: ~40 actions/s).
STEP_S = 0.01
BACKOFF = Backoff(strategy="exponential", base_ms=50, max_ms=500)
#: (action, weight): what the operator does next, drawn from the seed.
ACTIONS = (
    ("cancel-queued", 3.0),
    ("cancel-running", 4.0),
    ("retry-dead", 4.0),
    ("retry-cancelled", 2.0),
    ("replay-dead", 1.0),
    ("replay-while-pruning", 1.0),
    ("cancel-workflow", 1.0),
)
PAUSE_P = 0.03  # per action and pausable queue that is running


def scaled_jobs(jobs: int, alone: bool) -> int:
    """The scenario's own job count: all of --jobs when it runs alone; in --all a
    tenth of it (1000 at least), so that it adds tens of seconds to a 100k run."""
    return jobs if alone else min(jobs, max(1000, jobs // 10))


@dataclass(frozen=True)
class OperatorsConfig:
    jobs: int
    workers: int
    kill_rate: float
    kill_interval: float
    seed: int
    handler_ms: int
    timeout: float
    worker_env: dict[str, str]

    @property
    def prefix(self) -> str:
        return f"chaos-ops-{self.seed}-"

    @property
    def workflows(self) -> int:
        return max(5, self.jobs // 40)


@dataclass(frozen=True)
class Clock:
    """The database clock and the last lease token handed out, read together."""

    now: datetime
    token: int


class Journal:
    """Every operator action the harness sent (thread-safe), in order."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.acks: list[Ack] = []
        self.sent: Counter[str] = Counter()

    def add(
        self,
        kind: str,
        acked: bool,
        via: str,
        lo: Clock,
        hi: Clock | None,
        *,
        job_id: int | None = None,
        queue: str | None = None,
        state: str | None = None,
        token: int | None = None,
    ) -> None:
        with self._lock:
            self.acks.append(
                Ack(
                    len(self.acks) + 1,
                    kind,
                    acked,
                    via,
                    job_id,
                    queue,
                    state,
                    token,
                    lo.now,
                    lo.token,
                    None if hi is None else hi.now,
                    round(self._clock(), 3),
                )
            )


class Operator(threading.Thread):
    """Submits the jobs, then acts on them, and prunes, until told to stop."""

    def __init__(self, cfg: OperatorsConfig, dsn: str, api: ApiServer, journal: Journal) -> None:
        super().__init__(name="chaos-operator", daemon=True)
        self.cfg = cfg
        self.dsn = dsn
        self.api = api
        self.journal = journal
        self.rng = random.Random(f"{cfg.seed}:operators")
        self.acked_jobs = 0
        self.acked_workflows = 0
        self.workflow_ids: list[int] = []
        self.statuses: Counter[str] = Counter()  # "<action> <status>"
        self.pruned = 0
        self.errors: list[str] = []
        self.submitted = threading.Event()
        self.operated = threading.Event()  # done acting, every queue resumed
        self.stop = threading.Event()
        self.submit_s = 0.0
        self._paused: dict[str, float] = {}  # queue -> resume at (monotonic)
        self._clock_conn: psycopg.AsyncConnection[Any] | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # reported as a failed check, never a dead harness
            self.errors.append(repr(exc))
        finally:
            self.submitted.set()
            self.operated.set()

    async def _main(self) -> None:
        store = AsyncStore.create(self.dsn, max_size=3, retry_s=10.0)
        await store.open()
        try:
            pruner = asyncio.create_task(self._prune(store))
            try:
                # The operator acts while the jobs are still going in, as people do.
                submitting = asyncio.create_task(self._submit())
                try:
                    await self._operate(store, submitting)
                finally:
                    await self._resume_all()
                await submitting  # its failure, if any, is the run's
            finally:
                self.operated.set()
            await asyncio.to_thread(self.stop.wait)  # pruning goes on through the drain
            pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pruner
        finally:
            if self._clock_conn is not None:
                await self._clock_conn.close()
            await store.close()

    # -- the database clock ------------------------------------------------------------

    async def _now(self) -> Clock | None:
        """The database clock and token sequence, or None if they cannot be read now."""
        try:
            if self._clock_conn is None or self._clock_conn.closed:
                self._clock_conn = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=5
                )
            cur = await self._clock_conn.execute(OPS["operators_clock"])
            row = await cur.fetchone()
            return None if row is None else Clock(row[0], int(row[1]))
        except psycopg.Error:
            self._clock_conn = None
            return None

    # -- HTTP --------------------------------------------------------------------------

    async def _http(
        self, client: ApiClient, method: str, path: str, body: Any = None, **headers: str
    ) -> tuple[int, Any]:
        """(status, parsed body); status 0 when no answer came."""
        data = None if body is None else json.dumps(body).encode()
        try:
            status, _, parsed = await asyncio.to_thread(
                client.request, method, path, data, dict(headers)
            )
        except (OSError, http.client.HTTPException):
            return 0, None
        return status, parsed

    # -- submission --------------------------------------------------------------------

    async def _submit(self) -> None:
        started = time.monotonic()
        client = ApiClient(self.api.port)
        rng = random.Random(f"{self.cfg.seed}:operators-jobs")
        per_batch = max(1, self.cfg.workflows * BATCH // max(self.cfg.jobs, 1))
        try:
            for first in range(0, self.cfg.jobs, BATCH):
                items = [
                    self._job_item(rng, n) for n in range(first, min(first + BATCH, self.cfg.jobs))
                ]
                await self._until_acked(client, "/jobs/batch", {"jobs": items})
                self.acked_jobs += len(items)
                for _ in range(per_batch):
                    if self.acked_workflows < self.cfg.workflows:
                        await self._workflow(client, rng)
            while self.acked_workflows < self.cfg.workflows:
                await self._workflow(client, rng)
        finally:
            client.close()
            self.submit_s = time.monotonic() - started
            self.submitted.set()

    async def _until_acked(self, client: ApiClient, path: str, body: Any, **headers: str) -> Any:
        for _ in range(600):  # bounded: ~a minute of 429/503/no answer
            if self.stop.is_set():
                break
            status, parsed = await self._http(client, "POST", path, body, **headers)
            self.statuses[f"submit {status}"] += 1
            if status in (200, 201):
                return parsed
            if status not in (0, 429, 503):
                raise DeadmanError(f"POST {path} answered {status}: {parsed}")
            await asyncio.sleep(0.1)
        raise DeadmanError(f"POST {path} was never acknowledged")

    def _job_item(self, rng: random.Random, n: int) -> dict[str, Any]:
        return {**self._job(rng), "idempotency_key": f"{self.cfg.prefix}{n}"}

    def _job(self, rng: random.Random) -> dict[str, Any]:
        """Half succeed, a fifth always fail (dead after 2 attempts), the rest fail
        half their attempts; the sleeps give cancels running jobs to land on."""
        ms = rng.randint(0, max(50, 5 * self.cfg.handler_ms))
        draw = rng.random()
        common = {"queue": rng.choice(QUEUES), "backoff": BACKOFF.to_json()}
        if draw < 0.2:
            return {**common, "type": "fail", "max_attempts": 2, "payload": {}}
        if draw < 0.5:
            return {
                **common,
                "type": "chaos-flaky",
                "max_attempts": 2,
                "payload": {"ms": ms, "p": 0.5},
            }
        return {**common, "type": "chaos-effect", "max_attempts": 3, "payload": {"ms": ms}}

    async def _workflow(self, client: ApiClient, rng: random.Random) -> None:
        """A diamond: a -> b, a -> c, b and c -> d."""
        k = self.acked_workflows
        nodes = [{"name": name, **self._job(rng)} for name in ("a", "b", "c", "d")]
        edges = [{"from": s, "to": d} for s, d in (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))]
        body = {"name": f"ops-{k}", "nodes": nodes, "edges": edges}
        parsed = await self._until_acked(
            client, "/workflows", body, **{"Idempotency-Key": f"{self.cfg.prefix}wf-{k}"}
        )
        self.workflow_ids.append(int(parsed["id"]))
        self.acked_workflows += 1

    # -- acting ------------------------------------------------------------------------

    async def _operate(self, store: AsyncStore, submitting: asyncio.Task[None]) -> None:
        client = ApiClient(self.api.port, timeout=30.0)
        names, weights = zip(*ACTIONS, strict=True)
        tail_ends = give_up = float("inf")  # counted from the last submission
        next_look = 0.0
        busy = True
        try:
            while not self.stop.is_set() and (busy or time.monotonic() < tail_ends):
                now = time.monotonic()
                if submitting.done() and tail_ends == float("inf"):
                    if submitting.exception() is not None:
                        return
                    tail_ends = now + OPERATE_TAIL_S
                    give_up = now + min(OPERATE_MAX_S, self.cfg.timeout / 2)
                if now >= next_look:
                    next_look = now + 0.5
                    busy = not submitting.done() or (await self._busy() and now < give_up)
                await self._toggle_pauses(client)
                action = self.rng.choices(names, weights)[0]
                if action == "cancel-queued":
                    await self._cancel(client, self.rng.choice(("queued", "waiting", "retrying")))
                elif action == "cancel-running":
                    await self._cancel(client, "running")
                elif action == "retry-dead":
                    await self._retry(client, "dead")
                elif action == "retry-cancelled":
                    await self._retry(client, "cancelled")
                elif action == "replay-dead":
                    await self._replay(store)
                elif action == "replay-while-pruning":
                    # The dead letters replayed first are the oldest, the very rows
                    # retention is deleting right now (a DELETE that waits on a
                    # replayed row's lock must not take it once requeued).
                    await asyncio.gather(
                        self._prune_once(store), self._replay(store, 0.005, everything=True)
                    )
                else:
                    await self._cancel_workflow(store)
                await asyncio.sleep(STEP_S)
        finally:
            client.close()

    async def _busy(self) -> bool:
        """More than OPERATE_UNTIL_LEFT of the jobs still unfinished?"""
        try:
            if self._clock_conn is None or self._clock_conn.closed:
                return True  # _now() reconnects
            cur = await self._clock_conn.execute(OPS["operators_unfinished"])
            row = await cur.fetchone()
        except psycopg.Error:
            self._clock_conn = None
            return True
        return row is not None and int(row[0]) > OPERATE_UNTIL_LEFT * self.cfg.jobs

    async def _pick(self, client: ApiClient, state: str) -> int | None:
        status, parsed = await self._http(client, "GET", f"/jobs?state={state}&limit=50")
        jobs = parsed.get("jobs", []) if status == 200 and isinstance(parsed, dict) else []
        return int(self.rng.choice(jobs)["id"]) if jobs else None

    async def _cancel(self, client: ApiClient, state: str) -> None:
        job_id = await self._pick(client, state)
        lo = await self._now()
        if job_id is None or lo is None:
            return
        status, parsed = await self._http(client, "POST", f"/jobs/{job_id}/cancel")
        self.statuses[f"cancel {status}"] += 1
        if status not in (200, 202) or not isinstance(parsed, dict):
            return  # 404/409: nothing was cancelled; no answer: nothing was promised
        lease = parsed.get("lease") or {}
        token = lease.get("token") if status == 202 else None
        self.journal.add(
            "cancel",
            True,
            "http",
            lo,
            await self._now(),
            job_id=job_id,
            queue=parsed.get("queue"),
            state=parsed.get("state"),
            token=None if token is None else int(token),
        )

    async def _retry(self, client: ApiClient, state: str) -> None:
        job_id = await self._pick(client, state)
        lo = await self._now()
        if job_id is None or lo is None:
            return
        status, parsed = await self._http(client, "POST", f"/jobs/{job_id}/retry")
        self.statuses[f"retry {status}"] += 1
        ok = status == 200 and isinstance(parsed, dict)
        # Journalled whatever the answer: one that never came may have committed, and
        # even a refusal then ends the window in which the job must not run again.
        self.journal.add(
            "retry",
            ok,
            "http",
            lo,
            await self._now() if ok else None,
            job_id=job_id,
            state=parsed.get("state") if ok else None,
        )

    async def _replay(
        self, store: AsyncStore, after_s: float = 0.0, everything: bool = False
    ) -> None:
        """A bulk replay of a queue's dead letters (of one type, sometimes), or of
        every dead letter (``deadman dlq replay --all``)."""
        queue = None if everything else self.rng.choice(QUEUES)
        kind = None if everything else self.rng.choice((None, None, "fail", "chaos-flaky"))
        await asyncio.sleep(after_s)  # e.g. once a prune's DELETE is under way
        lo = await self._now()
        if lo is None:
            return
        try:
            ids = await store.job_retry_dead_many(kind, queue)
        except DeadmanError as exc:
            self.statuses["replay error"] += 1
            self.errors.append(f"bulk replay: {exc}")
            return
        self.statuses["replay ok"] += 1
        hi = await self._now()
        for job_id in ids:
            self.journal.add("retry", True, "store-bulk", lo, hi, job_id=job_id, queue=queue)

    async def _cancel_workflow(self, store: AsyncStore) -> None:
        if not self.workflow_ids:
            return
        workflow_id = self.rng.choice(self.workflow_ids)
        lo = await self._now()
        if lo is None:
            return
        try:
            rows = await store.workflow_cancel(workflow_id)
        except DeadmanError as exc:
            self.statuses["workflow-cancel error"] += 1
            self.errors.append(f"workflow cancel: {exc}")
            return
        self.statuses["workflow-cancel ok"] += 1
        hi = await self._now()
        for row in rows:
            self.journal.add(
                "cancel",
                True,
                "store-workflow",
                lo,
                hi,
                job_id=int(row["id"]),
                state=str(row["state"]),
            )

    async def _toggle_pauses(self, client: ApiClient) -> None:
        now = time.monotonic()
        for queue in PAUSABLE:
            if queue in self._paused:
                if now >= self._paused[queue]:
                    await self._resume(client, queue)
            elif self.rng.random() < PAUSE_P:
                lo = await self._now()
                if lo is None:
                    continue
                status, _ = await self._http(client, "POST", f"/queues/{queue}/pause")
                self.statuses[f"pause {status}"] += 1
                # Paused unless refused: an answer that never came may have paused it.
                if status != 200 and status != 0:
                    continue
                self._paused[queue] = now + self.rng.uniform(0.3, 1.5)
                if status == 200:
                    self.journal.add("pause", True, "http", lo, await self._now(), queue=queue)

    async def _resume(self, client: ApiClient, queue: str) -> bool:
        lo = await self._now()
        if lo is None:
            return False
        status, _ = await self._http(client, "POST", f"/queues/{queue}/resume")
        self.statuses[f"resume {status}"] += 1
        ok = status == 200
        # Journalled whatever the answer: it ends the pause's window either way.
        self.journal.add("resume", ok, "http", lo, await self._now() if ok else None, queue=queue)
        if ok:
            del self._paused[queue]
        return ok

    async def _resume_all(self) -> None:
        client = ApiClient(self.api.port)
        try:
            for _ in range(100):  # bounded: every queue must run again for the drain
                for queue in list(self._paused):
                    await self._resume(client, queue)
                if not self._paused:
                    return
                await asyncio.sleep(0.2)
            self.errors.append(f"queues left paused: {sorted(self._paused)}")
        finally:
            client.close()

    # -- retention ---------------------------------------------------------------------

    async def _prune(self, store: AsyncStore) -> None:
        """What the rescuer's retention does, every PRUNE_EVERY_S."""
        while True:
            await self._prune_once(store)
            await asyncio.sleep(PRUNE_EVERY_S)

    async def _prune_once(self, store: AsyncStore) -> None:
        """One round of the rescuer's retention: batches until one comes back short."""
        params = PruneParams(succeeded_ms=RETENTION_MS, failed_ms=RETENTION_MS)
        try:
            for _ in range(50):
                n = await store.job_prune_finished(params)
                self.pruned += n
                if n < params.limit:
                    break
            await store.workflow_prune_finished(params)
        except DeadmanError as exc:
            self.statuses["prune error"] += 1
            self.errors.append(f"prune: {exc}")


@dataclass
class Outcome:
    checks: list[Check]
    report: dict[str, Any]
    applied: list[Applied] = field(default_factory=list)


class OperatorsPhase:
    """The whole scenario on one (empty, migrated) database: instrument it, start an
    API server and a fleet, submit and act while kills go on, drain, verify."""

    def __init__(
        self, cfg: OperatorsConfig, dsn: str, log_dir: Path, clock: Callable[[], float]
    ) -> None:
        self.cfg = cfg
        self.dsn = dsn
        self.log_dir = log_dir
        self.clock = clock
        self.db = Db(dsn)
        self.journal = Journal(clock)
        self.applied: list[Applied] = []
        self.kills_withheld = 0

    def run(self) -> Outcome:
        cfg = self.cfg
        started = time.monotonic()
        deadline = started + cfg.timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(OPS["operators_instrument"])
        env = {
            **cfg.worker_env,
            "DEADMAN_QUEUES": ",".join(QUEUES),
            "DEADMAN_RETENTION_SUCCEEDED_S": str(RETENTION_MS / 1000),
            "DEADMAN_RETENTION_FAILED_S": str(RETENTION_MS / 1000),
        }
        api = ApiServer(self.dsn, self.log_dir, depth_cap=None, name="operators-api")
        pool = WorkerPool(self.dsn, cfg.workers, env, self.log_dir / "operators")
        plan = FaultPlan(cfg.seed, cfg.workers, cfg.kill_rate, True, False)
        op = Operator(cfg, self.dsn, api, self.journal)
        drained_s: float | None = None
        api_exit: int | None = None
        try:
            api.start()
            pool.start_all()
            op.start()
            self._kill_while(op, pool, plan, deadline)
            drained_s = self._drain(pool, deadline, started)
        finally:
            op.stop.set()
            pool.stop_all()
            op.join(timeout=30)
            api_exit = api.exit_code()
            api.stop()
        acks_load(self.dsn, self.journal.acks)
        submitted = Submitted(cfg.prefix, op.acked_jobs, f"{cfg.prefix}wf-", op.acked_workflows)
        figures = operator_figures(self.dsn, submitted)
        checks = operator_checks(figures) + self._harness_checks(op, pool, drained_s, api_exit)
        kinds = Counter(
            f"{a.kind}{'' if a.acked else ' (refused or unanswered)'}" for a in self.journal.acks
        )
        report = {
            "jobs": cfg.jobs,
            "workflows": cfg.workflows,
            "figures": figures,
            "examples": {k: v for k, v in examples(self.dsn).items() if v},
            "actions": dict(sorted(op.statuses.items())),
            "journal": dict(sorted(kinds.items())),
            "pruned_by_scenario": op.pruned,
            "errors": op.errors[:20],
            "fleet": pool.summary(),
            "kills_withheld": self.kills_withheld,
            "submit_s": round(op.submit_s, 2),
            "drained_s": drained_s,
            "wall_s": round(time.monotonic() - started, 1),
        }
        return Outcome(checks, report, self.applied)

    def _kill_while(self, op: Operator, pool: WorkerPool, plan: FaultPlan, deadline: float) -> None:
        """Kills on the tick, for as long as the operator acts."""
        tick = 0
        next_tick = time.monotonic() + self.cfg.kill_interval
        while not op.operated.is_set() and time.monotonic() < deadline:
            pool.reap()
            if time.monotonic() >= next_tick:
                next_tick += self.cfg.kill_interval
                applied, withheld = kill_workers(
                    pool, self.db, plan.tick(tick).kills, set(), self.clock
                )
                tick += 1
                self.applied += applied
                self.kills_withheld += withheld
                pool.reap()
            op.operated.wait(0.05)

    def _drain(self, pool: WorkerPool, deadline: float, started: float) -> float | None:
        """Wait until no job and no workflow is unfinished; seconds since the start."""
        while time.monotonic() < deadline:
            pool.reap()
            left = self.db.row("operators_unfinished")
            if left is not None and int(left["jobs"]) == 0 and int(left["workflows"]) == 0:
                return round(time.monotonic() - started, 1)
            time.sleep(0.2)
        return None

    def _harness_checks(
        self, op: Operator, pool: WorkerPool, drained_s: float | None, api_exit: int | None
    ) -> list[Check]:
        cfg = self.cfg
        server_errors = {k: n for k, n in op.statuses.items() if k.split()[-1].startswith("5")}
        return [
            Check(
                "operators: every submission acknowledged (harness)",
                op.acked_jobs == cfg.jobs and op.acked_workflows == cfg.workflows,
                f"{op.acked_jobs} of {cfg.jobs} jobs, {op.acked_workflows} of "
                f"{cfg.workflows} workflows in {op.submit_s:.1f} s",
            ),
            Check(
                "operators: drained, nothing left running (harness)",
                drained_s is not None,
                f"drained at {drained_s} s" if drained_s else f"not drained in {cfg.timeout} s",
            ),
            Check(
                "operators: workers SIGKILLed and replaced, none exited on its own, API up "
                "(harness)",
                pool.kills > 0 and not pool.unexpected and api_exit is None,
                f"{pool.kills} SIGKILLs, {pool.spawns} worker starts, "
                f"{len(pool.unexpected)} unexpected exits, API exit code {api_exit}",
            ),
            Check(
                "operators: every operator action was answered, none failed (harness)",
                not op.errors and not server_errors,
                f"{sum(op.statuses.values())} actions; server errors {server_errors or 'none'}"
                + "".join(f"; {e}" for e in op.errors[:3]),
            ),
        ]
