"""The dashboard's pages and actions, mounted at ``/ui`` by ``create_app``.

Server-rendered HTML over the same store methods as the JSON API; a little vanilla
JS only re-fetches the page for auto-refresh. Every page stays fast on a table of
millions of jobs: listings are keyset-paginated (``before=<id>``) along the indexes
of job_list, queue counts read only unfinished rows, finished totals stop at a cap
and are shown as estimates beyond it (marked "~").

Auth (same token as the API): a request passes with ``Authorization: Bearer`` (a
proxy or a script), or with the ``deadman_ui`` cookie set by the sign-in form at
``/ui/login``. The cookie holds an HMAC of the token, not the token: it opens the
dashboard but is no API credential. It is HttpOnly, SameSite=Strict, Path=/ui, and
Secure when the request came over https. With no DEADMAN_API_TOKEN the dashboard is
open, as the API is.

CSRF: every POST must come from a page of this server: its ``Origin`` (or, if a
browser sent none, its ``Referer``) must name the same host as the request's
``Host``; otherwise 403. Together with SameSite=Strict that stops cross-site forms.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from deadman.api.routes_ops import LIVE_STATES, queue_json, stats_json
from deadman.api.schema import parse_id
from deadman.api.serialize import attempt_json, job_json, worker_json
from deadman.api.state import api_state
from deadman.api.ui.templates import (
    Safe,
    join,
    link,
    login_page,
    page,
    post_button,
    pretty_json,
    render,
    sparkline,
    table,
    url,
)
from deadman.errors import InvalidJob
from deadman.model import JobState, validate_queue, validate_type
from deadman.store import ListParams

COOKIE = "deadman_ui"
PAGE_SIZE = 50
SPARK_MINUTES = 30

Handler = Callable[[Request], Awaitable[Response]]


# --------------------------------------------------------------------------- auth, CSRF


def _token(request: Request) -> str | None:
    token: str | None = request.app.state.deadman.settings.api_token
    return token


def _session_value(token: str) -> str:
    return hmac.new(token.encode(), b"deadman-ui-session-v1", hashlib.sha256).hexdigest()


def _authorized(request: Request) -> bool:
    token = _token(request)
    if token is None:
        return True
    expected = hashlib.sha256(token.encode()).digest()
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        got = hashlib.sha256(given.strip().encode("latin-1", "replace")).digest()
        return hmac.compare_digest(got, expected)
    cookie = request.cookies.get(COOKIE, "")
    return hmac.compare_digest(
        hashlib.sha256(cookie.encode("latin-1", "replace")).digest(),
        hashlib.sha256(_session_value(token).encode()).digest(),
    )


def _same_origin(request: Request) -> bool:
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    try:
        netloc = urlsplit(source).netloc
    except ValueError:  # "http://[" and the like: no origin at all, so not ours
        return False
    return netloc.lower() == request.headers.get("host", "").lower()


class PageError(Exception):
    """Raise in a page or action to answer with a short error page (a 4xx)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


def guarded(handler: Handler) -> Handler:
    """Signed in (else to the sign-in form), and for a POST: sent by our own page."""

    async def wrapper(request: Request) -> Response:
        if not _authorized(request):
            if request.method == "GET":
                return RedirectResponse("/ui/login", status_code=303)
            return _html("sign in first", Safe(""), 401)
        if request.method == "POST" and not _same_origin(request):
            return _html("forbidden", render("<p>cross-site request refused</p>"), 403)
        try:
            return await handler(request)
        except PageError as exc:
            return _html(exc.title, render("<p>$m</p>", m=exc.message), exc.status)

    return wrapper


async def login_form(request: Request) -> Response:
    return HTMLResponse(login_page())


async def login(request: Request) -> Response:
    if not _same_origin(request):
        return HTMLResponse(login_page("cross-site sign-in refused"), status_code=403)
    token = _token(request)
    try:
        given = (await _form(request, frozenset({"token"}))).get("token", "")
    except PageError as exc:
        return HTMLResponse(login_page(exc.message), status_code=exc.status)
    if token is None:
        return RedirectResponse("/ui/", status_code=303)
    if not hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(token.encode()).digest()
    ):
        return HTMLResponse(login_page("that token is not valid"), status_code=401)
    response = RedirectResponse("/ui/", status_code=303)
    response.set_cookie(
        COOKIE,
        _session_value(token),
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


# --------------------------------------------------------------------------- helpers


async def _form(request: Request, fields: frozenset[str]) -> dict[str, str]:
    """A urlencoded form body of ``fields``, each at most once (the app's body size
    limit applies). Anything else is a 422 page, never read as a form with fewer
    fields: for the bulk replay, a form without filters means every dead job."""
    try:
        body = (await request.body()).decode("utf-8")
        pairs = parse_qsl(body, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise PageError(422, "bad form", "the form is not UTF-8") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        if name not in fields or name in form:
            raise PageError(422, "bad form", f"unexpected field {_shorten(name)!r} in the form")
        form[name] = value
    return form


def _html(title: str, body: Safe, status: int = 200) -> HTMLResponse:
    return HTMLResponse(page(title, body), status_code=status)


def _ago(value: str | None) -> str:
    if not value:
        return "-"
    seconds = (datetime.now(UTC) - datetime.fromisoformat(value)).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 60:
        text = f"{seconds:.0f}s"
    elif seconds < 3600:
        text = f"{seconds / 60:.0f}m"
    elif seconds < 86400:
        text = f"{seconds / 3600:.1f}h"
    else:
        text = f"{seconds / 86400:.1f}d"
    return f"in {text}" if future else f"{text} ago"


def _error_line(error: str | None, width: int = 120) -> str:
    """The line that says what went wrong: a traceback's last line, not its first."""
    lines = [ln.strip() for ln in (error or "").splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last if len(last) <= width else last[: width - 1] + "…"


def _state_cell(state: str) -> Safe:
    return render('<span class="state-$s">$s</span>', s=state)


def _filter_value(request: Request, name: str, check: Callable[[str], str]) -> str | None:
    value = request.query_params.get(name) or None
    if value is None:
        return None
    try:
        return check(value)
    except InvalidJob:
        return None


def _before(request: Request) -> int | None:
    """The page cursor: absent, or a job id (as the "older" link writes it); anything
    else is a 400 page, not the first page passed off as the one asked for."""
    raw = request.query_params.get("before") or None
    if raw is None:
        return None
    before = parse_id(raw)
    if before is None:
        raise PageError(400, "bad page", f"before={_shorten(raw)} is not a job id")
    return before


def _path_id(request: Request) -> int:
    """The job id of the path; a 404 page when it cannot be one (no job has it)."""
    raw = str(request.path_params["id"])
    job_id = parse_id(raw)
    if job_id is None:
        raise PageError(404, "not found", f"no job {_shorten(raw)}")
    return job_id


def _shorten(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _spark_series(rows: list[Any]) -> dict[str, list[int]]:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    series: dict[str, list[int]] = {}
    for r in rows:
        if r["state"] != "succeeded":
            continue
        back = int((now - r["minute"]).total_seconds() // 60)
        if 0 <= back < SPARK_MINUTES:
            points = series.setdefault(r["queue"], [0] * SPARK_MINUTES)
            points[SPARK_MINUTES - 1 - back] += int(r["jobs"])
    return series


# --------------------------------------------------------------------------- pages


@guarded
async def overview(request: Request) -> Response:
    store = api_state(request).store
    rows = await store.queue_list()
    stats = stats_json(rows, await store.job_counts_finished())
    series = _spark_series(await store.throughput_recent(SPARK_MINUTES))
    queues = [queue_json(r) for r in rows]
    names = sorted({q["name"] for q in queues} | set(series))
    by_name = {q["name"]: q for q in queues}
    body_rows = []
    for name in names:
        q = by_name.get(name) or {"paused": False, "counts": dict.fromkeys(LIVE_STATES, 0)}
        counts = q["counts"]
        age = q.get("oldest_due_age_s")
        points = series.get(name, [0] * SPARK_MINUTES)
        action = "resume" if q["paused"] else "pause"
        body_rows.append(
            [
                link(url("/ui/jobs", queue=name), name),
                render('<b class="bad">paused</b>') if q["paused"] else "",
                counts["queued"] + counts["scheduled"] + counts["retrying"],
                counts["running"],
                counts["waiting"],
                "-" if age is None else f"{age:.1f}s",
                join([sparkline(points), render(" <small>$n/min</small>", n=points[-1])]),
                post_button(f"/ui/queues/{name}/{action}", action),
            ]
        )
    queue_table = table(
        [
            "queue",
            "",
            "depth",
            "running",
            "waiting",
            "oldest due",
            f"succeeded/min ({SPARK_MINUTES} min)",
            "",
        ],
        body_rows,
        "no queues with unfinished jobs",
    )
    totals = table(
        ["state", "jobs"],
        [
            [
                link(url("/ui/jobs", state=s), s),
                f"~{n}" if s in stats["estimated"] else n,
            ]
            for s, n in stats["jobs"].items()
        ],
        "",
    )
    note = render(
        "<p><small>~ marks an estimate: finished states with many jobs are counted from "
        "the planner's statistics, never by scanning the table.</small></p>"
    )
    return _html("queues", join([queue_table, render("<h2>jobs by state</h2>"), totals, note]))


def _jobs_table(jobs: list[dict[str, Any]], replay: bool) -> Safe:
    headers = ["id", "type", "queue", "state", "attempt", "run at", "finished", "last error"]
    rows = []
    for j in jobs:
        row: list[object] = [
            link(f"/ui/jobs/{j['id']}", j["id"]),
            j["type"],
            j["queue"],
            _state_cell(j["state"]),
            f"{j['attempt']}/{j['max_attempts']}",
            _ago(j["run_at"]),
            _ago(j["finished_at"]),
            _error_line(j["last_error"]),
        ]
        if replay:
            row.append(post_button(f"/ui/jobs/{j['id']}/retry", "replay"))
        rows.append(row)
    return table(headers + ([""] if replay else []), rows, "no jobs")


def _filters_form(action: str, state: str | None, type_: str | None, queue: str | None) -> Safe:
    selected = Safe(" selected")
    options = join(
        render('<option value="$v"$sel>$v</option>', v=s, sel=selected if s == state else "")
        for s in [s.value for s in JobState]
    )
    state_select = (
        render('<select name="state"><option value="">any state</option>$o</select>', o=options)
        if action == "/ui/jobs"
        else Safe("")
    )
    return render(
        '<form class="filters" method="get" action="$action">$state_select'
        '<input name="type" placeholder="type" value="$type">'
        '<input name="queue" placeholder="queue" value="$queue">'
        '<button type="submit">filter</button></form>',
        action=action,
        state_select=state_select,
        type=type_ or "",
        queue=queue or "",
    )


async def _listing(request: Request, state: JobState | None) -> tuple[list[dict[str, Any]], Safe]:
    type_ = _filter_value(request, "type", validate_type)
    queue = _filter_value(request, "queue", validate_queue)
    before = _before(request)
    params = ListParams(limit=PAGE_SIZE, state=state, type=type_, queue=queue, before_id=before)
    jobs = [job_json(j) for j in await api_state(request).store.job_list(params)]
    more = Safe("")
    if len(jobs) == PAGE_SIZE:
        nxt = url(
            request.url.path,
            state=state.value if state and request.url.path == "/ui/jobs" else None,
            type=type_,
            queue=queue,
            before=jobs[-1]["id"],
        )
        more = link(nxt, "older →")
    return jobs, more


@guarded
async def jobs(request: Request) -> Response:
    raw = request.query_params.get("state") or None
    state = JobState(raw) if raw in {s.value for s in JobState} else None
    found, more = await _listing(request, state)
    form = _filters_form(
        "/ui/jobs",
        state.value if state else None,
        request.query_params.get("type"),
        request.query_params.get("queue"),
    )
    return _html("jobs", join([form, _jobs_table(found, replay=False), more]))


@guarded
async def dead(request: Request) -> Response:
    found, more = await _listing(request, JobState.DEAD)
    type_ = _filter_value(request, "type", validate_type)
    queue = _filter_value(request, "queue", validate_queue)
    form = _filters_form("/ui/dead", None, type_, queue)
    scope = " and ".join(
        f"{k} {v}" for k, v in (("type", type_), ("queue", queue)) if v is not None
    )
    bulk = post_button(
        "/ui/dead/replay",
        f"replay every dead job{' of ' + scope if scope else ''}",
        "bulk",
        type=type_,
        queue=queue,
    )
    return _html("dead letters", join([form, bulk, _jobs_table(found, replay=True), more]))


@guarded
async def job_page(request: Request) -> Response:
    job_id = _path_id(request)
    store = api_state(request).store
    job = await store.job_get(job_id)
    if job is None:
        return _html("not found", render("<p>no job $id</p>", id=job_id), 404)
    j = job_json(job)
    attempts = [attempt_json(a) for a in await store.job_attempts(job.id)]
    facts = table(
        ["field", "value"],
        [
            ["state", _state_cell(j["state"])],
            ["type", j["type"]],
            ["queue", link(url("/ui/jobs", queue=j["queue"]), j["queue"])],
            ["priority", j["priority"]],
            ["attempt", f"{j['attempt']} of {j['max_attempts']}"],
            ["created", f"{j['created_at']} ({_ago(j['created_at'])})"],
            ["run at", f"{j['run_at']} ({_ago(j['run_at'])})"],
            ["started", j["started_at"] or "-"],
            ["finished", j["finished_at"] or "-"],
            ["idempotency key", j["idempotency_key"] or "-"],
            [
                "lease",
                "-"
                if j["lease"] is None
                else f"worker {j['lease']['worker']}, token {j['lease']['token']}, "
                f"expires {j['lease']['expires_at']}",
            ],
        ],
        "",
    )
    actions = []
    if j["state"] in ("dead", "cancelled"):
        actions.append(post_button(f"/ui/jobs/{job.id}/retry", "replay"))
    if j["state"] not in ("succeeded", "dead", "cancelled"):
        actions.append(post_button(f"/ui/jobs/{job.id}/cancel", "cancel"))
    timeline = table(
        ["#", "started", "finished", "took", "worker", "lease token", "outcome", "error"],
        [
            [
                a["attempt"],
                a["started_at"] or "-",
                a["finished_at"] or "-",
                _took(a["started_at"], a["finished_at"]),
                a["worker"] or "-",
                a["lease_token"],
                _state_cell(a["outcome"]),
                render("<pre>$e</pre>", e=a["error"] or ""),
            ]
            for a in attempts
        ],
        "no attempt has ended yet",
    )
    body = join(
        [
            facts,
            join(actions),
            render("<h2>payload</h2>"),
            pretty_json(j["payload"]),
            render("<h2>result</h2>"),
            pretty_json(j["result"]),
            render("<h2>last error</h2><pre>$e</pre>", e=j["last_error"] or "-"),
            render("<h2>attempts</h2>"),
            timeline,
        ]
    )
    return _html(f"job {job.id}", body)


def _took(start: str | None, end: str | None) -> str:
    if not start or not end:
        return "-"
    return f"{(datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds():.3f}s"


@guarded
async def workers(request: Request) -> Response:
    state = api_state(request)
    rows = await state.store.worker_list(int(state.settings.lease_ttl_s * 1000))
    found = [worker_json(r) for r in rows]
    return _html(
        "workers",
        table(
            ["id", "host", "pid", "queues", "jobs held", "alive", "last heartbeat", "started"],
            [
                [
                    link(url("/ui/jobs", state="running"), w["id"]),
                    w["hostname"],
                    w["pid"],
                    ", ".join(w["queues"]),
                    f"{w['jobs_held']} / {w['concurrency']}",
                    "yes" if w["alive"] else render('<b class="bad">no</b>'),
                    _ago(w["last_heartbeat_at"]),
                    _ago(w["started_at"]),
                ]
                for w in found
            ],
            "no workers registered",
        ),
    )


# --------------------------------------------------------------------------- actions


@guarded
async def retry(request: Request) -> Response:
    """Replay one dead (or cancelled) job, then show it (its page refreshes itself)."""
    job_id = _path_id(request)
    await api_state(request).store.job_retry(job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@guarded
async def cancel(request: Request) -> Response:
    job_id = _path_id(request)
    await api_state(request).store.job_cancel(job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@guarded
async def replay_bulk(request: Request) -> Response:
    form = await _form(request, frozenset({"type", "queue"}))
    try:
        type_ = validate_type(form["type"]) if form.get("type") else None
        queue = validate_queue(form["queue"]) if form.get("queue") else None
    except InvalidJob as exc:
        return _html("bad filter", render("<p>$e</p>", e=str(exc)), 422)
    ids = await api_state(request).store.job_retry_dead_many(type_, queue)
    back = link(url("/ui/jobs", state="queued", type=type_, queue=queue), "see them queued")
    return _html("replayed", join([render("<p>replayed $n dead job(s).</p>", n=len(ids)), back]))


@guarded
async def set_paused(request: Request) -> Response:
    action = request.path_params["action"]
    try:
        name = validate_queue(str(request.path_params["name"]))
    except InvalidJob as exc:
        return _html("bad queue", render("<p>$e</p>", e=str(exc)), 422)
    if action not in ("pause", "resume"):
        return _html("not found", render("<p>no such action</p>"), 404)
    await api_state(request).store.queue_set_paused(name, action == "pause")
    return RedirectResponse("/ui/", status_code=303)


ROUTES = [
    Route("/", overview, methods=["GET"]),
    Route("/login", login_form, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/jobs", jobs, methods=["GET"]),
    Route("/jobs/{id}", job_page, methods=["GET"]),
    Route("/jobs/{id}/retry", retry, methods=["POST"]),
    Route("/jobs/{id}/cancel", cancel, methods=["POST"]),
    Route("/dead", dead, methods=["GET"]),
    Route("/dead/replay", replay_bulk, methods=["POST"]),
    Route("/workers", workers, methods=["GET"]),
    Route("/queues/{name}/{action}", set_paused, methods=["POST"]),
]
