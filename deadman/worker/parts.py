"""What the worker's loops (producer, heartbeat) are built from: one worker's parts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deadman.config import Settings
from deadman.worker.executor import Executor
from deadman.worker.inflight import Inflight
from deadman.worker.worker_store import WorkerStore


@dataclass(frozen=True)
class WorkerParts:
    """One worker's store, settings, in-flight jobs, executor, id and queues: made once
    by process.py and handed to each of its loops."""

    store: WorkerStore
    settings: Settings
    inflight: Inflight
    executor: Executor
    worker_id: str
    queues: Sequence[str]


class WorkerLoop:
    """Base of the producer and the heartbeat: the parts as plain attributes (read on
    every claim and every beat, so not through ``WorkerParts``)."""

    def __init__(self, parts: WorkerParts) -> None:
        self._store = parts.store
        self._settings = parts.settings
        self._inflight = parts.inflight
        self._executor = parts.executor
        self._worker_id = parts.worker_id
        self._queues = list(parts.queues)
