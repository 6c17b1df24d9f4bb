"""Idempotency-Key on POST /jobs: replays, reuse with another body, concurrency, and
the key's lifetime (that of its job row)."""

from __future__ import annotations

from collections import Counter

from tests.factories import connect
from tests.helpers.api import (
    api_client,
    assert_problem,
    error_fields,
    new_job,
    post_together,
)


def _jobs_with_key(dsn: str, key: str) -> list[int]:
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id FROM deadman.jobs WHERE idempotency_key = %s", (key,)
        ).fetchall()
    return [int(r["id"]) for r in rows]


def test_a_repeat_is_a_replay_and_another_body_is_422(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        key = {"Idempotency-Key": "order-42"}
        first = c.post("/jobs", json=new_job(payload={"order": 42}), headers=key)
        assert first.status_code == 201
        assert "idempotent-replayed" not in first.headers
        assert first.json()["idempotency_key"] == "order-42"
        again = c.post("/jobs", json=new_job(payload={"order": 42}), headers=key)
        assert again.status_code == 200
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["location"] == first.headers["location"]
        assert again.json() == first.json()
        # the same request spelled differently (defaults written out, keys reordered)
        spelled = {"payload": {"order": 42}, "queue": "default", "priority": 0, "type": "noop"}
        assert c.post("/jobs", json=spelled, headers=key).status_code == 200
        # a different request under the same key
        other = c.post("/jobs", json=new_job(payload={"order": 43}), headers=key)
        body = assert_problem(other, 422, "idempotency-key-reused")
        assert [e["field"] for e in body["errors"]] == ["Idempotency-Key"]
        assert c.get(first.headers["location"]).json()["payload"] == {"order": 42}
    assert _jobs_with_key(db_dsn, "order-42") == [int(first.json()["id"])]


def test_key_syntax(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        # the draft's structured-field string and the bare value are the same key
        quoted = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": '"abc-1"'})
        bare = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": "abc-1"})
        assert (quoted.status_code, bare.status_code) == (201, 200)
        assert quoted.json()["idempotency_key"] == "abc-1"
        escaped = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": r'"a\"b"'})
        assert escaped.json()["idempotency_key"] == 'a"b'
        assert (
            c.post("/jobs", json=new_job(), headers={"Idempotency-Key": "k" * 255}).status_code
            == 201
        )
        for bad in ("k" * 256, "", '""'):
            r = c.post("/jobs", json=new_job(), headers={"Idempotency-Key": bad})
            if bad == '""':  # an empty quoted string is taken as the two-character key
                assert r.status_code == 201
            else:
                assert error_fields(r) == {"Idempotency-Key"}


def test_twenty_concurrent_identical_requests_make_one_job(db_dsn: str) -> None:
    n = 20
    key = {"Idempotency-Key": "k"}
    responses = post_together(db_dsn, "/jobs", [new_job(payload="same")] * n, key)
    assert Counter(r.status_code for r in responses) == {201: 1, 200: n - 1}
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 1
    assert _jobs_with_key(db_dsn, "k") == [int(ids.pop())]


def test_concurrent_different_bodies_under_one_key_make_one_job(db_dsn: str) -> None:
    bodies = [new_job(payload=i % 2) for i in range(10)]
    results = post_together(db_dsn, "/jobs", bodies, {"Idempotency-Key": "k"})
    (job_id,) = _jobs_with_key(db_dsn, "k")
    winner = next(r.json()["payload"] for r in results if r.status_code == 201)
    for i, r in enumerate(results):
        if i % 2 == winner:
            assert r.status_code in (200, 201) and r.json()["id"] == str(job_id)
        else:
            assert_problem(r, 422, "idempotency-key-reused")


def test_a_key_lives_as_long_as_its_job(db_dsn: str) -> None:
    with api_client(db_dsn) as c:
        key = {"Idempotency-Key": "short-lived"}
        first = c.post("/jobs", json=new_job(), headers=key).json()
        with connect(db_dsn) as conn:  # retention deleted the finished job
            conn.execute("DELETE FROM deadman.jobs WHERE id = %s", (int(first["id"]),))
        again = c.post("/jobs", json=new_job(), headers=key)
        assert again.status_code == 201
        assert again.json()["id"] != first["id"]
