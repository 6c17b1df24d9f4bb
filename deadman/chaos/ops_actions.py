"""What the operator does, one action at a time, as a person with the API would: cancel
a job or a whole workflow, retry a job, replay dead letters in bulk, pause a queue and
resume it; each journalled with the database clock read around it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from deadman.chaos.http import ApiClient
from deadman.chaos.ops_config import PAUSABLE, PAUSE_P, QUEUES
from deadman.chaos.ops_journal import Clock, DbClock, Journal
from deadman.errors import DeadmanError
from deadman.store import AsyncStore

T = TypeVar("T")


@dataclass
class Actions:
    """The actions, drawing their choices from ``rng`` (the operator's, so that a seed
    replays the same sequence). The HTTP ones take the client to send on; the store
    calls are those of ``deadman dlq replay`` and of the workflow cancel."""

    store: AsyncStore
    journal: Journal
    clock: DbClock
    rng: random.Random
    _paused: dict[str, float] = field(default_factory=dict, init=False)  # queue -> resume at
    #: Jobs the bulk replays have requeued so far (the operator leans on them until one has).
    replayed: int = field(default=0, init=False)

    async def _send(self, client: ApiClient, verb: str, path: str) -> tuple[int, Any]:
        """POST, and count the answer ("<verb> <status>"): (status, parsed body)."""
        status, parsed = await client.answer("POST", path)
        self.journal.statuses[f"{verb} {status}"] += 1
        return status, parsed

    async def _on_job(
        self, client: ApiClient, verb: str, state: str
    ) -> tuple[int, Clock, int, Any] | None:
        """``POST /jobs/{id}/<verb>`` to a job listed in ``state``: (its id, the clock
        before, status, parsed body); None if there was none or the clock could not be
        read (nothing was sent)."""
        job_id = await self._pick(client, state)
        lo = await self.clock.now()
        if job_id is None or lo is None:
            return None
        return job_id, lo, *await self._send(client, verb, f"/jobs/{job_id}/{verb}")

    async def _pick(self, client: ApiClient, state: str) -> int | None:
        status, parsed = await client.answer("GET", f"/jobs?state={state}&limit=50")
        jobs = parsed.get("jobs", []) if status == 200 and isinstance(parsed, dict) else []
        return int(self.rng.choice(jobs)["id"]) if jobs else None

    async def cancel(self, client: ApiClient, state: str) -> None:
        """Cancel a job in ``state`` (``POST /jobs/{id}/cancel``)."""
        sent = await self._on_job(client, "cancel", state)
        if sent is None:
            return
        job_id, lo, status, parsed = sent
        if status not in (200, 202) or not isinstance(parsed, dict):
            return  # 404/409: nothing was cancelled; no answer: nothing was promised
        lease = parsed.get("lease") or {}
        token = lease.get("token") if status == 202 else None
        self.journal.add(
            "cancel",
            True,
            "http",
            lo,
            await self.clock.now(),
            job_id=job_id,
            queue=parsed.get("queue"),
            state=parsed.get("state"),
            token=None if token is None else int(token),
        )

    async def retry(self, client: ApiClient, state: str) -> None:
        """Retry a job in ``state`` (``POST /jobs/{id}/retry``)."""
        sent = await self._on_job(client, "retry", state)
        if sent is None:
            return
        job_id, lo, status, parsed = sent
        ok = status == 200 and isinstance(parsed, dict)
        # Journalled whatever the answer: one that never came may have committed, and
        # even a refusal then ends the window in which the job must not run again.
        self.journal.add(
            "retry",
            ok,
            "http",
            lo,
            await self.clock.now() if ok else None,
            job_id=job_id,
            state=parsed.get("state") if ok else None,
        )

    async def replay(self, after_s: float = 0.0, everything: bool = False) -> None:
        """A bulk replay of a queue's dead letters (of one type, sometimes), or of
        every dead letter (``deadman dlq replay --all``)."""
        queue = None if everything else self.rng.choice(QUEUES)
        kind = None if everything else self.rng.choice((None, None, "fail", "chaos-flaky"))
        await asyncio.sleep(after_s)  # e.g. once a prune's DELETE is under way
        done = await self._by_store(
            "replay", "bulk replay", lambda: self.store.job_retry_dead_many(kind, queue)
        )
        if done is None:
            return
        lo, ids, hi = done
        self.replayed += len(ids)
        for job_id in ids:
            self.journal.add("retry", True, "store-bulk", lo, hi, job_id=job_id, queue=queue)

    async def cancel_workflow(self, workflow_ids: list[int]) -> None:
        """Cancel one of these workflows (the store call of ``POST /workflows/{id}/
        cancel``, which says which nodes the cancel took and in which state)."""
        if not workflow_ids:
            return
        workflow_id = self.rng.choice(workflow_ids)
        done = await self._by_store(
            "workflow-cancel", "workflow cancel", lambda: self.store.workflow_cancel(workflow_id)
        )
        if done is None:
            return
        lo, rows, hi = done
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

    async def _by_store(
        self, verb: str, what: str, call: Callable[[], Awaitable[T]]
    ) -> tuple[Clock, T, Clock | None] | None:
        """A store call between two clock reads, counted ("<verb> ok" or "<verb>
        error"): (clock before, its result, clock after); None if the clock could not
        be read (nothing was called) or the call failed (its error noted as ``what``)."""
        lo = await self.clock.now()
        if lo is None:
            return None
        try:
            result = await call()
        except DeadmanError as exc:
            self.journal.statuses[f"{verb} error"] += 1
            self.journal.errors.append(f"{what}: {exc}")
            return None
        self.journal.statuses[f"{verb} ok"] += 1
        return lo, result, await self.clock.now()

    async def toggle_pauses(self, client: ApiClient) -> None:
        """Resume the pausable queues whose pause is over; pause some running ones."""
        now = time.monotonic()
        for queue in PAUSABLE:
            if queue in self._paused:
                if now >= self._paused[queue]:
                    await self._resume(client, queue)
            elif self.rng.random() < PAUSE_P:
                lo = await self.clock.now()
                if lo is None:
                    continue
                status, _ = await self._send(client, "pause", f"/queues/{queue}/pause")
                # Paused unless refused: an answer that never came may have paused it.
                if status != 200 and status != 0:
                    continue
                self._paused[queue] = now + self.rng.uniform(0.3, 1.5)
                if status == 200:
                    self.journal.add("pause", True, "http", lo, await self.clock.now(), queue=queue)

    async def _resume(self, client: ApiClient, queue: str) -> bool:
        lo = await self.clock.now()
        if lo is None:
            return False
        status, _ = await self._send(client, "resume", f"/queues/{queue}/resume")
        ok = status == 200
        # Journalled whatever the answer: it ends the pause's window either way.
        self.journal.add(
            "resume", ok, "http", lo, await self.clock.now() if ok else None, queue=queue
        )
        if ok:
            del self._paused[queue]
        return ok

    async def resume_all(self, client: ApiClient) -> None:
        """Resume every queue still paused: each must run again for the drain."""
        for _ in range(100):  # bounded
            for queue in list(self._paused):
                await self._resume(client, queue)
            if not self._paused:
                return
            await asyncio.sleep(0.2)
        self.journal.errors.append(f"queues left paused: {sorted(self._paused)}")
