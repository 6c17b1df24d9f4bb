"""The benchmark report's issue-16 logic: pgbench's summary parsed, the ceiling's
jobs/s, and each target's ratio and verdict from a run's raw JSON."""

from __future__ import annotations

from typing import Any

import pytest

from bench.pgbench_ceiling import jobs_per_s, parse_pgbench
from bench.targets import best_burn, targets_16

# pgbench 15's summary, as `pgbench -n -M prepared -f ... -T 2` printed it here.
PGBENCH_15 = """\
transaction type: bench/pgbench_lifecycle.sql
scaling factor: 1
query mode: prepared
number of clients: 4
number of threads: 2
maximum number of tries: 1
duration: 2 s
number of transactions actually processed: 420
number of failed transactions: 0 (0.000%)
latency average = 19.047 ms
initial connection time = 5.123 ms
tps = 209.857626 (without initial connection time)
"""


def test_parse_pgbench_reads_the_summary() -> None:
    assert parse_pgbench(PGBENCH_15) == {"transactions": 420, "failed": 0, "tps": 209.857626}


def test_parse_pgbench_counts_failed_transactions() -> None:
    out = PGBENCH_15.replace("failed transactions: 0 (0.000%)", "failed transactions: 3 (0.7%)")
    assert parse_pgbench(out)["failed"] == 3


def test_parse_pgbench_without_a_failed_line_is_zero_failed() -> None:  # before 15
    out = "\n".join(x for x in PGBENCH_15.splitlines() if "failed" not in x)
    assert parse_pgbench(out)["failed"] == 0


@pytest.mark.parametrize("drop", ["actually processed", "tps ="])
def test_parse_pgbench_refuses_a_summary_without_its_figures(drop: str) -> None:
    out = "\n".join(x for x in PGBENCH_15.splitlines() if drop not in x)
    with pytest.raises(ValueError, match="pgbench output lacks"):
        parse_pgbench(out)


def test_jobs_per_s_is_tps_times_jobs_finished_per_transaction() -> None:
    # 420 transactions finished 40,000 jobs (some claims came up short): 95.2 a txn
    assert jobs_per_s(210.0, 420, 40_000) == 20_000.0
    assert jobs_per_s(210.0, 0, 0) == 0.0


def burn(rate: float, ok: bool = True, **extra: Any) -> dict[str, Any]:
    return {"jobs_per_s": rate, "ok": ok, **extra}


def run_data() -> dict[str, Any]:
    """A run with every phase issue 16 reads, numbers chosen so each verdict is clear."""
    return {
        "burn": {
            "deadman": [burn(10_000, processes=2, concurrency=500), burn(30_000, ok=False)],
            "pgqueuer": [burn(6_000, setting="2 proc, batch_size=100")],
            "procrastinate": [burn(300, setting="1 proc, concurrency=10")],
        },
        "shapes": {
            "defaults_read": {"deadman_concurrency": 10},
            "defaults": {
                "deadman": burn(5_000, processes=1, concurrency=10),
                "pgqueuer": burn(2_000, setting="1 proc, batch_size=10"),
                "procrastinate": burn(350, setting="1 proc, concurrency=1"),
            },
            "concurrency_1": {
                "deadman": burn(500, processes=1, concurrency=1),
                "pgqueuer": burn(300, setting="1 proc, concurrency_limit=1"),
                "procrastinate": burn(400, setting="1 proc, concurrency=1"),
            },
            "concurrency_8": {
                "deadman": burn(12_000, processes=1, concurrency=8),
                "pgqueuer": burn(7_000, ok=False, setting="x"),
                "procrastinate": burn(900, setting="1 proc, concurrency=8"),
            },
        },
        "ceiling": {"jobs_per_s": 40_000.0},
        "latency": {
            "deadman": {"ok": True, "p50_ms": 1.0, "p99_ms": 2.5, "p999_ms": 4.0},
            "pgqueuer": {"ok": True, "p50_ms": 1.5, "p99_ms": 3.0, "p999_ms": 5.0},
            "procrastinate": {"ok": True, "p50_ms": 1.2, "p99_ms": 9.0, "p999_ms": 20.0},
        },
        "bulk": {
            "deadman": burn(60_000, n=20_000),
            "pgqueuer": burn(50_000, n=20_000),
            "in_calls": {
                "deadman": burn(80_000, n=20_000, per_call=1_000),
                "pgqueuer": burn(50_000, n=20_000, per_call=1_000),
            },
            "keyed": {
                "deadman": burn(55_000, n=20_000, per_call=1_000),
                "pgqueuer": burn(50_000, n=20_000, per_call=1_000),
            },
        },
        "http": {"results": [{"mode": "keyed", "ok": True, "jobs_per_s": 6_000.0}]},
        "scale": {
            "ok": True,
            "n": 1_000_000,
            "points": {
                "completed": {
                    "p50_ms": 2.0,
                    "p99_ms": 4.0,
                    "p50_ratio": 1.4,
                    "p99_ratio": 1.6,
                    "control": {"p50_ms": 1.43, "p99_ms": 2.5},
                }
            },
        },
    }


def by_target(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["target"].split(":")[0]: r for r in rows}


def test_every_issue_16_target_gets_its_ratio_and_verdict() -> None:
    rows = by_target(targets_16(run_data()))
    defaults = rows["burn-down at library defaults, one process"]
    assert defaults["ratio"] == pytest.approx(2.5) and defaults["met"] is True
    assert "pgqueuer" in defaults["other"]
    # concurrency 1: the best peer is procrastinate (400), not pgqueuer (300)
    c1 = rows["burn-down at concurrency 1, one process"]
    assert c1["ratio"] == pytest.approx(1.25) and c1["met"] is False
    assert "procrastinate" in c1["other"]
    # concurrency 8: pgqueuer's run failed its check, so it is not the comparison
    c8 = rows["burn-down at concurrency 8, one process"]
    assert c8["ratio"] == pytest.approx(12_000 / 900) and c8["met"] is True
    # the best setting spans the grid and the shapes; the unverified 30,000 is not one
    best = rows["burn-down at the best setting"]
    assert best["ratio"] == pytest.approx(12_000 / 6_000) and best["met"] is True
    share = rows["best burn-down as a share of the pgbench batched lifecycle ceiling (aim ≥ 50%)"]
    assert share["ratio"] == pytest.approx(0.3) and share["met"] is False
    p50 = rows["latency at 200/s, p50"]
    assert p50["ratio"] == pytest.approx(1.0 / 1.2) and p50["met"] is False  # needs ≤ 0.8
    assert rows["latency at 200/s, p99"]["met"] is True
    assert rows["latency at 200/s, p99.9 (reported, no target)"]["met"] is None
    one = rows["bulk enqueue in one call of 20,000"]
    assert one["ratio"] == pytest.approx(1.2) and one["met"] is False
    calls = rows["bulk enqueue in calls of 1,000"]
    assert calls["ratio"] == pytest.approx(1.6) and calls["met"] is True
    keyed = rows["bulk enqueue in calls of 1,000, a new key per job (reported, no target)"]
    assert keyed["ratio"] == pytest.approx(1.1) and keyed["met"] is None
    http = next(r for t, r in rows.items() if t.startswith("HTTP POST /jobs"))
    assert http["ratio"] == pytest.approx(6.0) and http["met"] is True
    claim = next(r for t, r in rows.items() if t.startswith("claim right after"))
    assert claim["ratio"] == pytest.approx(1.6) and claim["met"] is False  # p99's, the worse


def test_a_target_whose_figures_are_missing_is_not_met_nor_failed() -> None:
    data = run_data()
    data["shapes"]["defaults"]["pgqueuer"] = {"ok": False, "error": "boom"}
    del data["ceiling"]
    rows = by_target(targets_16(data))
    assert rows["burn-down at library defaults, one process"]["met"] is None
    assert rows["burn-down at library defaults, one process"]["ratio"] is None
    share = rows["best burn-down as a share of the pgbench batched lifecycle ceiling (aim ≥ 50%)"]
    assert share["met"] is None


def test_the_effects_shapes_are_reported_against_the_best_verified_peer() -> None:
    data = {
        "effects": {
            "defaults_read": {"deadman_concurrency": 200},
            "defaults": {
                "deadman": burn(2_000, concurrency=200),
                "deadman_plain": burn(4_000),  # Deadman's own: never the comparison
                "pgqueuer": burn(3_000, setting="1 proc"),
                "procrastinate": burn(5_000, ok=False),  # unverified: not a peer figure
            },
            "concurrency_8": {
                "deadman": burn(1_500, concurrency=8),
                "pgqueuer": {"ok": False, "error": "boom"},
                "procrastinate": burn(500, setting="1 proc, concurrency=8"),
            },
        }
    }
    rows = by_target(targets_16(data))
    at = rows["a handler that writes one row, at library defaults"]
    assert at["ratio"] == pytest.approx(2 / 3) and at["met"] is None
    assert "pgqueuer" in at["other"] and "C=200" in at["deadman"]
    c8 = rows["a handler that writes one row, concurrency 8"]
    assert c8["ratio"] == pytest.approx(3.0) and "procrastinate" in c8["other"]
    assert len(rows) == 2


def test_a_run_without_the_phases_has_no_targets() -> None:
    assert targets_16({}) == []


def test_best_burn_takes_the_shapes_and_skips_unverified_runs() -> None:
    data = run_data()
    assert best_burn(data, "deadman") == data["shapes"]["concurrency_8"]["deadman"]
    assert best_burn(data, "pgqueuer") == data["burn"]["pgqueuer"][0]
    assert best_burn({}, "deadman") is None


def test_the_io_shapes_are_reported_by_wait_against_the_best_verified_peer() -> None:
    data = {
        "io": {
            "10ms": {
                "defaults_read": {"deadman_concurrency": 200},
                "defaults": {
                    "deadman": burn(12_000, concurrency=200),
                    "pgqueuer": burn(6_000, setting="1 proc"),
                    "procrastinate": burn(60, setting="1 proc"),
                },
            },
            "100ms": {
                "defaults": {
                    "deadman": burn(1_900, concurrency=200),
                    "pgqueuer": burn(5_700, setting="1 proc"),
                    "procrastinate": burn(9, ok=False),  # unverified: not a peer figure
                },
                "concurrency_8": {
                    "deadman": {"ok": False, "error": "boom"},
                    "pgqueuer": burn(50, setting="1 proc, concurrency_limit=8"),
                },
            },
        }
    }
    rows = by_target(targets_16(data))
    ten = rows["a handler that awaits 10 ms, at library defaults"]
    assert ten["ratio"] == pytest.approx(2.0) and ten["met"] is None
    assert "pgqueuer" in ten["other"] and "C=200" in ten["deadman"]
    hundred = rows["a handler that awaits 100 ms, at library defaults"]
    assert hundred["ratio"] == pytest.approx(1_900 / 5_700) and hundred["met"] is None
    failed = rows["a handler that awaits 100 ms, concurrency 8"]
    assert failed["ratio"] is None and failed["deadman"] == "FAILED"
    assert len(rows) == 3
