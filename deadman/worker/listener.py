"""LISTEN for ``deadman_jobs`` on a dedicated connection and wake the producer; for
``deadman_cancel`` (a running job's cancel was requested) to abort its handler at
once instead of at the next heartbeat; and on the worker's own handoff channel for
the jobs enqueues hand straight to it (DECISIONS 83).

Notifications are an accelerator, never the source of truth: if the connection
drops, the producer's polling still finds every job, and we reconnect in the
background with backoff.

Behind a pooler in transaction mode (PgBouncer) a LISTEN does not survive its
statement: the server connection goes back to the pool, and its notifications go to
whoever gets it next, or nowhere. So the listener connects to ``DEADMAN_LISTEN_URL``
when it is set (straight to Postgres: one connection per worker process), and with
``DEADMAN_LISTEN=off`` it does not listen at all: new jobs are found by the
producer's poll (every ``DEADMAN_POLL_S``) and cancels of running jobs by the next
heartbeat.

NOTIFY needs no privilege: any role that can connect (the read-only
``deadman_reader`` included) can send any text on these channels. So a payload is
input, parsed strictly; one that means nothing to us is logged (at a bounded rate:
a flood must not fill the disk) and ignored, and no exception, from a payload or
from a callback, ends the listener: it is logged and the listener reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from deadman import logs
from deadman.bounds import ID_PATTERN
from deadman.config import Settings, connection_settings
from deadman.db.pool import prepare_threshold
from deadman.db.queries import QUERIES

log = logs.get("deadman.listener")

CHANNEL = "deadman_jobs"
CANCEL_CHANNEL = "deadman_cancel"

#: A job id as job_cancel sends it: ASCII digits, no sign, no padding, a bigint.
#: (str.isdigit() is true for '²', which int() refuses.)
JOB_ID_RE = re.compile(ID_PATTERN)
#: How much of a bad payload a log line shows (a payload can be 7999 bytes).
PAYLOAD_SHOWN = 80


def parse_job_id(payload: str) -> int | None:
    """The job id in a deadman_cancel payload, or None if it is not one."""
    return int(payload) if JOB_ID_RE.fullmatch(payload) else None


class LogLimiter:
    """At most ``burst`` lines per ``window_s``; the rest are counted, and the count is
    logged with the first line of the next window."""

    def __init__(self, burst: int = 10, window_s: float = 60.0) -> None:
        self._burst = burst
        self._window_s = window_s
        self._window_end = 0.0
        self._logged = 0
        self.suppressed = 0

    def allow(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if now >= self._window_end:
            if self.suppressed:
                log.warning("notifications_ignored_suppressed", count=self.suppressed)
            self._window_end = now + self._window_s
            self._logged = 0
            self.suppressed = 0
        if self._logged < self._burst:
            self._logged += 1
            return True
        self.suppressed += 1
        return False


class Listener:
    def __init__(
        self,
        dsn: str,
        queues: Sequence[str],
        on_wake: Callable[[], None],
        on_cancel: Callable[[int], None] | None = None,
        *,
        settings: Settings | None = None,
        handoff: tuple[str, Callable[[str], bool]] | None = None,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        """``dsn``: the database URL; ``settings``: where and whether to listen
        (``listen``, ``listen_url``, ``prepare``; by default the environment's, see
        :func:`deadman.config.connection_settings`). ``handoff``: this worker's own
        channel and what to call with each payload heard there (DECISIONS 83, 86): it
        parses the payload itself and answers False when it names no job;
        ``on_connect``: called each time the LISTENs are in place, before the wake-up
        that follows."""
        s = connection_settings() if settings is None else settings
        self._dsn = s.listen_url or dsn
        self._enabled = s.listen
        self._prepare = s.prepare
        self._queues = set(queues)
        self._on_wake = on_wake
        self._on_cancel = on_cancel
        self._on_connect = on_connect
        self._handoff_channel = handoff[0] if handoff else ""
        self._on_note = handoff[1] if handoff else None
        self._stop = asyncio.Event()
        self.connected = asyncio.Event()
        self.received = 0
        self.ignored = 0
        self._limiter = LogLimiter()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if not self._enabled:
            # Returns only at stop(): the worker ends when any of its tasks ends.
            log.info("listener_off", reason="DEADMAN_LISTEN=off: polling only")
            await self._stop.wait()
            return
        delay = 0.1
        while not self._stop.is_set():
            try:
                await self._listen()
                delay = 0.1
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
                log.warning("listener_disconnected", error=str(exc), retry_in_s=delay)
            except Exception as exc:
                # Not an input (those are handled per notification) nor a lost
                # connection: a bug. Losing the listener only slows wake-ups down to
                # the poll interval; losing the worker would stop its jobs.
                log.error("listener_crashed", error=repr(exc), retry_in_s=delay)
            else:
                continue
            self.connected.clear()
            # Something may have been enqueued while we were deaf: poll now.
            self._on_wake()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, 5.0)

    async def _listen(self) -> None:
        async with await psycopg.AsyncConnection.connect(
            self._dsn, autocommit=True, prepare_threshold=prepare_threshold(self._prepare)
        ) as conn:
            await conn.execute(QUERIES["listen_jobs"])
            if self._on_cancel is not None:
                await conn.execute(QUERIES["listen_cancel"])
            if self._handoff_channel:
                channel = sql.Identifier(self._handoff_channel)
                await conn.execute(sql.SQL("LISTEN {}").format(channel))
            self.connected.set()
            if self._on_connect is not None:
                self._on_connect()
            self._on_wake()  # anything enqueued before LISTEN took effect
            while not self._stop.is_set():
                # Wake up at least every second to notice stop(); timeouts also probe
                # the connection, so a dead socket surfaces as an error here.
                async for note in conn.notifies(timeout=1.0):
                    self.received += 1
                    try:
                        self._dispatch(note.channel, note.payload)
                    except Exception as exc:  # a callback's bug: keep listening
                        log.error("notification_failed", channel=note.channel, error=repr(exc))
                await conn.execute(QUERIES["ping"])

    def _dispatch(self, channel: str, payload: str) -> None:
        if self._on_note is not None and channel == self._handoff_channel:
            # A handoff: ours alone, but anyone may send on it; the worker starts only
            # a job an enqueue handed into a slot of ours (Parking.noted).
            if not self._on_note(payload):
                self._ignore(channel, payload)
            return
        if self._on_cancel is not None and channel == CANCEL_CHANNEL:
            # A cancel: every worker hears it; the one holding the job acts, the rest
            # ignore it (a missed one is caught by the heartbeat, which reads
            # cancel_requested). The id is parsed strictly.
            job_id = parse_job_id(payload)
            if job_id is None:
                self._ignore(channel, payload)
            else:
                self._on_cancel(job_id)
        elif payload in self._queues:
            self._on_wake()
        # else: another fleet's queue, or noise; waking for it would only cost a claim

    def _ignore(self, channel: str, payload: str) -> None:
        self.ignored += 1
        if self._limiter.allow():
            log.warning(
                "notification_ignored",
                channel=channel,
                payload=payload[:PAYLOAD_SHOWN],
                payload_chars=len(payload),
                reason="not a job id",
            )
