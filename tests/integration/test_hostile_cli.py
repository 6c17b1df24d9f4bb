"""Hostile input to the ``deadman`` command: arguments, environment settings, and a
database that is down, refuses us or lacks the schema.

Every case must end in a documented exit code (deadman/cli.py: 1 not done, 2 usage
or configuration, 3 database unavailable) with a short message on stderr whose last
line starts with ``deadman``, and never a traceback. The operator commands run
in-process through ``deadman.cli.main`` (an exception escaping it fails the test:
that is the traceback a user would see); the long-running commands, whose start-up
waits and configures logging, run as real processes, as do the cases that need bytes
in argv or the environment that are not UTF-8.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deadman.cli import build_parser, main
from tests.factories import connect, insert_job

REPO = Path(__file__).resolve().parents[2]
SURROGATE = os.fsdecode(b"\xff")  # what a non-UTF-8 byte in argv becomes
HUGE = "9" * 5000
LONG = "x" * 5000


def _nowhere() -> str:
    """A DSN where nothing listens: connections are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres:pw@127.0.0.1:{port}/postgres"


def _leaf_commands() -> set[tuple[str, ...]]:
    """Every runnable command of ``deadman --help``, nested ones as ("jobs", "ls")."""

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return {prefix}
        found: set[tuple[str, ...]] = set()
        for name, child in subs[0].choices.items():
            found |= walk(child, (*prefix, name))
        return found

    return walk(build_parser(), ())


def run(
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    **env: str,
) -> tuple[int, str, str]:
    for key in [k for k in os.environ if k.startswith("DEADMAN_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_short_error(code: int, expected: int, err: str, needle: str = "") -> None:
    lines = err.strip().splitlines()
    assert code == expected, err
    assert lines, "no message on stderr"
    assert "Traceback" not in err
    assert len(lines) <= 12, err  # argparse: the usage (chaos: 9 lines), then the error
    assert lines[-1].startswith("deadman"), err
    assert len(lines[-1]) <= 400, "a long value must not be echoed whole"
    assert needle.lower() in err.lower(), err


# --------------------------------------------------------------------------- arguments

ID_COMMANDS = [["jobs", "show"], ["jobs", "cancel"], ["jobs", "retry"], ["dlq", "replay"]]
BAD_IDS = ["²", "\u0663", "0", "-1", "", " ", "1.5", "0x10", "9" * 20, HUGE, SURROGATE, "1e3"]
LIST_COMMANDS = [["jobs", "ls"], ["dlq", "ls"]]
BAD_LIST_ARGS = [
    ["--limit", "²"],
    ["--limit", "0"],
    ["--limit", "1001"],
    ["--limit", ""],
    ["--limit", HUGE],
    ["--before", "²"],
    ["--before", "-5"],
    ["--before", "9" * 20],
    ["--type", ""],
    ["--type", LONG],
    ["--type", SURROGATE],
    ["--type", "a b"],
    ["--queue", "bad queue"],
    ["--queue", "é"],
]
USAGE: list[list[str]] = [
    [],
    ["frobnicate"],
    *[[*cmd, bad] for cmd in ID_COMMANDS for bad in BAD_IDS],
    *[[*cmd, *bad] for cmd in LIST_COMMANDS for bad in BAD_LIST_ARGS],
    ["jobs", "ls", "--state", "bogus"],
    ["jobs", "ls", "--state", SURROGATE],
    ["jobs"],
    ["dlq"],
    ["dlq", "replay"],  # neither ids nor a filter
    ["dlq", "replay", "1", "--all"],
    ["queues", "frobnicate"],
    ["queues", "pause"],
    ["queues", "pause", ""],
    ["queues", "pause", "bad queue"],
    ["queues", "resume", SURROGATE],
    ["queues", "resume", "q" * 129],
    ["workers", "extra"],
    ["stats", "--limit", "1"],
    ["top", "--interval", "0"],
    ["top", "--interval", "nan"],
    ["top", "--interval", "inf"],
    ["top", "--interval", "-1"],
    ["top", "--interval", "1e999"],
    ["worker", "--concurrency", "0"],
    ["worker", "--concurrency", "-5"],
    ["worker", "--concurrency", "²"],
    ["worker", "--concurrency", HUGE],
    ["worker", "--processes", "0"],
    ["worker", "--processes", "-1"],
    ["worker", "--processes", "100000"],
    ["worker", "--queues", ","],
    ["worker", "--queues", "a b"],
    ["worker", "--queues", SURROGATE],
    ["worker", "--metrics-port", "70000"],
    ["worker", "--metrics-port", "0"],
    ["worker", "--metrics-port", "65535", "--processes", "2"],
    ["worker", "--app", "nope"],
    ["worker", "--app", "no_such_module_xyz:registry"],
    ["worker", "--app", "deadman.handlers:no_such_attribute"],
    ["worker", "--app", SURROGATE],
    ["serve", "--port", "70000"],
    ["serve", "--port", "-1"],
    ["serve", "--port", "²"],
    ["chaos", "--jobs", "-1"],
    ["chaos", "--jobs", HUGE],
    ["chaos", "--workers", "0"],
    ["chaos", "--kill-rate", "2"],
    ["chaos", "--kill-rate", "nan"],
    ["chaos", "--kill-interval", "0"],
    ["chaos", "--lease-ttl", "inf"],
    ["chaos", "--seed", "²"],
    ["chaos", "--timeout", "-1"],
    ["chaos", "--handler-ms", "-1"],
    ["chaos", "--hosts=1"],
    ["chaos", "--hosts", "--partition"],
    ["devdb", "frobnicate"],
    ["enqueue"],  # no type: "type: is required", before any connection
    ["enqueue", "t", "--priority", "²"],
    ["enqueue", "t", "--priority", HUGE],
    ["enqueue", "t", "--priority", "101"],
    ["enqueue", "bad type", "--queue", LONG],
    ["enqueue", "t", "--payload", "{not json"],
    ["enqueue", "t", "--payload", '"\\u0000"'],
    ["enqueue", "t", "--payload", "[" * 5000],
    ["enqueue", "--body", "[]"],
    ["enqueue", "--body", '{"type": "t", "type": "u"}'],
    ["enqueue", "t", "--run-at", "yesterday"],
    ["enqueue", "t", "--depends-on", "0"],
    ["enqueue", "t", "--idempotency-key", ""],
    ["enqueue", "t", "--payload", SURROGATE],
    ["limits", "set", "k"],  # neither a concurrency nor a rate
    ["limits", "set", "k", "--concurrency", "0"],
    ["limits", "set", "k", "--concurrency", HUGE],
    ["limits", "set", "k", "--rate", "1/" + HUGE],
    ["limits", "set", "k", "--rate", "ten/second"],
    ["limits", "set", "bad key", "--concurrency", "1"],
    ["limits", "set", SURROGATE, "--concurrency", "1"],
    ["limits", "show", LONG],
    ["limits", "rm", "a/b"],
    ["limits", "ls", "extra"],
    ["limits"],
    ["shards"],
    ["shards", "init"],  # no DEADMAN_SHARDS: "DEADMAN_SHARDS is not set"
    ["shards", "check", "extra"],
    ["demo", "--database-url", "not a dsn"],
    ["demo", "--database-url", SURROGATE],
    *[
        [*cmd, "--database-url", bad]
        for cmd in (["jobs", "ls"], ["migrate"], ["worker"], ["rescuer"], ["serve"], ["stats"])
        for bad in ("not a dsn", "postgresql://u:pw@h:99999/x", "host='open", SURROGATE)
    ],
    NO_URL_JOBS := ["jobs", "ls"],  # no DEADMAN_DATABASE_URL and no --database-url
    NO_URL_WORKER := ["worker"],
]


def _usage_id(argv: list[str]) -> str:
    return (
        " ".join(a if len(a) < 16 else a[:12] + "..." for a in argv)
        .encode("ascii", "backslashreplace")
        .decode()
        or "<none>"
    )


@pytest.mark.parametrize("argv", USAGE, ids=[_usage_id(a) for a in USAGE])
def test_hostile_arguments_are_usage_errors_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database is configured (down: 3, not 2), so only the argument itself can
    # make this a usage error.
    url = {} if argv in (NO_URL_JOBS, NO_URL_WORKER) else {"DEADMAN_DATABASE_URL": _nowhere()}
    code, _, err = run(capsys, argv, monkeypatch, DEADMAN_STARTUP_WAIT_S="0", **url)
    assert_short_error(code, 2, err)


def test_every_subcommand_gets_hostile_arguments() -> None:
    tried = {tuple(a for a in argv[:2] if not a.startswith("-")) for argv in USAGE}
    covered = {cmd for cmd in _leaf_commands() if any(t[: len(cmd)] == cmd for t in tried)}
    assert covered == _leaf_commands()


# --------------------------------------------------------------------------- database

#: Every command that talks to the database, run in-process (the ones that do not
#: start a long-running process).
DB_COMMANDS: list[list[str]] = [
    ["jobs", "ls"],
    ["jobs", "show", "1"],
    ["jobs", "cancel", "1"],
    ["jobs", "retry", "1"],
    ["dlq", "ls"],
    ["dlq", "replay", "1"],
    ["dlq", "replay", "--all"],
    ["queues"],
    ["queues", "pause", "q"],
    ["workers"],
    ["stats"],
    ["top", "--once"],
]


@pytest.mark.parametrize("argv", DB_COMMANDS, ids=[" ".join(a) for a in DB_COMMANDS])
def test_a_database_that_is_down_is_exit_3_at_once(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.monotonic()
    code, _, err = run(capsys, [*argv, "--database-url", _nowhere()], monkeypatch)
    assert_short_error(code, 3, err, "refused")
    assert "pw" not in err.split("refused")[0].replace("pw@", "")  # no password shown
    assert time.monotonic() - started < 5, "a refused connection is not waited on"


@pytest.mark.parametrize("argv", DB_COMMANDS, ids=[" ".join(a) for a in DB_COMMANDS])
def test_a_role_that_does_not_exist_is_exit_2(
    argv: list[str],
    db_dsn: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from psycopg.conninfo import make_conninfo

    wrong = make_conninfo(db_dsn, user="nobody_here", password="hunter2")
    code, _, err = run(capsys, [*argv, "--database-url", wrong], monkeypatch)
    assert_short_error(code, 2, err, 'role "nobody_here" does not exist')
    assert "hunter2" not in err


@pytest.mark.parametrize("argv", DB_COMMANDS, ids=[" ".join(a) for a in DB_COMMANDS])
def test_a_database_without_the_schema_is_exit_2(
    argv: list[str],
    empty_db_dsn: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run(capsys, [*argv, "--database-url", empty_db_dsn], monkeypatch)
    assert_short_error(code, 2, err, "deadman migrate")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["jobs", "show", "424242"], "no job 424242"),
        (["jobs", "cancel", "424242"], "no job 424242"),
        (["jobs", "retry", "424242"], "no job"),
        (["dlq", "replay", "424242"], "no job"),
        (["jobs", "show", str(2**63 - 1)], "no job"),
    ],
)
def test_an_unknown_job_is_exit_1(
    argv: list[str],
    needle: str,
    db_dsn: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with connect(db_dsn) as conn:
        insert_job(conn)
    code, _, err = run(capsys, [*argv, "--database-url", db_dsn], monkeypatch)
    assert_short_error(code, 1, err, needle)


# --------------------------------------------------------------------------- processes


def _deadman(
    argv: list[str] | list[bytes], env: dict[bytes, bytes] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    base = {
        b"PATH": os.environb.get(b"PATH", b"/usr/bin:/bin"),
        b"PYTHONPATH": os.fsencode(REPO),
        b"DEADMAN_STARTUP_WAIT_S": b"0",
    }
    return subprocess.run(
        [sys.executable, "-m", "deadman", *argv],
        cwd=REPO,
        env={**base, **(env or {})},
        capture_output=True,
        timeout=timeout,
    )


def assert_process_error(done: subprocess.CompletedProcess[bytes], code: int, needle: str) -> None:
    err = done.stderr.decode("utf-8", "replace")
    assert_short_error(done.returncode, code, err, needle)


@pytest.mark.parametrize("command", ["worker", "rescuer", "migrate"])
def test_a_starting_process_told_not_to_wait_exits_3_in_one_line(command: str) -> None:
    done = _deadman([command, "--database-url", _nowhere()])
    assert_process_error(done, 3, "gave up waiting for the database")


@pytest.mark.parametrize("command", ["worker", "rescuer", "migrate", "serve"])
def test_a_starting_process_with_a_wrong_role_exits_2_at_once(command: str, db_dsn: str) -> None:
    from psycopg.conninfo import make_conninfo

    wrong = make_conninfo(db_dsn, user="nobody_here")
    done = _deadman([command, "--database-url", wrong], {b"DEADMAN_STARTUP_WAIT_S": b""})
    assert_process_error(done, 2, 'role "nobody_here" does not exist')


def test_bytes_that_are_not_utf8_in_argv_are_usage_errors() -> None:
    for argv in (
        [b"jobs", b"show", b"\xff"],
        [b"queues", b"pause", b"q\xe9"],
        [b"worker", b"--queues", b"\xff"],
        [b"jobs", b"ls", b"--database-url", b"postgresql://u@h/\xff"],
    ):
        assert_process_error(_deadman(argv), 2, "")


#: One real worker per class of bad setting: each must exit 2 at once, naming it.
ENV_CLASSES: list[tuple[str, bytes, str]] = [
    ("not a number", b"\xc2\xb2", "DEADMAN_CONCURRENCY"),  # '²'
    ("not finite", b"nan", "DEADMAN_LEASE_TTL_S"),
    ("overflowing", b"1e999", "DEADMAN_POLL_S"),
    ("out of range", b"1000000", "DEADMAN_POOL_SIZE"),
    ("negative", b"-1", "DEADMAN_STARTUP_WAIT_S"),
    ("huge", HUGE.encode(), "DEADMAN_COMPLETER_BATCH"),
    ("non-ASCII digits", "\u0661\u0660".encode(), "DEADMAN_CLAIM_BATCH"),
    ("not UTF-8", b"\xff", "DEADMAN_QUEUES"),
    ("not UTF-8 in a string", b"tok\xe9n", "DEADMAN_API_TOKEN"),
    ("unknown word", b"verbose", "DEADMAN_LOG_LEVEL"),
    ("control character", b"js\x1bon", "DEADMAN_LOG_FORMAT"),
    ("bad connection string", b"host=db port=99999", "DEADMAN_DATABASE_URL"),
    ("not UTF-8 in the DSN", b"postgresql://u@h/\xff", "DEADMAN_DATABASE_URL"),
]


@pytest.mark.parametrize(
    ("what", "raw", "var"), ENV_CLASSES, ids=[what for what, _, _ in ENV_CLASSES]
)
def test_a_worker_refuses_a_bad_setting_naming_it(what: str, raw: bytes, var: str) -> None:
    env = {b"DEADMAN_DATABASE_URL": os.fsencode(_nowhere()), var.encode(): raw}
    started = time.monotonic()
    done = _deadman(["worker"], env)
    assert_process_error(done, 2, var)
    assert time.monotonic() - started < 30


def test_serve_that_cannot_listen_exits_1_in_one_line() -> None:
    """uvicorn's own exit code for this is 3, which is ours for "database down"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for host, p in (("127.0.0.1", port), ("999.1.1.1", "8080")):
            done = _deadman(["serve", "--host", host, "--port", p, "--database-url", _nowhere()])
            assert_process_error(done, 1, f"cannot listen on {host}:{p}")
