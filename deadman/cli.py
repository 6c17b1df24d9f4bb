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
        if args.metrics_port:
            passthrough += ["--metrics-port", str(args.metrics_port)]
        return Fleet(args.processes, child_command(passthrough)).run()

    from deadman.db.migrate import check_current
    from deadman.registry import Registry, load_registry
    from deadman.worker.process import Worker

    check_current(dsn)
    if args.metrics_port:
        from deadman import metrics

        metrics.serve(args.metrics_port)
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
    elif args.action == "remove":
        devdb.stop(base, remove=True)
    else:
        print(devdb.ensure_running(base))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from deadman.demo import run_demo

    return run_demo(database_url=args.database_url, devdb_base=Path(args.dir))


def cmd_serve(args: argparse.Namespace) -> int:
    """The HTTP API on uvicorn. Starts even while the database is down (then /ready
    says 503); SIGTERM/SIGINT stop accepting, let requests in flight finish, close."""
    settings = _settings(args)
    dsn = _dsn(settings)
    logs.configure(settings.log_format, settings.log_level)
    import uvicorn

    from deadman.api import create_app

    uvicorn.run(
        create_app(settings, dsn),
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
    )
    return 0


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
    w.add_argument("--metrics-port", type=int, help="serve Prometheus metrics (child i: +i)")
    w.set_defaults(func=cmd_worker)

    r = sub.add_parser("rescuer", help="run the rescuer standalone")
    db_arg(r)
    r.set_defaults(func=cmd_rescuer)

    d = sub.add_parser("devdb", help="a private Postgres under .deadman/ for demos")
    d.add_argument(
        "action",
        choices=["start", "stop", "url", "remove"],
        help="remove: stop it and delete a data directory kept under /tmp (make clean)",
    )
    d.add_argument("--dir", default=str(DEVDB_BASE))
    d.set_defaults(func=cmd_devdb)

    demo = sub.add_parser("demo", help="start everything, run a mix of jobs, show them finish")
    db_arg(demo)
    demo.add_argument("--dir", default=str(DEVDB_BASE))
    demo.set_defaults(func=cmd_demo)

    sv = sub.add_parser("serve", help="run the HTTP API")
    db_arg(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    sv.set_defaults(func=cmd_serve)

    ch = sub.add_parser("chaos", help="kill, pause and restart things under load; verify")
    db_arg(ch)  # default: a private throwaway cluster (the restart scenario needs one)
    ch.add_argument("--jobs", type=int, default=100_000)
    ch.add_argument("--workers", type=int, default=4, help="worker processes")
    ch.add_argument("--concurrency", type=int, help="handlers at once per worker (32)")
    ch.add_argument("--kill-rate", type=float, default=0.30, help="P(SIGKILL) per worker per tick")
    ch.add_argument("--kill-interval", type=float, default=2.0, help="seconds per tick")
    ch.add_argument("--lease-ttl", type=float, default=3.0, help="seconds")
    ch.add_argument("--seed", type=int, default=1, help="the fault schedule follows from it")
    ch.add_argument("--submit", choices=["http", "client"], default="http")
    ch.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run")
    ch.add_argument("--handler-ms", type=int, default=20, help="handler sleeps 0..N ms")
    ch.add_argument("--keep", action="store_true", help="leave the cluster running, print DSN")
    ch.add_argument("--unsafe-effects", action="store_true", help="negative control")
    for scenario in ("kill", "zombie", "pg-restart", "conn-kill", "outrun", "partition"):
        ch.add_argument(f"--{scenario}", action="store_true")
    ch.add_argument("--submit-faults", action="store_true", help="needs --submit http")
    ch.add_argument("--all", action="store_true", help="every scenario (the default)")
    ch.add_argument("--report", help="also write the report as JSON to this path")
    ch.set_defaults(func=cmd_chaos)

    from deadman.cli_ops import add_parsers  # jobs, dlq, queues, workers, stats, top

    add_parsers(sub, db_arg)
    return p


def cmd_chaos(args: argparse.Namespace) -> int:
    from deadman.chaos.harness import main as chaos_main

    return chaos_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except DeadmanError as exc:
        print(f"deadman: {exc}", file=sys.stderr)
        return 2
