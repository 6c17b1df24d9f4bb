"""Writes attempt outcomes in batches: one ``job_finish_many`` statement per flush.

No timer: a flush starts as soon as there is something to write, and whatever
arrives while it runs goes into the next one. Idle, a completion is written at
once; under load, batches grow by themselves (up to ``batch_max``).

Up to ``in_flight`` flushes run at once, each on its own connection. With one, a
worker's slots move in lockstep (claim all, run all, write all, claim all again)
and the claim and the write never overlap; with two, one batch is written while
the next is still running. Concurrent flushes touch disjoint rows and each locks
its rows in id order, as the heartbeat does, so they cannot deadlock.

One outcome that cannot be written (not transient: a value the database refuses,
or one psycopg cannot even encode) fails alone: the batch is retried row by row,
and only that row's submitter gets the error. Nothing a row holds ends the task:
it is the worker's only way to record outcomes.

Refill (DECISIONS 45, 62): a flush also claims the jobs that take the slots its
outcomes free, in the same statement (``job_finish_claim``), so a worker under load
pays one round trip and one commit per cycle instead of one for the write and one
for the claim. Not on a queue whose last claim came back short (DECISIONS 59). The
producer says how (``refill``: the queue and how many, or None when it must claim
itself: stopping, a quarantine check due, a suspect to run alone); the claimed jobs
start (``on_claimed``), then the batch's submitters are told. A slot is still
given back only once its outcome is written, and here the claim that retakes it
commits with that write. Only the slots of outcomes whose
handler has returned count (``frees_slot``): a sync handler's thread that ignored its
timeout keeps its slot, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable

from deadman import logs, metrics, tracing
from deadman.errors import DatabaseUnavailable
from deadman.model import AttemptOutcome, Job, JobState
from deadman.store import ClaimParams, Finish
from deadman.worker.worker_store import WorkerStore

log = logs.get("deadman.completer")

#: Most bytes of results one flush writes. The batch travels as one JSON document
#: and Postgres refuses a jsonb value over 256 MiB with an error psycopg reports as
#: operational (so, to us, transient): 500 results of 1 MiB (each within
#: DEADMAN_MAX_PAYLOAD_BYTES) would have been retried forever, and with them every
#: outcome behind them.
BATCH_MAX_BYTES = 64 * 1024 * 1024

#: the states a written outcome puts its job back in line with (on_requeue)
_REQUEUED = (JobState.RETRYING, JobState.QUEUED)

#: Told how an outcome ended: (True, None) written, (False, None) refused by the
#: fence, (False, error) not writable (not transient). Called on the event loop, once.
Written = Callable[[bool, BaseException | None], None]

#: one pending outcome: what to write, its queue, who is told, whether its slot frees
Pending = tuple[Finish, str, Written, bool]


class Completer:
    def __init__(
        self,
        store: WorkerStore,
        worker_id: str,
        batch_max: int = 500,
        in_flight: int = 2,
        *,
        batch_max_bytes: int = BATCH_MAX_BYTES,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._batch_max = batch_max
        self._batch_max_bytes = batch_max_bytes
        self._sizes: deque[int] = deque()  # bytes of each pending outcome, in step
        self._in_flight = in_flight
        self._flushing: set[asyncio.Task[None]] = set()
        self._pending: deque[Pending] = deque()
        self._wake = asyncio.Event()
        self._stopping = False
        self.flushes = 0
        #: called after outcomes that put jobs back in line (retrying, released)
        self.on_requeue: Callable[[], None] | None = None
        #: the claim to send with a flush that frees this many slots (module docstring)
        self.refill: Callable[[int], ClaimParams | None] | None = None
        #: start the jobs a refill claimed (their claim's monotonic send time)
        self.on_claimed: Callable[[ClaimParams, list[Job], float], None] | None = None
        self._refilling = 0  # flushes in flight that carry a claim
        self._refills_done = asyncio.Event()
        self._refills_done.set()
        self._background: set[asyncio.Task[None]] = set()

    def post(
        self,
        finish: Finish,
        queue: str,
        written: Written,
        size: int = 0,
        *,
        frees_slot: bool = False,
    ) -> None:
        """Queue one outcome; ``written`` is told how it ended (see Written), from the
        flush that writes it. ``size``: about how many bytes its result and error take
        (see BATCH_MAX_BYTES). ``frees_slot``: its slot is given back once it is
        written (its handler has returned), so a refill may claim a job for that slot.
        The executor posts and its job's task ends there (DECISIONS 102): no future
        and no second step of the task per job."""
        self._pending.append((finish, queue, written, frees_slot))
        self._sizes.append(size)
        self._wake.set()

    async def submit(
        self, finish: Finish, queue: str, size: int = 0, *, frees_slot: bool = False
    ) -> bool:
        """:meth:`post`, awaited: True once written, False if the fence refused it; the
        error of an outcome that cannot be written is raised here."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def written(ok: bool, error: BaseException | None) -> None:
            if fut.done():
                return  # its awaiter was cancelled
            if error is None:
                fut.set_result(ok)
            else:
                fut.set_exception(error)

        self.post(finish, queue, written, size, frees_slot=frees_slot)
        return await fut

    async def refills_settled(self) -> None:
        """Until no flush that carries a claim is in flight (the worker's shutdown waits
        for it after stopping the producer, so no job it claimed starts unseen)."""
        await self._refills_done.wait()

    def stop(self) -> None:
        """Finish what is pending, then return from run()."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for task in [t for t in self._flushing if t.done()]:
                self._flushing.discard(task)
                task.result()
            while self._pending:
                if len(self._flushing) >= self._in_flight:
                    await self._reap()
                    continue
                batch = self._next_batch()
                task = asyncio.create_task(self._flush(batch))
                task.add_done_callback(lambda _t: self._wake.set())  # reaped above
                self._flushing.add(task)
            if self._stopping and not self._pending:
                while self._flushing:
                    await self._reap()
                if not self._pending:
                    return

    def _next_batch(self) -> list[Pending]:
        """Up to batch_max outcomes and batch_max_bytes (always at least one)."""
        batch = [self._pending.popleft()]
        total = self._sizes.popleft()
        while self._pending and len(batch) < self._batch_max:
            if total + self._sizes[0] > self._batch_max_bytes:
                break
            total += self._sizes.popleft()
            batch.append(self._pending.popleft())
        return batch

    async def _reap(self) -> None:
        """Wait for a flush to end. ``_flush`` handles every error of its rows, so
        one that raised anyway is a bug, and takes the worker down."""
        done, _ = await asyncio.wait(self._flushing, return_when=asyncio.FIRST_COMPLETED)
        self._flushing -= done
        for task in done:
            task.result()

    async def _flush(self, batch: list[Pending]) -> None:
        with tracing.span(
            "deadman complete", {"messaging.batch.message_count": len(batch)}
        ) as span:
            done = await self._flush_rows(batch)
            span.set_attribute("deadman.complete.written", len(done))

    async def _flush_rows(self, batch: list[Pending]) -> set[int]:
        """Write the batch (with a refill claim, when the producer asks for one),
        settle each submitter, then start what was claimed; the ids written."""
        freed = sum(1 for item in batch if item[3])
        claim = self.refill(freed) if self.refill is not None and freed else None
        if claim is None:
            return await self._write_settle(batch)
        self._refilling += 1
        self._refills_done.clear()
        try:
            sent = time.monotonic()
            try:
                done, jobs = await self._write_claim(batch, claim)
            except Exception as exc:
                # Transient, a row that cannot be written, or the claim itself failed:
                # nothing committed (see job_finish_claim for a lost COMMIT reply). The
                # outcomes are written the usual way; the producer claims their slots.
                log.warning("refill_failed", error=repr(exc)[:500], outcomes=len(batch))
            else:
                # The claimed jobs start first, then the outcomes' submitters are told
                # (and give their slots back): told first, the freed slots woke the
                # producer, whose look (nothing free once these start) then ran ahead
                # of every job this refill started (DECISIONS 102).
                try:
                    if self.on_claimed is not None:
                        self.on_claimed(claim, jobs, sent)
                finally:
                    self._settle(batch, done)
                return done
        finally:
            self._refilling -= 1
            if not self._refilling:
                self._refills_done.set()
        return await self._write_settle(batch)

    async def _write_claim(
        self, batch: list[Pending], claim: ClaimParams
    ) -> tuple[set[int], list[Job]]:
        attrs: dict[str, str | int] = {
            "messaging.system": "deadman",
            "messaging.operation.type": "receive",
            "messaging.destination.name": claim.queue,
            "deadman.claim.limit": claim.limit,
            "deadman.claim.refill": True,
        }
        with tracing.span("deadman claim", attrs) as span:
            done, jobs = await self._store.job_finish_claim([f for f, _, _, _ in batch], claim)
            span.set_attribute("messaging.batch.message_count", len(jobs))
        if jobs:
            metrics.JOBS_CLAIMED.labels(claim.queue).inc(len(jobs))
        return done, jobs

    async def _write_settle(self, batch: list[Pending]) -> set[int]:
        """Write the batch (row by row if it cannot be written whole), settle each
        submitter; the ids written."""
        try:
            done = await self._write([f for f, _, _, _ in batch])
        except Exception:
            # One bad row must not sink the others' outcomes: write them one by one.
            # (Exception, not DeadmanError: psycopg raises UnicodeEncodeError for a
            # lone surrogate before anything reaches the server.)
            done = set()
            writable = []
            for item in batch:
                try:
                    done |= await self._write([item[0]])
                except Exception as exc:
                    log.error(
                        "completion_not_written",
                        job_id=item[0].id,
                        lease_token=item[0].token,
                        queue=item[1],
                        worker=self._worker_id,
                        error=repr(exc)[:500],  # an encoding error quotes the whole row
                    )
                    self._tell(item, False, exc)
                else:
                    writable.append(item)
            batch = writable
        self._settle(batch, done)
        return done

    async def _write(self, finishes: list[Finish]) -> set[int]:
        while True:
            try:
                return await self._store.job_finish_many(finishes)
            except DatabaseUnavailable as exc:
                # The store already retried for a while. Keep trying: if our leases
                # lapse meanwhile, the rescuer hands the jobs on and these writes are
                # refused by the fence when they finally land, which is correct.
                log.warning("completer_db_unavailable", error=str(exc), pending=len(finishes))
                await asyncio.sleep(1.0)

    def _settle(self, batch: list[Pending], done: set[int]) -> None:
        self.flushes += 1
        refused: list[tuple[int, int]] = []
        finished: Counter[tuple[str, AttemptOutcome]] = Counter()
        requeued = False  # an outcome written put its job back in line
        for item in batch:
            finish, queue = item[0], item[1]
            ok = finish.id in done
            if ok:
                finished[queue, finish.outcome] += 1  # .value once per batch, below
                requeued = requeued or finish.state in _REQUEUED
            else:
                refused.append((finish.id, finish.token))
                metrics.STALE_WRITES_REFUSED.labels("finish").inc()
                log.warning(
                    "stale_write_refused",
                    job_id=finish.id,
                    queue=queue,
                    lease_token=finish.token,
                    action="finish",
                    outcome=finish.outcome.value,
                    worker=self._worker_id,
                )
            self._tell(item, ok, None)
        for (queue, outcome), n in finished.items():  # one metric update per batch
            metrics.JOBS_FINISHED.labels(queue, outcome.value).inc(n)
        if requeued and self.on_requeue is not None:
            self.on_requeue()
        if refused:
            task = asyncio.create_task(self._record(refused))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _tell(self, item: Pending, ok: bool, error: BaseException | None) -> None:
        """Tell an outcome's submitter how it ended. Its callback failing is a bug on
        its side, logged; it must not end this flush and with it every outcome behind
        (the completer is the worker's only way to record them)."""
        try:
            item[2](ok, error)
        except Exception as exc:
            log.error("written_callback_failed", job_id=item[0].id, error=repr(exc)[:500])

    async def _record(self, refused: list[tuple[int, int]]) -> None:
        try:
            await self._store.lease_refusal_record(self._worker_id, "finish", refused)
        except Exception as exc:  # evidence is best effort; the fence already held
            log.warning("refusal_not_recorded", count=len(refused), error=repr(exc))
