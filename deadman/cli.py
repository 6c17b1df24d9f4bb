"""The ``deadman`` command.

Exit codes, for every subcommand (README's CLI section):

- 0: done;
- 1: not done: no such job, a job in a state the action does not apply to, a refused
  replay, or an operation that failed (a port in use, a cluster that would not start);
- 2: usage or configuration error: a bad argument or ``DEADMAN_*`` setting, wrong
  credentials, a database that does not exist, a schema this code cannot use.
  Retrying without changing something cannot help (systemd:
  ``RestartPreventExitStatus=2``);
- 3: the database is unavailable (an operator command fails at once; a starting
  worker, rescuer or migrate waits first, up to ``DEADMAN_STARTUP_WAIT_S``).
  Retrying later may help.

An operational error is one line on stderr (``deadman: ...``), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import psycopg

from deadman import devdb, eventloop, gcpolicy, logs
from deadman.cli_args import integer, queue_names
from deadman.config import Settings
from deadman.errors import ConfigError, DatabaseUnavailable, DeadmanError

DEVDB_BASE = Path(".deadman") / "pg"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    if getattr(args, "database_url", None):
        overrides["database_url"] = args.database_url
    if getattr(args, "concurrency", None) is not None:
        overrides["concurrency"] = args.concurrency
    if getattr(args, "queues", None) is not None:
        overrides["queues"] = args.queues
    return Settings.from_env(None, **overrides)


def _dsn(settings: Settings) -> str:
    if not settings.database_url:
        raise ConfigError(
            "DEADMAN_DATABASE_URL is not set (or pass --database-url); "
            "`deadman devdb start` starts a private Postgres and prints its URL"
        )
    return settings.database_url


def _wait_for_database(settings: Settings, dsn: str, process: str, *, schema: bool) -> bool:
    """Block until the database (and, with ``schema``, our schema) is there; False if
    SIGTERM/SIGINT came first. See deadman/db/startup.py."""
    from deadman.db.startup import StartupWait, wait_for_database

    wait = StartupWait(process, settings.startup_wait_s, schema=schema)
    return asyncio.run(wait_for_database(dsn, wait))


def _started(
    args: argparse.Namespace, process: str, *, schema: bool
) -> tuple[Settings, str] | None:
    """Settings, DSN and logging for a long-running command, then the wait for the
    database; None when SIGTERM/SIGINT came first (the command exits 0)."""
    settings = _settings(args)
    dsn = _dsn(settings)
    logs.configure(settings.log_format, settings.log_level)
    if not _wait_for_database(settings, dsn, process, schema=schema):
        return None
    return settings, dsn


def cmd_migrate(args: argparse.Namespace) -> int:
    from deadman.db.migrate import migrate

    started = _started(args, "migrate", schema=False)
    if started is None:
        return EXIT_OK
    applied = migrate(started[1])
    print(f"applied {applied}" if applied else "already up to date")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    from deadman.registry import Registry, load_registry
    from deadman.stackdump import dump_stacks_on_sigusr1

    # from here on, SIGUSR1 dumps stacks: a worker stuck waiting for its database
    # answers too (the Worker installs it again, for embedders)
    dump_stacks_on_sigusr1()
    settings = _settings(args)
    dsn = _dsn(settings)
    if args.metrics_port and args.metrics_port + args.processes - 1 > 65535:
        raise ConfigError("--metrics-port: fleet child i listens on port + i, past 65535")
    # The handlers first, in the supervisor too: a typo in --app is one error now,
    # not N children failing and being restarted forever.
    registry: Registry | None = load_registry(args.app) if args.app else None
    logs.configure(settings.log_format, settings.log_level)
    # A fleet waits once, before it starts children, and a database it can never use
    # (wrong password, newer schema) is exit 2 here instead of a restart loop.
    if not _wait_for_database(settings, dsn, "worker", schema=True):
        return EXIT_OK
    if args.processes > 1:
        from deadman.worker.fleet import Fleet, child_command

        passthrough: list[str] = []
        if args.app:
            passthrough += ["--app", args.app]
        if args.concurrency:
            passthrough += ["--concurrency", str(args.concurrency)]
        if args.queues:
            passthrough += ["--queues", ",".join(args.queues)]
        if args.database_url:
            passthrough += ["--database-url", args.database_url]
        if args.no_rescuer:
            passthrough += ["--no-rescuer"]
        if args.metrics_port:
            passthrough += ["--metrics-port", str(args.metrics_port)]
        return Fleet(args.processes, child_command(passthrough)).run()

    from deadman.worker.process import Worker

    if args.metrics_port:
        from deadman import metrics

        metrics.serve(args.metrics_port)
    worker = Worker(dsn, settings, registry, run_rescuer=not args.no_rescuer)

    async def main() -> int:
        worker.install_signal_handlers()
        return await worker.run()

    gcpolicy.apply(settings.gc)
    code = eventloop.run(main, settings.event_loop)
    _exit_past_stuck_threads(code)
    return code


def _exit_past_stuck_threads(code: int) -> None:
    """A thread that is not a daemon and still runs would keep the interpreter alive at
    exit (a thread a handler started itself, a library's pool). Sync handlers' own
    threads are daemons (deadman/worker/threads.py). Jobs are already released; leave
    without it."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()[1:]):
        sys.stdout.flush()
        sys.stderr.flush()
        import os

        os._exit(code)


def cmd_rescuer(args: argparse.Namespace) -> int:
    from deadman.maintenance import services
    from deadman.store import AsyncStore

    started = _started(args, "rescuer", schema=True)
    if started is None:
        return EXIT_OK
    settings, dsn = started

    async def main() -> int:
        import signal

        store = AsyncStore.create(dsn, min_size=1, max_size=2)
        await store.open()
        running = services(store, settings)  # the rescuer, the expirer, the cleaner
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        try:
            for service in running:
                service.start()
            await stopping.wait()
        finally:
            await asyncio.gather(*(service.stop() for service in running))
            await store.close()
        return 0

    return asyncio.run(main())


def cmd_devdb(args: argparse.Namespace) -> int:
    base = Path(args.dir)
    try:
        if args.action == "stop":
            devdb.stop(base)
        elif args.action == "remove":
            devdb.stop(base, remove=True)
        else:
            print(devdb.ensure_running(base))
    except RuntimeError as exc:  # devdb's errors say what failed and what to do
        print(f"deadman: devdb {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from deadman.demo import run_demo

    settings = _settings(args)  # a bad DEADMAN_* or --database-url: exit 2 before anything
    try:
        return run_demo(database_url=settings.database_url, devdb_base=Path(args.dir))
    except RuntimeError as exc:  # a private cluster that could not start
        print(f"deadman: demo: {exc}", file=sys.stderr)
        return EXIT_FAILED


def cmd_serve(args: argparse.Namespace) -> int:
    """The HTTP API on uvicorn. Starts even while the database is down (then /ready
    says 503 and its pool reconnects in the background: a health check must see the
    process up), but not with a database it can never use (wrong password, no such
    database, a newer schema): that is exit 2 at once. SIGTERM/SIGINT stop
    accepting, let requests in flight finish, close."""
    settings = _settings(args)
    dsn = _dsn(settings)
    logs.configure(settings.log_format, settings.log_level)
    import uvicorn

    from deadman.api import create_app
    from deadman.api.protocol import HttpProtocol
    from deadman.db.startup import check_once, redact
    from deadman.stackdump import dump_stacks_on_sigusr1

    not_yet = asyncio.run(check_once(dsn, schema=True))
    if not_yet is not None:
        logs.get("deadman.serve").warning(
            "database_unavailable_at_start",
            dsn=redact(dsn),
            reason=not_yet,
            action="serving anyway; /ready answers 503 until the database is back",
        )

    eventloop.loop_factory(settings.event_loop)  # uvloop asked for but missing: exit 2
    app = create_app(settings, dsn)
    gcpolicy.apply(settings.gc)
    dump_stacks_on_sigusr1()
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            http=HttpProtocol,
            loop=settings.event_loop,  # uvicorn's names: auto, uvloop, asyncio
            access_log=settings.access_log,
            log_level=settings.log_level.lower(),
            timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        )
    except SystemExit as exc:
        # uvicorn exits 3 when it cannot listen (its ERROR line above says why); our
        # 3 means "database unavailable", so this is 1: the operation failed.
        if exc.code in (None, 0):
            return EXIT_OK
        print(f"deadman: serve: cannot listen on {args.host}:{args.port}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


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
    w.add_argument("--concurrency", type=integer(1, 10_000), help="handlers at once per process")
    w.add_argument("--queues", type=queue_names, help="comma-separated queues (default: default)")
    w.add_argument("--processes", type=integer(1, 1000), default=1, help="supervise N processes")
    w.add_argument("--no-rescuer", action="store_true", help="do not run the rescuer here")
    w.add_argument(
        "--metrics-port", type=integer(1, 65535), help="serve Prometheus metrics (child i: +i)"
    )
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
    sv.add_argument("--port", type=integer(0, 65535), default=8080, help="port to listen on (8080)")
    sv.set_defaults(func=cmd_serve)

    # Subcommands that live in modules of their own, one registration each (in the
    # order --help lists them):
    from deadman import cli_chaos, cli_enqueue, cli_limits, cli_ops, cli_shards, cli_top

    cli_chaos.add_parsers(sub, db_arg)  # chaos
    cli_ops.add_parsers(sub, db_arg)  # jobs, dlq, queues, workers, stats
    cli_top.add_parsers(sub, db_arg)  # top
    cli_enqueue.add_parser(sub, db_arg)  # enqueue
    cli_limits.add_parser(sub, db_arg)  # limits ls|show|set|rm
    cli_shards.add_parser(sub, db_arg)  # shards init|check
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; turn every operational error into one line and an exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except DatabaseUnavailable as exc:
        return _error(exc, EXIT_UNAVAILABLE)
    except DeadmanError as exc:
        return _error(exc, EXIT_USAGE)
    except psycopg.OperationalError as exc:  # the database went away after start-up
        return _error(f"the database is unavailable: {exc}", EXIT_UNAVAILABLE)
    except OSError as exc:  # a port in use, a file that cannot be written
        return _error(exc, EXIT_FAILED)
    except KeyboardInterrupt:
        return 130


def _error(message: object, code: int) -> int:
    text = " ".join(str(message).split())
    # A message may quote a value that came in with undecodable bytes.
    print(f"deadman: {text}".encode("utf-8", "backslashreplace").decode(), file=sys.stderr)
    return code
