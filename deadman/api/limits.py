"""The limits on what clients may send: the body size, and the depth of a queue.

Body size (``DEADMAN_MAX_PAYLOAD_BYTES``): refused with 413 *without reading the
body*. A declared ``Content-Length`` over the limit is answered before the first
byte of the body is read (and, with ``Expect: 100-continue``, before the client
sends it); a chunked body is counted as it streams in and refused at the first byte
over the limit. Nothing ever buffers more than the limit.

Queue depth (``DEADMAN_MAX_QUEUE_DEPTH``): a queue holding that many waiting jobs
answers 429 with ``Retry-After``. The count stops at the cap, so it costs the same
for a queue of a thousand or a billion. It is checked before the insert, not under
a lock: concurrent submissions can overshoot the cap by a few. That is a deliberate
trade (a lock would serialise every submission to the queue); the cap is a brake
against runaway producers, not an accounting limit. Only new jobs count: a resent
submission (same idempotency key) is answered as its replay even at the cap.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deadman.api.problems import RETRY_AFTER_QUEUE_FULL_S, Problem
from deadman.api.schema import ascii_int
from deadman.store import AsyncStore, NewJob


class _TooLarge(Exception):
    """Raised out of ``receive`` to unwind the app; the middleware answers 413."""


def _too_large(limit: int) -> Problem:
    return Problem("content-too-large", f"the request body is larger than {limit} bytes")


class BodyLimit:
    """ASGI middleware refusing request bodies over ``limit`` bytes with 413."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        length = None if declared is None else ascii_int(declared.strip())
        if length is not None and length > self.limit:
            await _too_large(self.limit).send(send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:  # pragma: no cover - routes read their body before answering
                raise
            await _too_large(self.limit).send(send)


async def check_queue_depth(
    store: AsyncStore,
    cap: int | None,
    jobs: Sequence[NewJob],
    *,
    workflow_key: str | None = None,
) -> None:
    """429 if the *new* jobs among ``jobs`` would take any of their queues past ``cap``.

    A resent submission is answered as the replay it is, whatever the depth: a job
    whose idempotency key already holds a job is not new (a replay, or a key reused
    for another request, which the insert refuses with 422), and neither is any node
    of a workflow whose key is taken. Keys are looked up only for a queue that would
    overflow, so a submission under the cap costs no extra read.
    """
    if cap is None:
        return
    by_queue: dict[str, list[NewJob]] = defaultdict(list)
    for job in jobs:
        by_queue[job.queue].append(job)
    for queue, adding in sorted(by_queue.items()):
        depth = await store.queue_depth_get(queue, cap)
        if depth + len(adding) <= cap:
            continue
        if workflow_key is not None:
            if await store.workflow_get_by_idempotency_key(workflow_key) is not None:
                return
        elif depth + await _count_new(store, adding) <= cap:
            continue
        raise Problem(
            "queue-full",
            f"queue {queue!r} holds {depth} waiting jobs, its cap is {cap}; retry later",
            headers={"Retry-After": str(RETRY_AFTER_QUEUE_FULL_S)},
        )


async def _count_new(store: AsyncStore, jobs: Sequence[NewJob]) -> int:
    """How many of ``jobs`` would be inserted: those without a key, or whose key holds
    no job yet. One read for all the keys; only on the way to a 429 (see above)."""
    keys = [j.idempotency_key for j in jobs if j.idempotency_key is not None]
    taken = {j.idempotency_key for j in await store.job_get_many_by_idempotency_key(keys)}
    return sum(1 for j in jobs if j.idempotency_key is None or j.idempotency_key not in taken)
