"""The ``hosts`` scenario: the load phase on three hosts, one cut off, one hours off.

The hosts are deadman/chaos/hosts.py's: the API server on the first, the worker slots
spread over the other two (even slots on ``workers-a``, odd ones on ``workers-b``, whose
clock is hours ahead under libfaketime). Mid-run ``workers-a`` is cut off while one of
its workers holds leases whose handlers have begun (the same episode as the partition,
on a whole host) and healed once its leases lapsed and were rescued: by the skewed
host's rescuer, whenever the skewed host leads.

The harness's own verification judges the rest: nothing lost, no effect doubled,
duplicate executions counted. This episode adds what the database says about the skewed
host's leases: each granted for the lease TTL on the database's clock, never hours ahead
or behind.

Unlike the partition, which is skipped where the kernel refuses namespaces, asking for
``--hosts`` there is an error: the scenario is nothing but its hosts.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from deadman.chaos import netns
from deadman.chaos.hosts import FAKETIME_LIB, SKEW, Hosts, faketime_missing
from deadman.chaos.workers import WorkerPool
from deadman.db.queries import parse
from deadman.errors import DeadmanError

QUERIES: dict[str, LiteralString] = parse(
    resources.files("deadman.chaos").joinpath("hosts.sql").read_text(encoding="utf-8")
)
#: How far a lease's end may sit past now() + TTL (a renewal's own round trip).
LEASE_SLACK_S = 1.0


def make(dsn: str) -> Hosts:
    """The three hosts for a run on ``dsn``; DeadmanError says why they cannot be had."""
    reason = netns.available() or faketime_missing()
    if reason is not None:
        raise DeadmanError(f"--hosts needs network namespaces and libfaketime: {reason}")
    try:
        return Hosts(dsn).setup()
    except RuntimeError as exc:
        raise DeadmanError(f"--hosts: could not make the hosts' namespaces: {exc}") from exc


def place(pool: WorkerPool, hosts: Hosts) -> None:
    """Put each worker slot on a worker host: even slots on the first, odd on the
    skewed one (a replacement after a kill starts on the same host)."""
    for slot in pool.slots:
        host = hosts.workers[slot.index % 2]
        slot.prefix = host.prefix()
        slot.dsn = host.dsn(pool.dsn)


def cut_slot(pool: WorkerPool, partition_slot: int) -> int:
    """The slot the episode watches: the partition's pick, moved onto the first worker
    host (an even slot), so that the skewed host stays up to rescue."""
    return partition_slot - partition_slot % 2 if pool.size > 1 else 0


def skewed_workers(pool: WorkerPool) -> list[int]:
    """The pids of the live workers on the skewed host."""
    return [pid for index, pid in pool.pids().items() if index % 2 == 1]


def faked(pid: int) -> bool:
    """Whether the process runs in a network namespace other than ours with libfaketime
    loaded: proof that a skewed slot is what it says (read from /proc)."""
    try:
        elsewhere = os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        maps = Path(f"/proc/{pid}/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return elsewhere and FAKETIME_LIB.name in maps


def lease_clock(dsn: str, pids: list[int], ttl_s: float) -> dict[str, Any]:
    """What the database says about the skewed host's live leases right now: how far
    each one's end is from now(), on the database's clock; and whether those workers
    really run on that host, under its clock."""
    on_host = sum(1 for pid in pids if faked(pid))
    try:
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row, connect_timeout=5) as c:
            row = c.execute(QUERIES["hosts_lease_margins"], {"pids": pids}).fetchone()
    except psycopg.OperationalError as exc:
        return {"leases_ok": False, "lease_error": str(exc)}
    assert row is not None
    n, lo, hi = int(row["leases"]), row["min_left_s"], row["max_left_s"]
    # No lease at all proves nothing: the skewed host must be busy while the other
    # is cut off (it runs what was rescued).
    ok = n > 0 and hi is not None and hi <= ttl_s + LEASE_SLACK_S and on_host == len(pids) > 0
    return {
        "skewed_workers_faked": f"{on_host}/{len(pids)}",
        "skew": SKEW,
        "skewed_leases": n,
        "skewed_lease_left_s": None if lo is None or hi is None else [round(lo, 2), round(hi, 2)],
        "leases_ok": ok,
    }


class LeaseWatch:
    """:func:`lease_clock`, read every 0.1 s from a thread while the other host is cut
    off (``start`` at the cut, ``stop`` before the heal). One instant proves nothing:
    the skewed host may hold no lease (a kill just replaced its worker, its slots are
    between claims, or the queue ran dry during a long cut), or a worker a kill just
    started may not be readable yet. The verdict: some reading conclusive (a lease
    held, every worker seen faked), and no reading with a lease ending past the TTL."""

    def __init__(self, dsn: str, pids: Callable[[], list[int]], ttl_s: float) -> None:
        self._dsn, self._pids, self._ttl_s = dsn, pids, ttl_s
        self._readings: list[dict[str, Any]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self._readings.append(lease_clock(self._dsn, self._pids(), self._ttl_s))
            self._done.wait(0.1)

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self._thread.join(10.0)
        readings = self._readings or [lease_clock(self._dsn, self._pids(), self._ttl_s)]
        bound = self._ttl_s + LEASE_SLACK_S
        late = [
            r
            for r in readings
            if r.get("skewed_leases") and (r.get("skewed_lease_left_s") or [0.0, 0.0])[1] > bound
        ]
        good = [r for r in readings if r.get("leases_ok")]
        final = late[0] if late else max(good or readings, key=lambda r: r.get("skewed_leases", 0))
        ok = bool(good) and not late
        return {**final, "leases_ok": ok, "lease_readings": len(readings)}
