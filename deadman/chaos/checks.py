"""What the harness itself saw, judged: the checks whose names say "(harness)" or name
a scenario, beside the database's own (verify.py, verify_ops.py)."""

from __future__ import annotations

from typing import Any

from deadman.chaos.http import BATCH, HttpSubmitter
from deadman.chaos.load import LoadPhase
from deadman.chaos.ops_config import OperatorsConfig
from deadman.chaos.ops_operator import Operator
from deadman.chaos.verify import Check
from deadman.chaos.workers import WorkerPool

#: Bound for "memory stays bounded" in the outrun scenario: a worker holds at most
#: its concurrency in jobs however deep the queue is, so its peak RSS must not grow
#: with the backlog. Measured peaks are ~45-50 MiB; this leaves room for noise.
WORKER_RSS_LIMIT_MIB = 300.0

_CUT_KEYS = [
    "worker",
    "leases_at_cut",
    "begun_at_cut",
    "cut_s",
    "rescued_from_it",
    "refused_writes",
]
_RESTART_KEYS = [
    "down_s",
    "running_at_stop",
    "outstanding_at_stop",
    "workers_before",
    "workers_reconnected",
    "reconnect_s",
    "workers_died",
]
#: (scenario, episode, check, what its detail shows)
_EPISODES = [
    (
        "zombie",
        "zombie",
        "zombie: paused past its lease; late writes refused or given up",
        _CUT_KEYS,
    ),
    (
        "partition",
        "partition",
        "partition: cut off past its lease; late writes refused or given up",
        _CUT_KEYS,
    ),
    (
        "hosts",
        "hosts",
        "hosts: a worker host cut off past its leases and healed, one hours off; "
        "late writes refused or given up, the skewed host's leases on the database clock",
        [
            *_CUT_KEYS,
            "host",
            "skew",
            "skewed_workers_faked",
            "skewed_leases",
            "skewed_lease_left_s",
        ],
    ),
    (
        "pg-restart",
        "pg-restart-fast",
        "postgres restart (fast): workers reconnected on their own",
        _RESTART_KEYS,
    ),
    (
        "pg-restart",
        "pg-restart-immediate",
        "postgres restart (immediate, crash recovery): workers reconnected",
        _RESTART_KEYS,
    ),
]


def load_checks(load: LoadPhase, f: dict[str, dict[str, int]]) -> list[Check]:
    """The load phase's: submission, drain, the fleet, and each scenario that ran."""
    o, obs, submitter, pool = load.opts, load.obs, load.submitter, load.pool
    checks = [
        Check(
            "all submissions acknowledged (harness)",
            submitter.acked == o.jobs and submitter.error is None,
            f"acknowledged {submitter.acked} of {o.jobs} in {submitter.duration_s:.1f} s, "
            f"{submitter.resends} batch resends"
            + (f"; {submitter.error}" if submitter.error else ""),
        ),
        Check(
            "drained before --timeout (harness)",
            obs.drained_s is not None and not obs.timed_out,
            f"drained at {obs.drained_s:.1f} s"
            if obs.drained_s
            else f"timed out after {o.timeout:.0f} s",
        ),
        Check(
            "no worker exited on its own (harness)",
            not pool.unexpected,
            f"{len(pool.unexpected)} unexpected exits"
            + "".join(
                f"; w{e.slot} pid {e.pid} code {e.code} at {e.at_s:.1f} s"
                for e in pool.unexpected[:5]
            ),
        ),
    ]
    if "kill" in o.scenarios:
        att = f["attempts"]
        checks.append(
            Check(
                "kill: workers SIGKILLed, replaced, their jobs rescued",
                pool.kills > 0 and att["rescues"] > 0,
                f"{pool.kills} SIGKILLs, {pool.spawns} worker starts, "
                f"{att['rescues']} rescues of {att['jobs_rescued']} jobs",
            )
        )
    for scenario, name, title, keys in _EPISODES:
        r = load.episodes.get(name, {"ok": False, "error": "did not run"})
        if scenario in o.scenarios and "skipped" not in r:
            checks.append(Check(title, bool(r.get("ok")), _describe(r, [*keys, "reason", "error"])))
    if "conn-kill" in o.scenarios:
        checks.append(
            Check(
                "connection kills: backends terminated, fleet carried on",
                obs.conn_kills > 0 and not pool.unexpected,
                f"{obs.conn_kills} worker backends terminated",
            )
        )
    if "outrun" in o.scenarios:
        peak = pool.summary()["worker_peak_rss_mib_max"] or 0.0
        checks.append(
            Check(
                "outrun: queue backlog built up, worker memory bounded",
                obs.peak_depth >= min(o.jobs, load.depth_cap()) // 2
                and peak <= WORKER_RSS_LIMIT_MIB,
                f"peak queue depth {obs.peak_depth} of {o.jobs} jobs; worker peak RSS "
                f"{peak} MiB (limit {WORKER_RSS_LIMIT_MIB:.0f})",
            )
        )
    if isinstance(submitter, HttpSubmitter):
        checks += _http_checks(load, submitter)
    return checks


def _http_checks(load: LoadPhase, sub: HttpSubmitter) -> list[Check]:
    o, obs, api = load.opts, load.obs, load.api
    assert api is not None
    checks = [
        Check(
            "api server stayed up through the run (harness)",
            load.api_exit is None,
            f"exit code {load.api_exit}; statuses {sub.summary()['statuses']}",
        )
    ]
    if "outrun" in o.scenarios:
        # Rescued jobs go back to queued on their own, past the cap's check.
        bound = load.depth_cap() + BATCH + o.workers * o.concurrency
        checks.append(
            Check(
                "outrun (http): a full queue answered 429, depth stayed near the cap",
                sub.statuses.get(429, 0) > 0 and obs.peak_depth <= bound,
                f"429 answers {sub.statuses.get(429, 0)}, cap {api.depth_cap}, "
                f"peak depth {obs.peak_depth} (bound {bound}); api peak RSS "
                f"{round(api.peak_rss_kib / 1024, 1)} MiB",
            )
        )
    if "submit-faults" in o.scenarios:
        checks.append(
            Check(
                "submission faults: timed-out and repeated submissions were replays",
                sub.client_timeouts > 0 and sub.duplicates_sent > 0 and not sub.replays_wrong,
                f"{sub.client_timeouts} client timeouts resent, {sub.duplicates_sent} "
                f"duplicates sent, {sub.replays_ok} answered as replays"
                + "".join(f"; {w}" for w in sub.replays_wrong[:3]),
            )
        )
    return checks


def operators_checks(
    cfg: OperatorsConfig,
    op: Operator,
    pool: WorkerPool,
    drained_s: float | None,
    api_exit: int | None,
) -> list[Check]:
    """The operators phase's: submission, drain, the fleet and the API, the answers."""
    sub, statuses, errors = op.submission, op.journal.statuses, op.journal.errors
    server_errors = {k: n for k, n in statuses.items() if k.split()[-1].startswith("5")}
    return [
        Check(
            "operators: every submission acknowledged (harness)",
            sub.acked_jobs == cfg.jobs and sub.acked_workflows == cfg.workflows,
            f"{sub.acked_jobs} of {cfg.jobs} jobs, {sub.acked_workflows} of "
            f"{cfg.workflows} workflows in {sub.submit_s:.1f} s",
        ),
        Check(
            "operators: drained, nothing left running (harness)",
            drained_s is not None,
            f"drained at {drained_s} s" if drained_s else f"not drained in {cfg.opts.timeout} s",
        ),
        Check(
            "operators: workers SIGKILLed and replaced, none exited on its own, API up (harness)",
            pool.kills > 0 and not pool.unexpected and api_exit is None,
            f"{pool.kills} SIGKILLs, {pool.spawns} worker starts, "
            f"{len(pool.unexpected)} unexpected exits, API exit code {api_exit}",
        ),
        Check(
            "operators: every operator action was answered, none failed (harness)",
            not errors and not server_errors,
            f"{sum(statuses.values())} actions; server errors {server_errors or 'none'}"
            + "".join(f"; {e}" for e in errors[:3]),
        ),
    ]


def _describe(result: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(
        f"{k} {result[k]}" for k in keys if k in result and result[k] not in (None, [])
    )
