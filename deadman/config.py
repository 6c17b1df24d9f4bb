"""One frozen :class:`Settings`, read from ``DEADMAN_*`` environment variables.

Every setting has a working default. Nonsense is rejected at start-up with a
message naming the variable, because a worker that silently runs with a heartbeat
longer than its lease would lose every job it holds.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from deadman import eventloop, gcpolicy
from deadman.bounds import MAX_ATTEMPTS_MAX, MAX_ATTEMPTS_MIN
from deadman.errors import ConfigError
from deadman.model import QUEUE_RE

T = TypeVar("T")

#: Upper bounds on durations: past them a value is a typo, and some would overflow
#: later (a lease in milliseconds is a bigint; a thread wait takes at most ~292 years).
DAY_S = 24 * 3600.0
TEN_YEARS_S = 3650 * DAY_S
#: The shortest period a loop may be given: below it a timer is a busy loop.
MIN_PERIOD_S = 0.01
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class Settings:
    """All of Deadman's knobs. Construct with :meth:`from_env`, adjust with ``replace``."""

    database_url: str | None = None
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 2.0
    rescue_s: float = 1.0
    poll_s: float = 1.0
    concurrency: int = 200  # DECISIONS 48, 73: async handlers wait, slots are cheap
    queues: tuple[str, ...] = ("default",)
    max_attempts: int = 5
    max_rescues: int = 5
    shutdown_grace_s: float = 10.0
    api_token: str | None = None
    max_payload_bytes: int = 1024 * 1024
    max_queue_depth: int | None = None
    retention_succeeded_s: float = 24 * 3600.0
    retention_failed_s: float = 7 * 24 * 3600.0
    #: The vacuumer's trigger: dead versions in deadman.jobs (DECISIONS 72); 0: off,
    #: autovacuum alone keeps the table.
    vacuum_dead_tuples: int = 10_000
    completer_batch: int = 500
    completer_flushes: int = 2  # completion batches written at once (connections)
    claim_batch: int = 0  # most jobs one claim takes; 0: half the slots (at least 1)
    #: Free slots an idle worker parks for handoffs at enqueue (DECISIONS 83); 0: off.
    handoff_slots: int = 4
    pool_size: int = 0  # 0: derived from concurrency
    #: Most connections each of a worker's two handler pools (async and sync handlers'
    #: ctx.transaction()) opens; 0: min(concurrency, 16) (deadman/worker/process.py).
    handler_pool_size: int = 0
    log_format: str = "auto"  # auto | json | console
    log_level: str = "info"
    #: How long a starting worker, rescuer or migrate waits for the database (and its
    #: schema); None: as long as it takes (see deadman/db/startup.py for why).
    startup_wait_s: float | None = None
    #: Let psycopg prepare statements it runs often (after 5 runs on a connection).
    #: Off (``DEADMAN_PREPARE=off``): ``prepare_threshold=None`` on every connection,
    #: which a pooler in transaction mode without protocol-level prepared statements
    #: (PgBouncer < 1.21) needs: a statement prepared on one server connection is
    #: missing on the next, and two clients' ``_pg3_0`` collide on a shared one.
    prepare: bool = True
    #: LISTEN for wake-ups (new jobs, cancels, ends of waited jobs). Off: polling only,
    #: every DEADMAN_POLL_S (a worker) and every second (a wait). A pooler in
    #: transaction mode cannot carry LISTEN: turn it off, or point DEADMAN_LISTEN_URL
    #: straight at Postgres.
    listen: bool = True
    #: Where the listeners connect instead of the database URL (straight to Postgres,
    #: past the pooler); the same database. Unset: the database URL.
    listen_url: str | None = None
    #: The event loop of a worker and of ``deadman serve``: auto (uvloop where it is
    #: installed), uvloop, or asyncio (the standard library's); deadman.eventloop.
    event_loop: str = "auto"
    #: ``deadman serve`` writes uvicorn's access log, a plain-text line per request.
    #: Off by default: /metrics counts every request by route and status, and the line
    #: cost ~10 % of the server's CPU per submission (DECISIONS 74).
    access_log: bool = False
    #: How the cyclic garbage collector runs in a worker and in ``deadman serve``:
    #: tuned (startup objects frozen, generation 0 every 50,000 allocations) or
    #: python (the interpreter's own thresholds); deadman.gcpolicy.
    gc: str = "tuned"

    @property
    def claim_size(self) -> int:
        """Most jobs one claim takes: ``claim_batch``, or half the slots (at least 1).
        Claiming all free slots at once makes a worker's jobs move in lockstep:
        claimed together, written together, claimed again together, and the claim
        never overlaps the write. Half the slots per claim keeps two cohorts out of
        phase, so one is claimed and run while the other's outcomes are written."""
        return self.claim_batch or max(1, (self.concurrency + 1) // 2)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            var = "DEADMAN_" + f.name.upper()
            if isinstance(value, float):
                _require(math.isfinite(value), var, "must be finite")
            if isinstance(value, str):
                _check_text(var, value)
        _range(self.lease_ttl_s, 2 * MIN_PERIOD_S, DAY_S, "DEADMAN_LEASE_TTL_S")
        _range(self.heartbeat_s, MIN_PERIOD_S, DAY_S, "DEADMAN_HEARTBEAT_S")
        # A heartbeat must have at least two chances to land before the lease lapses.
        _require(
            self.heartbeat_s * 2 <= self.lease_ttl_s,
            "DEADMAN_HEARTBEAT_S",
            f"must be at most half of DEADMAN_LEASE_TTL_S ({self.lease_ttl_s}), "
            f"got {self.heartbeat_s}",
        )
        _range(self.rescue_s, MIN_PERIOD_S, 3600, "DEADMAN_RESCUE_S")
        _range(self.poll_s, MIN_PERIOD_S, 3600, "DEADMAN_POLL_S")
        _range(self.concurrency, 1, 10_000, "DEADMAN_CONCURRENCY")
        _require(len(self.queues) > 0, "DEADMAN_QUEUES", "must name at least one queue")
        _require(len(self.queues) <= 1000, "DEADMAN_QUEUES", "must name at most 1000 queues")
        # the bounds HTTP and Client use too (bug 9: they disagreed once)
        _range(self.max_attempts, MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX, "DEADMAN_MAX_ATTEMPTS")
        _range(self.max_rescues, 0, 1000, "DEADMAN_MAX_RESCUES")
        _range(self.shutdown_grace_s, 0, DAY_S, "DEADMAN_SHUTDOWN_GRACE_S")
        _range(self.max_payload_bytes, 1, 2**30, "DEADMAN_MAX_PAYLOAD_BYTES")
        if self.max_queue_depth is not None:
            _range(self.max_queue_depth, 1, 10**12, "DEADMAN_MAX_QUEUE_DEPTH")
        _range(self.retention_succeeded_s, 0, TEN_YEARS_S, "DEADMAN_RETENTION_SUCCEEDED_S")
        _range(self.retention_failed_s, 0, TEN_YEARS_S, "DEADMAN_RETENTION_FAILED_S")
        _range(self.vacuum_dead_tuples, 0, 10**12, "DEADMAN_VACUUM_DEAD_TUPLES")
        for q in self.queues:
            _require(
                bool(QUEUE_RE.fullmatch(q)),
                "DEADMAN_QUEUES",
                f"has {_shown(q)}; queue names are 1-128 characters of [A-Za-z0-9_.:-]",
            )
        _range(self.completer_batch, 1, 100_000, "DEADMAN_COMPLETER_BATCH")
        _range(self.completer_flushes, 1, 64, "DEADMAN_COMPLETER_FLUSHES")
        _range(self.claim_batch, 0, 10_000, "DEADMAN_CLAIM_BATCH")
        _range(self.handoff_slots, 0, 10_000, "DEADMAN_HANDOFF_SLOTS")
        _range(self.pool_size, 0, 1000, "DEADMAN_POOL_SIZE")
        _range(self.handler_pool_size, 0, 10_000, "DEADMAN_HANDLER_POOL_SIZE")
        _require(
            self.log_format in {"auto", "json", "console"},
            "DEADMAN_LOG_FORMAT",
            "must be auto, json or console",
        )
        _require(
            self.log_level.lower() in LOG_LEVELS,
            "DEADMAN_LOG_LEVEL",
            f"must be one of {', '.join(LOG_LEVELS)}",
        )
        _require(
            self.event_loop in eventloop.CHOICES,
            "DEADMAN_EVENT_LOOP",
            "must be auto, uvloop or asyncio",
        )
        _require(self.gc in gcpolicy.CHOICES, "DEADMAN_GC", "must be tuned or python")
        if self.api_token is not None:
            # Starlette reads headers as latin-1 and clients send ASCII: a token with
            # anything else in it could never be presented, locking everyone out.
            _require(self.api_token != "", "DEADMAN_API_TOKEN", "is empty")
            _require(
                len(self.api_token) <= 4096 and _TOKEN_RE.fullmatch(self.api_token) is not None,
                "DEADMAN_API_TOKEN",
                "must be 1-4096 printable ASCII characters without spaces",
            )
        if self.startup_wait_s is not None:
            _range(self.startup_wait_s, 0, TEN_YEARS_S, "DEADMAN_STARTUP_WAIT_S")
        if self.database_url is not None:
            _check_dsn(self.database_url)
        if self.listen_url is not None:
            _check_dsn(self.listen_url, "DEADMAN_LISTEN_URL")
            _require(
                self.listen,
                "DEADMAN_LISTEN_URL",
                "is set but DEADMAN_LISTEN is off: unset one of them",
            )

    @property
    def lease_margin_s(self) -> float:
        """How early a worker stops trusting a lease it could not renew."""
        return min(self.heartbeat_s, self.lease_ttl_s / 4)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            var = "DEADMAN_" + f.name.upper()
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            values[f.name] = _parse(var, raw.strip(), _PARSERS[f.name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


_TOKEN_RE = re.compile(r"[!-~]+")
_INT_RE = re.compile(r"[+-]?[0-9]{1,19}")
_FLOAT_RE = re.compile(
    r"[+-]?(?:[0-9]{1,19}(?:\.[0-9]{0,19})?|\.[0-9]{1,19})(?:[eE][+-]?[0-9]{1,3})?"
)


def _require(ok: bool, var: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{var} {message}")


def _range(value: float, low: float, high: float, var: str) -> None:
    _require(low <= value <= high, var, f"must be from {low:g} to {high:g}, got {value:g}")


def _shown(raw: str, width: int = 40) -> str:
    """A value as an error message may quote it: escaped (repr) and cut short."""
    return repr(raw if len(raw) <= width else raw[:width] + "...")


def _check_text(var: str, value: str) -> None:
    # os.environ decodes bytes that are not UTF-8 as lone surrogates
    # (surrogateescape); they would fail later, deep in psycopg or a log renderer.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{var} is not valid UTF-8 (undecodable bytes)") from None
    _require(value.isprintable(), var, "contains control characters")
    _require(len(value) <= 8192, var, "is longer than 8192 characters")


def _check_dsn(dsn: str, var: str = "DEADMAN_DATABASE_URL (or --database-url)") -> None:
    """A connection string libpq cannot parse (or with a port that is no port) is a
    configuration error now, not a connection that fails, and is waited on, later.
    The message never quotes the value: it may hold a password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        why = " ".join(str(exc).split())
        raise ConfigError(f"{var} is not a valid connection string: {why}") from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(f"{var} has port {_shown(port)}; a port is 1-65535")


def _parse(var: str, raw: str, parser: Callable[[str], object]) -> object:
    if not raw.isascii() or not raw.isprintable():
        _check_text(var, raw)  # names undecodable bytes and control characters
    try:
        return parser(raw)
    except ValueError as exc:
        raise ConfigError(f"{var}={_shown(raw)} is not valid: {exc}") from exc


def _int(raw: str) -> int:
    # int() also takes '١٢', '1_000' and 4,000-digit numbers; a setting is ASCII.
    if not _INT_RE.fullmatch(raw):
        raise ValueError("not an integer")
    return int(raw)


def _float(raw: str) -> float:
    # float() also takes 'nan', 'inf', '1e999' (inf) and non-ASCII digits.
    if not _FLOAT_RE.fullmatch(raw):
        raise ValueError("not a finite decimal number")
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError("not a finite decimal number")
    return value


def _queues(raw: str) -> tuple[str, ...]:
    names = tuple(q.strip() for q in raw.split(",") if q.strip())
    if not names:
        raise ValueError("no queue names")
    return names


def _opt_int(raw: str) -> int | None:
    return None if raw.lower() in {"none", "off", "0"} else _int(raw)


def _wait_limit(raw: str) -> float | None:
    return None if raw.lower() == "forever" else _float(raw)


_ON = {"on", "true", "yes", "1"}
_OFF = {"off", "false", "no", "0"}


def _switch(raw: str) -> bool:
    word = raw.lower()
    if word not in _ON | _OFF:
        raise ValueError("not on or off")
    return word in _ON


#: The settings that say how a connection is made (deadman/db/pool.py, the listeners).
CONNECTION_VARS = ("DEADMAN_PREPARE", "DEADMAN_LISTEN", "DEADMAN_LISTEN_URL")


def connection_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The environment's DEADMAN_PREPARE, DEADMAN_LISTEN and DEADMAN_LISTEN_URL, parsed
    and checked as :meth:`Settings.from_env` does (every other field at its default):
    read where a connection is made, so that every connection of a process (pools,
    clients, the CLI, migrations, listeners) follows them without each caller
    threading them through."""
    env = os.environ if environ is None else environ
    return Settings.from_env({var: env[var] for var in CONNECTION_VARS if var in env})


_PARSERS: dict[str, Callable[[str], object]] = {
    "database_url": str,
    "lease_ttl_s": _float,
    "heartbeat_s": _float,
    "rescue_s": _float,
    "poll_s": _float,
    "concurrency": _int,
    "queues": _queues,
    "max_attempts": _int,
    "max_rescues": _int,
    "shutdown_grace_s": _float,
    "api_token": str,
    "max_payload_bytes": _int,
    "max_queue_depth": _opt_int,
    "retention_succeeded_s": _float,
    "retention_failed_s": _float,
    "vacuum_dead_tuples": _int,
    "completer_batch": _int,
    "completer_flushes": _int,
    "claim_batch": _int,
    "handoff_slots": _int,
    "pool_size": _int,
    "handler_pool_size": _int,
    "log_format": str,
    "log_level": str,
    "startup_wait_s": _wait_limit,
    "prepare": _switch,
    "listen": _switch,
    "listen_url": str,
    "event_loop": str,
    "access_log": _switch,
    "gc": str,
}
