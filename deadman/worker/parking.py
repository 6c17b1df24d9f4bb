"""Handoffs at enqueue (DECISIONS 83, 86): an idle worker parks a few free slots in
``deadman.parked``; an enqueue that finds one inserts its job already running under
this worker's lease and sends the job on this worker's channel; we run it and close
the slot's row (``adopt``). No claim round trip, no claim commit, no read: the handler
starts about when the enqueue returns.

The slots are this worker's accounting as much as the table's: a parked slot is
taken from :class:`Slots` when it is parked, so no claim or refill uses it, and comes
back when it is unparked or when the job handed into it starts (which takes a slot
of its own). Every row is taken once, by whichever statement closes it: ``adopt``
(the notification) or ``unpark`` (before every claim round, and at stop). So a job
handed off is started once, whatever the channel carries (a payload is input: anyone
may NOTIFY), and one whose notification was lost is found by the next unpark.

Never trusted beyond its lease: an enqueue started the lease before we knew of it, so
the job is trusted from the adopting statement's send time only for what that
statement read was left of it, less the margin; a job with too little left is not
started (the lease lapses, and the rescuer hands it on).

Started from the notification (DECISIONS 86): the enqueue's notification carries the
job and the nonce we wrote into the slot's row when we parked it. With a nonce we
gave that slot and have not seen used, the job starts at once, and
``job_handoff_close`` closes the row behind it (without reading the job back). The lease then counts
from when we sent the park that wrote the nonce: the enqueue read the row after that
park committed, so its lease started later and ends later. A slot parked too long ago
for that to leave half the trust window, a nonce that is not one of ours, or a row we
cannot read: the notification is only an id, and the job is read first, as above. So
that an idle worker's slots stay fresh, the producer parks them again (an unpark, then
a park: new nonces) once they are that old (``stale``).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Coroutine
from typing import Any

from deadman import logs, metrics
from deadman.errors import DatabaseUnavailable
from deadman.model import JobState
from deadman.store.handoffs import Adopted, Park
from deadman.worker.handoff_note import Note, job_from_row, parse_note
from deadman.worker.parts import WorkerLoop, WorkerParts
from deadman.worker.slots import Slots

log = logs.get("deadman.parking")

CHANNEL_PREFIX = "deadman_handoff_"


def handoff_channel(worker_id: str) -> str:
    """The channel a worker hears its handoffs on: one of its own (no worker hears
    another's), a valid identifier of at most 63 bytes whatever the worker's id."""
    return CHANNEL_PREFIX + hashlib.blake2b(worker_id.encode(), digest_size=16).hexdigest()


class Parking(WorkerLoop):
    def __init__(self, parts: WorkerParts, slots: Slots) -> None:
        super().__init__(parts)
        s = parts.settings
        # Without LISTEN a handed job would wait for the next unpark: slower than a claim.
        self.target = s.handoff_slots if s.listen else 0
        self.channel = handoff_channel(self._worker_id)
        self._slots = slots
        self._ttl_ms = int(s.lease_ttl_s * 1000)
        self._ttl_s = s.lease_ttl_s
        self._margin_s = s.lease_margin_s
        self._trust_s = s.lease_ttl_s - s.lease_margin_s
        #: each parked slot and the nonce its park wrote; each nonce not yet used (its
        #: slot, and when that park was sent)
        self._parked: dict[int, int] = {}
        self._by_nonce: dict[int, tuple[int, float]] = {}
        #: slots whose job started from its notification while job_handoff_close (or
        #: an unpark) has yet to close the row: their numbers are not parked again before
        self._closing: set[int] = set()
        self._adopting: set[asyncio.Task[None]] = set()
        self.adopted = 0
        #: of those, started from their notification (DECISIONS 86)
        self.noted_starts = 0
        #: set when a handoff takes a parked slot (the producer parks another)
        self.taken = asyncio.Event()
        #: set while the listener hears our channel (process.py): a slot parked while
        #: it does not would get its job only at the next unpark
        self.listening: asyncio.Event | None = None
        #: the listener connected again while slots were parked: notifications may have
        #: been lost meanwhile, so the producer unparks (every handed job found)
        self.resync = False

    @property
    def parked(self) -> int:
        return len(self._parked)

    def heard(self) -> None:
        """The listener (re)connected and hears our channel."""
        if self._parked:
            self.resync = True

    @property
    def fresh_s(self) -> float:
        """How long a parked slot stays fresh: half the trust window (DECISIONS 86)."""
        return self._trust_s / 2

    def fresh_for(self) -> float:
        """Seconds until the oldest parked slot is too old for a job handed into it to
        start from its notification (0: it is already; inf: none parked)."""
        if not self._parked:
            return float("inf")
        oldest = min(self._by_nonce.get(n, (0, 0.0))[1] for n in self._parked.values())
        return max(0.0, oldest + self.fresh_s - time.monotonic())

    def stale(self) -> bool:
        """Some parked slot is too old for its job to start from its notification."""
        return self.fresh_for() <= 0

    def short(self) -> bool:
        """Fewer slots parked than wanted, and our channel is heard."""
        heard = self.listening is None or self.listening.is_set()
        return heard and len(self._parked) < self.target

    async def park(self) -> None:
        """Park free slots up to the target. A park whose outcome is unknown keeps its
        slots reserved: the next unpark takes back whatever rows exist."""
        n = min(self._slots.free(), self.target - len(self._parked))
        if n <= 0:
            return
        first = self._free_run(n)
        nonces = [secrets.randbits(63) for _ in range(n)]
        sent = time.monotonic()
        for slot, nonce in zip(range(first, first + n), nonces, strict=True):
            self._slots.take()
            self._parked[slot] = nonce
            self._by_nonce[nonce] = (slot, sent)
        park = Park(self._worker_id, self._queues, self.channel, self._ttl_ms, first, nonces)
        try:
            await self._store.worker_park(park)
        except DatabaseUnavailable as exc:
            log.warning("park_failed", error=str(exc), slots=n)

    def _free_run(self, n: int) -> int:
        """The lowest ``first`` such that slots ``first`` .. ``first + n - 1`` are none
        of them parked. A slot's number is used again once it is back (its row was
        closed: worker_park reopens it in place, DECISIONS 85), so the numbers stay
        below twice the target and the rows are the same few."""
        first = 0
        while any(s in self._parked or s in self._closing for s in range(first, first + n)):
            first += 1
        return first

    async def unpark(self) -> None:
        """Take every parked slot back and start the jobs handed into them."""
        if not self._parked:
            return
        try:
            rows = await self._store.job_unpark(self._worker_id)
            self.resync = False
        except DatabaseUnavailable as exc:
            # Still parked: claims use the other slots; the next unpark tries again.
            log.warning("unpark_failed", error=str(exc), slots=len(self._parked))
            return
        for u in rows:
            self._release(u.slot)
        # a row whose job already started from its notification, closed by this unpark
        # before job_adopt could: the job is not started again
        started = {u.slot for u in rows if u.slot in self._closing}
        self._closing -= started
        # A row we parked and did not get back was taken by an adoption under way (its
        # notification came first): it settles that slot. Once none is under way, a
        # slot still parked has no row at all (a park whose commit we never saw, a
        # row pruned or lost with a crash of Postgres) and comes back here.
        if self._parked and self._adopting:
            await asyncio.wait(set(self._adopting), timeout=5.0)
        for slot in list(self._parked):
            self._release(slot)
        if not self._adopting:
            self._closing.clear()  # each row is closed now, or gone
        handed = [u for u in rows if u.job_id is not None and u.slot not in started]
        if not handed:
            return
        sent = time.monotonic()
        try:
            adopted = await self._store.job_adopt_read(self._worker_id, handed)
        except DatabaseUnavailable as exc:
            # Their leases lapse and the rescuer hands them on.
            log.warning("adopt_failed", error=str(exc), jobs=len(handed))
            return
        for a in adopted:
            self._start(a, sent)

    def noted(self, payload: str) -> bool:
        """A notification on our channel: start the job it carries if we can trust it,
        else read the job it names (``job_adopt``). False: it names no job."""
        note = parse_note(payload)
        if note is None:
            return False
        if not self._start_noted(note):
            self.handed(note.job_id)
        return True

    def handed(self, job_id: int) -> None:
        """Adopt the job ``job_id``, if an enqueue handed it into one of our slots."""
        self._track(self._adopt(job_id))

    def _track(self, adoption: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(adoption)
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    def _start_noted(self, note: Note) -> bool:
        """Start the job a note carries, if it carries a nonce of a slot we parked (used
        up here, whatever follows) and we may still trust a lease that began after that
        park for half our trust window."""
        if note.nonce is None or note.row is None:
            return False
        found = self._by_nonce.pop(note.nonce, None)
        if found is None:  # not ours, or used: a slot's nonces go when it does
            return False
        slot, opened = found
        if opened + self.fresh_s < time.monotonic():
            return False  # parked long ago (stale): how much lease is left is read instead
        try:
            job = job_from_row(note.row)
        except Exception as exc:  # read from the table instead, which says why
            log.warning("handoff_note_unreadable", job_id=note.job_id, error=repr(exc)[:200])
            return False
        lease = job.lease
        if (job.id != note.job_id or job.state is not JobState.RUNNING or lease is None
                or lease.worker != self._worker_id):  # fmt: skip
            log.warning("handoff_note_mismatch", job_id=note.job_id, slot=slot)
            return False
        self._release(slot)
        self._closing.add(slot)
        self.adopted += 1
        self.noted_starts += 1
        metrics.JOBS_HANDED.labels(job.queue).inc()
        self._executor.start(job, opened)
        self._track(self._close(slot, job.id))
        return True

    async def _close(self, slot: int, job_id: int) -> None:
        """Close the row of a slot whose job started from its notification."""
        try:
            await self._store.job_handoff_close(self._worker_id, job_id)
        except DatabaseUnavailable as exc:
            # The row stays open: the next unpark closes it (and does not start it).
            log.warning("handoff_close_failed", error=str(exc), job_id=job_id)
            return
        self._closing.discard(slot)

    async def _adopt(self, job_id: int) -> None:
        sent = time.monotonic()
        try:
            slot, adopted = await self._store.job_adopt(self._worker_id, job_id)
        except DatabaseUnavailable as exc:
            # The row stays: the next unpark finds it (or its lease lapses first).
            log.warning("adopt_failed", error=str(exc), job_id=job_id)
            return
        if slot is not None:
            self._release(slot)
        if adopted is not None:
            self._start(adopted, sent)

    def _release(self, slot: int) -> None:
        """The slot is no longer parked: give it back (once)."""
        if slot in self._parked:
            self._by_nonce.pop(self._parked.pop(slot), None)
            self._slots.give()
            self.taken.set()

    def _start(self, a: Adopted, sent: float) -> None:
        # trusted until sent + what was left of the lease - the margin (Executor adds
        # the trust window, TTL - margin, to the time it is given)
        left_s = a.lease_left_ms / 1000
        if left_s <= self._margin_s:
            log.warning("handoff_too_late", job_id=a.job.id, lease_left_ms=a.lease_left_ms)
            return
        self.adopted += 1
        metrics.JOBS_HANDED.labels(a.job.queue).inc()
        self._executor.start(a.job, sent + left_s - self._ttl_s)

    async def settle(self) -> None:
        """At stop: the adoptions under way end, then every slot comes back."""
        if self._adopting:
            await asyncio.wait(set(self._adopting), timeout=5.0)
        await self.unpark()
