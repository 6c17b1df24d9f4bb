"""One frozen :class:`Settings`, read from ``DEADMAN_*`` environment variables.

Every setting has a working default. Nonsense is rejected at start-up with a
message naming the variable, because a worker that silently runs with a heartbeat
longer than its lease would lose every job it holds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from deadman.errors import ConfigError
from deadman.model import QUEUE_RE

T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """All of Deadman's knobs. Construct with :meth:`from_env`, adjust with ``replace``."""

    database_url: str | None = None
    lease_ttl_s: float = 10.0
    heartbeat_s: float = 2.0
    rescue_s: float = 1.0
    poll_s: float = 1.0
    concurrency: int = 10
    queues: tuple[str, ...] = ("default",)
    max_attempts: int = 5
    max_rescues: int = 5
    shutdown_grace_s: float = 10.0
    api_token: str | None = None
    max_payload_bytes: int = 1024 * 1024
    max_queue_depth: int | None = None
    retention_succeeded_s: float = 24 * 3600.0
    retention_failed_s: float = 7 * 24 * 3600.0
    completer_batch: int = 500
    completer_flushes: int = 2  # completion batches written at once (connections)
    claim_batch: int = 0  # most jobs one claim takes; 0: half the slots (at least 1)
    pool_size: int = 0  # 0: derived from concurrency
    log_format: str = "auto"  # auto | json | console
    log_level: str = "info"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                _require(math.isfinite(value), "DEADMAN_" + f.name.upper(), "must be finite")
        _require(self.lease_ttl_s > 0, "DEADMAN_LEASE_TTL_S", "must be > 0")
        _require(self.heartbeat_s > 0, "DEADMAN_HEARTBEAT_S", "must be > 0")
        # A heartbeat must have at least two chances to land before the lease lapses.
        _require(
            self.heartbeat_s * 2 <= self.lease_ttl_s,
            "DEADMAN_HEARTBEAT_S",
            f"must be at most half of DEADMAN_LEASE_TTL_S ({self.lease_ttl_s}), "
            f"got {self.heartbeat_s}",
        )
        _require(self.rescue_s > 0, "DEADMAN_RESCUE_S", "must be > 0")
        _require(self.poll_s > 0, "DEADMAN_POLL_S", "must be > 0")
        _require(1 <= self.concurrency <= 10_000, "DEADMAN_CONCURRENCY", "must be 1..10000")
        _require(len(self.queues) > 0, "DEADMAN_QUEUES", "must name at least one queue")
        _require(1 <= self.max_attempts <= 100, "DEADMAN_MAX_ATTEMPTS", "must be 1..100")
        _require(0 <= self.max_rescues <= 1000, "DEADMAN_MAX_RESCUES", "must be 0..1000")
        _require(self.shutdown_grace_s >= 0, "DEADMAN_SHUTDOWN_GRACE_S", "must be >= 0")
        _require(self.max_payload_bytes > 0, "DEADMAN_MAX_PAYLOAD_BYTES", "must be > 0")
        _require(
            self.max_queue_depth is None or self.max_queue_depth > 0,
            "DEADMAN_MAX_QUEUE_DEPTH",
            "must be > 0",
        )
        _require(self.retention_succeeded_s >= 0, "DEADMAN_RETENTION_SUCCEEDED_S", "must be >= 0")
        _require(self.retention_failed_s >= 0, "DEADMAN_RETENTION_FAILED_S", "must be >= 0")
        for q in self.queues:
            _require(
                bool(QUEUE_RE.fullmatch(q)),
                "DEADMAN_QUEUES",
                f"has {q!r}; queue names are 1-128 characters of [A-Za-z0-9_.:-]",
            )
        _require(self.completer_batch >= 1, "DEADMAN_COMPLETER_BATCH", "must be >= 1")
        _require(self.completer_flushes >= 1, "DEADMAN_COMPLETER_FLUSHES", "must be >= 1")
        _require(self.claim_batch >= 0, "DEADMAN_CLAIM_BATCH", "must be >= 0")
        _require(self.pool_size >= 0, "DEADMAN_POOL_SIZE", "must be >= 0")
        _require(
            self.log_format in {"auto", "json", "console"},
            "DEADMAN_LOG_FORMAT",
            "must be auto, json or console",
        )
        _require(self.api_token is None or self.api_token != "", "DEADMAN_API_TOKEN", "is empty")

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


def _require(ok: bool, var: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{var} {message}")


def _parse(var: str, raw: str, parser: Callable[[str], object]) -> object:
    try:
        return parser(raw)
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is not valid: {exc}") from exc


def _queues(raw: str) -> tuple[str, ...]:
    names = tuple(q.strip() for q in raw.split(",") if q.strip())
    if not names:
        raise ValueError("no queue names")
    return names


def _opt_int(raw: str) -> int | None:
    return None if raw.lower() in {"none", "off", "0"} else int(raw)


_PARSERS: dict[str, Callable[[str], object]] = {
    "database_url": str,
    "lease_ttl_s": float,
    "heartbeat_s": float,
    "rescue_s": float,
    "poll_s": float,
    "concurrency": int,
    "queues": _queues,
    "max_attempts": int,
    "max_rescues": int,
    "shutdown_grace_s": float,
    "api_token": str,
    "max_payload_bytes": int,
    "max_queue_depth": _opt_int,
    "retention_succeeded_s": float,
    "retention_failed_s": float,
    "completer_batch": int,
    "completer_flushes": int,
    "claim_batch": int,
    "pool_size": int,
    "log_format": str,
    "log_level": str,
}
