"""Hostile input to the dashboard (/ui) over real HTTP: every page's query string and
path parameter, every form, with values a careless or malicious client sends
(unicode digits such as '²' and '٣' that ``str.isdigit()`` accepts and ``int()``
refuses, numbers past bigint or of 5,000 digits, NUL, lone surrogates and invalid
UTF-8 percent-encoded, overlong strings), and forms without their CSRF proof or
credentials. Each must get a clear 4xx page (or the page, when the value is a filter
it may ignore), never a 500, and leave the database as it was.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from deadman.api.auth import SESSION_COOKIE
from tests.factories import connect, insert_job
from tests.helpers.api import client, make_app, serve

TOKEN = "dashboard-hostile-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

#: Values that are not a job id, already percent-encoded for a URL.
NOT_IDS = [
    "%C2%B2",  # '²': isdigit() is True, int() raises
    "%D9%A3",  # '٣' (Arabic-Indic three): isdigit() and int() both accept it
    "1%C2%B2",
    "9" * 5000,  # int() refuses more than 4300 digits
    "9223372036854775808",  # one past bigint
    "-1",
    "0",
    "007",
    "%2B1",  # '+1'
    "%201",  # ' 1'
    "1%00",
    "%00",
    "%ED%A0%80",  # a lone surrogate, encoded as UTF-8 would if it could
    "%FF%FE",  # not UTF-8 at all
    "x" * 10_000,
]


def _snapshot(dsn: str) -> Any:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM deadman.queues) AS q,"
            " (SELECT COALESCE(jsonb_agg(jsonb_build_array(id, state, attempt, cancel_requested)"
            "   ORDER BY id), '[]') FROM deadman.jobs) AS jobs"
        ).fetchone()
    assert row is not None
    return row


@pytest.fixture
def dashboard(db_dsn: str) -> Any:
    with connect(db_dsn) as conn:
        for state in ("queued", "running", "dead", "cancelled", "succeeded"):
            insert_job(conn, state=state, queue="q")
    app = make_app(db_dsn, api_token=TOKEN, max_payload_bytes=64 * 1024)
    with serve(app) as base, client(base, headers=AUTH) as c:
        yield base, c


def _is_clear_4xx(r: httpx.Response, statuses: tuple[int, ...]) -> None:
    assert r.status_code in statuses, (str(r.url)[:120], r.status_code, r.text[:300])
    assert "Traceback" not in r.text
    if r.status_code >= 400:
        assert r.headers["content-type"].startswith(("text/html", "application/problem+json"))


def test_a_before_that_is_no_job_id_is_a_400_page(dashboard: Any, db_dsn: str) -> None:
    """Bug 9: /ui/jobs?before=² and a 5,000-digit before= were 500s."""
    _base, c = dashboard
    before = _snapshot(db_dsn)
    for value in NOT_IDS:
        for page in ("/ui/jobs", "/ui/dead"):
            r = c.get(f"{page}?before={value}")
            _is_clear_4xx(r, (400,))
            assert "before" in r.text
            r = c.get(f"{page}?state=dead&queue=q&before={value}")
            _is_clear_4xx(r, (400,))
    assert _snapshot(db_dsn) == before


def test_a_path_id_that_is_no_job_id_is_a_404_page_and_changes_nothing(
    dashboard: Any, db_dsn: str
) -> None:
    """Bug 9: /ui/jobs/² was a 500, and so were its retry and cancel forms."""
    base, c = dashboard
    before = _snapshot(db_dsn)
    for value in NOT_IDS:
        _is_clear_4xx(c.get(f"/ui/jobs/{value}"), (404,))
        for action in ("retry", "cancel"):
            r = c.post(f"/ui/jobs/{value}/{action}", headers={"Origin": base})
            _is_clear_4xx(r, (404,))
    assert _snapshot(db_dsn) == before


HOSTILE_TEXT = [
    "%C2%B2",
    "%00",
    "a%00b",
    "%ED%A0%80",
    "%FF",
    "%0A",
    "x" * 5000,
    "%27%20OR%20%271%27=%271",
    "%3Cscript%3Ealert(1)",
]


def test_filters_never_break_a_page(dashboard: Any, db_dsn: str) -> None:
    """state, type and queue are filters: a value that cannot match is ignored (the
    page shows, escaped), never a 500."""
    _base, c = dashboard
    before = _snapshot(db_dsn)
    for value in HOSTILE_TEXT:
        for page in ("/ui/", "/ui/jobs", "/ui/dead", "/ui/workers"):
            for name in ("state", "type", "queue"):
                r = c.get(f"{page}?{name}={value}")
                _is_clear_4xx(r, (200,))
                assert "<script>alert" not in r.text
    assert _snapshot(db_dsn) == before


FORM_BODIES: list[bytes] = [
    b"type=%C2%B2",
    b"queue=%00",
    b"type=%ED%A0%80",
    b"type=" + b"x" * 5000,
    b"\xff\xfe\xfd",  # not UTF-8
    b"type=pdf&type=%00",
    b"=&&=&type",
    b"%",
]


def test_bulk_replay_form_refuses_bad_filters(dashboard: Any, db_dsn: str) -> None:
    """A filter the form cannot use is a 422 page that replays nothing (never "no
    filter", which would replay every dead job)."""
    base, c = dashboard
    before = _snapshot(db_dsn)
    headers = {"Origin": base, "Content-Type": "application/x-www-form-urlencoded"}
    for body in FORM_BODIES:
        r = c.post("/ui/dead/replay", content=body, headers=headers)
        _is_clear_4xx(r, (422,))
        assert _snapshot(db_dsn) == before, body


def test_pause_form_refuses_bad_queue_names(dashboard: Any, db_dsn: str) -> None:
    base, c = dashboard
    before = _snapshot(db_dsn)
    for name in ("%C2%B2", "%00", "%ED%A0%80", "x" * 200, "a%20b", "%FF"):
        for action in ("pause", "resume", "explode"):
            r = c.post(f"/ui/queues/{name}/{action}", headers={"Origin": base})
            _is_clear_4xx(r, (404, 422))
    assert _snapshot(db_dsn) == before


def test_forms_without_csrf_proof_or_credentials_change_nothing(
    dashboard: Any, db_dsn: str
) -> None:
    base, c = dashboard
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead").id
        queued = insert_job(conn).id
    before = _snapshot(db_dsn)
    posts = [
        f"/ui/jobs/{dead}/retry",
        f"/ui/jobs/{queued}/cancel",
        "/ui/dead/replay",
        "/ui/queues/q/pause",
    ]
    bad_origins: list[dict[str, str]] = [
        {},
        {"Origin": "null"},
        {"Origin": "http://evil.example"},
        {"Referer": "http://evil.example/ui/"},
        {"Origin": base.replace("127.0.0.1", "127.0.0.1.evil.example")},
        {"Origin": "%ED%A0%80"},
        {"Origin": "http://["},  # urlsplit raises ValueError on these
        {"Referer": "http://[::1/ui/"},
        {"Origin": "//[x]"},
    ]
    for path in posts:
        for headers in bad_origins:
            _is_clear_4xx(c.post(path, headers=headers), (403,))
    with httpx.Client(base_url=base, timeout=30) as anonymous:
        for path in posts:
            for credentials in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "Basic " + TOKEN},
                {"Cookie": "deadman_ui=forged"},
                {"Cookie": f"{SESSION_COOKIE}=forged"},
                {"Cookie": f"{SESSION_COOKIE}=" + "a" * 5000},
                {"Cookie": f"{SESSION_COOKIE}=e30.aw6HYw.%ED%A0%80"},
            ):
                r = anonymous.post(path, headers={"Origin": base, **credentials})
                _is_clear_4xx(r, (401,))
        # the sign-in form: a wrong or hostile token is a 401 page, a foreign origin 403
        form = {"Origin": base, "Content-Type": "application/x-www-form-urlencoded"}
        for body in (b"token=wrong", b"token=%00", b"token=%ED%A0%80", b"token=\xff\xfe"):
            _is_clear_4xx(anonymous.post("/ui/login", content=body, headers=form), (401, 422))
        for body in (b"token=a&token=" + TOKEN.encode(), b"token=x&admin=1", b"%"):
            _is_clear_4xx(anonymous.post("/ui/login", content=body, headers=form), (422,))
        r = anonymous.post("/ui/login", data={"token": "x" * 5000}, headers={"Origin": base})
        _is_clear_4xx(r, (401,))
        for origin in ("http://x", "http://[", "//[x]"):
            r = anonymous.post("/ui/login", data={"token": TOKEN}, headers={"Origin": origin})
            _is_clear_4xx(r, (403,))
    assert _snapshot(db_dsn) == before


def test_a_form_over_the_size_limit_is_413(dashboard: Any, db_dsn: str) -> None:
    base, c = dashboard
    before = _snapshot(db_dsn)
    r = c.post("/ui/dead/replay", data={"type": "x" * 100_000}, headers={"Origin": base})
    _is_clear_4xx(r, (413,))
    assert _snapshot(db_dsn) == before
