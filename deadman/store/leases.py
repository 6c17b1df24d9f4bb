"""The worker's lease lifecycle as parameters: claim, heartbeat, finish; each
parameter object stands above the function that turns it into its query's
placeholders, so a field added to one is seen missing from the other."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from deadman.db import jsoncodec
from deadman.db.queries import QUERIES
from deadman.errors import translate
from deadman.model import (
    AttemptOutcome,
    Job,
    JobState,
    check_transition,
    reader_for,
)
from deadman.store.async_base import AsyncBase
from deadman.store.conn import AsyncConn
from deadman.store.reads import _ms


@dataclass(frozen=True)
class ClaimParams:
    queue: str
    worker: str
    limit: int
    ttl_ms: int
    #: jobs rescued this many times are quarantined: claimed only alone
    quarantine_at: int = 5
    #: claim keyed jobs too (False: the completer's refill, see job_claim)
    keyed: bool = True


def claim_params(p: ClaimParams) -> dict[str, Any]:
    """job_claim's: every field, by its name (as limit_params)."""
    return asdict(p)


@dataclass(frozen=True)
class ClaimLeft:
    """What a claim that was not full left in its queue (job_claim_left)."""

    #: a due job a claim could take is left: claim again at once (another claimer's,
    #: still being taken, or one held back by its limit)
    more: bool
    #: milliseconds until the queue's next not-yet-due job falls due or a rate token
    #: frees for its keyed jobs; None if neither (a NOTIFY or the poll)
    wait_ms: float | None


def quarantine_claim_params(p: ClaimParams) -> dict[str, Any]:
    """job_claim_quarantined's: claim_params without the limit (it claims one) and
    the keyed switch (a quarantined job is never keyed)."""
    params = claim_params(p)
    del params["limit"], params["keyed"]
    return params


@dataclass(frozen=True, slots=True)
class Finish:
    """How one attempt ended, as the worker reports it (fenced by ``token``)."""

    id: int
    token: int
    state: JobState
    outcome: AttemptOutcome
    delay_ms: int = 0
    error: str | None = None
    result: Any = None

    def __post_init__(self) -> None:
        check_transition(JobState.RUNNING, self.state)


#: How long a handler's transaction may sit idle after its fenced completion before
#: the server ends it (see job_succeed_in): the COMMIT follows at once, so only a
#: paused or partitioned worker ever comes near it.
FINISH_IDLE_MS = 5000


def succeed_params(finish: Finish, idle_ms: int = FINISH_IDLE_MS) -> dict[str, Any]:
    """job_succeed_in's: one success, and ``idle_ms``, the idle limit of the caller's
    transaction that the statement arms."""
    if finish.state is not JobState.SUCCEEDED or finish.outcome is not AttemptOutcome.SUCCEEDED:
        raise ValueError(f"job_succeed_in writes successes only, not {finish.state.value}")
    return {
        "id": finish.id,
        "token": finish.token,
        # passed check_storable (no NaN or infinity): jsoncodec.dumps is exact
        "result": None if finish.result is None else jsoncodec.dumps(finish.result),
        "idle_ms": idle_ms,
    }


def finish_params(finishes: Sequence[Finish]) -> dict[str, Any]:
    """job_finish_many's: the batch as one JSON document (see the statement) and its
    ids, which let the planner go straight to the primary key."""
    batch = [
        {
            "id": f.id,
            "token": f.token,
            "state": f.state.value,
            "outcome": f.outcome.value,
            "delay_ms": f.delay_ms,
            "error": None if f.error is None else _storable(f.error),
            "result": f.result,
        }
        for f in finishes
    ]
    return {
        # results passed check_storable (no NaN or infinity): jsoncodec.dumps is exact
        "batch": jsoncodec.dumps(batch),
        "ids": bigint_array([f.id for f in finishes]),
    }


def bigint_array(ids: Sequence[int]) -> str:
    """``ids`` as a Postgres array literal, for a ``%(...)s::bigint[]`` parameter:
    psycopg adapts a list element by element in Python (~0.53 us an id; this string
    ~0.07), and a finish batch sends one id per job (DECISIONS 81). ``int`` only:
    its ``str`` is digits and a sign, nothing the literal would have to quote."""
    return "{" + ",".join(map(str, ids)) + "}"


def refill_params(finishes: Sequence[Finish], p: ClaimParams) -> dict[str, Any]:
    """job_finish_claim's: the batch (finish_params) and claim_params without the keyed
    switch (the refill claims unkeyed jobs only)."""
    params = claim_params(p)
    del params["keyed"]
    return finish_params(finishes) | params


def _storable(text: str) -> str:
    """An error message must never sink its batch: Postgres text cannot hold NUL, and
    a lone surrogate (from a badly decoded exception message) is not UTF-8."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class HeartbeatParams:
    worker: str
    hostname: str
    pid: int
    queues: Sequence[str]
    concurrency: int
    ttl_ms: int
    leases: Sequence[tuple[int, int]]  # (job id, lease token)


def heartbeat_params(p: HeartbeatParams) -> dict[str, Any]:
    return {
        "worker": p.worker,
        "hostname": p.hostname,
        "pid": p.pid,
        "queues": list(p.queues),
        "concurrency": p.concurrency,
        "ttl_ms": p.ttl_ms,
        "ids": [i for i, _ in p.leases],
        "tokens": [t for _, t in p.leases],
    }


class LeaseStore(AsyncBase):
    """The worker's statements: claim, heartbeat, finish, and what goes with them."""

    # -- the worker's path ---------------------------------------------------------

    async def job_claim(self, p: ClaimParams, retry_s: float | None = None) -> list[Job]:
        names, rows = await self._tuples("job_claim", claim_params(p), retry_s)
        return await self._readable(names, rows)

    async def job_claim_left(self, queue: str, quarantine_at: int) -> ClaimLeft:
        """After a claim that was not full: claim again at once, or sleep how long?"""
        rows = await self._all("job_claim_left", {"queue": queue, "quarantine_at": quarantine_at})
        return ClaimLeft(bool(rows[0]["more"]), _ms(rows[0]["wait"]))

    async def job_claim_quarantined(
        self, p: ClaimParams, retry_s: float | None = None
    ) -> list[Job]:
        """At most one quarantined job; only for a worker that holds nothing else."""
        names, rows = await self._tuples(
            "job_claim_quarantined", quarantine_claim_params(p), retry_s
        )
        return await self._readable(names, rows)

    async def _readable(self, names: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> list[Job]:
        """The claimed rows (tuples, columns ``names``) as jobs. A row this code cannot
        read (a backoff or payload written by hand, or by a newer version) ends dead
        at once, fenced by the token just taken, with the reason; its batch-mates are
        claimed as usual. Raising instead lost the whole batch's claim to the rescuer,
        a rescue counted against every job in it."""
        jobs: list[Job] = []
        broken: list[Finish] = []
        read = reader_for(names)
        for r in rows:
            try:
                jobs.append(read(r))
            except Exception as exc:
                error = f"the job row cannot be read by this worker: {exc!r}"[:2000]
                outcome = AttemptOutcome.FAILED
                broken.append(
                    Finish(
                        int(r[names.index("id")]),
                        int(r[names.index("lease_token")]),
                        JobState.DEAD,
                        outcome,
                        error=error,
                    )
                )
        if broken:
            await self.job_finish_many(broken)
        return jobs

    async def job_quarantine_pending(self, queues: Sequence[str], quarantine_at: int) -> bool:
        rows = await self._all(
            "job_quarantine_pending",
            {"queues": list(queues), "quarantine_at": quarantine_at},
        )
        return bool(rows and rows[0]["pending"])

    async def job_finish_many(self, finishes: Sequence[Finish]) -> set[int]:
        """End attempts; returns the ids that were still ours. Missing ids: lease lost."""
        if not finishes:
            return set()
        # Prepared: its generic plan goes through the primary key and is the fastest
        # at every batch size (DECISIONS.md 25).
        rows = await self._all("job_finish_many", finish_params(finishes))
        return {int(r["id"]) for r in rows}

    async def job_finish_claim(
        self, finishes: Sequence[Finish], claim: ClaimParams
    ) -> tuple[set[int], list[Job]]:
        """job_finish_many and job_claim's unkeyed claim as one statement
        (job_finish_claim): one round trip and one commit for a worker's write and its
        next claim (the completer's refill, DECISIONS 45 and 62). Its CTEs are the two
        statements' own. Not retried: the claim's send time starts its lease's trust
        window. If the connection fails before the reply, the caller cannot know
        whether it landed and writes the outcomes again; a write that had landed is
        then refused by the fence (reported as a lost lease) and the claimed jobs
        lapse to the rescuer, as a retried job_finish_many would."""
        if claim.keyed:
            raise ValueError("job_finish_claim claims unkeyed jobs only (ClaimParams.keyed)")
        names, rows = await self._tuples(
            "job_finish_claim", refill_params(finishes, claim), retry_s=0
        )
        at = names.index("finished")
        done = {int(r[at]) for r in rows if r[at] is not None}
        return done, await self._readable(names, [r for r in rows if r[at] is None])

    async def job_succeed_in(
        self, conn: AsyncConn, finish: Finish, idle_ms: int = FINISH_IDLE_MS
    ) -> bool:
        """The attempt's success on the caller's connection and inside its transaction
        (ctx.transaction()), which the server ends if it then sits idle for ``idle_ms``
        (the statement arms that limit). False: the fence refused it (the lease is
        gone), and nothing was written."""
        with translate():
            cur = await conn.execute(QUERIES["job_succeed_in"], succeed_params(finish, idle_ms))
            return cur.rowcount == 1

    async def job_heartbeat_many(
        self, p: HeartbeatParams, retry_s: float | None = None
    ) -> dict[int, bool]:
        """Renew leases; returns {job id: cancel requested} for the leases still ours."""
        rows = await self._all("job_heartbeat_many", heartbeat_params(p), retry_s)
        return {int(r["id"]): bool(r["cancel_requested"]) for r in rows}

    async def worker_deregister(self, worker: str) -> None:
        await self._all("worker_deregister", {"worker": worker})

    async def queue_notify(self, queues: Sequence[str]) -> None:
        if queues:
            await self._all("queue_notify", {"queues": sorted(set(queues))})

    async def lease_refusal_record(
        self, worker: str, action: str, leases: Sequence[tuple[int, int]]
    ) -> None:
        """Record refused writes; best effort (the refusal itself already protected us)."""
        if leases:
            await self._all(
                "lease_refusal_record",
                {
                    "ids": [i for i, _ in leases],
                    "tokens": [t for _, t in leases],
                    "workers": [worker] * len(leases),
                    "actions": [action] * len(leases),
                },
            )

    async def effect_insert(self, conn: AsyncConn, job_id: int, lease_token: int) -> None:
        with translate():
            await conn.execute(
                QUERIES["effect_insert"], {"job_id": job_id, "lease_token": lease_token}
            )
