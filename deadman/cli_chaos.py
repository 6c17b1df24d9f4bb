"""``deadman chaos``: its arguments, and the harness they run (deadman/chaos/)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from deadman.cli_args import integer, number
from deadman.config import Settings


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    db_arg: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Register ``chaos`` on ``deadman``'s subparsers."""
    ch = sub.add_parser("chaos", help="kill, pause and restart things under load; verify")
    db_arg(ch)  # default: a private throwaway cluster (the restart scenario needs one)
    ch.add_argument("--jobs", type=integer(1, 10_000_000), default=100_000)
    ch.add_argument("--workers", type=integer(1, 64), default=4, help="worker processes")
    ch.add_argument(
        "--concurrency", type=integer(1, 10_000), help="handlers at once per worker (32)"
    )
    ch.add_argument(
        "--kill-rate", type=number(0, 1), default=0.30, help="P(SIGKILL) per worker per tick"
    )
    ch.add_argument(
        "--kill-interval", type=number(0.01, 3600), default=2.0, help="seconds per tick"
    )
    ch.add_argument("--lease-ttl", type=number(0.1, 3600), default=3.0, help="seconds")
    ch.add_argument(
        "--seed", type=integer(0, 2**63 - 1), default=1, help="the fault schedule follows from it"
    )
    ch.add_argument("--submit", choices=["http", "client"], default="http")
    ch.add_argument(
        "--timeout", type=number(1, 86400), default=900.0, help="seconds for the whole run"
    )
    ch.add_argument(
        "--handler-ms", type=integer(0, 3_600_000), default=20, help="handler sleeps 0..N ms"
    )
    ch.add_argument(
        "--max-rescues",
        type=integer(0, 1000),
        default=Settings().max_rescues,
        help="the workers' DEADMAN_MAX_RESCUES: rescues before a job is claimed alone, and "
        "one more while alone ends it dead as a poison pill (random kills at a high rate "
        "can do that to an innocent job)",
    )
    ch.add_argument("--keep", action="store_true", help="leave the cluster running, print DSN")
    ch.add_argument("--unsafe-effects", action="store_true", help="negative control")
    for scenario in ("kill", "zombie", "pg-restart", "conn-kill", "outrun", "partition", "limits"):
        ch.add_argument(f"--{scenario}", action="store_true")
    ch.add_argument("--submit-faults", action="store_true", help="needs --submit http")
    ch.add_argument(
        "--operators",
        action="store_true",
        help="operator actions (cancel, retry, replay, pause, 1 s retention) under kills; "
        "own database",
    )
    ch.add_argument(
        "--handoffs",
        action="store_true",
        help="jobs enqueued one at a time, handed off to idle workers' parked slots, under "
        "kills; own database",
    )
    ch.add_argument(
        "--hosts",
        action="store_true",
        help="API and two worker hosts in network namespaces, one cut off and healed, "
        "one's clock hours off (needs root and libfaketime; not in --all)",
    )
    ch.add_argument("--all", action="store_true", help="every scenario but --hosts (the default)")
    ch.add_argument("--report", help="also write the report as JSON to this path")
    ch.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    from deadman.chaos.harness import main as chaos_main

    return chaos_main(args)
