"""The options of a chaos run (``deadman chaos``'s arguments), their bounds, and the
environment its worker processes get."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from deadman.chaos.app import UNSAFE_ENV
from deadman.errors import DeadmanError

SCENARIOS = (
    "kill",
    "zombie",
    "pg-restart",
    "conn-kill",
    "outrun",
    "partition",
    "submit-faults",
    "limits",
    "operators",
    "handoffs",
    "hosts",
)
#: Run only when asked for by name, not with --all: the hosts scenario needs root for
#: its namespaces (and libfaketime) and fails the run without them.
OPT_IN = frozenset({"hosts"})


@dataclass(frozen=True)
class Options:
    jobs: int
    workers: int
    concurrency: int
    kill_rate: float
    kill_interval: float
    lease_ttl: float
    seed: int
    submit: str
    timeout: float
    database_url: str | None
    keep: bool
    unsafe_effects: bool
    handler_ms: int
    #: the workers' DEADMAN_MAX_RESCUES (see cli_chaos: random kills at a high rate can
    #: make a job look like a poison pill)
    max_rescues: int
    scenarios: frozenset[str]
    report: Path | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        """Every field is the argument of its name (deadman/cli.py), but three: the
        concurrency's default, the scenarios chosen (all but OPT_IN if none is), the
        report's path."""
        chosen = {s for s in SCENARIOS if getattr(args, s.replace("-", "_"), False)}
        if args.all or not chosen:
            chosen |= set(SCENARIOS) - OPT_IN
            if "hosts" in chosen and not args.partition:
                chosen.discard("partition")  # every worker sits on a host: none to cut off
        derived: dict[str, Any] = {
            "concurrency": args.concurrency or 32,
            "scenarios": frozenset(chosen),
            "report": Path(args.report) if args.report else None,
        }
        given = {f.name: getattr(args, f.name) for f in fields(cls) if f.name not in derived}
        return cls(**given, **derived)

    def validate(self) -> None:
        if self.jobs < 1 or self.workers < 1 or self.concurrency < 1:
            raise DeadmanError("--jobs, --workers and --concurrency must be at least 1")
        if not 0 <= self.kill_rate <= 1:
            raise DeadmanError("--kill-rate is a probability: 0..1")
        if self.kill_interval <= 0 or self.lease_ttl <= 0 or self.timeout <= 0:
            raise DeadmanError("--kill-interval, --lease-ttl and --timeout must be > 0")
        if self.handler_ms < 0:
            raise DeadmanError("--handler-ms must be >= 0")
        if {"hosts", "partition"} <= self.scenarios:
            raise DeadmanError("--hosts puts every worker on a host: not with --partition")

    def worker_env(self) -> dict[str, str]:
        heartbeat = self.lease_ttl / 4  # a beat may be late once without losing the lease
        return {
            "DEADMAN_LEASE_TTL_S": str(self.lease_ttl),
            "DEADMAN_HEARTBEAT_S": str(heartbeat),
            "DEADMAN_RESCUE_S": str(min(1.0, heartbeat)),
            "DEADMAN_POLL_S": "1",
            "DEADMAN_CONCURRENCY": str(self.concurrency),
            "DEADMAN_MAX_RESCUES": str(self.max_rescues),
            "DEADMAN_SHUTDOWN_GRACE_S": "5",
            "DEADMAN_LOG_FORMAT": "json",
            # warnings and errors only: leases lost, refusals, reconnects, crashes
            "DEADMAN_LOG_LEVEL": "warning",
            UNSAFE_ENV: "1" if self.unsafe_effects else "0",
        }

    def summary(self, private_cluster: bool) -> dict[str, Any]:
        """The options as the JSON report shows them."""
        return {
            "jobs": self.jobs,
            "workers": self.workers,
            "concurrency": self.concurrency,
            "kill_rate": self.kill_rate,
            "kill_interval_s": self.kill_interval,
            "lease_ttl_s": self.lease_ttl,
            "seed": self.seed,
            "submit": self.submit,
            "timeout_s": self.timeout,
            "handler_ms": self.handler_ms,
            "max_rescues": self.max_rescues,
            "unsafe_effects": self.unsafe_effects,
            "scenarios": sorted(self.scenarios),
            "database": "private cluster" if private_cluster else "--database-url",
        }
