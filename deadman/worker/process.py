"""One worker process: wires producer, executor, completer, heartbeat, listener, the
loop's watch (``loopwatch``) and the maintenance services together, and owns graceful
shutdown.

The store and the services are arguments (``Worker(..., store=, services=)``): a
test hands in a store that records or fails statements, or services of its own.
Left out, the worker builds the store below and, with ``run_rescuer``, the
maintenance services (``deadman.maintenance.services``).

Shutdown (SIGTERM/SIGINT): stop claiming; give in-flight handlers
``shutdown_grace_s`` to finish; release the rest back to ``queued`` (fenced, no
attempt used); flush the completer; deregister; exit 0. A second signal exits at
once: its leases then lapse and the rescuer hands the jobs on.

Connections, per worker process (the budget README's configuration table gives):

- worker statements: one pool of ``DEADMAN_POOL_SIZE`` (default
  ``DEADMAN_COMPLETER_FLUSHES + 4``: heartbeat, claim, the completer's flushes, the
  maintenance services, and one spare for refusal evidence and notifies);
- the listener: 1;
- handlers' ``ctx.transaction()``: a pool for async handlers and one for sync
  handlers, each at most ``min(concurrency, 16)`` (``DEADMAN_HANDLER_POOL_SIZE``
  changes the 16: ``handler_pool_size``) and opened on first use.

Handlers never take a connection from the worker's own pool: a handler holding a
transaction for minutes (or a thousand of them) must not make the heartbeat wait
(measured before the split: 20 handlers in transactions past the trust window left
the heartbeat without a connection, and every lease untrusted, on a healthy
database). Above the pool's size, handlers wait for a handler connection; that wait
is bounded (``HANDLER_POOL_TIMEOUT_S``, then a retryable failure of that attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg_pool import ConnectionPool

from deadman import logs
from deadman.config import Settings
from deadman.db.plans import generic_plans
from deadman.db.pool import async_pool, sync_pool
from deadman.handlers import builtins
from deadman.loopwatch import LoopWatch
from deadman.maintenance import Service
from deadman.maintenance import services as maintenance_services
from deadman.registry import Registry
from deadman.stackdump import dump_stacks_on_sigusr1
from deadman.store import AsyncStore, SyncStore
from deadman.worker.completer import Completer
from deadman.worker.executor import Executor
from deadman.worker.heartbeat import Heartbeat
from deadman.worker.inflight import Abort, Inflight
from deadman.worker.listener import Listener
from deadman.worker.parts import WorkerParts
from deadman.worker.producer import Producer
from deadman.worker.slots import Slots
from deadman.worker.threads import HandlerThreads
from deadman.worker.worker_store import WorkerStore

log = logs.get("deadman.worker")

#: Most connections each handler pool (async, sync) opens unless DEADMAN_HANDLER_POOL_SIZE
#: says otherwise; above it handlers wait.
HANDLER_POOL_MAX = 16
#: Longest a handler waits for a ctx.transaction() connection before its attempt fails.
HANDLER_POOL_TIMEOUT_S = 30.0


def worker_pool_size(settings: Settings) -> int:
    """Connections for the worker's own statements (see the module docstring)."""
    return settings.pool_size or settings.completer_flushes + 4


def handler_pool_size(settings: Settings) -> int:
    """Most connections of each handler pool: ``DEADMAN_HANDLER_POOL_SIZE``, else
    min(concurrency, 16). More than the concurrency would never be used."""
    wanted = settings.handler_pool_size or HANDLER_POOL_MAX
    return max(1, min(settings.concurrency, wanted))


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    def __init__(
        self,
        dsn: str,
        settings: Settings,
        registry: Registry | None = None,
        *,
        worker_id: str | None = None,
        run_rescuer: bool = True,
        store: WorkerStore | None = None,
        services: Sequence[Service] | None = None,
    ) -> None:
        """``store``: the worker's statements (default: an AsyncStore of
        ``worker_pool_size`` connections; the worker opens and closes it).
        ``services``: started after the first heartbeat, stopped at shutdown
        (default: the maintenance services on ``store`` when it is an AsyncStore,
        none when not ``run_rescuer``)."""
        self.dsn = dsn
        self.settings = settings
        self.registry = builtins if registry is None else builtins.merged(registry)
        self.worker_id = worker_id or new_worker_id()
        self.queues = list(settings.queues)
        self.run_rescuer = run_rescuer
        self._stop = asyncio.Event()
        self._signals = 0
        self._sync_pool: ConnectionPool[Any] | None = None
        self.producer: Producer | None = None
        self._sync_pool_lock = threading.Lock()
        pool_max = worker_pool_size(settings)
        self.store: WorkerStore = store or AsyncStore.create(
            generic_plans(dsn),  # the claim was planned again on every call (db/plans.py)
            min_size=min(2, pool_max),
            max_size=pool_max,
            timeout=max(1.0, settings.lease_ttl_s / 4),
        )
        if services is None and run_rescuer and isinstance(self.store, AsyncStore):
            services = maintenance_services(self.store, settings)
        self.services: list[Service] = list(services or [])
        # Async handlers' ctx.transaction(): a pool of their own (min_size 0: a worker
        # whose handlers never use it opens no connection for it). Connections as the
        # store's (autocommit, dict rows: what handlers always got).
        self.handler_pool = async_pool(
            dsn,
            name="deadman-handlers",
            min_size=0,
            max_size=handler_pool_size(settings),
            timeout=HANDLER_POOL_TIMEOUT_S,
        )

    def _get_sync_pool(self) -> ConnectionPool[Any]:
        """Sync handlers' ctx.transaction() connections; made on first use."""
        with self._sync_pool_lock:
            if self._sync_pool is None:
                self._sync_pool = sync_pool(
                    self.dsn,
                    name="deadman-sync",
                    min_size=0,
                    max_size=handler_pool_size(self.settings),
                    timeout=HANDLER_POOL_TIMEOUT_S,
                )
            return self._sync_pool

    async def _declare_schedules(self) -> None:
        """Write the registry's periodic schedules to the table (Registry.periodic)."""
        declared = self.registry.periodics()
        if not declared or not isinstance(self.store, AsyncStore):
            return
        now = await self.store.db_now()
        for name, spec in declared.items():
            await self.store.schedule_declare(spec.params(name, now))
        log.info("schedules_declared", worker=self.worker_id, schedules=sorted(declared))

    def request_stop(self) -> None:
        self._signals += 1
        if self._signals >= 2:
            log.warning("worker_forced_exit", worker=self.worker_id)
            os._exit(130)
        log.info("worker_stopping", worker=self.worker_id)
        self._stop.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        dump_stacks_on_sigusr1(loop)  # the threads, then the loop's tasks

    async def run(self) -> int:
        s = self.settings
        await self.store.open(wait=True, timeout=30.0)
        await self.handler_pool.open(wait=False)
        inflight = Inflight()
        slots = Slots(s.concurrency)
        threads = HandlerThreads(s.concurrency)
        store = self.store
        completer = Completer(
            store, self.worker_id, s.completer_batch, in_flight=s.completer_flushes
        )
        executor = Executor(
            registry=self.registry,
            store=store,
            handler_pool=self.handler_pool,
            sync_store=SyncStore(),
            sync_pool=self._get_sync_pool,
            completer=completer,
            inflight=inflight,
            slots=slots,
            worker_id=self.worker_id,
            trust_s=s.lease_ttl_s - s.lease_margin_s,
            threads=threads,
            max_result_bytes=s.max_payload_bytes,
        )
        parts = WorkerParts(
            store=store,
            settings=s,
            inflight=inflight,
            executor=executor,
            worker_id=self.worker_id,
            queues=self.queues,
        )
        producer = Producer(parts, slots)
        self.producer = producer  # for tests and a debugger: claims made so far
        # A retry or release makes a job due later; the idle producer must look again.
        completer.on_requeue = producer.wake
        completer.refill = producer.refill
        completer.on_claimed = producer.refilled
        heartbeat = Heartbeat(parts)
        parking = producer.parking
        listener = Listener(
            self.dsn,
            self.queues,
            producer.wake,
            on_cancel=executor.cancel_requested,
            handoff=(parking.channel, parking.noted) if parking.target else None,
            on_connect=parking.heard,
        )
        parking.listening = listener.connected

        await self._declare_schedules()
        await heartbeat.beat()  # registers this worker before it claims anything
        tasks = {
            "completer": asyncio.create_task(completer.run(), name="completer"),
            "heartbeat": asyncio.create_task(heartbeat.run(), name="heartbeat"),
            "listener": asyncio.create_task(listener.run(), name="listener"),
            "producer": asyncio.create_task(producer.run(), name="producer"),
        }
        for service in self.services:
            service.start()  # its ticks survive their own errors (see Service)
        log.info(
            "worker_started",
            worker=self.worker_id,
            queues=self.queues,
            concurrency=s.concurrency,
            handlers=self.registry.types(),
        )
        watch = LoopWatch()
        watch.start()
        stop_wait = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait(
            {stop_wait, *tasks.values()}, return_when=asyncio.FIRST_COMPLETED
        )
        crashed = [t for t in done if t is not stop_wait and t.exception() is not None]
        for t in crashed:
            log.error("worker_task_crashed", task=t.get_name(), error=repr(t.exception()))

        # 1. stop claiming
        producer.stop()
        await asyncio.gather(tasks["producer"], return_exceptions=True)
        with contextlib.suppress(TimeoutError):  # jobs claimed with a write: started
            await asyncio.wait_for(completer.refills_settled(), 10.0)
        # 2. let in-flight handlers finish within the grace period
        if len(inflight):
            log.info("worker_draining", held=len(inflight), grace_s=s.shutdown_grace_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inflight.wait_empty(), s.shutdown_grace_s)
        # 3. release the rest: each cancelled handler's task records 'released'
        #    through the completer (fenced, no attempt used). A sync handler's thread
        #    cannot be stopped; whatever it writes later is refused by the fence.
        leftovers = [h for h in inflight.all() if not (h.finishing or h.ctx.finishing)]
        for h in leftovers:
            executor.abort(h.job.id, Abort.SHUTDOWN)
        if executor.tasks:
            await asyncio.wait(executor.tasks, timeout=10.0)
        # 4. flush (the releases too: a job's task ends when it posts its outcome, not
        # when it is written, DECISIONS 102), then wake the queues for what was
        # released: a NOTIFY ahead of the releases' commit woke an idle worker to find
        # the jobs still running, and it slept its poll before it looked again
        completer.stop()
        await asyncio.wait({tasks["completer"]}, timeout=10.0)
        if leftovers:
            log.info("jobs_released", count=len(leftovers))
            await self.store.queue_notify(self.queues)
        heartbeat.stop()
        listener.stop()
        await asyncio.gather(*(service.stop() for service in self.services))
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        try:
            await self.store.worker_deregister(self.worker_id)
        except Exception as exc:
            log.warning("deregister_failed", error=repr(exc))
        await self.store.close()
        await self.handler_pool.close()
        if self._sync_pool is not None:
            self._sync_pool.close()
        threads.shutdown()
        watch.stop()
        log.info(
            "worker_stopped",
            worker=self.worker_id,
            crashed=len(crashed),
            claims=producer.claims,
            handed=producer.parking.adopted,
            handed_from_note=producer.parking.noted_starts,
        )
        return 1 if crashed else 0
