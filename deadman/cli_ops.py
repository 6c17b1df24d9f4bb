"""The operator's commands: ``deadman jobs|dlq|queues|workers|stats`` (and ``top``, in
cli_top.py, on the same plumbing).

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
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rich.table import Table
from rich.text import Text

from deadman import bounds, cli_args
from deadman.api.routes_ops import queue_json, stats_json
from deadman.api.serialize import attempt_json, job_json, worker_json
from deadman.cli_tables import (
    console,
    jobs_table,
    print_json,
    queues_table,
    short,
    workers_table,
)
from deadman.config import Settings
from deadman.db.startup import require_ready
from deadman.errors import translate
from deadman.model import Job, JobState, validate_queue, validate_type
from deadman.store import AsyncStore, ListParams

T = TypeVar("T")

OK, NOT_FOUND, USAGE = 0, 1, 2


# --------------------------------------------------------------------------- plumbing


def settings_dsn(args: argparse.Namespace) -> tuple[Settings, str]:
    from deadman.cli import _dsn, _settings  # the one place settings are read

    settings = _settings(args)
    return settings, _dsn(settings)


def _run(args: argparse.Namespace, work: Callable[[AsyncStore, Settings], Awaitable[T]]) -> T:
    """Open a small pool, run ``work`` on it, close it. No retries: an operator (or
    a script) sees a database outage at once, as exit code 3 (deadman.cli)."""
    settings, dsn = settings_dsn(args)

    async def main() -> T:
        store = await open_store(dsn)
        try:
            return await work(store, settings)
        finally:
            await store.close()

    return asyncio.run(main())


async def open_store(dsn: str) -> AsyncStore:
    """One plain connection first: it fails in milliseconds with the reason (refused,
    wrong password, no schema) where the pool would retry quietly for its timeout."""
    await require_ready(dsn)
    store = AsyncStore.create(dsn, min_size=1, max_size=2, retry_s=0, timeout=10.0)
    with translate():  # a PoolTimeout if it went away in between: DatabaseUnavailable
        await store.open(wait=True, timeout=10.0)
    return store


def _fail(message: str, code: int = NOT_FOUND) -> int:
    print(f"deadman: {message}", file=sys.stderr)
    return code


# --------------------------------------------------------------------------- jobs


def _list(args: argparse.Namespace, state: JobState | None, title: str) -> int:
    """One page of jobs, newest first (``jobs ls``, ``dlq ls``)."""
    p = ListParams(
        limit=args.limit, state=state, type=args.type, queue=args.queue, before_id=args.before
    )
    page = _run(args, lambda s, _: s.job_list(p))
    if args.json:
        print_json({"jobs": [job_json(j) for j in page.jobs], "next_before": page.next_before})
    else:
        console().print(jobs_table(page.jobs, f"{title} (newest first, {len(page.jobs)} shown)"))
        if page.next_before is not None:
            print(f"next page: --before {page.next_before}")
            if page.window_ended:
                print(
                    f"(this page looked through the {bounds.LIST_WINDOW:,} jobs below its cursor)"
                )
    return OK


def cmd_jobs_ls(args: argparse.Namespace) -> int:
    return _list(args, args.state, "jobs")


def cmd_jobs_show(args: argparse.Namespace) -> int:
    async def work(store: AsyncStore, _: Settings) -> tuple[Job | None, list[Any]]:
        job = await store.job_get(args.id)
        return job, (await store.job_attempts(args.id) if job else [])

    job, attempts = _run(args, work)
    if job is None:
        return _fail(f"no job {args.id}")
    if args.json:
        print_json({**job_json(job), "attempts": [attempt_json(a) for a in attempts]})
        return OK
    out = console()
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
            short(aj["error"]),
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
        print_json(job_json(done))
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
    return _list(args, JobState.DEAD, "dead letters")


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
        print_json({"replayed": [str(i) for i in replayed], "refused": refused})
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
            print_json({"queues": queues})
        else:
            console().print(queues_table(queues))
        return OK
    if args.name is None:
        return _fail(f"usage: deadman queues {args.action} NAME", USAGE)
    name = args.name
    row = _run(args, lambda s, _: s.queue_set_paused(name, args.action == "pause"))
    if args.json:
        print_json(queue_json(row))
    else:
        print(f"queue {name}: {'paused' if row['paused'] else 'running'}")
    return OK


async def worker_rows(store: AsyncStore, settings: Settings) -> list[dict[str, Any]]:
    rows = await store.worker_list(int(settings.lease_ttl_s * 1000))
    return [worker_json(r) for r in rows]


def cmd_workers(args: argparse.Namespace) -> int:
    workers = _run(args, worker_rows)
    if args.json:
        print_json({"workers": workers})
    else:
        console().print(workers_table(workers))
    return OK


def cmd_stats(args: argparse.Namespace) -> int:
    async def work(store: AsyncStore, _: Settings) -> dict[str, Any]:
        return stats_json(await store.queue_list(), await store.job_counts_finished())

    body = _run(args, work)
    if args.json:
        print_json(body)
        return OK
    approx = "~" if body["estimated"] else ""
    t = Table(title=f"jobs by state ({approx}{body['total']} total)", title_justify="left")
    t.add_column("state")
    t.add_column("jobs", justify="right")
    for state, n in body["jobs"].items():
        t.add_row(state, f"~{n} (estimate)" if state in body["estimated"] else str(n))
    console().print(t)
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
        sp.add_argument(
            "--type", type=cli_args.validated(validate_type), help="only jobs of this type"
        )
        sp.add_argument(
            "--queue", type=cli_args.validated(validate_queue), help="only jobs of this queue"
        )

    def page(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--limit", type=cli_args.page_limit, default=50, help="rows per page (1-1000, 50)"
        )
        sp.add_argument("--before", type=cli_args.job_id, help="jobs with a smaller id (next page)")

    jobs = sub.add_parser("jobs", help="list, show, cancel and retry jobs")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    ls = common(jsub.add_parser("ls", help="list jobs, newest first"))
    ls.add_argument("--state", type=cli_args.job_state)
    filters(ls)
    page(ls)
    ls.set_defaults(func=cmd_jobs_ls)
    for name, func, text in (
        ("show", cmd_jobs_show, "a job with its payload, result and attempts"),
        ("cancel", cmd_jobs_cancel, "cancel a job (a running one cooperatively)"),
        ("retry", cmd_jobs_retry, "retry a dead or cancelled job"),
    ):
        sp = common(jsub.add_parser(name, help=text))
        sp.add_argument("id", type=cli_args.job_id)
        sp.set_defaults(func=func)

    dlq = sub.add_parser("dlq", help="dead letters: list and replay")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    dls = common(dsub.add_parser("ls", help="dead jobs, newest first"))
    filters(dls)
    page(dls)
    dls.set_defaults(func=cmd_dlq_ls)
    rp = common(dsub.add_parser("replay", help="replay dead jobs by id, or in bulk"))
    rp.add_argument("ids", nargs="*", type=cli_args.job_id, metavar="ID")
    filters(rp)
    rp.add_argument("--all", action="store_true", help="every dead job (with filters: those)")
    rp.set_defaults(func=cmd_dlq_replay)

    q = common(sub.add_parser("queues", help="queues; `queues pause|resume NAME`"))
    q.add_argument("action", nargs="?", choices=["pause", "resume"])
    q.add_argument("name", nargs="?", type=cli_args.validated(validate_queue))
    q.set_defaults(func=cmd_queues)

    common(sub.add_parser("workers", help="worker processes and their heartbeats")).set_defaults(
        func=cmd_workers
    )
    common(sub.add_parser("stats", help="job counts by state")).set_defaults(func=cmd_stats)
