"""The operator CLI (deadman/cli_ops.py) against a real database, in-process through
``deadman.cli.main`` (output, --json, exit codes) and once as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from deadman import bounds
from deadman.cli import main
from tests.factories import connect, insert_job, with_store


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr; a usage error (argparse's SystemExit) included."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], dsn: str, *argv: str) -> object:
    code, out, err = run(capsys, *argv, "--json", "--database-url", dsn)
    assert code == 0, err
    return json.loads(out)


def state_of(dsn: str, job_id: int) -> str:
    with connect(dsn) as conn:
        row = conn.execute("SELECT state FROM deadman.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row["state"])


def test_jobs_ls_filters_pages_and_tables(db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with connect(db_dsn) as conn:
        ids = [insert_job(conn, type="mail", queue="q1").id for _ in range(3)]
        dead = insert_job(conn, state="dead", type="pdf", queue="q2", last_error="boom").id
    body = run_json(capsys, db_dsn, "jobs", "ls", "--type", "mail", "--limit", "2")
    assert isinstance(body, dict)
    assert [j["id"] for j in body["jobs"]] == [str(ids[2]), str(ids[1])]
    older = run_json(capsys, db_dsn, "jobs", "ls", "--type", "mail", "--before", str(ids[1]))
    assert isinstance(older, dict)
    assert [j["id"] for j in older["jobs"]] == [str(ids[0])]
    by_state = run_json(capsys, db_dsn, "jobs", "ls", "--state", "dead")
    assert isinstance(by_state, dict)
    assert [j["id"] for j in by_state["jobs"]] == [str(dead)]

    code, out, _ = run(capsys, "jobs", "ls", "--queue", "q2", "--database-url", db_dsn)
    assert code == 0
    assert str(dead) in out and "pdf" in out and "boom" in out and "mail" not in out


def test_jobs_ls_by_queue_follows_its_windows(
    db_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing by queue reads LIST_WINDOW jobs per page (DECISIONS 79): a short page
    says so and gives the cursor onward, in text and in --json (next_before)."""
    monkeypatch.setattr(bounds, "LIST_WINDOW", 3)
    with connect(db_dsn) as conn:
        rare = insert_job(conn, queue="rare", state="succeeded").id
        for _ in range(5):
            insert_job(conn, queue="busy", state="succeeded")
    code, out, _ = run(capsys, "jobs", "ls", "--queue", "rare", "--database-url", db_dsn)
    assert code == 0 and "0 shown" in out
    assert "next page: --before" in out and "looked through the 3 jobs" in out
    seen: list[str] = []
    before: list[str] = []
    for _ in range(3):  # 6 jobs in windows of 3
        body = run_json(capsys, db_dsn, "jobs", "ls", "--queue", "rare", *before)
        assert isinstance(body, dict)
        seen += [j["id"] for j in body["jobs"]]
        if body["next_before"] is None:
            break
        before = ["--before", str(body["next_before"])]
    else:
        raise AssertionError("the listing did not end in 3 pages")
    assert seen == [str(rare)]


def test_jobs_show_cancel_retry_and_exit_codes(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with connect(db_dsn) as conn:
        queued = insert_job(conn, type="mail", payload={"to": "a@example.com"}).id
        running = insert_job(conn, state="running").id
        done = insert_job(conn, state="succeeded").id
    url = ("--database-url", db_dsn)

    body = run_json(capsys, db_dsn, "jobs", "show", str(queued))
    assert isinstance(body, dict)
    assert body["payload"] == {"to": "a@example.com"} and body["attempts"] == []
    code, out, _ = run(capsys, "jobs", "show", str(queued), *url)
    assert code == 0 and "a@example.com" in out and "attempts" in out

    code, _, err = run(capsys, "jobs", "show", "999999", *url)
    assert code == 1 and "no job 999999" in err

    code, out, _ = run(capsys, "jobs", "cancel", str(queued), *url)
    assert code == 0 and "cancelled" in out
    assert state_of(db_dsn, queued) == "cancelled"
    code, out, _ = run(capsys, "jobs", "cancel", str(running), *url)
    assert code == 0 and "cancel requested" in out
    code, _, err = run(capsys, "jobs", "cancel", str(done), *url)
    assert code == 1 and "is succeeded" in err

    retried = run_json(capsys, db_dsn, "jobs", "retry", str(queued))
    assert isinstance(retried, dict) and retried["state"] == "queued"
    code, _, err = run(capsys, "jobs", "retry", str(queued), *url)
    assert code == 1 and "is queued" in err
    code, _, err = run(capsys, "jobs", "retry", "424242", *url)
    assert code == 1 and "no job" in err


def test_usage_and_config_errors_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEADMAN_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["jobs", "show", "not-a-number"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["jobs", "ls", "--state", "bogus"])
    assert exc.value.code == 2
    code, _, err = run(capsys, "jobs", "ls")
    assert code == 2 and "DEADMAN_DATABASE_URL" in err


def test_dlq_ls_and_replay_by_id_and_in_bulk(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with connect(db_dsn) as conn:
        a = insert_job(conn, state="dead", type="pdf", queue="q1").id
        b = insert_job(conn, state="dead", type="pdf", queue="q2").id
        c = insert_job(conn, state="dead", type="mail", queue="q1").id
        d = insert_job(conn, state="dead", type="mail", queue="q2").id
        alive = insert_job(conn, state="queued").id
    url = ("--database-url", db_dsn)

    listed = run_json(capsys, db_dsn, "dlq", "ls", "--queue", "q1")
    assert isinstance(listed, dict)
    assert [j["id"] for j in listed["jobs"]] == [str(c), str(a)]

    code, _, err = run(capsys, "dlq", "replay", *url)
    assert code == 2 and "--all" in err
    code, _, err = run(capsys, "dlq", "replay", str(a), "--all", *url)
    assert code == 2

    code, out, err = run(capsys, "dlq", "replay", str(a), str(alive), "77777", *url)
    assert code == 1 and "replayed 1 job" in out
    assert f"job {alive} is queued" in err and "no job 77777" in err
    assert state_of(db_dsn, a) == "queued"

    body = run_json(capsys, db_dsn, "dlq", "replay", "--type", "pdf")
    assert body == {"replayed": [str(b)], "refused": []}
    body = run_json(capsys, db_dsn, "dlq", "replay", "--all")
    assert body == {"replayed": [str(c), str(d)], "refused": []}
    assert {state_of(db_dsn, i) for i in (a, b, c, d)} == {"queued"}


def test_bulk_replay_runs_in_batches_and_notifies(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        ids = [insert_job(conn, state="dead", queue="q1").id for _ in range(7)]
    listener = connect(db_dsn)
    listener.execute("LISTEN deadman_jobs")
    assert with_store(db_dsn, lambda s: s.job_retry_dead_many(None, None, batch=3)) == ids
    assert with_store(db_dsn, lambda s: s.job_retry_dead_many(None, None, batch=3)) == []
    listener.execute("SELECT 1")
    notes = list(listener.notifies(timeout=1, stop_after=3))
    listener.close()
    # one notification per queue per batch (3 + 3 + 1 rows): identical ones collapse
    assert [n.payload for n in notes] == ["q1", "q1", "q1"]


def _busy_queue(dsn: str) -> tuple[str, str]:
    """Queue q1 with one queued, one running (held by worker w-1 on host-a) and one
    job succeeded 30 s ago; returns the --database-url arguments."""
    with connect(dsn) as conn:
        insert_job(conn, queue="q1")
        insert_job(conn, queue="q1", state="running", lease_worker="w-1")
        insert_job(conn, queue="q1", state="succeeded", finished_ago_s=30)
        conn.execute(
            "INSERT INTO deadman.workers (id, hostname, pid, queues, concurrency)"
            " VALUES ('w-1', 'host-a', 42, '{q1}', 8)"
        )
    return ("--database-url", dsn)


def test_queues_pause_and_resume(db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = _busy_queue(db_dsn)
    body = run_json(capsys, db_dsn, "queues", "pause", "q1")
    assert isinstance(body, dict) and body["paused"] is True
    queues = run_json(capsys, db_dsn, "queues")
    assert isinstance(queues, dict)
    (q1,) = queues["queues"]
    assert q1["name"] == "q1" and q1["paused"] is True
    assert q1["counts"]["queued"] == 1 and q1["counts"]["running"] == 1
    code, out, _ = run(capsys, "queues", "resume", "q1", *url)
    assert code == 0 and "queue q1: running" in out


@pytest.mark.parametrize(
    ("name", "error"), [((), "NAME"), (("bad name!",), "1-128 characters")], ids=["none", "bad"]
)
def test_queues_pause_without_a_good_name_is_exit_2(
    db_dsn: str, capsys: pytest.CaptureFixture[str], name: tuple[str, ...], error: str
) -> None:
    code, _, err = run(capsys, "queues", "pause", *name, "--database-url", db_dsn)
    assert code == 2 and error in err


def test_workers_lists_the_live_worker_and_what_it_holds(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _busy_queue(db_dsn)
    workers = run_json(capsys, db_dsn, "workers")
    assert isinstance(workers, dict)
    (w,) = workers["workers"]
    assert w["id"] == "w-1" and w["jobs_held"] == 1 and w["alive"] is True


def test_stats_count_the_jobs(db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    _busy_queue(db_dsn)
    stats = run_json(capsys, db_dsn, "stats")
    assert isinstance(stats, dict)
    assert stats["jobs"]["queued"] == 1 and stats["jobs"]["running"] == 1


def test_top_once_shows_queues_workers_and_throughput(
    db_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _busy_queue(db_dsn)
    code, out, _ = run(capsys, "top", "--once", *url)
    assert code == 0
    assert "q1" in out and "host-a" in out and "throughput" in out
    assert "▁" in out  # the sparkline row of q1 (one success 30 s ago: a full bar)


def test_subprocess_exit_codes_and_json(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        dead = insert_job(conn, state="dead", type="pdf").id
    env = {**os.environ, "DEADMAN_DATABASE_URL": db_dsn}
    cmd = [sys.executable, "-m", "deadman"]
    ok = subprocess.run(
        [*cmd, "dlq", "ls", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert [j["id"] for j in json.loads(ok.stdout)["jobs"]] == [str(dead)]
    missing = subprocess.run(
        [*cmd, "jobs", "show", "123456789"], env=env, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 1 and "no job" in missing.stderr


def test_top_shows_limits_and_schedules(db_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with connect(db_dsn) as conn:
        conn.execute("INSERT INTO deadman.limits (key, concurrency) VALUES ('stripe', 5)")
        conn.execute(
            "INSERT INTO deadman.schedules (name, every_ms, job, next_fire_at)"
            " VALUES ('nightly', 60000, '{\"type\": \"noop\"}', now())"
        )
    code, out, _ = run(capsys, "top", "--once", "--database-url", db_dsn)
    assert code == 0
    assert "stripe" in out and "limits" in out
    assert "nightly" in out and "every 60000 ms" in out
