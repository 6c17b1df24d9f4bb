"""structlog set-up: JSON lines in production, readable lines in a terminal."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

#: What every log event about one job carries (the worker binds them all): enough to
#: find the job, the attempt and the lease in the database and in other processes' logs.
JOB_FIELDS = ("job_id", "type", "queue", "attempt", "lease_token", "worker")


def configure(
    fmt: str = "auto", level: str = "info", *, stream: TextIO | None = None, cache: bool = True
) -> None:
    """``auto``: JSON lines unless stderr is a terminal. ``stream`` (default stderr) and
    ``cache=False`` are for tests, which reconfigure and must not leave module-level
    loggers pinned to a captured stream."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=cache,
    )


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
