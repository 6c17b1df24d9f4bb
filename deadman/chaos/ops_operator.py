"""The operator of the operators scenario, a thread of its own: submits the jobs, acts
on them while they run and the fleet is killed under them, and prunes them with
one-second retention until told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time

from deadman.chaos.http import ApiClient, ApiServer
from deadman.chaos.ops_actions import Actions
from deadman.chaos.ops_config import (
    ACTIONS,
    OPERATE_MAX_S,
    OPERATE_TAIL_S,
    OPERATE_UNTIL_LEFT,
    PRUNE_EVERY_S,
    RETENTION_MS,
    STEP_S,
    OperatorsConfig,
)
from deadman.chaos.ops_journal import DbClock, Journal
from deadman.chaos.ops_submit import Submission
from deadman.errors import DeadmanError
from deadman.store import AsyncStore, PruneParams


class Operator(threading.Thread):
    """``operated``: set once it is done acting (every queue resumed); ``stop`` ends
    the pruning. What it did is in ``journal``, what it submitted in ``submission``."""

    def __init__(self, cfg: OperatorsConfig, dsn: str, api: ApiServer, journal: Journal) -> None:
        super().__init__(name="chaos-operator", daemon=True)
        self.cfg = cfg
        self.dsn = dsn
        self.api = api
        self.journal = journal
        self.rng = random.Random(f"{cfg.opts.seed}:operators")
        self.pruned = 0
        self.operated = threading.Event()
        self.stop = threading.Event()
        self.submission = Submission(cfg, api, journal, self.stop)

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # reported as a failed check, never a dead harness
            self.journal.errors.append(repr(exc))
        finally:
            self.operated.set()

    async def _main(self) -> None:
        store = AsyncStore.create(self.dsn, max_size=3, retry_s=10.0)
        await store.open()
        clock = DbClock(self.dsn)
        try:
            pruner = asyncio.create_task(self._prune(store))
            try:
                # The operator acts while the jobs are still going in, as people do.
                submitting = asyncio.create_task(self.submission.run())
                actions = Actions(store, self.journal, clock, self.rng)
                try:
                    await self._operate(actions, clock, store, submitting)
                finally:
                    client = ApiClient(self.api.port)
                    try:
                        await actions.resume_all(client)
                    finally:
                        client.close()
                await submitting  # its failure, if any, is the run's
            finally:
                self.operated.set()
            await asyncio.to_thread(self.stop.wait)  # pruning goes on through the drain
            pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pruner
        finally:
            await clock.close()
            await store.close()

    async def _operate(
        self, actions: Actions, clock: DbClock, store: AsyncStore, submitting: asyncio.Task[None]
    ) -> None:
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
                    give_up = now + min(OPERATE_MAX_S, self.cfg.opts.timeout / 2)
                if now >= next_look:
                    next_look = now + 0.5
                    busy = not submitting.done() or (await self._busy(clock) and now < give_up)
                await actions.toggle_pauses(client)
                action = self.rng.choices(names, weights)[0]
                if action == "retry-dead" and actions.replayed == 0 and self.rng.random() < 0.5:
                    # Dead letters live about a second (RETENTION_MS) and the one-by-one
                    # retries drain them too: on a slow machine a run could end without
                    # a bulk replay ever finding one, so half of those retries become
                    # replays of every dead letter until one has requeued a job.
                    action = "replay-all"
                if action == "cancel-queued":
                    await actions.cancel(client, self.rng.choice(("queued", "waiting", "retrying")))
                elif action == "cancel-running":
                    await actions.cancel(client, "running")
                elif action == "retry-dead":
                    await actions.retry(client, "dead")
                elif action == "retry-cancelled":
                    await actions.retry(client, "cancelled")
                elif action == "replay-dead":
                    await actions.replay()
                elif action == "replay-all":
                    await actions.replay(everything=True)
                elif action == "replay-while-pruning":
                    # The dead letters replayed first are the oldest, the very rows
                    # retention is deleting right now (a DELETE that waits on a
                    # replayed row's lock must not take it once requeued).
                    await asyncio.gather(
                        self._prune_once(store), actions.replay(0.005, everything=True)
                    )
                else:
                    await actions.cancel_workflow(self.submission.workflow_ids)
                await asyncio.sleep(STEP_S)
        finally:
            client.close()

    async def _busy(self, clock: DbClock) -> bool:
        """More than OPERATE_UNTIL_LEFT of the jobs still unfinished (or unknown)?"""
        left = await clock.unfinished()
        return left is None or left > OPERATE_UNTIL_LEFT * self.cfg.jobs

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
            self.journal.statuses["prune error"] += 1
            self.journal.errors.append(f"prune: {exc}")
