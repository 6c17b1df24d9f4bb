"""Runs one claimed job: the handler, its timeout, and how its attempt is recorded.

async handlers run on the event loop; sync handlers in a thread pool. When the
handler ends, the outcome goes to the completer (batched), unless the handler
already completed the job inside ``ctx.transaction()``.

Whatever a handler does ends its own attempt and nothing else: an exception of any
kind (``SystemExit`` and ``KeyboardInterrupt`` included: raised in a task they would
stop the event loop), a result that is not JSON or that Postgres cannot store (a
lone surrogate, NUL, NaN, nested deeper than the payload limit allows, bigger than
``DEADMAN_MAX_PAYLOAD_BYTES``), or a coroutine returned instead of a result. Each
fails the attempt with an error that says so.

An attempt the worker abandoned (its lease lost or no longer trusted) writes
nothing, however the handler ends: a success would be a lie (a cooperative handler
returns early, with a partial result), and a failure would spend one of the job's
attempts on our connectivity. The lease lapses and the rescuer hands the job on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from deadman import logs, metrics, tracing
from deadman.errors import LeaseLost
from deadman.model import AttemptOutcome, Job, JobState
from deadman.registry import HandlerSpec, Registry
from deadman.store import AsyncConn, Finish, SyncStore
from deadman.worker.completer import Completer
from deadman.worker.context import JobContext
from deadman.worker.inflight import Abort, Held, Inflight
from deadman.worker.joblog import JobLog
from deadman.worker.outcome import (
    checked_result,
    close_awaitable,
    describe,
    failure,
    safe_repr,
    safe_str,
)
from deadman.worker.slots import Slots
from deadman.worker.threads import HandlerThreads
from deadman.worker.worker_store import WorkerStore

__all__ = ["Executor", "HandlerExited", "Slots"]

log = logs.get("deadman.executor")


class HandlerExited(Exception):
    """A handler raised a BaseException that is not a cancellation (SystemExit,
    KeyboardInterrupt, GeneratorExit...): its attempt fails like any other; the
    original is chained as the cause, so the recorded traceback shows it."""


class Executor:
    def __init__(
        self,
        *,
        registry: Registry,
        store: WorkerStore,
        handler_pool: AsyncConnectionPool[AsyncConn],
        sync_store: SyncStore,
        sync_pool: Callable[[], ConnectionPool[Any]],
        completer: Completer,
        inflight: Inflight,
        slots: Slots,
        worker_id: str,
        trust_s: float,
        threads: HandlerThreads,
        max_result_bytes: int = 1024 * 1024,
    ) -> None:
        self._registry = registry
        self._store = store
        self._handler_pool = handler_pool  # async handlers' ctx.transaction()
        self._sync_store = sync_store
        self._sync_pool = sync_pool
        self._completer = completer
        self._inflight = inflight
        self._slots = slots
        self._worker_id = worker_id
        self._trust_s = trust_s
        self._threads = threads
        self._max_result_bytes = max_result_bytes
        self.tasks: set[asyncio.Task[None]] = set()
        self._debug = log.is_enabled_for(logging.DEBUG)

    def start(self, job: Job, claimed_at: float) -> None:
        """Take a slot and run the job in its own task. ``claimed_at``: monotonic time
        the claim was *sent*, so the trust window can only err on the early side."""
        ctx = JobContext(
            job,
            worker_id=self._worker_id,
            store=self._store,
            pool=self._handler_pool,
            sync_store=self._sync_store,
            sync_pool=self._sync_pool,
            trusted_until=claimed_at + self._trust_s,
            max_result_bytes=self._max_result_bytes,
        )
        spec = self._registry.get(job.type)
        held = Held(job=job, ctx=ctx, is_async=spec.is_async if spec else True)
        if self._inflight.get(job.id) is not None:
            # We claimed a job we still hold: our old lease lapsed and the job was
            # handed on (to us). The old attempt is no longer ours; without this its
            # entry would be overwritten, and nothing would ever tell its handler.
            log.warning("job_reclaimed_while_held", job_id=job.id, worker=self._worker_id)
            self.abort(job.id, Abort.LEASE_LOST)
        self._slots.take()
        self._inflight.add(held)
        # No task name (``job-<id>`` was 3 % of the worker's CPU at the best setting:
        # DECISIONS 69); the held job is reachable from the task's coroutine.
        task = asyncio.create_task(self._run(held, spec))
        held.task = task
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._done, held))
        if job.heartbeat_timeout_ms:
            watch = asyncio.create_task(self._watch_heartbeat(held), name=f"watch-{job.id}")
            task.add_done_callback(lambda _t: watch.cancel())

    def cancel_requested(self, job_id: int) -> None:
        """A deadman_cancel notification: abort the handler if we hold the job."""
        held = self._inflight.get(job_id)
        if held is not None and not held.ctx.cancel_requested:
            log.info("job_cancel_requested", job_id=job_id, worker=self._worker_id, via="notify")
            self.abort(job_id, Abort.CANCEL)

    async def _watch_heartbeat(self, held: Held) -> None:
        """Treat a handler as hung once it has not called ctx.heartbeat() for
        heartbeat_timeout_ms (the attempt's start counts as the first beat). Kept in
        this process's memory: if the process itself dies, the lease lapses anyway."""
        assert held.job.heartbeat_timeout_ms
        limit = held.job.heartbeat_timeout_ms / 1000
        while True:
            idle = time.monotonic() - held.ctx.last_heartbeat
            if idle >= limit:
                log.warning(
                    "job_hung",
                    job_id=held.job.id,
                    heartbeat_timeout_ms=held.job.heartbeat_timeout_ms,
                    worker=self._worker_id,
                )
                self.abort(held.job.id, Abort.HUNG)
                return
            await asyncio.sleep(limit - idle)

    def _give_slot(self, held: Held) -> None:
        """Give back the slot once; for a sync handler not before its thread returned
        (a thread that ignores ctx.cancelled keeps a pool thread busy, and the slot
        says so: the producer does not claim work that no thread could run)."""
        if held.slot_released:
            return
        if held.thread is not None and not held.thread.done():
            held.thread.add_done_callback(lambda _f: self._give_slot(held))
            return
        held.slot_released = True
        self._slots.give()

    def _abandon_thread(self, held: Held, bound: Any) -> None:
        """We stopped waiting for a sync handler's thread (timeout, cancel, hung). When
        it returns, look at what it did: a fenced write it attempted late was refused
        (LeaseLost), and that refusal is recorded as evidence, like any other."""
        fut = held.thread
        if fut is None or fut.done():
            return

        def returned(f: asyncio.Future[Any]) -> None:
            exc = None if f.cancelled() else f.exception()
            if isinstance(exc, LeaseLost):
                metrics.STALE_WRITES_REFUSED.labels("transaction").inc()
                bound.warning("stale_write_refused", action="transaction", late=True)
                self._evidence(held.ctx, "transaction")
            else:
                error = None if exc is None else safe_repr(exc)
                bound.info("abandoned_handler_returned", error=error)

        fut.add_done_callback(returned)

    def _done(self, held: Held, task: asyncio.Task[None]) -> None:
        """The job's task ended. A task cancelled before its first step never runs
        _run's finally blocks; without this the slot and the in-flight entry would
        leak, and the heartbeat would renew an orphaned lease forever."""
        self.tasks.discard(task)
        if not held.finishing:  # posted: _written gives the slot back once written
            self._release(held)

    def _release(self, held: Held) -> None:
        """Give back the slot (once) and forget the job. Idempotent."""
        self._give_slot(held)
        if self._inflight.get(held.job.id) is held:
            self._inflight.remove(held.job.id)

    def abort(self, job_id: int, reason: Abort) -> None:
        """Stop a handler. Sync handlers cannot be interrupted: they see ctx.cancelled."""
        held = self._inflight.get(job_id)
        if held is None or held.finishing:
            return
        if held.abort is None:
            held.abort = reason
        if reason is Abort.LEASE_LOST:
            held.ctx.mark_lease_lost()
            # Evidence, as for a refused write: a worker that wakes late (paused,
            # partitioned) usually stands down on its own before it writes at all.
            self._evidence(held.ctx, "abandoned")
            if not held.is_async:
                # A thread cannot be stopped, so keep waiting for it: whatever it then
                # writes is refused by the fence, and the refusal is recorded. Its slot
                # stays taken, which is the truth: the thread is still busy.
                return
        else:
            held.ctx.request_cancel()
        # A task cancelled before its first step would never run _run at all, so
        # nothing would record the attempt (and its lease would just lapse). Not
        # started yet: _invoke sees held.abort as it begins.
        if held.started and held.task is not None and not held.task.done():
            held.task.cancel()

    async def _run(self, held: Held, spec: HandlerSpec | None) -> None:
        job, ctx = held.job, held.ctx
        bound = JobLog(self._debug, job, ctx.lease_token, self._worker_id)
        metrics.START_LATENCY.observe(max(0.0, time.time() - job.run_at.timestamp()))
        started = time.monotonic()
        finish: Finish | None = None
        try:
            # in the attempt's span while a tracer provider records (deadman.tracing)
            traced = tracing.recording()
            run = self._invoke(held, spec, bound, traced)
            finish = await (tracing.attempt(job, ctx, run) if traced else run)
        finally:
            metrics.RUN_TIME.observe(time.monotonic() - started)
        if finish is None:
            self._release(held)
            return
        # The slot stays taken until the outcome is written (_written releases it): if
        # slots freed when handlers returned, a slow database would let unwritten
        # outcomes pile up behind the completer while the producer claimed more and
        # more; the heartbeat then renews thousands of leases, waits on the completer's
        # row locks and lets leases lapse (measured: 7,000 of 20,000 jobs ran twice).
        # The task ends here: the completer tells _written (DECISIONS 102).
        self._post(held, finish, bound, retry=True)

    def _post(self, held: Held, finish: Finish, bound: JobLog, *, retry: bool) -> None:
        """Hand the outcome to the completer; ``retry``: a success it cannot write is
        failed instead (once)."""
        if retry:
            size = held.result_bytes + len(finish.error or "")
            frees = held.thread is None or held.thread.done()  # see _give_slot
        else:
            size, frees = 0, False
        written = functools.partial(self._written, held, finish, bound, retry)
        self._completer.post(finish, held.job.queue, written, size, frees_slot=frees)
        # set once posted: from here on the outcome's own fenced result decides (abort
        # leaves the job alone), and _written, not the task's end, gives the slot back
        held.finishing = True

    def _written(
        self,
        held: Held,
        finish: Finish,
        bound: JobLog,
        retry: bool,
        ok: bool,
        error: BaseException | None,
    ) -> None:
        """The completer wrote the outcome, the fence refused it, or it could not be
        written (``error``). Runs in the completer's flush: never raises."""
        if error is None:
            if ok:
                # debug: at thousands of jobs/s an info line per job is a fifth of the
                # worker's CPU; metrics count outcomes, warnings log the exceptions
                bound.debug("job_finished", state=finish.state.value, outcome=finish.outcome.value)
            else:
                bound.warning("job_outcome_refused", outcome=finish.outcome.value)
            self._release(held)
            return
        # Not writable (not transient). A success whose result slipped past
        # checked_result is failed instead; anything else is left to lapse, and the
        # rescuer hands the job on, up to max_rescues.
        why = safe_str(error)[:500]  # an encoding error quotes the whole row
        bound.error("job_outcome_not_written", error=why)
        if not retry or finish.state is not JobState.SUCCEEDED:
            self._release(held)
            return
        failed = failure(
            held.job,
            held.ctx.lease_token,
            f"handler result cannot be stored: {why}",
            AttemptOutcome.FAILED,
        )
        try:
            self._post(held, failed, bound, retry=False)
        except Exception as exc:  # a bug: the lease lapses, the rescuer hands it on
            bound.error("job_outcome_not_written", error=safe_str(exc)[:500])
            self._release(held)

    async def _invoke(
        self, held: Held, spec: HandlerSpec | None, bound: Any, traced: bool
    ) -> Finish | None:
        """Run the handler; return the outcome to write, or None when there is nothing
        to write (completed in its transaction, or the lease is gone). ``traced``: it
        runs in the attempt's span, which a sync handler's thread then carries."""
        job, ctx = held.job, held.ctx
        timeout = job.timeout_ms / 1000 if job.timeout_ms else None
        held.started = True
        try:
            if held.abort is not None:
                raise asyncio.CancelledError()  # aborted before it began (see abort)
            if spec is None:
                raise LookupError(f"no handler registered for job type {job.type!r}")
            bound.debug("job_started")
            if spec.is_async and timeout is None:
                # Awaited here, not through wait_for, and guarded inline, not through
                # _guarded: one coroutine less a job (DECISIONS 102).
                try:
                    result = await spec.fn(job, ctx)
                except (Exception, asyncio.CancelledError):
                    raise
                except BaseException as exc:
                    raise HandlerExited(_exited(exc)) from exc
            elif spec.is_async:
                # _guarded: wait_for runs the coroutine in a task of its own, and a
                # SystemExit escaping a task stops the event loop.
                result = await asyncio.wait_for(_guarded(spec.fn(job, ctx)), timeout)
            else:
                fn = tracing.carried(spec.fn) if traced else spec.fn
                fut = self._threads.submit(fn, job, ctx)
                held.thread = fut
                # A thread cannot be interrupted: on timeout or cancel we stop waiting
                # and tell it through ctx.cancelled; whatever it writes later is
                # refused by the fencing token once the attempt is recorded.
                result = await asyncio.wait_for(_guarded(asyncio.shield(fut)), timeout)
        except TimeoutError:
            if held.abort is Abort.LEASE_LOST:
                self._abandoned(held, bound)
                return None
            ctx.request_cancel()
            self._abandon_thread(held, bound)
            bound.warning("job_timed_out", timeout_ms=job.timeout_ms)
            return failure(
                job,
                ctx.lease_token,
                f"timed out after {job.timeout_ms} ms",
                AttemptOutcome.TIMED_OUT,
            )
        except asyncio.CancelledError as exc:
            reason = held.abort
            if reason is None:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # not ours: the loop itself is going down
                # Nobody cancelled this task: the handler raised it (a library's leaked
                # cancellation; its thread, if any, has returned), an error of the
                # attempt like any other. Re-raised, it would end the task with nothing
                # written, and the job would wait for a rescue, run after run.
                return failure(job, ctx.lease_token, describe(exc), AttemptOutcome.FAILED)
            self._abandon_thread(held, bound)
            if reason is Abort.LEASE_LOST:
                bound.warning("job_abandoned_lease_lost")
                return None
            if reason is Abort.HUNG:
                return failure(
                    job,
                    ctx.lease_token,
                    f"no heartbeat for {job.heartbeat_timeout_ms} ms: treated as hung",
                    AttemptOutcome.TIMED_OUT,
                )
            if reason is Abort.CANCEL:
                return Finish(
                    job.id,
                    ctx.lease_token,
                    JobState.CANCELLED,
                    AttemptOutcome.CANCELLED,
                    error="cancelled on request",
                )
            return Finish(
                job.id, ctx.lease_token, JobState.QUEUED, AttemptOutcome.RELEASED, error=None
            )
        except Exception as exc:
            if isinstance(exc, LeaseLost) and ctx.lease_lost:
                # The fenced completion inside ctx.transaction() was refused (it marks
                # the lease lost before raising); the handler's effects rolled back
                # with it. Record the evidence, write nothing else. A LeaseLost the
                # handler raised while its lease stood is its error like any other.
                metrics.STALE_WRITES_REFUSED.labels("transaction").inc()
                bound.warning("stale_write_refused", action="transaction")
                await self._record_refusal(ctx, "transaction")
                return None
            if ctx.completed_in_transaction:
                bound.warning("handler_raised_after_commit", error=safe_repr(exc))
                return None
            if held.abort is Abort.LEASE_LOST:
                # Not a refusal by the fence (that is LeaseLost, above): say what it was.
                self._abandoned(held, bound, error=safe_repr(exc))
                return None
            # Even when we suspect the lease is gone, report: the fence decides.
            return failure(job, ctx.lease_token, describe(exc), AttemptOutcome.FAILED)
        if ctx.completed_in_transaction:
            metrics.JOBS_FINISHED.labels(job.queue, "succeeded").inc()
            bound.debug("job_finished", state="succeeded", outcome="succeeded", in_tx=True)
            return None
        if held.abort is Abort.LEASE_LOST:
            # A sync handler that saw ctx.cancelled and returned early (or an async one
            # that swallowed its cancellation): what it returns is not a success.
            self._abandoned(held, bound, result)
            return None
        stored, held.result_bytes, problem = checked_result(result, self._max_result_bytes)
        if problem is not None:
            return failure(job, ctx.lease_token, problem, AttemptOutcome.FAILED)
        return Finish(
            job.id, ctx.lease_token, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED, result=stored
        )

    def _abandoned(
        self, held: Held, bound: Any, result: Any = None, error: str | None = None
    ) -> None:
        """The handler ended after we gave its lease up: write nothing (see the module
        docstring); the lease lapses and the rescuer hands the job on. ``error``: what
        it raised, if it raised (a commit cut off by the server, say)."""
        close_awaitable(result)
        bound.warning("job_abandoned_lease_lost", handler_returned=True, error=error)

    def _evidence(self, ctx: JobContext, action: str) -> None:
        """Record a refused or given-up write, in a task of its own (best effort)."""
        task = asyncio.create_task(self._record_refusal(ctx, action))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _record_refusal(self, ctx: JobContext, action: str) -> None:
        try:
            await self._store.lease_refusal_record(
                self._worker_id, action, [(ctx.job_id, ctx.lease_token)]
            )
        except Exception as exc:  # evidence is best effort; the fence already held
            log.warning("refusal_not_recorded", error=repr(exc))


async def _guarded(aw: Any) -> Any:
    """Await a handler; a BaseException that is not a cancellation becomes an
    ordinary exception (HandlerExited), so it fails the attempt instead of stopping
    the worker's event loop."""
    try:
        return await aw
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise HandlerExited(_exited(exc)) from exc


def _exited(exc: BaseException) -> str:
    return f"the handler raised {type(exc).__name__}"
