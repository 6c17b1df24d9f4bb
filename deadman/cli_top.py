"""``deadman top``: a live view of queues, throughput and workers, redrawn in place."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from deadman.api.routes_ops import queue_json
from deadman.cli_args import interval
from deadman.cli_ops import OK, open_store, settings_dsn, worker_rows
from deadman.cli_tables import console, queues_table, sparkline, workers_table
from deadman.config import Settings
from deadman.store import AsyncStore
from deadman.store.limits import Limit
from deadman.store.reads import throughput_series
from deadman.store.schedules import Schedule


async def _snapshot(store: AsyncStore, settings: Settings) -> RenderableType:
    minutes = 30
    queues = [queue_json(r) for r in await store.queue_list()]
    series = throughput_series(await store.throughput_recent(minutes), minutes)
    workers = await worker_rows(store, settings)
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
        queues_table(queues),
        t,
        workers_table(workers),
        *_flow_tables(await store.limit_list(), await store.schedule_list()),
    )


def _flow_tables(limits: list[Limit], schedules: list[Schedule]) -> list[Table]:
    """Limits with their live figures, schedules with their next fire; only those
    there are."""
    tables = []
    if limits:
        lt = Table(title="limits", title_justify="left")
        for column in ("key", "concurrency", "running", "rate", "available"):
            lt.add_column(column)
        for x in limits:
            rate = "-" if x.rate_count is None else f"{x.rate_count}/{x.rate_per_ms} ms"
            available = "-" if x.available is None else str(x.available)
            lt.add_row(x.key, str(x.concurrency or "-"), str(x.running), rate, available)
        tables.append(lt)
    if schedules:
        st = Table(title="schedules", title_justify="left")
        for column in ("name", "when", "next fire", "last job"):
            st.add_column(column)
        for s in schedules:
            when = s.cron or f"every {s.every_ms} ms"
            nxt = "paused" if s.paused else s.next_fire_at.astimezone(UTC).strftime("%H:%M:%SZ")
            st.add_row(s.name, when, nxt, str(s.last_job_id or "-"))
        tables.append(st)
    return tables


def cmd_top(args: argparse.Namespace) -> int:
    """A live view, redrawn every --interval seconds with one short pool for the whole
    session (each refresh runs the same cheap queries as the API)."""
    settings, dsn = settings_dsn(args)

    async def main() -> int:
        store = await open_store(dsn)
        try:
            if args.once:
                console().print(await _snapshot(store, settings))
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


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    db_arg: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Register ``top`` on ``deadman``'s subparsers."""
    top = sub.add_parser("top", help="a live view of queues, throughput and workers")
    db_arg(top)
    top.add_argument(
        "--interval",
        type=interval,
        default=2.0,
        help="seconds between refreshes (0.1-3600)",
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.set_defaults(func=cmd_top)
