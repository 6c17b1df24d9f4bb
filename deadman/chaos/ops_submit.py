"""The operators scenario's submissions over HTTP: its jobs in batches, with four-node
workflows between them, each sent until it is acknowledged."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from deadman.chaos.http import BATCH, ApiClient, ApiServer
from deadman.chaos.ops_config import BACKOFF, QUEUES, OperatorsConfig
from deadman.chaos.ops_journal import Journal
from deadman.errors import DeadmanError


@dataclass
class Submission:
    """Sends them all; what was acknowledged is counted here, every answer's status
    in the journal ("submit <status>")."""

    cfg: OperatorsConfig
    api: ApiServer
    journal: Journal
    stop: threading.Event
    acked_jobs: int = 0
    acked_workflows: int = 0
    workflow_ids: list[int] = field(default_factory=list)
    submit_s: float = 0.0

    async def run(self) -> None:
        started = time.monotonic()
        client = ApiClient(self.api.port)
        rng = random.Random(f"{self.cfg.opts.seed}:operators-jobs")
        jobs, workflows = self.cfg.jobs, self.cfg.workflows
        per_batch = max(1, workflows * BATCH // max(jobs, 1))
        try:
            for first in range(0, jobs, BATCH):
                items = [self._job_item(rng, n) for n in range(first, min(first + BATCH, jobs))]
                await self._until_acked(client, "/jobs/batch", {"jobs": items})
                self.acked_jobs += len(items)
                for _ in range(per_batch):
                    if self.acked_workflows < workflows:
                        await self._workflow(client, rng)
            while self.acked_workflows < workflows:
                await self._workflow(client, rng)
        finally:
            client.close()
            self.submit_s = time.monotonic() - started

    async def _until_acked(
        self, client: ApiClient, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> Any:
        for _ in range(600):  # bounded: ~a minute of 429/503/no answer
            if self.stop.is_set():
                break
            status, parsed = await client.answer("POST", path, body, headers)
            self.journal.statuses[f"submit {status}"] += 1
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
        ms = rng.randint(0, max(50, 5 * self.cfg.opts.handler_ms))
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
            client, "/workflows", body, {"Idempotency-Key": f"{self.cfg.prefix}wf-{k}"}
        )
        self.workflow_ids.append(int(parsed["id"]))
        self.acked_workflows += 1
