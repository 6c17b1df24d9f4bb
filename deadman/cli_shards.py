"""``deadman shards init|check``: the one-time step that makes each shard's ids its
own (:mod:`deadman.shards.ids`), and the check the router makes before using a shard,
for every shard of ``DEADMAN_SHARDS``. One JSON line per shard; init is idempotent."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from deadman.errors import DatabaseUnavailable, DeadmanError
from deadman.shards.ids import id_range, initialise
from deadman.shards.shardmap import ShardMap

EXIT_OK, EXIT_FAILED, EXIT_UNAVAILABLE = 0, 1, 3


def add_parser(sub: Any, db_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("shards", help="queues across clusters ($DEADMAN_SHARDS): init, check")
    ssub = p.add_subparsers(dest="shards_command", required=True)
    for name, text in (
        ("init", "confine each shard's ids to its range (one-time, idempotent)"),
        ("check", "say whether each shard is reachable and initialised"),
    ):
        sp = ssub.add_parser(name, help=text)
        sp.set_defaults(func=cmd_shards, check_only=name == "check")


def cmd_shards(args: argparse.Namespace) -> int:
    """Every shard in turn, each reported; the worst outcome is the exit code (3: a
    shard unreachable, 1: one not initialised), so one bad shard hides no other."""
    shard_map = ShardMap.from_env(os.environ)
    code = EXIT_OK
    for shard in shard_map.shards:
        first, last = id_range(shard.index)
        line: dict[str, Any] = {"shard": shard.name, "index": shard.index, "ids": [first, last]}
        try:
            initialise(shard.url, shard.index, check_only=args.check_only, shard=shard.name)
            line["ok"] = True
        except DatabaseUnavailable as exc:
            line |= {"ok": False, "error": f"unavailable: {exc}"}
            code = EXIT_UNAVAILABLE
        except DeadmanError as exc:
            line |= {"ok": False, "error": str(exc)}
            code = max(code, EXIT_FAILED) if code != EXIT_UNAVAILABLE else code
        print(json.dumps(line, sort_keys=True))
    return code
