"""One definition of a job: the same out-of-range values sent through HTTP
(``POST /jobs``), ``Client.enqueue``, ``AsyncClient.enqueue`` and ``deadman enqueue``
get the same refusal, word for word, and nothing is stored; values at the bounds are
accepted by all of them.

The bounds themselves are read from nowhere here: they are written out by hand, so
that a bound changed by accident in deadman/bounds.py fails this test.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from deadman import AsyncClient, Client
from deadman.cli import main
from deadman.config import Settings
from deadman.model import Job
from deadman.spec import SpecError
from tests.factories import connect, run_async
from tests.helpers.api import api_client

#: (field, value sent over HTTP and the CLI, the Client's keyword and value, rule)
REFUSED: list[tuple[str, Any, tuple[str, Any], str]] = [
    ("priority", 101, ("priority", 101), "must be an integer from -100 to 100"),
    ("priority", -101, ("priority", -101), "must be an integer from -100 to 100"),
    ("max_attempts", 0, ("max_attempts", 0), "must be an integer from 1 to 100"),
    ("max_attempts", 101, ("max_attempts", 101), "must be an integer from 1 to 100"),
    (
        "queue",
        "has space",
        ("queue", "has space"),
        "must be 1-128 characters of A-Z a-z 0-9 _ . : -",
    ),
    ("queue", "q" * 129, ("queue", "q" * 129), "must be 1-128 characters of A-Z a-z 0-9 _ . : -"),
    ("delay_ms", -1, ("delay", -0.001), "must be an integer from 0 to 315360000000"),
    ("timeout_ms", 0, ("timeout", 0), "must be an integer from 1 to 2147483647"),
    (
        "heartbeat_timeout_ms",
        2**31,
        ("heartbeat_timeout", 2**31 / 1000),
        "must be an integer from 1 to 2147483647",
    ),
    (
        "run_at",
        "0000-01-01T00:00:00Z",
        ("run_at", datetime(1, 1, 1, tzinfo=UTC)),
        "must be between 0001-01-02 and 9999-12-30",
    ),
]
IDS = [f"{field}={value!r}"[:40] for field, value, _, _ in REFUSED]
ACCEPTED: list[tuple[str, Any, tuple[str, Any]]] = [
    ("priority", 100, ("priority", 100)),
    ("priority", -100, ("priority", -100)),
    ("max_attempts", 1, ("max_attempts", 1)),
    ("max_attempts", 100, ("max_attempts", 100)),
    ("queue", "q" * 128, ("queue", "q" * 128)),
    ("heartbeat_timeout_ms", 2**31 - 1, ("heartbeat_timeout", (2**31 - 1) / 1000)),
]


def _cli_flag(field: str) -> str:
    return "--" + field.replace("_", "-")


@pytest.fixture
def client(db_dsn: str) -> Iterator[Client]:
    with Client(db_dsn, settings=Settings()) as c:
        yield c


def _async_enqueue(db_dsn: str, **options: Any) -> Job:
    async def enqueue() -> Job:
        async with AsyncClient(db_dsn, settings=Settings()) as aclient:
            return await aclient.enqueue("one.spec", **options)

    return run_async(enqueue)


def _jobs(db_dsn: str) -> int:
    with connect(db_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM deadman.jobs WHERE type = 'one.spec'"
        ).fetchone()
        assert row is not None
        return int(row["n"])


@pytest.mark.parametrize(("field", "value", "kwarg", "rule"), REFUSED, ids=IDS)
def test_http_client_and_cli_refuse_alike(
    db_dsn: str,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    value: Any,
    kwarg: tuple[str, Any],
    rule: str,
) -> None:
    before = _jobs(db_dsn)
    expected = {"field": field, "message": rule}

    with api_client(db_dsn) as http:
        r = http.post("/jobs", json={"type": "one.spec", field: value})
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [expected]

    with pytest.raises(SpecError) as refused:
        client.enqueue("one.spec", **{kwarg[0]: kwarg[1]})
    assert refused.value.errors == [expected]
    with pytest.raises(SpecError) as refused_async:
        _async_enqueue(db_dsn, **{kwarg[0]: kwarg[1]})
    assert refused_async.value.errors == [expected]

    monkeypatch.setenv("DEADMAN_DATABASE_URL", db_dsn)
    capsys.readouterr()
    code = main(["enqueue", "one.spec", f"{_cli_flag(field)}={value}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [f"deadman: {field}: {rule}"]

    assert _jobs(db_dsn) == before  # nothing stored by any of them


@pytest.mark.parametrize(("field", "value", "kwarg"), ACCEPTED)
def test_http_client_and_cli_accept_the_bounds(
    db_dsn: str,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    value: Any,
    kwarg: tuple[str, Any],
) -> None:
    before = _jobs(db_dsn)
    with api_client(db_dsn) as http:
        r = http.post("/jobs", json={"type": "one.spec", field: value})
    assert r.status_code == 201, r.text
    assert r.json()[field] == value

    job = client.enqueue("one.spec", **{kwarg[0]: kwarg[1]})
    assert getattr(job, field) == value
    assert getattr(_async_enqueue(db_dsn, **{kwarg[0]: kwarg[1]}), field) == value

    monkeypatch.setenv("DEADMAN_DATABASE_URL", db_dsn)
    capsys.readouterr()
    assert main(["enqueue", "one.spec", f"{_cli_flag(field)}={value}"]) == 0
    assert f'"{field}": {value!r}'.replace("'", '"') in capsys.readouterr().out
    assert _jobs(db_dsn) == before + 4


def test_every_broken_field_is_named_once_by_all_three(
    db_dsn: str,
    client: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Several broken fields at once: each way in names all of them, in the same order."""
    body = {"type": "one.spec", "priority": 500, "max_attempts": 0, "queue": "a b"}
    with api_client(db_dsn) as http:
        over_http = http.post("/jobs", json=body).json()["errors"]
    assert {e["field"] for e in over_http} == {"priority", "max_attempts", "queue"}
    with pytest.raises(SpecError) as refused:
        client.enqueue("one.spec", priority=500, max_attempts=0, queue="a b")
    assert sorted(refused.value.errors, key=str) == sorted(over_http, key=str)
    with pytest.raises(SpecError) as refused_async:
        _async_enqueue(db_dsn, priority=500, max_attempts=0, queue="a b")
    assert sorted(refused_async.value.errors, key=str) == sorted(over_http, key=str)
    monkeypatch.setenv("DEADMAN_DATABASE_URL", db_dsn)
    capsys.readouterr()
    assert (
        main(
            [
                "enqueue",
                "--body",
                '{"type": "one.spec", "priority": 500, "max_attempts": 0, "queue": "a b"}',
            ]
        )
        == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert sorted(lines) == sorted(f"deadman: {e['field']}: {e['message']}" for e in over_http)
