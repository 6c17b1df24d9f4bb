"""PNG plots from the raw results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"deadman": "#1f6feb", "pgqueuer": "#d1242f", "procrastinate": "#8250df"}


def throughput_grid(data: dict[str, Any], out: Path) -> Path | None:
    """Deadman burn-down jobs/s vs concurrency, one line per process count; each
    peer's best setting as a horizontal line."""
    burn = data.get("burn")
    if not burn or not burn.get("deadman"):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    by_p: dict[int, list[tuple[int, float]]] = {}
    for r in burn["deadman"]:
        if r.get("ok"):
            by_p.setdefault(r["processes"], []).append((r["concurrency"], r["jobs_per_s"]))
    for p, pts in sorted(by_p.items()):
        pts.sort()
        ax.plot(
            [c for c, _ in pts],
            [v for _, v in pts],
            marker="o",
            label=f"deadman, {p} process(es)",
            color=COLORS["deadman"],
            alpha=1.0 if p == 1 else 0.6,
            linestyle="-" if p == 1 else "--",
        )
    for peer in ("pgqueuer", "procrastinate"):
        ok = [r for r in burn.get(peer, []) if r.get("ok")]
        if ok:
            best = max(ok, key=lambda r: r["jobs_per_s"])
            ax.axhline(
                best["jobs_per_s"],
                color=COLORS[peer],
                linestyle=":",
                label=f"{peer} best ({best['setting']})",
            )
    ax.set_xscale("log")
    ax.set_xlabel("concurrency per process (--concurrency)")
    ax.set_ylabel("burn-down jobs/s (median)")
    ax.set_title(f"No-op burn-down, {data['plan']['burn_n']:,} jobs, durable Postgres")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def latency_bars(data: dict[str, Any], out: Path) -> Path | None:
    lat = data.get("latency")
    if not lat:
        return None
    systems = [s for s in ("deadman", "pgqueuer", "procrastinate") if lat.get(s, {}).get("ok")]
    if not systems:
        return None
    keys = [("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    width = 0.8 / len(systems)
    for i, s in enumerate(systems):
        vals = [lat[s][k] for k, _ in keys]
        xs = [j + i * width for j in range(len(keys))]
        bars = ax.bar(xs, vals, width, label=s, color=COLORS[s])
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in vals], fontsize=7)
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(keys))])
    ax.set_xticklabels([label for _, label in keys])
    ax.set_yscale("log")
    ax.set_ylabel("enqueue -> handler start, ms (log)")
    plan = data["plan"]
    ax.set_title(f"Latency at {plan['rate']:.0f} jobs/s offered for {plan['latency_s']:.0f} s")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "latency.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def bulk_bars(data: dict[str, Any], out: Path) -> Path | None:
    bulk = data.get("bulk")
    if not bulk:
        return None
    systems = [s for s in ("deadman", "pgqueuer", "procrastinate") if bulk.get(s, {}).get("ok")]
    if not systems:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    vals = [bulk[s]["jobs_per_s"] for s in systems]
    bars = ax.bar(systems, vals, color=[COLORS[s] for s in systems])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in vals], fontsize=8)
    ax.set_ylabel("jobs/s (median)")
    ax.set_title(f"Bulk enqueue of {data['plan']['bulk_n']:,} no-op jobs")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "bulk.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def retention_sizes(data: dict[str, Any], out: Path) -> Path | None:
    """Jobs table heap and index size, dead tuples, and jobs finished per second over
    the steady run, with the window of the open transaction shaded."""
    ret = data.get("retention")
    if not ret or not ret.get("samples"):
        return None
    samples = ret["samples"]
    ts = [s["t_s"] for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=110, sharex=True)
    top.plot(ts, [s["heap_bytes"] / 2**20 for s in samples], marker="o", label="heap MiB")
    top.plot(ts, [s["index_bytes"] / 2**20 for s in samples], marker="s", label="indexes MiB")
    top.set_ylabel("deadman.jobs size, MiB")
    top.set_ylim(bottom=0)
    dead = top.twinx()
    dead.plot(
        ts,
        [s["n_dead_tup"] / 1000 for s in samples],
        color="#999999",
        linestyle=":",
        marker=".",
        label="dead tuples (k)",
    )
    dead.set_ylabel("dead tuples, thousands")
    dead.set_ylim(bottom=0)
    bottom.plot(
        ts,
        [s["finished_per_s"] for s in samples],
        marker="o",
        color=COLORS["deadman"],
        label="jobs finished/s (interval)",
    )
    bottom.plot(ts, [s["backlog"] for s in samples], color="#d1242f", label="backlog (jobs)")
    bottom.set_ylabel("jobs/s, jobs")
    bottom.set_xlabel("seconds since the load started")
    bottom.set_ylim(bottom=0)
    hold = ret.get("hold")
    if hold:
        for ax in (top, bottom):
            ax.axvspan(hold["began_s"], hold["ended_s"], color="#f0b400", alpha=0.25)
        top.text(
            hold["began_s"],
            top.get_ylim()[1] * 0.95,
            " transaction open",
            fontsize=8,
            va="top",
        )
    lines = top.get_legend_handles_labels()
    lines2 = dead.get_legend_handles_labels()
    top.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper left")
    bottom.legend(fontsize=8, loc="upper left")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.set_title(
        f"{ret['rate']} jobs/s for {ret['duration_s']:.0f} s, retention "
        f"{ret['retention_s']:g} s, {ret['workers']} workers"
    )
    fig.tight_layout()
    path = out / "retention.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def write_all(data: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "throughput": throughput_grid(data, out),
        "latency": latency_bars(data, out),
        "bulk": bulk_bars(data, out),
        "retention": retention_sizes(data, out),
    }
    return {k: v for k, v in made.items() if v is not None}
