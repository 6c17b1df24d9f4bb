"""The operator's commands: ``deadman jobs|dlq|queues|workers|stats|top``.

They use the same async store methods as the HTTP API (one short-lived pool per
command, run with ``asyncio.run``), so the CLI and the API can never disagree about
what a cancel or a replay means. Every command prints a rich table for people or,
with ``--json``, the API's JSON shapes for scripts. Exit codes: 0 ok, 1 not found or
conflict (the job does not exist, or is in a state the action does not apply to),
2 usage or configuration error, 3 database unavailable (``deadman.cli`` documents
them and maps the errors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from deadman.api.routes_ops import LIVE_STATES, queue_json, stats_json
from deadman.api.serialize import attempt_json, job_json, worker_json
from deadman.config import Settings
from deadman.db.startup import require_ready
from deadman.errors import InvalidJob, translate
from deadman.model import Job, JobState, validate_queue, validate_type
from deadman.store import AsyncStore, ListParams
from deadman.store.reads import throughput_series

T = TypeVar("T")

OK, NOT_FOUND, USAGE = 0, 1, 2
SPARK = "▁▂▃▄▅▆▇█"


# --------------------------------------------------------------------------- plumbing


def _settings_dsn(args: argparse.Namespace) -> tuple[Settings, str]:
    from deadman.cli import _dsn, _settings  # the one place settings are read

    settings = _settings(args)
    return settings, _dsn(settings)


def _run(args: argparse.Namespace, work: Callable[[AsyncStore, Settings], Awaitable[T]]) -> T:
    """Open a small pool, run ``work`` on it, close it. No retries: an operator (or
    a script) sees a database outage at once, as exit code 3 (deadman.cli)."""
    settings, dsn = _settings_dsn(args)

    async def main() -> T:
        store = await _open_store(dsn)
        try:
            return await work(store, settings)
        finally:
            await store.close()

    return asyncio.run(main())


async def _open_store(dsn: str) -> AsyncStore:
    """One plain connection first: it fails in milliseconds with the reason (refused,
    wrong password, no schema) where the pool would retry quietly for its timeout."""
    await require_ready(dsn)
    store = AsyncStore.create(dsn, min_size=1, max_size=2, retry_s=0, timeout=10.0)
    with translate():  # a PoolTimeout if it went away in between: DatabaseUnavailable
        await store.open(wait=True, timeout=10.0)
    return store


def _console() -> Console:
    # A pipe or a test's captured stdout has no width; 160 keeps ids and times whole.
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def _fail(message: str, code: int = NOT_FOUND) -> int:
    print(f"deadman: {message}", file=sys.stderr)
    return code


def _age(value: str | datetime | None) -> str:
    if value is None:
        return "-"
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    seconds = (datetime.now(UTC) - when).total_seconds()
    if seconds < 0:
        return f"in {_span(-seconds)}"
    return f"{_span(seconds)} ago"


def _span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _short(text: str | None, width: int = 60) -> str:
    """The line that says what went wrong: a traceback's last line, not its first."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= width else line[: width - 1] + "…"


#: Ids are bigints; a larger number is a typo to report, not a query to send.
MAX_ID = 2**63 - 1


def _job_id(value: str) -> int:
    # isdigit() alone is true for '²', which int() refuses, and int() takes '١٢'
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise argparse.ArgumentTypeError(f"job id must be a positive integer, not {_shown(value)}")
    n = int(value)
    if not 1 <= n <= MAX_ID:
        raise argparse.ArgumentTypeError(f"job id must be from 1 to {MAX_ID}")
    return n


def _limit(value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 4 and 1 <= int(value) <= 1000):
        raise argparse.ArgumentTypeError("limit must be an integer from 1 to 1000")
    return int(value)


def _interval(value: str) -> float:
    try:
        seconds = float(value) if value.isascii() else math.nan
    except ValueError:
        seconds = math.nan
    if not 0.1 <= seconds <= 3600:  # also false for nan
        raise argparse.ArgumentTypeError("interval must be 0.1 to 3600 seconds")
    return seconds


def _shown(value: str, width: int = 40) -> str:
    """A value as an error message may quote it: escaped and cut short."""
    return repr(value if len(value) <= width else value[:width] + "...")


def _state(value: str) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        names = ", ".join(s.value for s in JobState)
        raise argparse.ArgumentTypeError(f"state must be one of {names}") from None


def _filter(check: Callable[[str], str]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        try:
            return check(value)
        except InvalidJob as exc:  # the message quotes the value: keep it short
            message = str(exc)
            raise argparse.ArgumentTypeError(
                message if len(message) <= 200 else f"{_shown(value)}: {message[-60:]}"
            ) from None

    return parse


# --------------------------------------------------------------------------- tables


def _jobs_table(jobs: Sequence[Job], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("id", "type", "queue", "state", "attempt", "run_at", "finished", "last error"):
        t.add_column(col, justify="right" if col == "id" else "left", no_wrap=col != "last error")
    for j in jobs:
        t.add_row(
            str(j.id),
            j.type,
            j.queue,
            j.state.value,
            f"{j.attempt}/{j.max_attempts}",
            _age(j.run_at),
            _age(j.finished_at),
            _short(j.last_error),
        )
    return t


def _queues_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title="queues (unfinished jobs, exact)", title_justify="left")
    t.add_column("queue")
    t.add_column("paused")
    for col in LIVE_STATES:
        t.add_column(col, justify="right")
    t.add_column("oldest due", justify="right")
    for q in rows:
        age = q["oldest_due_age_s"]
        t.add_row(
            q["name"],
            "PAUSED" if q["paused"] else "",
            *(str(q["counts"][s]) for s in LIVE_STATES),
            "-" if age is None else _span(age),
        )
    return t


def _workers_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title="workers", title_justify="left")
    for col in ("id", "host", "pid", "queues", "jobs", "alive", "last heartbeat"):
        t.add_column(col, justify="right" if col in ("pid", "jobs") else "left")
    for w in rows:
        t.add_row(
            w["id"],
            w["hostname"],
            str(w["pid"]),
            ",".join(w["queues"]),
            f"{w['jobs_held']}/{w['concurrency']}",
            "yes" if w["alive"] else "NO",
            _age(w["last_heartbeat_at"]),
        )
    return t


def sparkline(values: Sequence[int]) -> str:
    """Unicode block sparkline, scaled to the largest value (all blank when idle)."""
    top = max(values, default=0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, v * (len(SPARK) - 1) // top)] for v in values)


# --------------------------------------------------------------------------- jobs


def cmd_jobs_ls(args: argparse.Namespace) -> int:
    p = ListParams(
        limit=args.limit, state=args.state, type=args.type, queue=args.queue, before_id=args.before
    )
    jobs = _run(args, lambda s, _: s.job_list(p))
    if args.json:
        _print_json({"jobs": [job_json(j) for j in jobs]})
    else:
        _console().print(_jobs_table(jobs, f"jobs (newest first, {len(jobs)} shown)"))
        if len(jobs) == args.limit:
            print(f"next page: --before {jobs[-1].id}")
    return OK


def cmd_jobs_show(args: argparse.Namespace) -> int:
    async def work(store: AsyncStore, _: Settings) -> tuple[Job | None, list[Any]]:
        job = await store.job_get(args.id)
        return job, (await store.job_attempts(args.id) if job else [])

    job, attempts = _run(args, work)
    if job is None:
        return _fail(f"no job {args.id}")
    if args.json:
        _print_json({**job_json(job), "attempts": [attempt_json(a) for a in attempts]})
        return OK
    out = _console()
    t = Table(title=f"job {job.id}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value")
    body = job_json(job)
    for key in ("type", "queue", "state", "priority", "attempt", "max_attempts", "run_at"):
        t.add_row(key, str(body[key]))
    for key in ("created_at", "started_at", "finished_at", "idempotency_key"):
        t.add_row(key, str(body[key] or "-"))
    if job.lease:
        t.add_row("lease", f"worker {job.lease.worker}, token {job.lease.token}")
    t.add_row("payload", Text(json.dumps(job.payload, indent=2)))
    t.add_row("result", Text(json.dumps(job.result, indent=2)))
    t.add_row("last_error", Text(job.last_error or "-"))
    out.print(t)
    h = Table(title="attempts", title_justify="left")
    for col in ("#", "lease token", "worker", "started", "finished", "outcome", "error"):
        h.add_column(col)
    for a in attempts:
        aj = attempt_json(a)
        h.add_row(
            str(aj["attempt"]),
            aj["lease_token"],
            aj["worker"] or "-",
            aj["started_at"] or "-",
            aj["finished_at"] or "-",
            aj["outcome"],
            _short(aj["error"]),
        )
    out.print(h)
    return OK


def _act(args: argparse.Namespace, action: str) -> int:
    """cancel or retry one job; 1 (with the reason) when it is missing or not eligible."""

    async def work(store: AsyncStore, _: Settings) -> tuple[Job | None, str]:
        if action == "retry":
            done = await store.job_retry(args.id)
            why = None if done else await store.job_retry_refusal(args.id)
            return done, why or f"no job {args.id}"
        done = await store.job_cancel(args.id)
        current = None if done else await store.job_get(args.id)
        if current is None:
            return done, f"no job {args.id}"
        return done, f"job {args.id} is {current.state.value}: cannot {action} it"

    done, why = _run(args, work)
    if done is None:
        return _fail(why)
    if args.json:
        _print_json(job_json(done))
    elif action == "cancel" and done.state is JobState.RUNNING:
        print(f"job {done.id}: cancel requested (it is running; its worker will stop it)")
    else:
        print(f"job {done.id}: {done.state.value}")
    return OK


def cmd_jobs_cancel(args: argparse.Namespace) -> int:
    return _act(args, "cancel")


def cmd_jobs_retry(args: argparse.Namespace) -> int:
    return _act(args, "retry")


# --------------------------------------------------------------------------- dlq


def cmd_dlq_ls(args: argparse.Namespace) -> int:
    p = ListParams(
        limit=args.limit,
        state=JobState.DEAD,
        type=args.type,
        queue=args.queue,
        before_id=args.before,
    )
    jobs = _run(args, lambda s, _: s.job_list(p))
    if args.json:
        _print_json({"jobs": [job_json(j) for j in jobs]})
    else:
        _console().print(_jobs_table(jobs, f"dead letters (newest first, {len(jobs)} shown)"))
        if len(jobs) == args.limit:
            print(f"next page: --before {jobs[-1].id}")
    return OK


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    """By id (dead or cancelled jobs, as POST /jobs/{id}/retry), or in bulk: every dead
    job matching --type/--queue; a bulk replay of everything needs --all, so a typo
    in a filter can never replay the whole dead-letter queue."""
    bulk = args.all or args.type is not None or args.queue is not None
    if bool(args.ids) == bulk:
        return _fail("give job ids, or --type/--queue/--all (not both)", USAGE)

    async def work(store: AsyncStore, _: Settings) -> tuple[list[int], list[str]]:
        if bulk:
            return await store.job_retry_dead_many(args.type, args.queue), []
        replayed: list[int] = []
        refused: list[str] = []
        for job_id in args.ids:
            if await store.job_retry(job_id):
                replayed.append(job_id)
                continue
            refused.append(await store.job_retry_refusal(job_id) or f"no job {job_id}")
        return replayed, refused

    replayed, refused = _run(args, work)
    if args.json:
        _print_json({"replayed": [str(i) for i in replayed], "refused": refused})
    else:
        print(f"replayed {len(replayed)} job(s)")
    for reason in refused:
        print(f"deadman: {reason}", file=sys.stderr)
    return NOT_FOUND if refused else OK


# --------------------------------------------------------------------------- queues, workers


def cmd_queues(args: argparse.Namespace) -> int:
    if args.action is None:
        if args.name is not None:
            return _fail("usage: deadman queues [pause|resume NAME]", USAGE)
        queues = [queue_json(r) for r in _run(args, lambda s, _: s.queue_list())]
        if args.json:
            _print_json({"queues": queues})
        else:
            _console().print(_queues_table(queues))
        return OK
    if args.name is None:
        return _fail(f"usage: deadman queues {args.action} NAME", USAGE)
    name = args.name
    row = _run(args, lambda s, _: s.queue_set_paused(name, args.action == "pause"))
    if args.json:
        _print_json(queue_json(row))
    else:
        print(f"queue {name}: {'paused' if row['paused'] else 'running'}")
    return OK


async def _workers(store: AsyncStore, settings: Settings) -> list[dict[str, Any]]:
    rows = await store.worker_list(int(settings.lease_ttl_s * 1000))
    return [worker_json(r) for r in rows]


def cmd_workers(args: argparse.Namespace) -> int:
    workers = _run(args, _workers)
    if args.json:
        _print_json({"workers": workers})
    else:
        _console().print(_workers_table(workers))
    return OK


def cmd_stats(args: argparse.Namespace) -> int:
    async def work(store: AsyncStore, _: Settings) -> dict[str, Any]:
        return stats_json(await store.queue_list(), await store.job_counts_finished())

    body = _run(args, work)
    if args.json:
        _print_json(body)
        return OK
    approx = "~" if body["estimated"] else ""
    t = Table(title=f"jobs by state ({approx}{body['total']} total)", title_justify="left")
    t.add_column("state")
    t.add_column("jobs", justify="right")
    for state, n in body["jobs"].items():
        t.add_row(state, f"~{n} (estimate)" if state in body["estimated"] else str(n))
    _console().print(t)
    return OK


# --------------------------------------------------------------------------- top


async def _snapshot(store: AsyncStore, settings: Settings) -> RenderableType:
    minutes = 30
    queues = [queue_json(r) for r in await store.queue_list()]
    series = throughput_series(await store.throughput_recent(minutes), minutes)
    workers = await _workers(store, settings)
    t = Table(title=f"throughput (succeeded/min, last {minutes} min)", title_justify="left")
    t.add_column("queue")
    t.add_column("last min", justify="right")
    t.add_column("trend")
    for name in sorted({q["name"] for q in queues} | set(series)):
        values = series.get(name, [0] * minutes)
        t.add_row(name, str(values[-1]), sparkline(values))
    stamp = datetime.now(UTC).strftime("%H:%M:%SZ")
    return Group(
        Text(f"deadman top · {stamp} · Ctrl-C to quit", style="bold"),
        _queues_table(queues),
        t,
        _workers_table(workers),
    )


def cmd_top(args: argparse.Namespace) -> int:
    """A live view, redrawn every --interval seconds with one short pool for the whole
    session (each refresh runs the same cheap queries as the API)."""
    settings, dsn = _settings_dsn(args)

    async def main() -> int:
        store = await _open_store(dsn)
        try:
            if args.once:
                _console().print(await _snapshot(store, settings))
                return OK
            with Live(await _snapshot(store, settings), screen=False, auto_refresh=False) as live:
                while True:
                    await asyncio.sleep(args.interval)
                    live.update(await _snapshot(store, settings), refresh=True)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return OK


# --------------------------------------------------------------------------- parsers


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    db_arg: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Register the operator commands on ``deadman``'s subparsers."""

    def common(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        db_arg(sp)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    def filters(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--type", type=_filter(validate_type), help="only jobs of this type")
        sp.add_argument("--queue", type=_filter(validate_queue), help="only jobs of this queue")

    def page(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--limit", type=_limit, default=50, help="rows per page (1-1000, 50)")
        sp.add_argument("--before", type=_job_id, help="jobs with a smaller id (next page)")

    jobs = sub.add_parser("jobs", help="list, show, cancel and retry jobs")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    ls = common(jsub.add_parser("ls", help="list jobs, newest first"))
    ls.add_argument("--state", type=_state)
    filters(ls)
    page(ls)
    ls.set_defaults(func=cmd_jobs_ls)
    for name, func, text in (
        ("show", cmd_jobs_show, "a job with its payload, result and attempts"),
        ("cancel", cmd_jobs_cancel, "cancel a job (a running one cooperatively)"),
        ("retry", cmd_jobs_retry, "retry a dead or cancelled job"),
    ):
        sp = common(jsub.add_parser(name, help=text))
        sp.add_argument("id", type=_job_id)
        sp.set_defaults(func=func)

    dlq = sub.add_parser("dlq", help="dead letters: list and replay")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    dls = common(dsub.add_parser("ls", help="dead jobs, newest first"))
    filters(dls)
    page(dls)
    dls.set_defaults(func=cmd_dlq_ls)
    rp = common(dsub.add_parser("replay", help="replay dead jobs by id, or in bulk"))
    rp.add_argument("ids", nargs="*", type=_job_id, metavar="ID")
    filters(rp)
    rp.add_argument("--all", action="store_true", help="every dead job (with filters: those)")
    rp.set_defaults(func=cmd_dlq_replay)

    q = common(sub.add_parser("queues", help="queues; `queues pause|resume NAME`"))
    q.add_argument("action", nargs="?", choices=["pause", "resume"])
    q.add_argument("name", nargs="?", type=_filter(validate_queue))
    q.set_defaults(func=cmd_queues)

    common(sub.add_parser("workers", help="worker processes and their heartbeats")).set_defaults(
        func=cmd_workers
    )
    common(sub.add_parser("stats", help="job counts by state")).set_defaults(func=cmd_stats)

    top = sub.add_parser("top", help="a live view of queues, throughput and workers")
    db_arg(top)
    top.add_argument(
        "--interval", type=_interval, default=2.0, help="seconds between refreshes (0.1-3600)"
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(func=cmd_top)
