"""Keeps the worker's leases alive: one statement per interval renews all of them.

After each beat, a lease the database did not renew is lost (someone else holds
the job now): the handler is told and, if it is async, cancelled. A lease whose
renewal could not be confirmed in time (database unreachable, process paused) stops
being trusted at ``TTL - margin`` after the last confirmed renewal, measured on
this process's monotonic clock; the database's clock stays the authority.

Trust is checked on a timer of its own, not only after a beat: a renewal that
keeps failing is retried for a while, and one that blocks (on a row lock, a stalled
server) does not return at all, and either way the check must still happen before
the lease lapses. A lease given up is not renewed again, even when connectivity
comes back while a sync handler's thread runs on: the lease lapses, the rescuer
hands the job on, and whatever the thread writes late is refused by the fence.
Nothing a beat meets ends the heartbeat: an unexpected error is logged and the
next beat tried (trust keeps being checked meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

from deadman import logs, metrics
from deadman.errors import DatabaseUnavailable
from deadman.store import HeartbeatParams
from deadman.worker.inflight import Abort
from deadman.worker.joblog import job_fields
from deadman.worker.parts import WorkerLoop, WorkerParts

log = logs.get("deadman.heartbeat")


class Heartbeat(WorkerLoop):
    def __init__(self, parts: WorkerParts) -> None:
        super().__init__(parts)
        self._stop = asyncio.Event()
        self.beats = 0

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        watch = asyncio.create_task(self._watch_trust(), name="trust-watch")
        try:
            while not self._stop.is_set():
                try:
                    await self.beat()
                except Exception as exc:  # a bug or a refusal we did not foresee
                    log.error("heartbeat_error", error=repr(exc)[:500])
                    self.check_trust()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._settings.heartbeat_s)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _watch_trust(self) -> None:
        """check_trust() every half margin: a lease stops being trusted at TTL - margin
        after its last confirmed renewal, so this acts at least margin/2 before it
        lapses, whatever the beat is stuck on."""
        every = max(self._settings.lease_margin_s / 2, 0.01)
        while True:
            await asyncio.sleep(every)
            self.check_trust()

    async def beat(self) -> None:
        # Leases already given up are not renewed (see the module docstring).
        held = [h for h in self._inflight.all() if not h.ctx.lease_lost]
        leases = [(h.job.id, h.token) for h in held]
        sent = time.monotonic()
        try:
            renewed = await self._store.job_heartbeat_many(
                HeartbeatParams(
                    worker=self._worker_id,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    queues=self._queues,
                    concurrency=self._settings.concurrency,
                    ttl_ms=int(self._settings.lease_ttl_s * 1000),
                    leases=leases,
                ),
                retry_s=self._settings.heartbeat_s,
            )
        except DatabaseUnavailable as exc:
            log.warning("heartbeat_failed", error=str(exc), leases=len(leases))
            self.check_trust()
            return
        self.beats += 1
        trusted_until = sent + self._settings.lease_ttl_s - self._settings.lease_margin_s
        lost: list[tuple[int, int]] = []
        for h in held:
            if h.job.id in renewed:
                h.ctx.renew_trust(trusted_until)
                if renewed[h.job.id] and not h.ctx.cancel_requested:
                    log.info("job_cancel_requested", **job_fields(h.job, h.token, self._worker_id))
                    self._executor.abort(h.job.id, Abort.CANCEL)
            elif not (h.finishing or h.ctx.finishing) and self._inflight.get(h.job.id) is h:
                lost.append((h.job.id, h.token))
                metrics.LEASES_LOST.inc()
                log.warning("lease_lost", **job_fields(h.job, h.token, self._worker_id))
                self._executor.abort(h.job.id, Abort.LEASE_LOST)
        if lost:
            metrics.STALE_WRITES_REFUSED.labels("heartbeat").inc(len(lost))
            try:
                await self._store.lease_refusal_record(self._worker_id, "heartbeat", lost)
            except DatabaseUnavailable:
                log.warning("refusal_not_recorded", count=len(lost))
        self.check_trust()

    def check_trust(self) -> None:
        """Abandon leases we can no longer vouch for (no renewal confirmed in time)."""
        now = time.monotonic()
        for h in self._inflight.all():
            if (
                not (h.finishing or h.ctx.finishing)
                and not h.ctx.lease_lost
                and h.ctx.trust_expired(now)
            ):
                metrics.LEASES_LOST.inc()
                log.warning("lease_untrusted", **job_fields(h.job, h.token, self._worker_id))
                self._executor.abort(h.job.id, Abort.LEASE_LOST)
