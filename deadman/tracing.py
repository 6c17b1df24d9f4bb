"""Traces (the optional ``deadman[otel]`` extra): the enqueuer's W3C trace context
travels with its job, and the worker runs each attempt in a span linked to it.

What a job carries is ``{"traceparent": ..., "tracestate": ...}`` (the jobs'
``trace_context`` column, migration 0014): the current span's context when
``Client``/``AsyncClient`` build the job (``current``), or a ``POST /jobs`` request's
``traceparent``/``tracestate`` headers (``carrier``). Both go through ``carrier``, the
one check of what is stored: a malformed ``traceparent`` is ignored, as W3C says
(the job is enqueued without one), never refused, and a ``tracestate`` that does not
parse or is over 32 members or 512 characters is dropped whole.

The worker's spans: ``deadman claim`` around each claim statement, ``deadman.run
<type>`` (kind CONSUMER) around each attempt, and ``deadman complete`` around each
completion flush. The run span is a root with a *link* to the stored context, not a
child of it: the enqueuing request has usually ended (its trace closed) long before
the job runs, or a retry runs it hours later, and one enqueue can start many
attempts; a link joins the two traces without stretching the first over the queue's
wait (DECISIONS 42).

Without OpenTelemetry nothing is imported: ``ENABLED`` is False, ``current`` returns
None, ``span`` a shared null context, and the executor tests ``recording()`` once per
job. With the API but no tracer provider set (an application that has
``opentelemetry-api`` through some other package and no SDK), every span would be the
API's no-op: ``recording()`` is False and the attempt's span is not made at all
(~6 µs a job of the worker's CPU; DECISIONS 103). A provider set later, at any time,
is used from the next job on. The W3C checks are plain Python and always on, so an
API server without the extra still stores a valid ``traceparent`` for workers that
have it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from deadman.model import AttemptOutcome

if TYPE_CHECKING:
    from deadman.model import Job
    from deadman.store import Finish
    from deadman.worker.context import JobContext

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: everything below is a no-op
    ENABLED = False
else:
    try:
        #: a ProxyTracer until the application sets its TracerProvider, then that one's.
        #: OTEL_PYTHON_TRACER_PROVIDER names a provider for the API to load here; one it
        #: cannot load (it logs why) turns tracing off instead of failing every import
        #: of deadman, the worker's and the API server's included.
        _TRACER = trace.get_tracer("deadman")
    except Exception:
        ENABLED = False
    else:
        ENABLED = True
        _PROPAGATOR = TraceContextTextMapPropagator()
        #: the run span's parent context: none (a root, linked to the enqueuer)
        _ROOT = otel_context.Context()
        #: the API's own providers, whose tracers make only no-op spans: a
        #: ProxyTracerProvider until the application sets one
        _NO_OP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        _UNKNOWN = object()

P = ParamSpec("P")
R = TypeVar("R")

#: a traceparent is 55 characters; a later version may append fields, so a few more
#: are read, and anything longer is ignored without being parsed
TRACEPARENT_MAX = 512
#: W3C: vendors propagate at least 512 characters and 32 members of a tracestate
TRACESTATE_MAX = 512
TRACESTATE_MEMBERS_MAX = 32

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY = r"[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(f"({_KEY})=({_VALUE})")
#: the attempt outcomes a run span reports as an error
_ERRORS = frozenset({AttemptOutcome.FAILED, AttemptOutcome.TIMED_OUT})


def traceparent(value: str) -> str | None:
    """The header as stored (version 00, lower-case hex), or None where W3C says to
    ignore it: not ``version-trace_id-parent_id-flags``, version ff, an all-zero id,
    upper-case hex, anything after a version-00 header. A later version is read as
    version 00 reads it (its four first fields, the sampled flag only)."""
    if len(value) > TRACEPARENT_MAX:
        return None
    value = value.strip(" \t")
    found = _TRACEPARENT.match(value)
    if found is None:
        return None
    version, trace_id, parent_id, flags = found.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    if version == "00":
        return value if len(value) == 55 else None
    if len(value) > 55 and value[55] != "-":
        return None
    return f"00-{trace_id}-{parent_id}-{int(flags, 16) & 1:02x}"


def tracestate(values: Sequence[str]) -> str | None:
    """Every ``tracestate`` header as one list (W3C: repeated headers combine), its
    members checked, empty ones left out; None when absent or when any member does
    not parse, a key repeats, or it is over TRACESTATE_MEMBERS_MAX members or
    TRACESTATE_MAX characters (dropped whole; the traceparent stays)."""
    if sum(len(v) for v in values) > 2 * TRACESTATE_MAX:  # before splitting anything
        return None
    members = [m.strip(" \t") for v in values for m in v.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > TRACESTATE_MEMBERS_MAX:
        return None
    keys: set[str] = set()
    for member in members:
        found = _MEMBER.fullmatch(member)
        if found is None or found.group(1) in keys:
            return None
        keys.add(found.group(1))
    joined = ",".join(members)
    return joined if len(joined) <= TRACESTATE_MAX else None


def carrier(traceparents: Sequence[str], tracestates: Sequence[str] = ()) -> dict[str, str] | None:
    """The trace context a job stores, from the ``traceparent`` values given (exactly
    one, or none is valid: W3C) and the ``tracestate`` values; None when there is no
    valid traceparent (a tracestate alone means nothing)."""
    if len(traceparents) != 1:
        return None
    parent = traceparent(traceparents[0])
    if parent is None:
        return None
    state = tracestate(tracestates)
    return (
        {"traceparent": parent} if state is None else {"traceparent": parent, "tracestate": state}
    )


def stored(value: object) -> dict[str, str] | None:
    """A job's ``trace_context`` as read back, checked again by ``carrier`` (the
    column holds whatever a hand-written row put there)."""
    if not isinstance(value, dict):
        return None
    parent, state = value.get("traceparent"), value.get("tracestate")
    if not isinstance(parent, str) or not isinstance(state, str | None):
        return None
    return carrier([parent], () if state is None else [state])


def current() -> dict[str, str] | None:
    """The trace context to send with a job enqueued now: the current span's (W3C
    propagator) when OpenTelemetry is installed and a span is current, else None."""
    # An empty context holds no span (0.07 µs to see, against 0.26 for the span's own
    # check): a bulk enqueue asks once per job it builds.
    if not ENABLED or not otel_context.get_current():
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    found: dict[str, str] = {}
    _PROPAGATOR.inject(found)
    parents = [found["traceparent"]] if "traceparent" in found else []
    return carrier(parents, [found["tracestate"]] if "tracestate" in found else ())


class Noting(Protocol):
    """What ``span`` yields: a span, or a stand-in that notes nothing."""

    def set_attribute(self, key: str, value: Any) -> None: ...


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        pass


#: a nullcontext can be entered again and again: one for every call without the extra
_NO_SPAN: AbstractContextManager[Noting] = contextlib.nullcontext(_NoSpan())


def recording() -> bool:
    """Whether a span made now would be recorded: OpenTelemetry is installed and the
    application has set a tracer provider of its own (an SDK's). Asked per job: a
    provider may be set after the worker started. It reads the API's global provider,
    as ``_TRACER`` (a ProxyTracer) does to choose between that provider's tracer and
    its no-op one: ``trace.get_tracer_provider()`` looks OTEL_PYTHON_TRACER_PROVIDER
    up in ``os.environ`` on every call while none is set, and a missing key costs that
    lookup a raised and caught KeyError (~2 µs a job, measured). An API without that
    global is asked through ``get_tracer_provider`` instead."""
    if not ENABLED:
        return False
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        try:
            provider = trace.get_tracer_provider()
        except Exception:  # OTEL_PYTHON_TRACER_PROVIDER since set to one it cannot load
            return False
    return provider is not None and not isinstance(provider, _NO_OP_PROVIDERS)


def span(name: str, attributes: Mapping[str, str | int]) -> AbstractContextManager[Noting]:
    """A span around a worker step (``deadman claim``, ``deadman complete``), current
    while it runs; without the extra or a provider (``recording``) a null context (one
    per claim or flush, not per job). An exception is recorded on it, and it ends with
    an error status."""
    if not recording():
        return _NO_SPAN
    return _TRACER.start_as_current_span(name, attributes=attributes)


async def attempt(job: Job, ctx: JobContext, run: Awaitable[Finish | None]) -> Finish | None:
    """Await ``run`` (the executor's call of the handler) in the attempt's span, current
    while the handler runs (its own spans are children), linked to the job's stored
    context. ``deadman.outcome``: the attempt's outcome, ``succeeded`` when the handler
    completed it in ``ctx.transaction()``, ``abandoned`` when the worker gave its
    lease up and wrote nothing; a failed or timed-out attempt is an error."""
    span = _TRACER.start_span(
        f"deadman.run {job.type}",
        context=_ROOT,
        kind=trace.SpanKind.CONSUMER,
        links=_link(job.trace_context),
        attributes={
            "messaging.system": "deadman",
            "messaging.operation.type": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "deadman.job.id": job.id,
            "deadman.job.type": job.type,
            "deadman.job.attempt": ctx.attempt,
            "deadman.lease.token": ctx.lease_token,
        },
    )
    with trace.use_span(span, end_on_exit=True):
        finish = await run
        if finish is not None:
            span.set_attribute("deadman.outcome", finish.outcome.value)
            if finish.outcome in _ERRORS:
                # a traceback's last line names the exception ("ValueError: ...")
                why = (finish.error or "").strip().rpartition("\n")[2][:200]
                span.set_status(trace.Status(trace.StatusCode.ERROR, why))
        else:
            done = "succeeded" if ctx.completed_in_transaction else "abandoned"
            span.set_attribute("deadman.outcome", done)
    return finish


def carried(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` to run in a thread with the caller's OpenTelemetry context (a sync
    handler's spans are children of its run span; threads start with none)."""
    context = otel_context.get_current()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        token = otel_context.attach(context)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return run


def _link(stored_context: object) -> list[trace.Link]:
    """A link to the stored context if it is (still) a valid one; else none."""
    found = stored(stored_context)
    if found is None:
        return []
    linked = trace.get_current_span(_PROPAGATOR.extract(found)).get_span_context()
    return [trace.Link(linked)] if linked.is_valid else []
