"""bench.report's io section: a table per wait, Deadman against each peer, and the
phase's runs on their own (``full-io-*.json``) rendered beside the full run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report import _io, _phase_runs


def run(rate: float, ok: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "jobs_per_s": rate,
        "reps": [rate],
        "n": 300,
        "ok": ok,
        "cpu_cores": {"workers": 0.5, "postgres": 0.4, "other": 0.0},
        "cpu_us_per_job": {"workers": 40.0, "postgres": 30.0},
        **extra,
    }


def io_data() -> dict[str, Any]:
    return {
        "plan": {"io_run_s": 3.0},
        "io": {
            "10ms": {
                "defaults_read": {
                    "deadman_concurrency": 200,
                    "pgqueuer_concurrency_limit": 0,
                    "procrastinate_concurrency": 1,
                },
                "defaults": {
                    "deadman": run(12_000, concurrency=200, concurrency_flag=False),
                    "pgqueuer": run(6_000, setting="1 proc, awaits 10 ms"),
                },
            },
            "100ms": {
                "defaults": {
                    "deadman": run(1_900, concurrency=200, concurrency_flag=False),
                    "pgqueuer": run(5_700, setting="1 proc, awaits 100 ms"),
                    "procrastinate": run(9, ok=False, setting="1 proc"),
                },
            },
        },
    }


def lines_of(render: Any) -> list[str]:
    out: list[str] = []
    render(out.append)
    return "\n".join(out).splitlines()


def test_each_wait_gets_its_table_with_deadman_against_each_peer() -> None:
    lines = lines_of(lambda w: _io(io_data(), w))
    assert lines[0].startswith("## Handlers that wait")
    assert "### Each job awaits 10 ms" in lines and "### Each job awaits 100 ms" in lines
    ten = lines[lines.index("### Each job awaits 10 ms") :]
    pgq = next(line for line in ten if "| pgqueuer |" in line)
    assert "| 6,000 |" in pgq and pgq.endswith("| 2.00x |")
    hundred = lines[lines.index("### Each job awaits 100 ms") :]
    pgq = next(line for line in hundred if "| pgqueuer |" in line)
    assert pgq.endswith("| 0.33x |")
    dm = next(line for line in hundred if "| deadman |" in line)
    assert "--concurrency 200 (no flag: the default)" in dm
    pro = next(line for line in hundred if "| procrastinate |" in line)
    assert "**NO — not a valid number**" in pro
    assert any("3.0 s of waiting alone" in line for line in lines)
    assert any(
        "at most 200 jobs at once in Deadman, no limit in pgqueuer and 1 in procrastinate" in line
        for line in lines
    )


def test_a_failed_phase_says_so() -> None:
    lines = lines_of(lambda w: _io({"io": {"ok": False, "error": "io: boom"}}, w))
    assert "FAILED: io: boom" in lines


def test_the_phase_run_on_its_own_renders_under_its_own_heading(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    data = io_data() | {
        "started_at": "2026-12-07T07:00:00Z",
        "git_head": "abc1234",
        "machine": {
            "cpu": "a CPU",
            "cores": 2,
            "memory_gib": 24,
            "kernel": "6.1",
            "postgres": "15",
        },
    }
    (results / "full-io-20261207T070000Z.json").write_text(json.dumps(data))
    md = tmp_path / "BENCHMARKS.md"
    out: list[str] = []
    _phase_runs(out.append, md, "io", lambda r: _io(r, out.append, intro=False))
    text = "\n".join(out)
    assert "## Handlers that wait" in text and ": runs on their own" in text
    assert "`python -m bench.run --only io`" in text
    assert "### Started 2026-12-07T07:00:00Z: code git abc1234" in text
    assert "#### Each job awaits 100 ms" in text
    assert "Raw: `bench/results/full-io-20261207T070000Z.json`." in text
