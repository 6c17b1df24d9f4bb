"""Hostile text in every field the dashboard shows comes out as text, never markup.

Two payloads, a script tag and an attribute break-out, are stored in every column a
page shows: job type, queue, payload, result, last error, idempotency key, lease
worker, attempt worker and error, worker id, hostname and queues, a paused queue's
name, and in what a page echoes back (filter inputs, a bad cursor, a bad path id, a
bad form field, a bad queue name). Type and queue names cannot hold them (CHECK
constraints); the test drops those constraints in its own database, because the
pages must stay safe even for rows no check ever saw. Each page must show the
escaped text (so the field really is on the page) and never the raw one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from psycopg.types.json import Jsonb

from tests.factories import connect, insert_job
from tests.helpers.api import PROBLEM, client, make_app, serve

SCRIPT = "<script>alert(1)</script>"
BREAKOUT = "\"'><img src=x onerror=alert(1)>"
HOSTILE = (SCRIPT, BREAKOUT)
#: How each payload reads once escaped, in whatever quoting (repr, JSON) surrounds it.
ESCAPED = ("&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;")
RAW = ("<script>alert", "<img", "onerror=alert(1)>", "\"'>")
UI = Path(__file__).resolve().parents[2] / "deadman" / "api" / "ui"


def _store_hostile_rows(dsn: str) -> list[tuple[int, str]]:
    """The rows; returns each job's id with the escaped text its page must show."""
    ids: list[int] = []
    shows: list[tuple[int, str]] = []
    with connect(dsn) as conn:
        conn.execute("ALTER TABLE deadman.jobs DROP CONSTRAINT jobs_type_valid")
        conn.execute("ALTER TABLE deadman.jobs DROP CONSTRAINT jobs_queue_valid")
        for row in conn.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = 'deadman.queues'::regclass AND contype = 'c'"
        ).fetchall():
            conn.execute(f'ALTER TABLE deadman.queues DROP CONSTRAINT "{row["conname"]}"')
        for h in HOSTILE:
            common: dict[str, Any] = {"type": h, "queue": h, "payload": {h: h}}
            ids.append(insert_job(conn, idempotency_key=h, **common).id)
            dead = insert_job(conn, state="dead", last_error=f"Traceback:\n  {h}", **common).id
            ids.append(dead)
            ids.append(insert_job(conn, state="running", lease_worker=h, **common).id)
            done = insert_job(conn, state="succeeded", finished_ago_s=30, **common).id
            conn.execute(
                "UPDATE deadman.jobs SET result = %s WHERE id = %s", (Jsonb({"r": h}), done)
            )
            ids.append(done)
            conn.execute(
                "INSERT INTO deadman.attempt_log"
                " (lease_token, job_id, attempt, worker, started_at, outcome, error)"
                " VALUES (nextval('deadman.lease_token_seq'), %s, 1, %s, now() - interval '5s',"
                " 'failed', %s)",
                (dead, h, h),
            )
            conn.execute(
                "INSERT INTO deadman.workers (id, hostname, pid, queues, concurrency)"
                " VALUES (%s, %s, 1, %s, 4)",
                (h, h, [h]),
            )
            conn.execute("INSERT INTO deadman.queues (name, paused) VALUES (%s, true)", (h,))
            shows += [(i, ESCAPED[HOSTILE.index(h)]) for i in ids[len(shows) :]]
    return shows


def _check(what: str, r: httpx.Response, status: int, escaped: tuple[str, ...]) -> None:
    assert r.status_code == status, (what, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html"), what
    assert r.headers["x-frame-options"] == "DENY", what  # no clickjacking of the forms
    assert r.headers["content-security-policy"] == "frame-ancestors 'none'", what
    for raw in RAW:
        assert raw not in r.text, (what, raw)
    for text in escaped:
        assert text in r.text, (what, text)


def test_hostile_text_in_every_field_is_escaped_on_every_page(db_dsn: str) -> None:
    shows = _store_hostile_rows(db_dsn)
    with serve(make_app(db_dsn)) as base, client(base) as c:
        for path in ("/ui/", "/ui/jobs", "/ui/jobs?state=running", "/ui/dead", "/ui/workers"):
            _check(path, c.get(path), 200, ESCAPED)
        for job_id, escaped in shows:
            page = c.get(f"/ui/jobs/{job_id}")
            _check(f"job {job_id}", page, 200, (escaped,))
            assert page.text.count(escaped) >= 3, job_id  # type, queue, payload at least
        for h, escaped in zip(HOSTILE, ESCAPED, strict=True):
            q = quote(h, safe="")
            r = c.get(f"/ui/jobs?type={q}&queue={q}")  # filters no job can match: shown
            assert r.status_code == 200 and r.text.count(escaped) >= 2
            for raw in RAW:
                assert raw not in r.text
            pages = [(f"/ui/jobs?before={q}", 400)]
            if "/" not in h:
                pages.append((f"/ui/jobs/{q}", 404))
            else:  # %2F is a path separator: no route matches, the app's 404 is JSON
                r = c.get(f"/ui/jobs/{q}")
                assert r.status_code == 404 and r.headers["content-type"] == PROBLEM
            for path, status in pages:
                r = c.get(path)
                assert r.status_code == status and escaped in r.text, path
                assert all(raw not in r.text for raw in RAW), path
            origin = {"Origin": base}
            form = {**origin, "Content-Type": "application/x-www-form-urlencoded"}
            posts = [("/ui/dead/replay", f"{q}=1", 422), ("/ui/dead/replay", f"type={q}", 422)]
            if "/" not in h:
                posts.append((f"/ui/queues/{q}/pause", "", 422))
            for path, body, status in posts:
                r = c.post(path, content=body, headers=form)
                assert r.status_code == status and escaped in r.text, (path, r.text[:300])
                assert all(raw not in r.text for raw in RAW), path


def test_the_dashboard_code_builds_no_html_and_marks_nothing_safe() -> None:
    """The guarantee rests on two things a later change could undo quietly: values
    reach a page only through a template, and no template opts out of escaping."""
    tag = re.compile(r"<(a|b|p|td|tr|th|table|form|input|div|span|pre|svg|h\d)[\s>]")
    for path in UI.glob("*.py"):
        assert not tag.search(path.read_text()), f"{path.name} builds HTML"
        assert "Markup" not in path.read_text(), path.name
    templates = list((UI / "templates").glob("*.html"))
    assert len(templates) >= 8
    for path in templates:
        text = path.read_text()
        assert "|safe" not in text.replace(" ", ""), path.name
        assert "{% autoescape" not in text, path.name
