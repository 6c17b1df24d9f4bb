"""Issue 16's targets against one run's raw JSON (rendered by bench.report).

Pure functions of the run's data, with no plotting imports, so the unit tests can
run them in the package's own environment.
"""

from __future__ import annotations

from typing import Any

PEERS = ("pgqueuer", "procrastinate")


def fmt(v: Any, digits: int = 0) -> str:
    """A number with thousands separators, or 'n/a'."""
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}"


_f = fmt

HTTP_KEYED_BEFORE = 1_000.0  # jobs/s of POST /jobs with Idempotency-Key when issue 16 was filed


def _ok_rate(r: dict[str, Any] | None) -> float | None:
    return r["jobs_per_s"] if r and r.get("ok") and "jobs_per_s" in r else None


def _best_of(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in rows if _ok_rate(r) is not None]
    return max(ok, key=lambda r: r["jobs_per_s"]) if ok else None


def _deadman_label(r: dict[str, Any]) -> str:
    return f"P={r.get('processes')}, C={r.get('concurrency')}"


def _peer_label(name: str, r: dict[str, Any]) -> str:
    return f"{name}, {r.get('setting')}"


def best_burn(data: dict[str, Any], system: str) -> dict[str, Any] | None:
    """The system's best verified burn-down in the run: the grid and the shapes."""
    rows = list(data.get("burn", {}).get(system, []))
    for shape, systems in data.get("shapes", {}).items():
        if isinstance(systems, dict) and shape != "defaults_read" and system in systems:
            rows.append(systems[system])
    return _best_of(rows)


def _fastest_peer(systems: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The verified peer of one shape with the most jobs/s, as (name, its result);
    ("best peer", {}) when none was verified."""
    peers = [(n, systems[n]) for n in PEERS if _ok_rate(systems.get(n)) is not None]
    none: tuple[str, dict[str, Any]] = ("best peer", {})
    return max(peers, key=lambda x: x[1]["jobs_per_s"], default=none)


def targets_16(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 16's targets against one run: each a row of target, Deadman's figure,
    what it is compared with, the ratio and whether it is met (None: not measured
    in this run). Pure: every figure comes from ``data``."""
    rows: list[dict[str, Any]] = []

    def row(target: str, deadman: str, other: str, ratio: float | None, met: bool | None) -> None:
        rows.append(
            {"target": target, "deadman": deadman, "other": other, "ratio": ratio, "met": met}
        )

    def vs(d: float | None, o: float | None, need: float, target: str, dl: str, ol: str) -> None:
        ratio = d / o if d and o else None
        row(
            target,
            f"{_f(d)} jobs/s ({dl})" if d else f"not measured ({dl})",
            f"{_f(o)} jobs/s ({ol})" if o else f"not measured ({ol})",
            ratio,
            None if ratio is None else ratio >= need,
        )

    shapes = data.get("shapes", {})
    defaults = shapes.get("defaults", {})
    if defaults:
        d, p = defaults.get("deadman", {}), defaults.get("pgqueuer", {})
        vs(
            _ok_rate(d),
            _ok_rate(p),
            2.0,
            "burn-down at library defaults, one process: ≥ 2x pgqueuer at its defaults",
            f"C={d.get('concurrency')}, no --concurrency flag",
            _peer_label("pgqueuer", p),
        )
    for shape, systems in shapes.items():
        if not shape.startswith("concurrency_") or not isinstance(systems, dict):
            continue
        c = shape.removeprefix("concurrency_")
        name, peer = _fastest_peer(systems)
        vs(
            _ok_rate(systems.get("deadman")),
            _ok_rate(peer),
            1.5,
            f"burn-down at concurrency {c}, one process: ≥ 1.5x the best peer at {c}",
            f"C={c}",
            _peer_label(name, peer) if peer else "no peer verified",
        )
    # Shapes reported beside the targets, without one: (what the handler does, how
    # Deadman's row is labelled, the shapes' results)
    reported = [
        (
            "a handler that writes one row, {where}: Deadman exactly once against the best "
            "peer's one INSERT, at least once",
            "ctx.transaction(), ",
            data.get("effects", {}),
        )
    ]
    reported += [
        (
            f"a handler that awaits {wait.removesuffix('ms')} ms, {{where}}: Deadman against "
            "the best peer",
            "",
            by_shape,
        )
        for wait, by_shape in data.get("io", {}).items()
        if isinstance(by_shape, dict)
    ]
    for what, how, by_shape in reported:
        for shape, systems in by_shape.items():
            if not isinstance(systems, dict) or shape == "defaults_read":
                continue
            name, peer = _fastest_peer(systems)
            d = systems.get("deadman", {})
            dr, pr = _ok_rate(d), _ok_rate(peer)
            where = "at library defaults" if shape == "defaults" else shape.replace("_", " ")
            row(
                what.format(where=where) + " (reported, no target)",
                f"{_f(dr)} jobs/s ({how}C={d.get('concurrency')})" if dr else "FAILED",
                f"{_f(pr)} jobs/s ({_peer_label(name, peer)})" if pr else "no peer verified",
                dr / pr if dr and pr else None,
                None,
            )
    if data.get("burn") or shapes:
        d, p = best_burn(data, "deadman"), best_burn(data, "pgqueuer")
        vs(
            _ok_rate(d),
            _ok_rate(p),
            1.5,
            "burn-down at the best setting: ≥ 1.5x pgqueuer's best (aim 2x)",
            _deadman_label(d) if d else "none verified",
            _peer_label("pgqueuer", p) if p else "none verified",
        )
        ceil = data.get("ceiling", {}).get("jobs_per_s")
        dv = _ok_rate(d)
        share = dv / ceil if dv and ceil else None
        row(
            "best burn-down as a share of the pgbench batched lifecycle ceiling (aim ≥ 50%)",
            f"{_f(dv)} jobs/s" if dv else "not measured",
            f"ceiling {_f(ceil)} jobs/s" if ceil else "ceiling not measured",
            share,
            None if share is None else share >= 0.5,
        )
    lat = data.get("latency", {})
    d = lat.get("deadman", {})
    if d.get("ok"):
        peers = [(n, lat[n]) for n in PEERS if lat.get(n, {}).get("ok")]
        nobody: tuple[str, dict[str, Any]] = ("best peer", {})
        name, peer = min(peers, key=lambda x: x[1]["p50_ms"], default=nobody)
        p50 = peer.get("p50_ms")
        ratio = d["p50_ms"] / p50 if p50 else None
        row(
            "latency at 200/s, p50: ≤ 0.8x the best peer",
            f"{_f(d['p50_ms'], 2)} ms",
            f"{_f(p50, 2)} ms ({name})",
            ratio,
            None if ratio is None else ratio <= 0.8,
        )
        row(
            "latency at 200/s, p99: ≤ 3 ms",
            f"{_f(d['p99_ms'], 2)} ms",
            f"{_f(peer.get('p99_ms'), 2)} ms ({name})",
            d["p99_ms"] / peer["p99_ms"] if peer.get("p99_ms") else None,
            d["p99_ms"] <= 3.0,
        )
        row(
            "latency at 200/s, p99.9 (reported, no target)",
            f"{_f(d.get('p999_ms'), 2)} ms",
            f"{_f(peer.get('p999_ms'), 2)} ms ({name})",
            d["p999_ms"] / peer["p999_ms"] if d.get("p999_ms") and peer.get("p999_ms") else None,
            None,
        )
    bulk = data.get("bulk", {})
    for rows_, size in ((bulk, "one call"), (bulk.get("in_calls", {}), "calls")):
        if not rows_:
            continue
        d, p = rows_.get("deadman", {}), rows_.get("pgqueuer", {})
        per = d.get("per_call") or p.get("per_call")
        label = f"in calls of {_f(per)}" if size == "calls" else f"in one call of {_f(d.get('n'))}"
        vs(
            _ok_rate(d),
            _ok_rate(p),
            1.5,
            f"bulk enqueue {label}: ≥ 1.5x pgqueuer",
            "Client.enqueue_many",
            "pgqueuer",
        )
    keyed = bulk.get("keyed", {})
    if keyed:
        d, p = keyed.get("deadman", {}), keyed.get("pgqueuer", {})
        dr, pr = _ok_rate(d), _ok_rate(p)
        row(
            f"bulk enqueue in calls of {_f(d.get('per_call') or p.get('per_call'))}, a new "
            "key per job (reported, no target)",
            f"{_f(dr)} jobs/s (Client.enqueue_many, idempotency keys)" if dr else "FAILED",
            f"{_f(pr)} jobs/s (pgqueuer, dedupe keys)" if pr else "not measured (pgqueuer)",
            dr / pr if dr and pr else None,
            None,
        )
    for r in data.get("http", {}).get("results", []):
        if r.get("mode") in ("keyed", "keyed_many"):
            v = r["jobs_per_s"] if r.get("ok") else None
            ratio = v / HTTP_KEYED_BEFORE if v else None
            clients = r.get("clients", data["http"].get("clients"))
            row(
                "HTTP POST /jobs with Idempotency-Key, one server process: ≥ 5x the "
                f"{_f(HTTP_KEYED_BEFORE)} jobs/s of the issue ({clients} clients"
                + ("; the issue's figure was at 8)" if r["mode"] == "keyed_many" else ")"),
                f"{_f(v)} jobs/s" if v else "FAILED",
                f"{_f(HTTP_KEYED_BEFORE)} jobs/s (when issue 16 was filed)",
                ratio,
                None if ratio is None else ratio >= 5.0,
            )
    sc = data.get("scale", {})
    p = sc.get("points", {}).get("completed")
    if p and sc.get("ok"):
        worst = max(p["p50_ratio"], p["p99_ratio"])
        row(
            f"claim right after {_f(sc['n'])} completions, no manual VACUUM: "
            "≤ 1.5x near-empty (p50 and p99)",
            f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f} ms",
            f"near-empty control {p['control']['p50_ms']:.2f} / {p['control']['p99_ms']:.2f} ms",
            worst,
            worst <= 1.5,
        )
    return rows
