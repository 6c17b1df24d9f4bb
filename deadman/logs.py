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
    _route_psycopg(out, renderer)


#: psycopg's own loggers (``psycopg.pool``: "error connecting in 'deadman-api': ...",
#: once per failed reconnection while the database is down) go through stdlib
#: logging; without a handler Python prints them as bare text among our JSON lines.
_LIBRARY_LOGGER = "psycopg"


def _route_psycopg(out: TextIO, renderer: structlog.typing.Processor) -> None:
    """Render psycopg's records like ours: one line each, with level, time and the
    logger's name. Replaces the handler an earlier call installed (tests reconfigure);
    leaves every other handler alone (pytest's capture, uvicorn's own)."""
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.set_name("deadman")
    library = logging.getLogger(_LIBRARY_LOGGER)
    for old in [h for h in library.handlers if h.get_name() == "deadman"]:
        library.removeHandler(old)
    library.addHandler(handler)


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
