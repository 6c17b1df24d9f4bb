"""The ``deadman`` command."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from deadman import devdb, logs
from deadman.config import Settings
from deadman.errors import ConfigError, DeadmanError

DEVDB_BASE = Path(".deadman") / "pg"


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    if getattr(args, "database_url", None):
        overrides["database_url"] = args.database_url
    if getattr(args, "concurrency", None):
        overrides["concurrency"] = args.concurrency
    if getattr(args, "queues", None):
        overrides["queues"] = tuple(q.strip() for q in args.queues.split(",") if q.strip())
    return Settings.from_env(None, **overrides)


def _dsn(settings: Settings) -> str:
    if not settings.database_url:
        raise ConfigError(
            "DEADMAN_DATABASE_URL is not set (or pass --database-url); "
            "`deadman devdb start` starts a private Postgres and prints its URL"
        )
    return settings.database_url


def cmd_migrate(args: argparse.Namespace) -> int:
    from deadman.db.migrate import migrate

    applied = migrate(_dsn(_settings(args)))
    print(f"applied {applied}" if applied else "already up to date")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    dsn = _dsn(settings)
    logs.configure(settings.log_format, settings.log_level)
    if args.processes > 1:
        from deadman.worker.fleet import Fleet, child_command

        passthrough: list[str] = []
        if args.app:
            passthrough += ["--app", args.app]
        if args.concurrency:
            passthrough += ["--concurrency", str(args.concurrency)]
        if args.queues:
            passthrough += ["--queues", args.queues]
        if args.database_url:
            passthrough += ["--database-url", args.database_url]
        if args.no_rescuer:
            passthrough += ["--no-rescuer"]
        return Fleet(args.processes, child_command(passthrough)).run()

    from deadman.db.migrate import check_current
    from deadman.registry import Registry, load_registry
    from deadman.worker.process import Worker

    check_current(dsn)
    registry: Registry | None = load_registry(args.app) if args.app else None
    worker = Worker(dsn, settings, registry, run_rescuer=not args.no_rescuer)

    async def main() -> int:
        worker.install_signal_handlers()
        return await worker.run()

    code = asyncio.run(main())
    _exit_past_stuck_threads(code)
    return code


def _exit_past_stuck_threads(code: int) -> None:
    """A sync handler that ignores cancellation would keep the interpreter alive at
    exit (thread pools are joined). Its job is already released; leave without it."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()[1:]):
        sys.stdout.flush()
        sys.stderr.flush()
        import os

        os._exit(code)


def cmd_rescuer(args: argparse.Namespace) -> int:
    settings = _settings(args)
    dsn = _dsn(settings)
    logs.configure(settings.log_format, settings.log_level)
    from deadman.db.migrate import check_current
    from deadman.rescuer import Rescuer
    from deadman.store import AsyncStore

    check_current(dsn)

    async def main() -> int:
        import signal

        store = AsyncStore.create(dsn, min_size=1, max_size=2)
        await store.open()
        rescuer = Rescuer(store, settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, rescuer.stop)
        try:
            await rescuer.run()
        finally:
            await store.close()
        return 0

    return asyncio.run(main())


def cmd_devdb(args: argparse.Namespace) -> int:
    base = Path(args.dir)
    if args.action == "start":
        print(devdb.ensure_running(base))
    elif args.action == "stop":
        devdb.stop(base)
    else:
        print(devdb.ensure_running(base))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from deadman.demo import run_demo

    return run_demo(database_url=args.database_url, devdb_base=Path(args.dir))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deadman", description="A Postgres-backed job queue.")
    sub = p.add_subparsers(dest="command", required=True)

    def db_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--database-url", help="default: $DEADMAN_DATABASE_URL")

    m = sub.add_parser("migrate", help="apply database migrations")
    db_arg(m)
    m.set_defaults(func=cmd_migrate)

    w = sub.add_parser("worker", help="run worker processes")
    db_arg(w)
    w.add_argument("--app", help="pkg.module:registry with your handlers")
    w.add_argument("--concurrency", type=int, help="handlers at once per process")
    w.add_argument("--queues", help="comma-separated queue names (default: default)")
    w.add_argument("--processes", type=int, default=1, help="supervise N processes")
    w.add_argument("--no-rescuer", action="store_true", help="do not run the rescuer here")
    w.set_defaults(func=cmd_worker)

    r = sub.add_parser("rescuer", help="run the rescuer standalone")
    db_arg(r)
    r.set_defaults(func=cmd_rescuer)

    d = sub.add_parser("devdb", help="a private Postgres under .deadman/ for demos")
    d.add_argument("action", choices=["start", "stop", "url"])
    d.add_argument("--dir", default=str(DEVDB_BASE))
    d.set_defaults(func=cmd_devdb)

    demo = sub.add_parser("demo", help="start everything, run a mix of jobs, show them finish")
    db_arg(demo)
    demo.add_argument("--dir", default=str(DEVDB_BASE))
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except DeadmanError as exc:
        print(f"deadman: {exc}", file=sys.stderr)
        return 2
