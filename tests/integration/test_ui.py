"""The dashboard at /ui over a real server and database: auth (bearer or the signed
session; the sessions' own tests are in test_ui_sessions.py), the CSRF guard on
POSTs, escaping of user data (all of it: test_ui_escaping.py), every page, and the
replay, cancel and pause actions."""

from __future__ import annotations

import html
import re

import httpx
import pytest

from deadman import bounds
from deadman.api.auth import SESSION_COOKIE, SESSION_TTL_S
from tests.factories import connect, insert_job, job_row
from tests.helpers.api import client, make_app, serve

TOKEN = "ui-test-token"


def _state(dsn: str, job_id: int) -> str:
    with connect(dsn) as conn:
        return str(job_row(conn, job_id)["state"])


def test_auth_by_header_or_sign_in_cookie(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        origin = {"Origin": base}
        r = c.get("/ui/", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        assert c.get("/ui/login").status_code == 200
        assert c.get("/ui/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        # the JSON API still wants the header: the cookie is no API credential
        bad = c.post("/ui/login", data={"token": "wrong"}, headers=origin)
        assert bad.status_code == 401 and "not valid" in bad.text
        assert SESSION_COOKIE not in c.cookies
        ok = c.post("/ui/login", data={"token": TOKEN}, headers=origin, follow_redirects=False)
        assert ok.status_code == 303
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=lax" in cookie and "path=/ui;" in cookie
        assert f"max-age={SESSION_TTL_S}" in cookie and "secure" not in cookie  # plain http
        assert TOKEN.lower() not in cookie
        assert c.get("/ui/").status_code == 200
        assert c.get("/jobs").status_code == 401  # API routes ignore the cookie
        # a sign-in posted from another site is refused
        evil = c.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://evil"})
        assert evil.status_code == 403


def test_posts_need_a_same_origin_request(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead").id
    with serve(make_app(db_dsn)) as base, client(base) as c:
        assert c.post(f"/ui/jobs/{dead}/retry").status_code == 403  # no Origin/Referer
        r = c.post(f"/ui/jobs/{dead}/retry", headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        assert _state(db_dsn, dead) == "dead"
        r = c.post(
            f"/ui/jobs/{dead}/retry", headers={"Referer": f"{base}/ui/dead"}, follow_redirects=False
        )
        assert r.status_code == 303 and r.headers["location"] == f"/ui/jobs/{dead}"
        assert _state(db_dsn, dead) == "queued"


def test_pages_render_and_escape_user_data(db_dsn: str) -> None:
    evil = "<script>alert(1)</script>"
    with connect(db_dsn) as conn:
        queued = insert_job(conn, queue="mail", payload={"html": evil}).id
        dead = insert_job(conn, state="dead", type="pdf", last_error=f"boom {evil}").id
        insert_job(conn, state="succeeded", queue="mail", finished_ago_s=30)
        conn.execute(
            "INSERT INTO deadman.workers (id, hostname, pid, queues, concurrency)"
            " VALUES ('w-1', 'host<b>', 1, '{mail}', 4)"
        )
    with serve(make_app(db_dsn)) as base, client(base) as c:
        pages = {
            p: c.get(p)
            for p in (
                "/ui/",
                "/ui/jobs",
                "/ui/jobs?state=dead&type=pdf",
                f"/ui/jobs/{queued}",
                f"/ui/jobs/{dead}",
                "/ui/dead",
                "/ui/workers",
            )
        }
        for path, r in pages.items():
            assert r.status_code == 200, path
            assert r.headers["content-type"].startswith("text/html")
            assert "<script>alert(1)" not in r.text, path
        assert "mail" in pages["/ui/"].text and "<svg" in pages["/ui/"].text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[f"/ui/jobs/{queued}"].text
        assert "boom &lt;script&gt;" in pages["/ui/dead"].text
        assert "host&lt;b&gt;" in pages["/ui/workers"].text
        assert str(dead) in pages["/ui/jobs?state=dead&type=pdf"].text
        assert f'/ui/jobs/{queued}"' not in pages["/ui/jobs?state=dead&type=pdf"].text
        assert c.get("/ui/jobs/999999").status_code == 404
        assert c.get("/ui/jobs/abc").status_code == 404
        # nonsense filters are ignored, not errors; a cursor that is no job id is a 400
        assert c.get("/ui/jobs?state=bogus&queue=a%20b").status_code == 200
        assert c.get("/ui/jobs?before=-1").status_code == 400


def test_keyset_pages(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        ids = [insert_job(conn, state="dead", queue="q").id for _ in range(55)]
    with serve(make_app(db_dsn)) as base, client(base) as c:
        first = c.get("/ui/dead?queue=q").text
        assert f"/ui/jobs/{ids[-1]}" in first and f'/ui/jobs/{ids[0]}"' not in first
        assert f"before={ids[5]}" in first  # 50 newest shown; the next page starts below
        second = c.get(f"/ui/dead?queue=q&before={ids[5]}").text
        assert f'/ui/jobs/{ids[0]}"' in second and "older →" not in second


def test_a_windowed_page_says_it_may_be_short(db_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing by queue reads LIST_WINDOW jobs per page (DECISIONS 79): a rare queue's
    first page may be empty; it says why and links on until the job is found."""
    monkeypatch.setattr(bounds, "LIST_WINDOW", 5)
    with connect(db_dsn) as conn:
        rare = insert_job(conn, queue="rare", state="succeeded").id
        for _ in range(12):
            insert_job(conn, queue="busy", state="succeeded")
    with serve(make_app(db_dsn)) as base, client(base) as c:
        path = "/ui/jobs?queue=rare"
        for _ in range(4):  # 13 jobs in windows of 5: the third page has it
            text = c.get(path).text
            if f'/ui/jobs/{rare}"' in text:
                break
            assert "no jobs" in text and "looked through the 5 jobs below it" in text
            found = re.search(r'href="(/ui/jobs\?[^"]*before=\d+)">older', text)
            assert found is not None, text
            path = html.unescape(found.group(1))
        else:
            raise AssertionError("the rare queue's job was never listed")
        assert "older →" not in text and "looked through" not in text


def test_bulk_replay_by_type_then_all(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        a = insert_job(conn, state="dead", type="pdf", queue="q1").id
        b = insert_job(conn, state="dead", type="mail", queue="q1").id
        c_ = insert_job(conn, state="dead", type="pdf", queue="q2").id
    with serve(make_app(db_dsn)) as base, client(base) as c:
        h = {"Origin": base}
        r = c.post("/ui/dead/replay", data={"type": "pdf"}, headers=h)
        assert r.status_code == 200 and "replayed 2 dead job(s)" in r.text
        assert [_state(db_dsn, i) for i in (a, b, c_)] == ["queued", "dead", "queued"]
        assert c.post("/ui/dead/replay", data={"type": "bad type!"}, headers=h).status_code == 422
        assert "replayed 1 dead" in c.post("/ui/dead/replay", data={}, headers=h).text
        assert _state(db_dsn, b) == "queued"


def test_cancel_a_queued_job(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        queued = insert_job(conn, queue="q1").id
    with serve(make_app(db_dsn)) as base, client(base) as c:
        assert c.post(f"/ui/jobs/{queued}/cancel", headers={"Origin": base}).status_code == 303
    assert _state(db_dsn, queued) == "cancelled"


def test_pause_and_resume_a_queue(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn, queue="q1")
    with serve(make_app(db_dsn)) as base, client(base) as c:
        h = {"Origin": base}
        assert c.post("/ui/queues/q1/pause", headers=h).status_code == 303
        assert "paused" in c.get("/ui/").text
        assert c.get("/queues").json()["queues"][0]["paused"] is True
        assert c.post("/ui/queues/q1/explode", headers=h).status_code == 404
        c.post("/ui/queues/q1/resume", headers=h)
        assert c.get("/queues").json()["queues"][0]["paused"] is False


def test_unauthenticated_posts_are_refused(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead").id
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, httpx.Client(base_url=base) as c:
        r = c.post(f"/ui/jobs/{dead}/retry", headers={"Origin": base})
        assert r.status_code == 401
    assert _state(db_dsn, dead) == "dead"


def test_the_overview_shows_limits_and_schedules(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        conn.execute("INSERT INTO deadman.limits (key, concurrency) VALUES ('stripe', 5)")
        conn.execute(
            "INSERT INTO deadman.schedules (name, cron, job, next_fire_at)"
            " VALUES ('nightly', '0 2 * * *', '{\"type\": \"noop\"}', now())"
        )
    with serve(make_app(db_dsn)) as base, client(base) as c:
        page = c.get("/ui/").text
    assert "nightly" in page and "0 2 * * *" in page
    assert "stripe" in page
