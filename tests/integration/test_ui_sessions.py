"""The dashboard's signed sessions over a real server: each sign-in its own session,
refused once the token rotates, once it is older than its lifetime (both sides of
the threshold, forged through the server's own signer with an old issue time: no
waiting), or when signed with any other key; signing out; Secure over https. And
the one token comparison the API and the dashboard share."""

from __future__ import annotations

import json
import re
import time
from base64 import b64decode, b64encode
from pathlib import Path
from typing import Any

import httpx
import itsdangerous
from structlog.testing import capture_logs

from deadman.api.auth import (
    SESSION_COOKIE,
    SESSION_SKEW_S,
    SESSION_TTL_S,
    SESSION_VERSION,
    new_session,
    session_secret,
    session_valid,
)
from tests.factories import connect, insert_job, job_row
from tests.helpers.api import client, make_app, serve

TOKEN = "session-test-token"
ROTATED = "session-test-token-rotated"
DEADMAN = Path(__file__).resolve().parents[2] / "deadman"


def _sign_in(c: httpx.Client, base: str, token: str = TOKEN, **headers: str) -> str:
    r = c.post(
        "/ui/login",
        data={"token": token},
        headers={"Origin": base, **headers},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/ui/", r.text
    value = r.cookies.get(SESSION_COOKIE)
    assert value, r.headers.get("set-cookie")
    return value


def _opens(base: str, cookie: str) -> bool:
    """Whether ``cookie`` alone opens the dashboard (a fresh client: no other state)."""
    with client(base) as c:
        r = c.get("/ui/", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"}, follow_redirects=False)
    assert r.status_code in (200, 303), r.status_code
    if r.status_code == 303:
        assert r.headers["location"] == "/ui/login"
    return r.status_code == 200


def _forge(payload: dict[str, Any], key: str) -> str:
    """A cookie as Starlette's SessionMiddleware writes one, signed with ``key``."""
    data = b64encode(json.dumps(payload).encode())
    return itsdangerous.TimestampSigner(key).sign(data).decode()


def test_each_sign_in_gets_its_own_session_without_the_token(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        first = _sign_in(c, base)
        second = _sign_in(c, base)
        assert first != second
        assert _opens(base, first) and _opens(base, second)
        payload = json.loads(b64decode(first.split(".")[0]))
        assert set(payload) == {"v", "sid", "iat"} and TOKEN not in first
        assert abs(payload["iat"] - time.time()) < 300


def test_rotating_the_token_ends_every_session(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        cookie = _sign_in(c, base)
        assert _opens(base, cookie)
    with serve(make_app(db_dsn, api_token=ROTATED)) as base, client(base) as c:
        assert not _opens(base, cookie)
        assert _opens(base, _sign_in(c, base, ROTATED))  # the new token signs in


def test_a_session_is_good_until_its_lifetime_and_refused_after(db_dsn: str) -> None:
    key = session_secret(TOKEN)
    now = int(time.time())

    def session(iat: Any, v: Any = SESSION_VERSION) -> str:
        return _forge({"v": v, "sid": "forged", "iat": iat}, key)

    with serve(make_app(db_dsn, api_token=TOKEN)) as base:
        # the cookie's own signature is fresh in every case: only the issue time ages
        assert _opens(base, session(now - SESSION_TTL_S + 120))
        assert not _opens(base, session(now - SESSION_TTL_S - 1))
        assert not _opens(base, session(now - 30 * 24 * 3600))
        assert _opens(base, session(now + SESSION_SKEW_S // 2))
        assert not _opens(base, session(now + SESSION_SKEW_S + 120))  # issued in the future
        for iat in (None, str(now), float(now), True, [now]):
            assert not _opens(base, session(iat))
        assert not _opens(base, session(now, v=SESSION_VERSION + 1))
        assert not _opens(base, _forge({}, key))


def test_the_lifetime_is_checked_by_the_server_not_only_by_the_cookie() -> None:
    issued = 1_000_000
    session = new_session(now=issued)
    assert session_valid(session, now=issued)
    assert session_valid(session, now=issued + SESSION_TTL_S - 1)
    assert not session_valid(session, now=issued + SESSION_TTL_S)
    assert not session_valid(session, now=issued - SESSION_SKEW_S - 1)
    assert new_session(now=issued)["sid"] != session["sid"]


def test_a_cookie_signed_with_another_key_is_refused(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead").id
    good = {"v": SESSION_VERSION, "sid": "x", "iat": int(time.time())}
    with serve(make_app(db_dsn, api_token=TOKEN)) as base:
        assert _opens(base, _forge(good, session_secret(TOKEN)))
        for key in ("another key", TOKEN, session_secret(ROTATED)):
            forged = _forge(good, key)
            assert not _opens(base, forged)
            with client(base) as c:
                r = c.post(
                    f"/ui/jobs/{dead}/retry",
                    headers={"Origin": base, "Cookie": f"{SESSION_COOKIE}={forged}"},
                )
                assert r.status_code == 401 and "Bearer" in r.text
        unsigned = b64encode(json.dumps(good).encode()).decode()
        assert not _opens(base, unsigned)
    with connect(db_dsn) as conn:
        assert job_row(conn, dead)["state"] == "dead"


def test_sign_out_clears_the_session(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        _sign_in(c, base)
        page = c.get("/ui/")
        assert page.status_code == 200 and 'action="/ui/logout"' in page.text
        assert c.post("/ui/logout", headers={"Origin": "http://evil.example"}).status_code == 403
        assert c.get("/ui/", follow_redirects=False).status_code == 200  # still signed in
        out = c.post("/ui/logout", headers={"Origin": base}, follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        cleared = out.headers["set-cookie"].lower()
        assert cleared.startswith(f"{SESSION_COOKIE}=null;") and "1970" in cleared
        assert SESSION_COOKIE not in c.cookies
        assert c.get("/ui/", follow_redirects=False).status_code == 303
        # a Bearer caller has no session to sign out of: the page offers none
        bearer = c.get("/ui/", headers={"Authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200 and "/ui/logout" not in bearer.text


def test_the_session_cookie_is_secure_over_https(db_dsn: str) -> None:
    """uvicorn trusts X-Forwarded-Proto from 127.0.0.1 (its default), as it would from
    a TLS-terminating proxy: the request then came over https."""
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        https = c.post(
            "/ui/login",
            data={"token": TOKEN},
            headers={"Origin": base.replace("http:", "https:"), "X-Forwarded-Proto": "https"},
            follow_redirects=False,
        )
        assert https.status_code == 303
        assert "; secure" in https.headers["set-cookie"].lower()
        plain = c.post(
            "/ui/login", data={"token": TOKEN}, headers={"Origin": base}, follow_redirects=False
        )
        assert "secure" not in plain.headers["set-cookie"].lower()


def test_the_session_opens_the_dashboard_only(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        cookie = _sign_in(c, base)
        r = c.get("/jobs", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"})
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
        # a proxy's Basic credentials in front of the dashboard do not hide the session
        assert c.get("/ui/", headers={"Authorization": "Basic eDp5"}).status_code == 200


def test_no_token_means_no_session_and_an_open_dashboard(db_dsn: str) -> None:
    with serve(make_app(db_dsn)) as base, client(base) as c:
        r = c.post(
            "/ui/login", data={"token": "x"}, headers={"Origin": base}, follow_redirects=False
        )
        assert r.status_code == 303 and "set-cookie" not in r.headers
        assert c.get("/ui/").status_code == 200


def test_tokens_are_compared_in_one_place() -> None:
    """The API and the dashboard share deadman.api.auth.token_matches: no second
    comparison of a token anywhere in the package."""
    found = [
        (str(path.relative_to(DEADMAN)), line)
        for path in DEADMAN.rglob("*.py")
        for line in path.read_text().splitlines()
        if re.search(r"compare_digest\(", line)
    ]
    assert [path for path, _ in found] == ["api/auth.py"], found


def test_a_refused_sign_in_is_logged_without_what_was_typed(db_dsn: str) -> None:
    with serve(make_app(db_dsn, api_token=TOKEN)) as base, client(base) as c:
        with capture_logs() as logged:
            r = c.post("/ui/login", data={"token": TOKEN + "-typo"}, headers={"Origin": base})
        assert r.status_code == 401 and SESSION_COOKIE not in r.headers.get("set-cookie", "")
    refused = [e for e in logged if e["event"] == "dashboard_sign_in_refused"]
    assert len(refused) == 1 and refused[0]["client"] == "127.0.0.1", logged
    assert TOKEN not in repr(logged)
