"""``deadman enqueue``: submit one job from a shell, with the same rules and the same
words of refusal as ``POST /jobs`` and ``Client.enqueue`` (all three check
:class:`deadman.JobSpec`).

``deadman enqueue email.send --payload '{"to": "a@b.c"}' --max-attempts 5``, or the
whole ``POST /jobs`` body with ``--body '{...}'``. A refused field is printed as
``deadman: <field>: <rule>`` and exits 2; the job is printed as the API's JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from deadman.api.problems import Problem
from deadman.api.schema import loads
from deadman.api.serialize import job_json
from deadman.cli_args import integer_text
from deadman.spec import JobSpec, SpecError, validate

EXIT_OK, EXIT_USAGE = 0, 2
#: flag -> the JobSpec field it sets, and how its text becomes the field's JSON value
_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "queue": ("queue", str),
    "priority": ("priority", int),
    "max_attempts": ("max_attempts", int),
    "delay_ms": ("delay_ms", int),
    "run_at": ("run_at", str),
    "timeout_ms": ("timeout_ms", int),
    "start_by": ("start_by", str),
    "deadline": ("deadline", str),
    "heartbeat_timeout_ms": ("heartbeat_timeout_ms", int),
    "limit_key": ("limit_key", str),
}


def add_parser(sub: Any, db_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("enqueue", help="submit one job (the rules of POST /jobs)")
    db_arg(p)
    p.add_argument("type", nargs="?", help="the job's type (or give it in --body)")
    p.add_argument("--payload", help="the payload as JSON (default null)")
    p.add_argument("--body", help="the whole POST /jobs body as JSON; flags override it")
    for flag, (_, parse) in _FIELDS.items():
        p.add_argument(
            "--" + flag.replace("_", "-"), dest=flag, type=integer_text if parse is int else str
        )
    p.add_argument("--depends-on", action="append", metavar="ID", help="repeat for several")
    p.add_argument("--idempotency-key", help="as the Idempotency-Key header")
    p.set_defaults(func=cmd_enqueue)


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /jobs body the flags describe; Problem or SpecError if it is broken."""
    body: Any = loads(os.fsencode(args.body)) if args.body is not None else {}
    if not isinstance(body, dict):
        raise SpecError([{"field": "body", "message": "must be a JSON object"}])
    if args.type is not None:
        body["type"] = args.type
    if args.payload is not None:
        body["payload"] = loads(os.fsencode(args.payload))
    for flag, (field, _) in _FIELDS.items():
        value = getattr(args, flag)
        if value is not None:
            body[field] = value
    if args.depends_on:
        body["depends_on"] = list(args.depends_on)
    return body


def cmd_enqueue(args: argparse.Namespace) -> int:
    from deadman.cli import _dsn, _settings  # the one place settings are read
    from deadman.client import Client

    try:
        spec = validate(JobSpec, body_of(args))
    except SpecError as exc:
        return _refuse([f"{e['field']}: {e['message']}" for e in exc.errors])
    except Problem as exc:
        return _refuse([f"{e['field']}: {e['message']}" for e in exc.errors] or [exc.detail])
    settings = _settings(args)
    with Client(_dsn(settings), settings=settings) as client:
        job = client.submit(spec, idempotency_key=args.idempotency_key)
    print(json.dumps(job_json(job), sort_keys=True))
    return EXIT_OK


def _refuse(lines: list[str]) -> int:
    for line in lines:
        text = f"deadman: {line}".encode("utf-8", "backslashreplace").decode()
        print(text, file=sys.stderr)
    return EXIT_USAGE
