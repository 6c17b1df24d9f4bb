"""How one operation serves both clients: it turns its arguments into a :class:`Call`
(a plan, and the caller's connection if any); :class:`Op` makes it a method of each
client, which runs the call its way (``Client`` blocking, ``AsyncClient`` awaited:
``Blocking`` and ``Awaiting``).

So the signature, the docstring, the checks and the statements of ``enqueue`` exist
once, and a type checker still sees ``Client.enqueue(...) -> Job`` and
``AsyncClient.enqueue(...) -> Awaitable[Job]``.
"""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, Unpack, overload

from deadman.clientcore.options import JobOptions, new_job
from deadman.config import Settings
from deadman.connections import Joinable
from deadman.errors import ConfigError
from deadman.store import NewJob
from deadman.store.plan import Plan

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Call(Generic[R]):
    """An operation ready to run: its plan, on ``conn`` (what the caller passed as
    ``conn=``; None: on the client's own pool)."""

    plan: Plan[R]
    conn: Joinable | None = None


class Core:
    """What both clients hold: settings, the dsn, and the physical connections
    already found to reach the client's database (checked once each, see
    :mod:`deadman.connections`). ``dsn`` defaults to ``DEADMAN_DATABASE_URL``."""

    def __init__(self, dsn: str | None = None, *, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env()
        dsn = dsn or self.settings.database_url
        if not dsn:
            raise ConfigError("DEADMAN_DATABASE_URL is not set and no dsn was given")
        self.dsn: str = dsn
        self._same_database: weakref.WeakSet[object] = weakref.WeakSet()

    def job(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> NewJob:
        """Build (and validate) a job without sending it; for ``enqueue_many`` and
        workflow nodes. The rules are :class:`deadman.JobSpec`'s, as over HTTP: a
        broken field raises :class:`~deadman.spec.SpecError` naming it."""
        return new_job(type, payload, options)

    def _call(self, op: Callable[..., Call[Any]], /, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - each client runs calls its way


class Blocking(Core):
    """A client whose calls return their result (``deadman.Client``)."""

    def _call(self, op: Callable[..., Call[R]], /, *args: Any, **kwargs: Any) -> R:
        return self._run(op(self, *args, **kwargs))

    def _run(self, call: Call[R]) -> R:
        raise NotImplementedError  # pragma: no cover


class Awaiting(Core):
    """A client whose calls are awaited (``deadman.AsyncClient``): the arguments are
    checked when the coroutine runs, so a refusal is raised where it is awaited (in
    its task, under ``asyncio.gather``), as any coroutine's error is."""

    async def _call(self, op: Callable[..., Call[R]], /, *args: Any, **kwargs: Any) -> R:
        return await self._run(op(self, *args, **kwargs))

    async def _run(self, call: Call[R]) -> R:
        raise NotImplementedError  # pragma: no cover


class Op(Generic[P, R]):
    """``op`` as a method of both clients: ``client.name(...)`` is
    ``client._call(op, ...)``, which runs ``op(client, ...)``'s call: a Client returns
    R, an AsyncClient a coroutine of R. The one method serves both; the difference is
    in ``_call`` and ``_run``."""

    def __init__(self, op: Callable[Concatenate[Core, P], Call[R]], doc: str | None = None) -> None:
        """``doc``: the method's docstring, when ``op``'s is not its own (a method of
        a table such as ``admin.LIMITS``)."""

        @functools.wraps(op)
        def method(client: Core, /, *args: P.args, **kwargs: P.kwargs) -> Any:
            return client._call(op, *args, **kwargs)

        if doc is not None:
            method.__doc__ = doc
        # help() and IDEs read the result's type, not the Call that carries it
        signature = inspect.signature(op)
        result = str(signature.return_annotation).removeprefix("Call[").removesuffix("]")
        method.__signature__ = signature.replace(return_annotation=result)  # type: ignore[attr-defined]
        self._method = method

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Callable[..., Any]: ...

    @overload
    def __get__(self, client: Blocking, owner: type[Any]) -> Callable[P, R]: ...

    @overload
    def __get__(self, client: Awaiting, owner: type[Any]) -> Callable[P, Awaitable[R]]: ...

    def __get__(self, client: Core | None, owner: type[Any]) -> Callable[..., Any]:
        if client is None:
            return self._method  # on the class: the function, for help() and docs
        return types.MethodType(self._method, client)
