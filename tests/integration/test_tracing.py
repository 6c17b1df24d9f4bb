"""Traces (deadman.tracing, the ``deadman[otel]`` extra), with the OpenTelemetry SDK's
in-memory exporter: a job enqueued inside a span (Client, AsyncClient, submit, typed
tasks, enqueue_many, workflows) or over HTTP with a ``traceparent`` header carries
that context, and the in-process worker runs each attempt in a root span *linked* to
it, the handler's own spans its children, with spans for the claim and the
completion. A job enqueued outside a span, with a malformed header, or with a stored
context written by hand runs without a link. Without OpenTelemetry (a subprocess that
cannot import it) nothing of it is imported and jobs run as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from deadman import tracing
from deadman.aclient import AsyncClient
from deadman.client import Client
from deadman.model import Job
from deadman.registry import Registry
from deadman.spec import JobSpec
from deadman.worker.context import JobContext
from tests.factories import attempt_rows, connect, job_row
from tests.helpers import wait_for
from tests.helpers.api import api_client
from tests.helpers.worker import FAST_RETRY, SETTINGS, running_worker

REPO = Path(__file__).resolve().parents[2]
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"

registry = Registry()


def _current_span_id() -> str:
    return format(trace.get_current_span().get_span_context().span_id, "016x")


@registry.handler("tr.async")
async def in_span_async(job: Job, ctx: JobContext) -> str:
    await asyncio.sleep(0)
    return _current_span_id()


@registry.handler("tr.sync")
def in_span_sync(job: Job, ctx: JobContext) -> str:  # runs in a pool thread
    return _current_span_id()


@registry.handler("tr.tx")
async def in_transaction(job: Job, ctx: JobContext) -> None:
    async with ctx.transaction():
        ctx.result = _current_span_id()


@registry.task(type="tr.typed")
def typed(n: int) -> int:
    return n + 1


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process's TracerProvider (set once: OpenTelemetry takes no second one),
    exporting to memory for this module, shut down after it (later modules' workers
    then export nothing here)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    found = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(found))
    yield found
    found.shutdown()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=SETTINGS) as c:
        yield c


def _tracer() -> trace.Tracer:
    return trace.get_tracer("tests.tracing")


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _runs(spans: InMemorySpanExporter, job_id: int, attempts: int = 1) -> list[ReadableSpan]:
    """The run spans of ``job_id`` by attempt, once ``attempts`` of them have ended."""

    def found() -> list[ReadableSpan] | None:
        runs = [
            s
            for s in spans.get_finished_spans()
            if s.name.startswith("deadman.run ") and _attrs(s).get("deadman.job.id") == job_id
        ]
        return runs if len(runs) >= attempts else None

    runs = wait_for(found, timeout=20, message=f"{attempts} run span(s) of job {job_id}")
    return sorted(runs, key=lambda s: int(_attrs(s)["deadman.job.attempt"]))


def _named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def _assert_linked(run: ReadableSpan, trace_id: int, span_id: int) -> None:
    """``run`` is a root span of its own trace with one link, to (trace_id, span_id)."""
    assert run.parent is None, "a run span is a root: linked to the enqueuer, not its child"
    assert [
        (lk.context.trace_id, lk.context.span_id, lk.context.is_remote) for lk in run.links
    ] == [(trace_id, span_id, True)]
    assert run.context is not None and run.context.trace_id != trace_id


def _carrier_of(span: trace.Span) -> dict[str, str]:
    sc = span.get_span_context()
    return {"traceparent": f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"}


@pytest.mark.parametrize("type_", ["tr.async", "tr.sync", "tr.tx"])
def test_a_job_enqueued_in_a_span_runs_in_a_root_span_linked_to_it(
    db_dsn: str, client: Client, spans: InMemorySpanExporter, type_: str
) -> None:
    with _tracer().start_as_current_span("checkout") as parent:
        job = client.enqueue(type_, {"order": 42})
    assert job.trace_context == _carrier_of(parent)
    with running_worker(db_dsn, handlers=registry):
        [run] = _runs(spans, job.id)
        if type_ != "tr.tx":  # completed in its own transaction: nothing to flush
            wait_for(lambda: _named(spans, "deadman complete"), timeout=20, message="complete")
    sc = parent.get_span_context()
    _assert_linked(run, sc.trace_id, sc.span_id)
    assert run.name == f"deadman.run {type_}" and run.kind is SpanKind.CONSUMER
    with connect(db_dsn) as conn:
        [attempt] = attempt_rows(conn, job.id)
        done = job_row(conn, job.id)
    assert _attrs(run) == {
        "messaging.system": "deadman",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.id),
        "deadman.job.id": job.id,
        "deadman.job.type": type_,
        "deadman.job.attempt": 1,
        "deadman.lease.token": int(attempt["lease_token"]),
        "deadman.outcome": "succeeded",
    }
    assert run.status.status_code is StatusCode.UNSET
    # the handler ran with its run span current: on the loop and in a pool thread alike
    assert run.context is not None
    assert done["state"] == "succeeded" and done["result"] == format(run.context.span_id, "016x")
    claims = [
        s for s in _named(spans, "deadman claim") if _attrs(s)["messaging.batch.message_count"]
    ]
    assert claims, "no claim span that claimed the job"
    claim = claims[0]
    assert _attrs(claim)["messaging.destination.name"] == "default"
    assert claim.end_time is not None and run.start_time is not None
    assert claim.end_time <= run.start_time, "the claim ends before the job starts"
    if type_ != "tr.tx":
        written = [_attrs(s)["deadman.complete.written"] for s in _named(spans, "deadman complete")]
        assert max(written) >= 1, written


def test_every_attempt_links_to_the_one_enqueue_and_a_failure_is_an_error(
    db_dsn: str, client: Client, spans: InMemorySpanExporter
) -> None:
    with _tracer().start_as_current_span("enqueue") as parent:
        job = client.enqueue(
            "fail", {"message": "card declined"}, max_attempts=2, backoff=FAST_RETRY
        )
    with running_worker(db_dsn, handlers=registry):
        runs = _runs(spans, job.id, attempts=2)
    sc = parent.get_span_context()
    for n, run in enumerate(runs, start=1):
        _assert_linked(run, sc.trace_id, sc.span_id)
        assert (_attrs(run)["deadman.job.attempt"], _attrs(run)["deadman.outcome"]) == (n, "failed")
        assert run.status.status_code is StatusCode.ERROR
        assert (run.status.description or "").endswith("HandlerFailure: card declined")
    assert runs[0].context is not None and runs[1].context is not None
    assert runs[0].context.trace_id != runs[1].context.trace_id, "each attempt: its own trace"


def test_a_job_enqueued_outside_a_span_runs_without_a_link(
    db_dsn: str, client: Client, spans: InMemorySpanExporter
) -> None:
    job = client.enqueue("tr.async")
    assert job.trace_context is None
    with running_worker(db_dsn, handlers=registry):
        [run] = _runs(spans, job.id)
    assert run.links == () or list(run.links) == []
    assert run.parent is None and _attrs(run)["deadman.outcome"] == "succeeded"


def test_a_stored_context_written_by_hand_is_ignored(
    db_dsn: str, client: Client, spans: InMemorySpanExporter
) -> None:
    """Whatever the column holds (it is checked where it comes in, not in the table),
    the worker links only to what deadman.tracing.carrier would have stored, and the
    API shows null for anything else."""
    bad: list[Any] = [
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": 42},
        {"traceparent": TRACEPARENT, "tracestate": ["a=1"]},
        [TRACEPARENT],
        "x" * 10_000,
        {"tracestate": "a=1"},
    ]
    jobs = [client.enqueue("tr.async") for _ in bad]
    with connect(db_dsn) as conn:
        for job, value in zip(jobs, bad, strict=True):
            conn.execute(
                "UPDATE deadman.jobs SET trace_context = %s::jsonb WHERE id = %s",
                (json.dumps(value), job.id),
            )
    with api_client(db_dsn) as http:
        for job in jobs:
            assert http.get(f"/jobs/{job.id}").json()["trace_context"] is None
    with running_worker(db_dsn, handlers=registry):
        runs = [_runs(spans, job.id)[0] for job in jobs]
    assert [list(r.links) for r in runs] == [[] for _ in runs]
    assert {_attrs(r)["deadman.outcome"] for r in runs} == {"succeeded"}


def test_every_way_to_enqueue_from_python_carries_the_current_context(
    db_dsn: str, client: Client
) -> None:
    """Client.job (for enqueue_many and workflow nodes), submit, typed tasks and
    AsyncClient take the span current when the job is built."""
    with _tracer().start_as_current_span("batch") as parent:
        ids = client.enqueue_many(client.job("noop", {"i": i}) for i in range(3))
        wf = client.workflow("w", {"a": client.job("noop"), "b": client.job("noop")}, [("a", "b")])
        submitted = client.submit(JobSpec.model_validate({"type": "noop"}))
        task_job = typed.enqueue(client, 1)
        many_tasks = client.enqueue_many([typed.job(client, 2)])

        async def from_async() -> Job:
            async with AsyncClient(db_dsn, settings=SETTINGS) as aclient:
                return await aclient.enqueue("noop")

        async_job = asyncio.run(from_async())
    outside = client.enqueue_many([client.job("noop")])
    want = _carrier_of(parent)
    with connect(db_dsn) as conn:
        stored = {
            i: job_row(conn, i)["trace_context"]
            for i in [*ids, *many_tasks, *(j.id for j in wf.nodes.values()), *outside]
        }
    assert [stored[i] for i in outside] == [None]
    del stored[outside[0]]
    assert set(map(json.dumps, stored.values())) == {json.dumps(want)}
    assert submitted.trace_context == task_job.trace_context == async_job.trace_context == want


def test_the_current_tracestate_travels_with_the_traceparent(client: Client) -> None:
    remote = trace.SpanContext(
        int(TRACE_ID, 16),
        int(SPAN_ID, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("rojo", "00f067aa0ba902b7"), ("congo", "t61rcWkgMzE")]),
    )
    upstream = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    with _tracer().start_as_current_span("handler", context=upstream) as span:
        job = client.enqueue("noop")
    assert job.trace_context == {
        **_carrier_of(span),
        "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
    }
    assert job.trace_context["traceparent"].startswith(f"00-{TRACE_ID}-")


def test_http_traceparent_and_tracestate_travel_with_the_job(
    db_dsn: str, spans: InMemorySpanExporter
) -> None:
    headers = {"traceparent": TRACEPARENT, "tracestate": "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"}
    with api_client(db_dsn) as http:
        r = http.post("/jobs", json={"type": "tr.async"}, headers=headers)
        batch = http.post("/jobs/batch", json={"jobs": [{"type": "noop"}] * 2}, headers=headers)
        plain = http.post("/jobs", json={"type": "noop"})
        wf = http.post(
            "/workflows",
            json={"name": "w", "nodes": [{"name": "a", "type": "noop"}], "edges": []},
            headers=headers,
        )
    assert r.status_code == 201 and batch.status_code == 201, (r.text, batch.text)
    assert wf.status_code == 201, wf.text
    want = {"traceparent": TRACEPARENT, "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}
    assert r.json()["trace_context"] == want
    assert [j["trace_context"] for j in batch.json()["jobs"]] == [want, want]
    assert plain.json()["trace_context"] is None
    job_id = int(r.json()["id"])
    node = int(wf.json()["nodes"][0]["job_id"])
    with connect(db_dsn) as conn:
        assert job_row(conn, job_id)["trace_context"] == want
        assert job_row(conn, node)["trace_context"] == want  # POST /workflows too
    with running_worker(db_dsn, handlers=registry):
        [run] = _runs(spans, job_id)
    _assert_linked(run, int(TRACE_ID, 16), int(SPAN_ID, 16))
    assert run.links[0].context.trace_state.to_header() == want["tracestate"]
    assert run.links[0].context.trace_flags.sampled


# -- the W3C checks (deadman.tracing.carrier), as a table ---------------------------------

VALID = [
    (TRACEPARENT, TRACEPARENT),
    (f"  {TRACEPARENT}\t", TRACEPARENT),  # optional whitespace
    (f"00-{TRACE_ID}-{SPAN_ID}-00", f"00-{TRACE_ID}-{SPAN_ID}-00"),  # not sampled
    (f"cc-{TRACE_ID}-{SPAN_ID}-09", f"00-{TRACE_ID}-{SPAN_ID}-01"),  # a later version
    (f"cc-{TRACE_ID}-{SPAN_ID}-01-what-comes-next", f"00-{TRACE_ID}-{SPAN_ID}-01"),
]
#: every one of these is ignored (W3C: restart the trace), never refused
MALFORMED = [
    "",
    "garbage",
    TRACEPARENT.upper(),
    f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",
    f"ff-{TRACE_ID}-{SPAN_ID}-01",  # version ff is invalid
    f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id
    f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
    f"00-{TRACE_ID}-{SPAN_ID}-01-extra",  # version 00 has four fields
    f"00-{TRACE_ID}-{SPAN_ID}-1",
    f"00-{TRACE_ID[:-1]}-{SPAN_ID}-01",
    f"00-{TRACE_ID}-{SPAN_ID}-0g",
    f"00_{TRACE_ID}_{SPAN_ID}_01",
    f"cc-{TRACE_ID}-{SPAN_ID}-01x",  # a later version: a new field starts with '-'
    f"00-{TRACE_ID}-{SPAN_ID}-01\x00",
    f"00-{TRACE_ID}-{SPAN_ID}-\u0660\u0661",  # other scripts' digits
    TRACEPARENT + " " * 600,  # over TRACEPARENT_MAX before any parsing
]


@pytest.mark.parametrize(("given", "stored"), VALID)
def test_a_valid_traceparent_is_stored_as_version_00(given: str, stored: str) -> None:
    assert tracing.carrier([given]) == {"traceparent": stored}


@pytest.mark.parametrize("given", MALFORMED)
def test_a_malformed_traceparent_is_ignored(given: str) -> None:
    assert tracing.carrier([given], ["a=1"]) is None


def test_two_traceparents_are_none() -> None:
    assert tracing.carrier([TRACEPARENT, TRACEPARENT]) is None
    assert tracing.carrier([]) is None


@pytest.mark.parametrize(
    ("states", "stored"),
    [
        (["a=1"], "a=1"),
        (["a=1, b=2", "c=3"], "a=1,b=2,c=3"),  # repeated headers are one list
        (["a=1,,  ,b=2"], "a=1,b=2"),  # empty members are left out
        (["tenant@vendor=x y"], "tenant@vendor=x y"),
        ([",".join(f"k{i}=v" for i in range(32))], ",".join(f"k{i}=v" for i in range(32))),
        ([], None),
        ([""], None),
        (["a=1,a=2"], None),  # a key repeated
        (["A=1"], None),
        (["a="], None),
        (["a=1=2"], None),
        (["a=x\x00"], None),
        (["a=\u00e9"], None),
        ([",".join(f"k{i}=v" for i in range(33))], None),  # over 32 members
        (["a=" + "x" * 256], "a=" + "x" * 256),  # the longest value W3C allows
        (["a=" + "x" * 257], None),
        ([",".join(f"k{i}={'v' * 40}" for i in range(20))], None),  # over 512 characters
        (["a=1," * 10_000], None),  # not even split
    ],
)
def test_tracestate_is_kept_whole_or_dropped_whole(states: list[str], stored: str | None) -> None:
    found = tracing.carrier([TRACEPARENT], states)
    assert found is not None and found["traceparent"] == TRACEPARENT
    assert found.get("tracestate") == stored


# -- without the extra ----------------------------------------------------------------------

NO_OTEL = textwrap.dedent(
    """
    import json, sys
    sys.modules["opentelemetry"] = None  # import opentelemetry now raises ImportError
    from deadman import tracing
    from deadman.client import Client
    from tests.helpers.worker import SETTINGS, running_worker, wait_terminal
    from tests.factories import connect, job_row

    dsn = sys.argv[1]
    with Client(dsn, settings=SETTINGS) as client:
        ids = [client.enqueue("t.async").id, client.enqueue("t.sync").id]
        ids += client.enqueue_many([client.job("t.async")])
    with running_worker(dsn), connect(dsn) as conn:
        wait_terminal(conn, ids, timeout=30)
        rows = [job_row(conn, i) for i in ids]
    print(json.dumps({
        "enabled": tracing.ENABLED,
        "imported": [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v],
        "states": [r["state"] for r in rows],
        "contexts": [r["trace_context"] for r in rows],
    }))
    """
)


def _program(program: str, dsn: str, **env: str) -> tuple[dict[str, Any], str]:
    """Run ``program`` in a Python of its own (no DEADMAN_ or OTEL_ settings but
    ``env``): what it printed last, as JSON, and its stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DEADMAN_", "OTEL_"))}
    out = subprocess.run(
        [sys.executable, "-c", program, dsn],
        cwd=REPO,
        env={**clean, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_without_opentelemetry_nothing_is_imported_and_jobs_run(db_dsn: str) -> None:
    seen, _ = _program(NO_OTEL, db_dsn)
    assert seen == {
        "enabled": False,
        "imported": [],
        "states": ["succeeded"] * 3,
        "contexts": [None] * 3,
    }


# -- with the API and no SDK ----------------------------------------------------------------

NO_PROVIDER = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from deadman import tracing
    from deadman.client import Client
    from tests.helpers.worker import SETTINGS, running_worker, wait_terminal
    from tests.factories import connect, job_row

    attempted = []
    made = tracing.attempt

    def counted(job, ctx, run):
        attempted.append(job.id)
        return made(job, ctx, run)

    tracing.attempt = counted
    dsn = sys.argv[1]
    before = tracing.recording()
    with Client(dsn, settings=SETTINGS) as client, running_worker(dsn), connect(dsn) as conn:
        first = [client.enqueue("t.async").id, client.enqueue("t.sync").id]
        wait_terminal(conn, first, timeout=30)
        # the application sets its provider after the worker started
        provider = TracerProvider()
        found = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(found))
        trace.set_tracer_provider(provider)
        after = tracing.recording()
        second = [client.enqueue("t.async").id, client.enqueue("t.sync").id]
        wait_terminal(conn, second, timeout=30)
        runs = [
            s.attributes["deadman.job.id"]
            for s in found.get_finished_spans()
            if s.name.startswith("deadman.run ")
        ]
        states = [job_row(conn, i)["state"] for i in first + second]
    print(json.dumps({
        "enabled": tracing.ENABLED,
        "states": states,
        "before": before,
        "after": after,
        "attempted": sorted(attempted),
        "runs": sorted(runs),
        "first": first,
        "second": sorted(second),
    }))
    """
)


@pytest.mark.parametrize("provider_env", [None, "no-such-provider"])
def test_without_a_tracer_provider_no_run_span_is_made_until_one_is_set(
    db_dsn: str, provider_env: str | None
) -> None:
    """``opentelemetry-api`` installed with no SDK set up (it comes with other packages):
    every span would be the API's no-op, so the worker makes none (DECISIONS 103). A
    provider the application sets after the worker started is used from the next job
    on. An OTEL_PYTHON_TRACER_PROVIDER that the API cannot load (it raised from
    ``import deadman`` before) turns tracing off for the process, and jobs run. In a
    process of its own: OpenTelemetry takes one global provider per process, and this
    module's fixture sets one."""
    env = {} if provider_env is None else {"OTEL_PYTHON_TRACER_PROVIDER": provider_env}
    seen, stderr = _program(NO_PROVIDER, db_dsn, **env)
    assert seen["states"] == ["succeeded"] * 4, seen
    assert seen["before"] is False, seen
    if provider_env is None:
        assert seen["after"] is True, seen
        assert seen["attempted"] == seen["second"], seen  # none of the first two jobs
        assert seen["runs"] == seen["second"], seen  # and the second two recorded
    else:
        assert seen["enabled"] is False, seen
        assert seen["after"] is False and seen["attempted"] == seen["runs"] == [], seen
        assert "Failed to load configured provider" in stderr, stderr[-3000:]
