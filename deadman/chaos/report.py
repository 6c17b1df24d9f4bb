"""The report of a chaos run: the header printed before the load, the JSON report
(``--report``) and the text printed from it, for each phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deadman import devdb
from deadman.chaos import verify_limits
from deadman.chaos.http import HttpSubmitter
from deadman.chaos.load import LoadPhase
from deadman.chaos.operators import Outcome
from deadman.chaos.options import SCENARIOS, Options
from deadman.chaos.verify import Check, sql_text


def header(o: Options, private_cluster: bool, log_dir: Path) -> str:
    where = "private cluster (fsync off)" if private_cluster else "--database-url"
    return (
        f"deadman chaos: seed {o.seed}, {o.jobs} jobs, {o.workers} workers x "
        f"concurrency {o.concurrency}, kill-rate {o.kill_rate} per {o.kill_interval} s, "
        f"lease TTL {o.lease_ttl} s, handler 0-{o.handler_ms} ms, "
        f"effects {'UNSAFE (outside the transaction)' if o.unsafe_effects else 'fenced'}\n"
        f"scenarios: {', '.join(s for s in SCENARIOS if s in o.scenarios)}\n"
        f"submit: {o.submit}; database: {where}; worker logs: {log_dir}"
    )


def load_json(
    load: LoadPhase,
    f: dict[str, dict[str, int]],
    checks: list[Check],
    elapsed: float,
    dsn: str,
    limits: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The load phase's report: the verdict of its checks, and all that was load;
    ``limits``: verify_limits.sql's figures by key, with the limits scenario."""
    o, obs, submitter = load.opts, load.obs, load.submitter
    kinds: dict[str, int] = {}
    for a in load.applied:
        kinds[a.kind] = kinds.get(a.kind, 0) + 1
    return {
        "verdict": "PASS" if all(c.passed for c in checks) else "FAIL",
        "wall_s": round(elapsed, 1),
        "options": o.summary(private_cluster=load.cluster is not None),
        "figures": f,
        "checks": [c.to_json() for c in checks],
        "episodes": load.episodes,
        "fleet": load.pool.summary(),
        "http": submitter.summary() if isinstance(submitter, HttpSubmitter) else None,
        "observed": {
            "ticks": obs.ticks,
            "peak_queue_depth": obs.peak_depth,
            "peak_outstanding": obs.peak_outstanding,
            "conn_kills": obs.conn_kills,
            "kills_withheld": obs.kills_withheld,
            "faults_stopped_s": obs.faults_stopped_s,
            "drained_s": obs.drained_s,
            "submit_s": round(submitter.duration_s, 2),
            "postgres_peak_rss_mib": obs.postgres_peak_rss_mib,
            "harness_peak_rss_mib": obs.harness_peak_rss_mib,
            "throughput_jobs_per_s": round(o.jobs / obs.drained_s, 1) if obs.drained_s else None,
        },
        "stuck_at_timeout": obs.stuck,
        "faults_applied": {"counts": kinds, "events": [a.to_json() for a in load.applied]},
        "dsn": dsn if o.keep else None,
        "verifier_sql": sql_text(),
        "limits": None
        if limits is None
        else {
            "by_key": verify_limits.summary(limits),
            "figures": limits,
            "verifier_sql": verify_limits.sql_text(),
        },
    }


def load_text(r: dict[str, Any], cluster: devdb.Cluster | None) -> str:
    """The load phase's report as printed (``cluster``: the private one, if any)."""
    f = r["figures"]
    lines = ["", "figures (from verify.sql):"]
    for name, row in f.items():
        lines.append(f"  {name:<15} " + ", ".join(f"{k} {v}" for k, v in row.items()))
    if r["limits"] is not None:
        lines.append("limits by key (from verify_limits.sql):")
        for key, row in r["limits"]["by_key"].items():
            lines.append(f"  {key:<15} " + ", ".join(f"{k} {v}" for k, v in row.items()))
    obs, fleet = r["observed"], r["fleet"]
    lines += [
        "observed by the harness:",
        f"  faults applied  {r['faults_applied']['counts'] or 'none'} "
        f"(kills withheld from booting/protected workers: {obs['kills_withheld']})",
        f"  fleet           {fleet['spawns']} worker starts, {fleet['sigkills']} SIGKILLs, "
        f"{len(fleet['unexpected_exits'])} unexpected exits",
        f"  memory          worker peak RSS max {fleet['worker_peak_rss_mib_max']} MiB "
        f"(median {fleet['worker_peak_rss_mib_median']}, {fleet['worker_processes_sampled']} "
        f"processes), postgres {obs['postgres_peak_rss_mib']} MiB, harness "
        f"{obs['harness_peak_rss_mib']} MiB",
        f"  queue           peak depth {obs['peak_queue_depth']}, submitted in "
        f"{obs['submit_s']} s, faults stopped at {obs['faults_stopped_s']} s, drained at "
        f"{obs['drained_s']} s ({obs['throughput_jobs_per_s']} jobs/s)",
    ]
    for name, ep in r["episodes"].items():
        if "skipped" in ep:
            lines.append(f"  {name:<15} {ep['skipped']}")
    stuck = r.get("stuck_at_timeout")
    if stuck:
        lines.append(f"  not drained: {len(stuck['jobs'])} outstanding jobs, e.g.:")
        lines += [f"    {j}" for j in stuck["jobs"][:5]]
    lines.append("checks:")
    for c in r["checks"]:
        lines.append(f"  {'PASS' if c['passed'] else 'FAIL'}  {c['name']}: {c['detail']}")
    n_ok = sum(1 for c in r["checks"] if c["passed"])
    lines.append(
        f"verdict: {r['verdict']} ({n_ok}/{len(r['checks'])} checks passed) in {r['wall_s']} s"
    )
    if r["dsn"]:
        lines.append(f"cluster kept running: psql '{r['dsn']}'")
        if cluster is not None:
            root = cluster.datadir.parent
            lines.append(f"stop it with: deadman devdb stop --dir {root} && rm -rf {root}")
    lines += ["", "verifier SQL (deadman/chaos/verify.sql):", r["verifier_sql"]]
    if r["limits"] is not None:
        lines += ["verifier SQL (deadman/chaos/verify_limits.sql):", r["limits"]["verifier_sql"]]
    return "\n".join(lines)


def operators_text(out: Outcome) -> str:
    """The operators phase's report as printed."""
    r = out.report
    lines = [
        "operators figures (from verify_ops.sql):",
        *(
            f"  {name:<19} " + ", ".join(f"{k} {v}" for k, v in row.items())
            for name, row in r["figures"].items()
        ),
        f"  actions          {r['actions']}",
        f"  journal          {r['journal']}",
        f"  fleet            {r['fleet']['spawns']} worker starts, "
        f"{r['fleet']['sigkills']} SIGKILLs; submitted in {r['submit_s']} s, drained at "
        f"{r['drained_s']} s, phase {r['wall_s']} s",
        *(f"  e.g. {name}: {row}" for name, rows in r["examples"].items() for row in rows[:3]),
        "operators checks:",
        *(f"  {'PASS' if c.passed else 'FAIL'}  {c.name}: {c.detail}" for c in out.checks),
    ]
    return "\n".join(lines)
