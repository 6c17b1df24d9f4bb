"""``deadman limits``: list, show, set and remove flow-control limits, with the rules
and words of ``PUT /limits/{key}`` (:class:`deadman.spec.LimitSpec`). Output is the
API's JSON; a refused field prints as ``deadman: <field>: <rule>`` (exit 2), a key
without a limit exits 1."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from deadman.api.serialize import limit_json
from deadman.cli_args import integer_text
from deadman.spec import KeyedName, LimitSpec, SpecError, validate

EXIT_OK, EXIT_NOT_FOUND = 0, 1


def add_parser(sub: Any, db_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("limits", help="flow-control limits: ls, show, set, rm")
    lsub = p.add_subparsers(dest="limits_command", required=True)
    ls = lsub.add_parser("ls", help="every limit and its live state")
    db_arg(ls)
    ls.set_defaults(func=cmd_ls)
    for name, func, text in (("show", cmd_show, "one key's limit"), ("rm", cmd_rm, "remove it")):
        sp = lsub.add_parser(name, help=text)
        db_arg(sp)
        sp.add_argument("key")
        sp.set_defaults(func=func)
    st = lsub.add_parser("set", help="create or replace a key's limit")
    db_arg(st)
    st.add_argument("key")
    st.add_argument("--concurrency", type=integer_text, help="jobs at once, fleet-wide")
    st.add_argument("--rate", metavar="COUNT/PER_MS", help="e.g. 100/60000: 100 a minute")
    st.set_defaults(func=cmd_set)


def _client(args: argparse.Namespace) -> Any:
    from deadman.cli import _dsn, _settings  # the one place settings are read
    from deadman.client import Client

    settings = _settings(args)
    return Client(_dsn(settings), settings=settings)


def _key(raw: str) -> str:
    return validate(KeyedName, {"key": raw}).key


_RATE = re.compile(r"([0-9]{1,20})/([0-9]{1,20})")


def cmd_set(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"concurrency": args.concurrency}
    if args.rate is not None:
        m = _RATE.fullmatch(args.rate)
        if m is None:
            raise SpecError([{"field": "rate", "message": "must be COUNT/PER_MS, e.g. 100/60000"}])
        body["rate"] = {"count": int(m.group(1)), "per_ms": int(m.group(2))}
    spec = validate(LimitSpec, body)  # refused before any connection
    key = _key(args.key)
    rate = (
        None if spec.rate is None else (spec.rate.count, timedelta(milliseconds=spec.rate.per_ms))
    )
    with _client(args) as client:
        limit = client.set_limit(key, concurrency=spec.concurrency, rate=rate)
    print(json.dumps(limit_json(limit), sort_keys=True))
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(json.dumps({"limits": [limit_json(x) for x in client.limits()]}, sort_keys=True))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    key = _key(args.key)
    with _client(args) as client:
        found = client.limit(key)
    if found is None:
        print(f"deadman: no limit for key {key}")
        return EXIT_NOT_FOUND
    print(json.dumps(limit_json(found), sort_keys=True))
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    key = _key(args.key)
    with _client(args) as client:
        removed = client.delete_limit(key)
    if not removed:
        print(f"deadman: no limit for key {key}")
        return EXIT_NOT_FOUND
    return EXIT_OK
