"""Typed tasks: ``@registry.task(...)`` on a function with typed parameters.

    @registry.task(queue="mail", max_attempts=3, timeout=30)
    def send_email(to: str, body: Body, cc: list[str] | None = None) -> Receipt: ...

    send_email.enqueue(client, to="a@b.c", body=Body(...))           # -> Job
    await send_email.enqueue_async(aclient, to="a@b.c", body=Body(...))
    send_email.options(delay=30, idempotency_key="w-42", conn=conn).enqueue(client, ...)
    client.enqueue_many([send_email.job(client, to=t, body=b) for t in ...])
    send_email("a@b.c", Body(...))                                  # the plain function

The arguments are checked against the signature when the job is made (a missing,
unknown or wrongly typed argument raises :class:`InvalidArguments` naming it, before
anything is sent) and sent as the payload, one JSON value per parameter:
``{"to": "a@b.c", "body": {...}, "cc": null}`` (defaults included, so that one call
has one payload, and one fingerprint for its idempotency key). The worker decodes the
payload back into the typed values and calls the function; what it returns, encoded
through its return annotation, is the job's result. Types are pydantic's: plain
types, dataclasses, pydantic models, and unions, lists, dicts and tuples of them;
Python values must already have their type (strict: "5" is not an int), JSON values
are read as JSON (an ISO string is a datetime).

A first parameter annotated :class:`deadman.JobContext` receives the attempt's
context (``ctx.transaction()``, ``ctx.cancelled``...) and is not part of the payload.

Per-call job options go through :meth:`Task.options`, never among the function's
own keyword arguments: a task may have a parameter called ``queue``, ``delay`` or
``conn`` (procrastinate's ``configure``, Celery's ``apply_async``, dramatiq's
``send_with_options`` keep the two apart for the same reason).

A payload that does not decode (sent over HTTP by hand, or by an older or newer
release of the task) fails the attempt like any error and is retried by the job's
backoff: during a rolling deploy the retry may land on a worker that knows the new
signature. Its ``last_error`` names every parameter that did not match.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypedDict, TypeVar, Unpack

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.errors import PydanticSchemaGenerationError
from pydantic_core import ErrorDetails, PydanticSerializationError

from deadman.clientcore.options import JobOptions, new_job
from deadman.errors import ConfigError, DeadmanError, InvalidJob
from deadman.model import Backoff, Job, validate_type
from deadman.spec import SpecError
from deadman.spec.errors import path
from deadman.storable import FieldError, check_storable
from deadman.worker.context import JobContext

if TYPE_CHECKING:
    from deadman.store import NewJob

__all__ = ["InvalidArguments", "InvalidResult", "Task", "TaskDefaults", "TaskOptions"]

P = ParamSpec("P")
R = TypeVar("R")


class TaskDefaults(TypedDict, total=False):
    """The job options a task's decorator may fix for every call (``@registry.task``);
    durations in seconds or as timedeltas, as for ``Client.enqueue``."""

    queue: str
    priority: int
    max_attempts: int
    backoff: Backoff
    timeout: timedelta | float
    heartbeat_timeout: timedelta | float
    limit_key: str


class InvalidArguments(SpecError):
    """Arguments that do not fit the task's signature (when enqueued), or a payload
    that does not (when run). ``errors`` names each parameter, as ``SpecError`` does."""

    def __init__(self, task: str, errors: list[FieldError]) -> None:
        super().__init__(errors)
        self.task = task

    def __str__(self) -> str:
        return f"{self.task}: {super().__str__()}"


class InvalidResult(DeadmanError):
    """A task returned a value its return annotation does not describe."""


class MakesJobs(Protocol):
    """Either client: ``job()`` only builds a job."""

    def job(self, type: str, payload: Any = None, **options: Unpack[JobOptions]) -> NewJob: ...


class Enqueues(Protocol):
    """What a sync client offers a task: ``deadman.Client``."""

    def enqueue(
        self, type: str, payload: Any = None, *, conn: Any = None, **options: Unpack[JobOptions]
    ) -> Job: ...


class EnqueuesAsync(Protocol):
    """What an async client offers a task: ``deadman.AsyncClient``."""

    def enqueue(
        self, type: str, payload: Any = None, *, conn: Any = None, **options: Unpack[JobOptions]
    ) -> Awaitable[Job]: ...


def _is_context(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, JobContext)


def _messages(task: str, exc: ValidationError) -> InvalidArguments:
    def one(e: ErrorDetails) -> FieldError:
        if e["type"] == "missing":
            message = "is required"
        elif e["type"] == "extra_forbidden":
            message = f"is not a parameter of {task}"
        elif e["type"] == "model_type" and not e["loc"]:
            message = "must be a JSON object of the task's arguments"
        else:
            message = e["msg"][:1].lower() + e["msg"][1:]
        return {"field": path(e["loc"]) if e["loc"] else "payload", "message": message}

    return InvalidArguments(task, [one(e) for e in exc.errors(include_url=False)])


@dataclass(frozen=True)
class _Signature:
    """A task function's parameters as a pydantic model (the context aside), and its
    result's adapter (None without a return annotation: returned as it is)."""

    model: type[BaseModel]
    #: the parameters in order, each with its field in the model (p0, p1...: aliases
    #: carry the names, so no name can collide with the model's own attributes)
    params: tuple[tuple[str, str, bool], ...]  # (name, field, positional-only)
    context: bool
    result: TypeAdapter[Any] | None
    #: the annotation says a value (not None): ``ctx.result`` is encoded by it too
    value: bool = False

    @classmethod
    def of(cls, fn: Callable[..., Any], task: str) -> _Signature:
        """Raises ConfigError for a signature that cannot be sent as JSON, and NameError
        while an annotation names something not defined yet (see Task.signature)."""
        hints = typing.get_type_hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        params: list[tuple[str, str, bool]] = []
        context = False
        for i, (name, p) in enumerate(inspect.signature(fn).parameters.items()):
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                star = "*" if p.kind is p.VAR_POSITIONAL else "**"
                raise ConfigError(
                    f"{task}: {star}{name} cannot be sent in a payload; name each parameter"
                )
            if _is_context(hints.get(name)):
                if i != 0:
                    raise ConfigError(f"{task}: the JobContext parameter {name!r} must come first")
                context = True
                continue
            if name not in hints:
                raise ConfigError(f"{task}: parameter {name!r} needs a type annotation")
            default = ... if p.default is p.empty else p.default
            field = f"p{len(params)}"
            fields[field] = (hints[name], Field(default, alias=name))
            params.append((name, field, p.kind is p.POSITIONAL_ONLY))
        config = ConfigDict(extra="forbid", strict=True, validate_default=True, allow_inf_nan=False)
        returns = hints.get("return", inspect.Signature.empty)
        try:
            model = create_model(f"{fn.__name__}_arguments", __config__=config, **fields)
            result = None if returns is inspect.Signature.empty else TypeAdapter(returns)
        except PydanticSchemaGenerationError as exc:
            raise ConfigError(f"{task}: a parameter or the result cannot be JSON: {exc}") from None
        value = returns not in (inspect.Signature.empty, None, type(None))
        return cls(model, tuple(params), context, result, value)


class _Sends(Generic[P]):
    """enqueue, enqueue_async and job: written once for a task (its decorator's
    options) and for ``task.options(...)`` (those and the call's)."""

    _task: Task[P, Any]
    _options: JobOptions
    _conn: Any = None

    def job(self, client: MakesJobs, /, *args: P.args, **kwargs: P.kwargs) -> NewJob:
        """A job for ``client.enqueue_many`` or a workflow's node; nothing is sent."""
        if self._conn is not None:
            raise TypeError("conn= is for enqueue; a job() is sent by enqueue_many or workflow")
        return client.job(self._task.type, self._task.encode(*args, **kwargs), **self._options)

    def enqueue(self, client: Enqueues, /, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Check the arguments, send the job with ``client`` and return it."""
        payload = self._task.encode(*args, **kwargs)
        return client.enqueue(self._task.type, payload, conn=self._conn, **self._options)

    async def enqueue_async(
        self, client: EnqueuesAsync, /, *args: P.args, **kwargs: P.kwargs
    ) -> Job:
        """:meth:`enqueue` with an async client (``deadman.AsyncClient``)."""
        payload = self._task.encode(*args, **kwargs)
        return await client.enqueue(self._task.type, payload, conn=self._conn, **self._options)


class TaskOptions(_Sends[P]):
    """A task with options for one call: ``task.options(delay=30).enqueue(client, ...)``."""

    def __init__(self, task: Task[P, Any], options: JobOptions, conn: Any) -> None:
        self._task, self._options, self._conn = task, options, conn


class Task(_Sends[P], Generic[P, R]):
    """A function registered as a job type (see the module docstring). Calling it calls
    the function; ``handler`` is what the worker runs for a job of ``type``."""

    __name__: str  # the function's, as functools.update_wrapper copies them
    __qualname__: str

    def __init__(self, fn: Callable[..., R], *, type: str | None, defaults: TaskDefaults) -> None:
        self.fn = fn
        self.type = _type_of(fn) if type is None else _checked_type(type, fn)
        self._task = self
        self._options = typing.cast("JobOptions", dict(defaults))
        if defaults:
            new_job(self.type, None, self._options)  # refused now, not at the first call
        functools.update_wrapper(self, fn)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.handler: Callable[[Job, JobContext], Any] = (
            self._run_async if self.is_async else self._run_sync
        )
        self._sig: _Signature | None = None
        # an annotation may name a class defined later in its module: then at first use
        with contextlib.suppress(NameError):
            self._sig = _Signature.of(fn, self.type)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.type}>"

    def options(self, *, conn: Any = None, **options: Unpack[JobOptions]) -> TaskOptions[P]:
        """This task with job options for one call (they override the decorator's);
        ``conn``: enqueue inside the caller's transaction, as ``Client.enqueue`` does."""
        merged = typing.cast("JobOptions", {**self._options, **options})
        return TaskOptions(self, merged, conn)

    @property
    def signature(self) -> _Signature:
        if self._sig is None:
            try:
                self._sig = _Signature.of(self.fn, self.type)
            except NameError as exc:
                raise ConfigError(f"{self.type}: an annotation cannot be resolved: {exc}") from None
        return self._sig

    def encode(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The payload of a call with these arguments; InvalidArguments names what
        does not fit (nothing else is checked here: the client checks the job)."""
        sig = self.signature
        names = [name for name, _, _ in sig.params]
        if len(args) > len(names):
            raise InvalidArguments(
                self.type,
                [{"field": "args", "message": f"takes {len(names)} arguments, {len(args)} given"}],
            )
        given = dict(zip(names, args, strict=False))
        twice = sorted(given.keys() & kwargs.keys())
        if twice:
            raise InvalidArguments(
                self.type, [{"field": n, "message": "given twice"} for n in twice]
            )
        try:
            values = sig.model.model_validate({**given, **kwargs}, strict=True)
            payload: dict[str, Any] = values.model_dump(mode="json", by_alias=True, warnings=False)
        except ValidationError as exc:
            raise _messages(self.type, exc) from None
        except PydanticSerializationError as exc:
            raise InvalidArguments(self.type, [{"field": "payload", "message": str(exc)}]) from None
        problems = check_storable(payload)  # NUL, lone surrogates: Postgres refuses them
        if problems:
            raise InvalidArguments(self.type, problems)
        # Decoded here as the worker will: an instance is taken as it is (a dataclass
        # built with a str for its int), so only its JSON shows what it really holds.
        self._values(payload)
        return payload

    def decode(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        """A payload as the function's (positional-only, keyword) arguments."""
        sig = self.signature
        values = self._values(payload)
        args = [getattr(values, f) for _, f, positional in sig.params if positional]
        kwargs = {n: getattr(values, f) for n, f, positional in sig.params if not positional}
        return args, kwargs

    def _values(self, payload: Any) -> BaseModel:
        try:
            return self.signature.model.model_validate_json(
                json.dumps({} if payload is None else payload), strict=True
            )
        except ValidationError as exc:
            raise _messages(self.type, exc) from None

    def _call(self, job: Job, ctx: JobContext) -> Any:
        args, kwargs = self.decode(job.payload)
        if self.signature.value and ctx is not None:  # (None: unit tests)
            ctx.encode_result = self._ctx_result  # ctx.result, set in ctx.transaction()
        return self.fn(*([ctx] if self.signature.context else []), *args, **kwargs)

    def _result(self, value: Any) -> Any:
        adapter = self.signature.result
        if adapter is None:
            return value  # the executor checks it is JSON, as for any handler
        try:
            return adapter.dump_python(value, mode="json", warnings="error")
        except (PydanticSerializationError, ValueError, TypeError) as exc:
            raise InvalidResult(
                f"{self.type} returned what its annotation does not allow: {exc}"
            ) from None

    def _ctx_result(self, value: Any) -> Any:
        """``ctx.result`` as stored: None (not set) as it is; a value of the return
        annotation (a model) or its JSON form (a dict) encoded through it."""
        adapter = self.signature.result
        if value is None or adapter is None:
            return value
        try:
            value = adapter.validate_python(value)
        except ValidationError as exc:
            raise InvalidResult(
                f"{self.type} set ctx.result to what its annotation does not allow: {exc}"
            ) from None
        return self._result(value)

    def _run_sync(self, job: Job, ctx: JobContext) -> Any:
        return self._result(self._call(job, ctx))

    async def _run_async(self, job: Job, ctx: JobContext) -> Any:
        return self._result(await self._call(job, ctx))


def _checked_type(name: str, fn: Callable[..., Any]) -> str:
    try:
        return validate_type(name)
    except InvalidJob as exc:
        raise ConfigError(f"task {fn.__qualname__}: {exc}") from None


def _type_of(fn: Callable[..., Any]) -> str:
    """The default job type: the function's module-qualified name."""
    if fn.__module__ == "__main__":
        raise ConfigError(
            f"task {fn.__qualname__} is defined in __main__, which workers import under"
            " another name: give it type=..."
        )
    name = f"{fn.__module__}.{fn.__qualname__}"
    try:
        return validate_type(name)
    except InvalidJob:
        raise ConfigError(
            f"task {fn.__qualname__}: {name!r} cannot be a job type (1-128 of A-Z a-z 0-9 _ . : -):"
            " give it type=..."
        ) from None
