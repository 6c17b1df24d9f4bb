"""The claim loop: never fetch more jobs than there are free slots.

Claiming more than we can start would hold leases on jobs that sit idle in our
memory while other workers starve (and a crash would strand them until their
leases lapse). So the producer claims ``free slots`` jobs per queue and starts them at
once. A short batch is not an empty queue (SKIP LOCKED may simply have stepped over
rows another worker is taking), so after a claim that was not full, once its jobs
have started, the producer asks what it left (job_claim_left, DECISIONS 66): a due
job it could take (then it claims again at once), or else how long until the
queue's next job falls due. Idle, it sleeps until a NOTIFY, a freed slot, the
queue's next scheduled job, or the poll interval, whichever comes first. The claim
stays as lean as it was: what it would add to it is paid before the jobs start.

Quarantine: a job rescued ``max_rescues`` times is a suspected poison pill. It is
only ever claimed by a worker that holds nothing else, and that worker claims
nothing more until it is done, so a crash blames the right job (see the rescue
query). When a quarantined job is waiting, a busy producer stops claiming until its
in-flight jobs drain (checked every ``QUARANTINE_CHECK_S``); a fleet under constant
load therefore pauses briefly for each suspect instead of starving it. An idle
producer only tries the quarantine claim when that check saw a suspect: asking on
every wake-up put one more round trip in front of every claim (measured in the
latency benchmark), and a suspect can wait a few seconds.

Under load most claims ride on the completer's writes (``refill``, DECISIONS 45): the
slots a batch of outcomes frees are claimed again in that batch's statement. The
producer decides them, as it decides its own claims (which queue, how many, and not
at all while it stops, drains for a suspect or has a quarantine check due), and
claims the rest itself: free slots, empty queues, wake-ups. A queue whose last claim
came back short gets no refill until a claim comes back full (DECISIONS 59): at low
load every refill came back empty and only delayed its write.

Handoffs (DECISIONS 83, :mod:`deadman.worker.parking`): idle, the producer parks a few
free slots, and keeps them topped up while it sleeps (a handed job's slot comes back
when it ends); an enqueue then hands its job straight to one, when nothing older is
due in its queue. A claim round claims with the other free slots; once a round leaves
work behind (or no other slot is free), every parked slot comes back to the claims
first (and the jobs handed into them start): with a backlog no enqueue hands off, so
a slot left parked would only sit idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from deadman import logs, metrics, tracing
from deadman.errors import DatabaseUnavailable
from deadman.model import Job
from deadman.store import ClaimParams, quarantine_at
from deadman.worker.parking import Parking
from deadman.worker.parts import WorkerLoop, WorkerParts
from deadman.worker.slots import Slots

log = logs.get("deadman.producer")

QUARANTINE_CHECK_S = 5.0
#: Least time between claims while they keep coming back empty. NOTIFY needs no
#: privilege, so anyone who can connect can wake every producer thousands of times a
#: second, and each wake-up was a claim and a next_run_at query then (measured: a
#: reader's NOTIFY flood cost an idle worker 27 % of a core; 821 claims in 1.7 s).
#: Steady traffic is not delayed: a claim that takes a job is not empty, so the
#: wake-up for the next job claims at once (the latency benchmark sends one every
#: 5 ms); only a second empty claim in a row makes the next one wait.
EMPTY_CLAIM_GAP_S = 0.01


class Producer(WorkerLoop):
    def __init__(self, parts: WorkerParts, slots: Slots) -> None:
        super().__init__(parts)
        settings = parts.settings
        self._slots = slots
        self.parking = Parking(parts, slots)
        self._quarantine_at = quarantine_at(settings.max_rescues)
        self._isolating: int | None = None  # id of the quarantined job we run alone
        # The last quarantine check saw a suspect waiting: while we hold jobs we drain
        # (claim nothing), and once we hold none we claim the suspect alone.
        self._suspects = False
        self._next_quarantine_check = 0.0
        self._claim_max = settings.claim_size  # half the slots: two cohorts out of phase
        self._ttl_ms = int(settings.lease_ttl_s * 1000)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._turn = 0
        self._last_empty = 0.0  # monotonic end of the last empty claim round
        self._empty_rounds = 0  # empty claim rounds in a row
        # Queues whose last claim (ours or a refill) came back short: nothing more was
        # waiting then, so a refill there would most likely come back empty too.
        self._drained: set[str] = set()
        #: the last claim round left work behind (a full claim, or a due job left)
        self._backlog = False
        self.claims = 0

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def refill(self, freed: int) -> ClaimParams | None:
        """The claim a completer flush that frees ``freed`` slots should carry: the
        next queue in turn, as many jobs as those slots (at most a claim's size); or
        None when this producer must look first (stopping, running or draining for a
        suspect, or its quarantine check is due: under steady load its own loop would
        otherwise never get a turn)."""
        if (
            freed <= 0
            or self._stop.is_set()
            or self._isolating is not None
            or self._suspects
            or time.monotonic() >= self._next_quarantine_check
        ):
            return None
        queue = self._next_undrained()
        if queue is None:
            return None
        # unkeyed jobs only: a key's freed slot goes to whichever worker claims first,
        # not always to the writer (job_claim)
        params = self._claim_params(queue, min(freed, self._claim_max), self._ttl_ms)
        return replace(params, keyed=False)

    def refilled(self, claim: ClaimParams, jobs: list[Job], sent: float) -> None:
        """Start the jobs a refill claimed (``sent``: when its statement was sent)."""
        self.claims += 1
        self._claimed(claim.queue, claim.limit, len(jobs))
        for job in jobs:
            self._executor.start(job, sent)

    def _next_undrained(self) -> str | None:
        """The next queue in turn whose last claim was not short; None if every one's
        was (the queues' own wake-ups claim what arrives next)."""
        n = len(self._queues)
        for _ in range(n):
            queue = self._queues[self._turn % n]
            self._turn += 1
            if queue not in self._drained:
                return queue
        return None

    def _claimed(self, queue: str, asked: int, got: int) -> None:
        if got < asked:
            self._drained.add(queue)
        else:
            self._drained.discard(queue)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            # every parked slot back, and the jobs handed into them started (the
            # worker's shutdown then runs or releases them with the rest)
            try:
                await self.parking.settle()
            except Exception as exc:  # their leases lapse; the rescuer hands them on
                log.error("unpark_error", error=repr(exc)[:500])

    async def _run(self) -> None:
        ttl_ms = self._ttl_ms
        while not self._stop.is_set():
            if self._isolating is not None and self._inflight.get(self._isolating) is None:
                self._isolating = None
            if self._isolating is not None or (self._suspects and len(self._inflight)):
                # running a suspect alone, or draining so that one can run alone:
                # no slot stays parked meanwhile
                await self.parking.unpark()
                await self._inflight.wait_removed(self._settings.poll_s)
                continue
            if self._slots.free() <= 0 and self.parking.parked:
                await self.parking.unpark()  # woken with every free slot parked
                if self.parking.parked:
                    # the unpark failed: no slot will come back by itself (a wait for
                    # one would outlast the outage), so try again soon
                    await self._sleep(min(self._settings.poll_s, 1.0))
                    continue
            if self._slots.free() <= 0:
                await self._wait_for_slot()
                continue
            gap = self._last_empty + EMPTY_CLAIM_GAP_S - time.monotonic()
            if self._empty_rounds >= 2 and gap > 0:  # wake-ups meanwhile fold into one
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), gap)
                continue
            self._wake.clear()
            try:
                if self._backlog or self.parking.resync:
                    # parked slots only wait for jobs that nothing is ahead of: with
                    # work waiting they come back to the claims; and after the listener
                    # reconnected, a job handed off meanwhile is found this way
                    await self.parking.unpark()
                await self._check_quarantine()
                if self._suspects:
                    # alone means alone: no slot parked for a handoff either
                    await self.parking.unpark()
                    if len(self._inflight):
                        continue  # drain first (the check at the top of the loop waits)
                    if await self._claim_quarantined(ttl_ms):
                        continue
                got, again, wait = await self._claim_round(ttl_ms)
                self._backlog = again
            except DatabaseUnavailable as exc:
                log.warning("claim_failed", error=str(exc))
                await self._sleep(min(self._settings.poll_s, 1.0))
                continue
            except Exception as exc:
                # Not the connection: a row we could not read (a job whose backoff
                # was written by hand, say). Its claim stands; the leases lapse and the
                # rescuer hands the jobs on, and a job that keeps failing this way is
                # quarantined and then claimed alone. The producer, and with it every
                # other job, carries on.
                log.error("claim_error", error=repr(exc)[:500])
                await self._sleep(min(self._settings.poll_s, 1.0))
                continue
            if got:
                self._empty_rounds = 0
            if again:
                continue
            if not got:
                self._empty_rounds += 1
                self._last_empty = time.monotonic()
            await self._idle(wait)

    async def _claim_quarantined(self, ttl_ms: int) -> bool:
        """Idle: take one quarantined job, if any, and run it alone. None left (another
        worker took it): back to normal claims until the next check says otherwise."""
        for queue in self._queues:
            sent = time.monotonic()
            with tracing.span("deadman claim", _claiming(queue, 1, quarantined=True)) as span:
                jobs = await self._store.job_claim_quarantined(
                    self._claim_params(queue, 1, ttl_ms), retry_s=0
                )
                span.set_attribute("messaging.batch.message_count", len(jobs))
            if jobs:
                job = jobs[0]
                log.warning(
                    "quarantined_job_claimed",
                    job_id=job.id,
                    rescues=job.rescues,
                    worker=self._worker_id,
                )
                metrics.JOBS_CLAIMED.labels(queue).inc()
                self._isolating = job.id
                self._executor.start(job, sent)
                return True
        self._suspects = False
        return False

    async def _check_quarantine(self) -> None:
        """Every few seconds, ask whether a suspect waits (busy: then drain)."""
        now = time.monotonic()
        if now < self._next_quarantine_check:
            return
        self._next_quarantine_check = now + QUARANTINE_CHECK_S
        self._suspects = await self._store.job_quarantine_pending(self._queues, self._quarantine_at)
        if self._suspects and len(self._inflight):
            log.info("draining_for_quarantined_job", held=len(self._inflight))

    def _claim_params(self, queue: str, limit: int, ttl_ms: int) -> ClaimParams:
        return ClaimParams(
            queue=queue,
            worker=self._worker_id,
            limit=limit,
            ttl_ms=ttl_ms,
            quarantine_at=self._quarantine_at,
        )

    async def _claim_round(self, ttl_ms: int) -> tuple[int, bool, float]:
        """One claim per queue, rotating the starting queue for fairness. Returns the
        jobs started, whether to claim again at once (a claim came back full, or
        short with a due job left; or the slots ran out first) and, if not, how long
        to sleep: until the soonest queue's next job falls due, at most the poll. An
        empty claim never means 'again' (a due job another claimer holds is theirs,
        or its holder wakes the queue when it lets go: DECISIONS 63)."""
        got = 0
        again = False
        wait = self._settings.poll_s
        n = len(self._queues)
        start = self._turn % n
        self._turn += 1
        for i in range(n):
            free = min(self._slots.free(), self._claim_max)
            if self._stop.is_set() or free <= 0:
                return got, True, 0.0  # the run loop stops, or waits for a slot
            queue = self._queues[(start + i) % n]
            sent = time.monotonic()
            # No retries inside the store: `sent` must be the send time of the claim
            # that succeeded (the trust window counts from it). The run loop backs
            # off and claims again on DatabaseUnavailable.
            with tracing.span("deadman claim", _claiming(queue, free)) as span:
                jobs = await self._store.job_claim(
                    self._claim_params(queue, free, ttl_ms), retry_s=0
                )
                span.set_attribute("messaging.batch.message_count", len(jobs))
            self.claims += 1
            self._claimed(queue, free, len(jobs))
            if jobs:
                metrics.JOBS_CLAIMED.labels(queue).inc(len(jobs))
            for job in jobs:
                self._executor.start(job, sent)
            got += len(jobs)
            if jobs:
                # Let the handlers take their first step before this loop builds and
                # sends its next statement: at 50 jobs/s that preparation kept a
                # claimed job from starting for 0.45 ms more (DECISIONS 67).
                await asyncio.sleep(0)
            if len(jobs) >= free:
                again = True
                continue
            # Not full; the jobs it took have started. Whatever this answers, the
            # claim that used to follow a short one is not sent when nothing is left.
            try:
                left = await self._store.job_claim_left(queue, self._quarantine_at)
            except DatabaseUnavailable:
                continue  # sleep the poll at most; a NOTIFY still wakes us
            if left.more and jobs:
                again = True
            elif left.wait_ms is not None:
                wait = min(wait, max(left.wait_ms / 1000, 0.0))
        return got, again, wait

    def _parking_on(self) -> bool:
        """Slots may stay parked: handoffs on, every queue's last claim came back short
        (with work waiting no enqueue hands off: under load, while the completer's
        refills keep claiming, the producer neither parks nor wakes per freed slot)."""
        return (
            self.parking.target > 0
            and not self._stop.is_set()
            and self._isolating is None
            and not self._suspects
            and self._drained.issuperset(self._queues)
        )

    async def _idle(self, seconds: float) -> None:
        """Sleep as :meth:`_sleep` does, after a claim round found nothing more; the
        while, keep slots parked for handoffs, parking each one that comes back."""
        if self.parking.resync:
            # an unpark the listener asked for has not happened yet (it failed): the
            # next round tries again within a second, whatever the poll
            seconds = min(seconds, 1.0)
        deadline = time.monotonic() + seconds
        while not self._wake.is_set():
            if not self._parking_on():
                await self._sleep(deadline - time.monotonic())
                return
            try:
                if self.parking.stale():
                    # parked too long ago for a handed job to start from its
                    # notification (DECISIONS 86): taken back, parked again below
                    await self.parking.unpark()
                if self.parking.short():
                    await self.parking.park()
            except Exception as exc:  # a bug: the next claim round unparks
                log.error("park_error", error=repr(exc)[:500])
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # Until the oldest parked slot goes stale, then park afresh. A park slower
            # than a slot stays fresh (a loaded database) leaves its slots stale at
            # once: they still take handoffs (each job read first, DECISIONS 86), and
            # parking again at once would only repeat the slow round trip, so wait as
            # long as a fresh park lasts. Ending the wait here ran an empty claim round
            # for each slow park (DECISIONS 96's addendum).
            fresh = self.parking.fresh_for()
            remaining = min(left, fresh if fresh > 0 else self.parking.fresh_s)
            # Also wake when parking can go on: short of the target, when a slot comes
            # back (a handed job's, once it ends); else when a handoff takes one.
            self.parking.taken.clear()
            more = self._slots.wait_given() if self.parking.short() else self.parking.taken.wait()
            # Woken, the time up, or the oldest parked slot gone stale first: the loop
            # ends on the first two and parks afresh on the third. Ending the wait on
            # the third too sent an empty claim round every trust / 2 (DECISIONS 96).
            await _first_of(more, self._wake.wait(), remaining)

    async def _sleep(self, seconds: float) -> None:
        if seconds <= 0 or self._wake.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _wait_for_slot(self) -> None:
        await _first_of(self._slots.wait_freed(), self._stop.wait())


async def _first_of(
    this: Awaitable[Any], other: Awaitable[Any], timeout: float | None = None
) -> bool:
    """Wait until ``this`` or ``other`` ends (or ``timeout`` seconds pass); whichever
    has not ended is cancelled. True if ``this`` ended."""
    first, second = asyncio.ensure_future(this), asyncio.ensure_future(other)
    try:
        done, _ = await asyncio.wait(
            {first, second}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        first.cancel()
        second.cancel()
    return first in done


def _claiming(queue: str, limit: int, *, quarantined: bool = False) -> dict[str, str | int]:
    """A claim span's attributes (deadman.tracing.span): the queue and how many jobs
    it asks for; ``messaging.batch.message_count`` is set to how many it got."""
    return {
        "messaging.system": "deadman",
        "messaging.operation.type": "receive",
        "messaging.destination.name": queue,
        "deadman.claim.limit": limit,
        "deadman.claim.quarantined": quarantined,
    }
