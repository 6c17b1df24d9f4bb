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


def write_all(data: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = {
        "throughput": throughput_grid(data, out),
        "latency": latency_bars(data, out),
        "bulk": bulk_bars(data, out),
    }
    return {k: v for k, v in made.items() if v is not None}
