"""Handlers by job type: ``registry = Registry()``, ``@registry.handler("email")``,
or typed tasks, ``@registry.task(queue=...)`` (deadman.tasks).

A handler is called with ``(job, ctx)``. ``async def`` handlers run on the worker's
event loop; plain functions run in a thread pool so they cannot stall the loop
(and with it the heartbeats that keep every other lease alive). A task is registered
as the handler of its type that decodes the payload and calls the function.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Unpack, overload

from deadman.errors import ConfigError
from deadman.model import validate_type
from deadman.tasks import Task, TaskDefaults
from deadman.worker.context import JobContext

if TYPE_CHECKING:
    from deadman.model import Job
    from deadman.spec import ScheduleSpec

HandlerFn = Callable[["Job", "JobContext"], Any]
AsyncHandlerFn = Callable[["Job", "JobContext"], Awaitable[Any]]
F = TypeVar("F", bound=HandlerFn)
P = ParamSpec("P")
R = TypeVar("R")


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

    @overload
    def task(self, fn: Callable[Concatenate[JobContext, P], R], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...
    @overload
    def task(
        self, fn: None = None, /, *, type: str | None = None, **defaults: Unpack[TaskDefaults]
    ) -> TaskDecorator: ...
    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        type: str | None = None,
        **defaults: Unpack[TaskDefaults],
    ) -> Task[Any, Any] | TaskDecorator:
        """Register a typed task (deadman.tasks): ``@registry.task`` or
        ``@registry.task(queue=..., max_attempts=..., timeout=..., type=...)``. ``type``
        defaults to the function's module-qualified name; the options (a queue,
        priority, max_attempts, backoff, timeout, heartbeat_timeout, limit_key) apply
        to every call and are checked now."""
        decorate = TaskDecorator(self, type, defaults)
        return decorate if fn is None else decorate(fn)

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


class TaskDecorator:
    """What ``@registry.task(...)`` returns: registers the function it decorates."""

    def __init__(self, registry: Registry, type: str | None, defaults: TaskDefaults) -> None:
        self._registry = registry
        self._type = type
        self._defaults = defaults

    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, P], R], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Task[Any, Any]:
        task: Task[Any, Any] = Task(fn, type=self._type, defaults=self._defaults)
        self._registry.register(task.type, task.handler)
        return task


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
