"""Handlers by job type: ``registry = Registry()``, ``@registry.handler("email")``.

A handler is called with ``(job, ctx)``. ``async def`` handlers run on the worker's
event loop; plain functions run in a thread pool so they cannot stall the loop
(and with it the heartbeats that keep every other lease alive).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from deadman.errors import ConfigError
from deadman.model import validate_type

if TYPE_CHECKING:
    from deadman.model import Job
    from deadman.spec import ScheduleSpec
    from deadman.worker.context import JobContext

HandlerFn = Callable[["Job", "JobContext"], Any]
AsyncHandlerFn = Callable[["Job", "JobContext"], Awaitable[Any]]
F = TypeVar("F", bound=HandlerFn)


@dataclass(frozen=True)
class HandlerSpec:
    type: str
    fn: HandlerFn
    is_async: bool


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, HandlerSpec] = {}
        self._periodic: dict[str, ScheduleSpec] = {}

    def handler(self, type: str) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            self.register(type, fn)
            return fn

        return decorate

    def register(self, type: str, fn: HandlerFn) -> None:
        validate_type(type)
        if type in self._handlers:
            raise ConfigError(f"a handler for {type!r} is already registered")
        self._handlers[type] = HandlerSpec(type, fn, _is_async(fn))

    def get(self, type: str) -> HandlerSpec | None:
        return self._handlers.get(type)

    def types(self) -> list[str]:
        return sorted(self._handlers)

    def periodic(
        self,
        when: str | timedelta,
        type: str,
        payload: Any = None,
        *,
        name: str | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
        **job: Any,
    ) -> None:
        """Declare a schedule in code: ``when`` a cron expression (in ``timezone``) or a
        timedelta (every so long, since the Unix epoch); each tick enqueues ``type``
        with ``payload`` (and ``job``'s POST /jobs fields, e.g. ``queue``). Every worker
        with this registry writes it to ``deadman.schedules`` when it starts (the same
        definition again keeps its next tick). ``name`` defaults to ``type``. Checked
        now, by the rules of PUT /schedules/{name}."""
        from deadman.spec import KeyedName, ScheduleSpec, validate

        body: dict[str, Any] = {
            "timezone": timezone,
            "catch_up": catch_up,
            "job": {"type": type, "payload": payload, **job},
        }
        if isinstance(when, timedelta):
            body["every_ms"] = round(when.total_seconds() * 1000)
        else:
            body["cron"] = when
        schedule_name = validate(KeyedName, {"key": name or type}).key
        if schedule_name in self._periodic:
            raise ConfigError(f"a schedule named {schedule_name!r} is already declared")
        self._periodic[schedule_name] = validate(ScheduleSpec, body)

    def periodics(self) -> dict[str, ScheduleSpec]:
        """The schedules declared with :meth:`periodic`, by name."""
        return dict(self._periodic)

    def merged(self, other: Registry) -> Registry:
        """A new registry with both sets of handlers and schedules; a type (or a
        schedule name) in both is an error."""
        out = Registry()
        for spec in [*self._handlers.values(), *other._handlers.values()]:
            out.register(spec.type, spec.fn)
        for periodic in (self._periodic, other._periodic):
            for name, schedule in periodic.items():
                if name in out._periodic:
                    raise ConfigError(f"a schedule named {name!r} is declared twice")
                out._periodic[name] = schedule
        return out


def _is_async(fn: HandlerFn) -> bool:
    """``async def``, or an object whose ``__call__`` is one: run on the event loop.
    (Mistaken for sync, it would run in a thread and return an unawaited coroutine.)"""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (the method, not callable())
    )


def load_registry(spec: str) -> Registry:
    """Import ``pkg.module:attribute`` and return the Registry found there."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app must look like pkg.module:registry, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app: cannot import {module_name!r}: {exc}") from exc
    registry = getattr(module, attr, None)
    if not isinstance(registry, Registry):
        raise ConfigError(f"--app: {spec!r} is not a deadman.Registry")
    return registry
