"""The worker processes a chaos run owns: one ``deadman worker --processes 1`` per
slot, so that the harness itself can SIGKILL, SIGSTOP and SIGCONT them (a Fleet
supervisor in between would restart them on its own and hide what happened).

A slot whose process the harness killed is refilled at once, to keep capacity. A
process that exits *without* being killed is an unexpected exit: it is recorded with
its exit code and log tail, because a worker that dies when Postgres restarts is
exactly what the harness is there to find.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from deadman.stackdump import request_dump

APP = "deadman.chaos.app:registry"


@dataclass
class Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    generation: int = 0
    log_path: Path | None = None
    killed: bool = False  # the harness sent SIGKILL: its exit is expected
    terminating: bool = False  # the harness sent SIGTERM at the end of the run
    stopped: bool = False  # SIGSTOPped (a zombie)
    prefix: Sequence[str] = ()  # e.g. ("ip", "netns", "exec", name)
    dsn: str | None = None  # overrides the pool's (a partitioned slot's route)


@dataclass
class Exit:
    slot: int
    pid: int
    code: int
    at_s: float
    log_tail: str


@dataclass
class WorkerPool:
    dsn: str
    size: int
    env: dict[str, str]
    log_dir: Path
    started_at: float = field(default_factory=time.monotonic)
    slots: list[Slot] = field(init=False)
    unexpected: list[Exit] = field(default_factory=list)
    kills: int = 0
    spawns: int = 0
    #: While False, empty slots stay empty (e.g. while Postgres is down: a worker
    #: started then would fail its schema check and count as a crash).
    respawn: bool = True
    peak_rss_kib: dict[int, int] = field(default_factory=dict)  # pid -> VmHWM

    def __post_init__(self) -> None:
        self.slots = [Slot(i) for i in range(self.size)]
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def worker_dsn(self, slot: Slot) -> str:
        # application_name lets the harness find this slot's backends in
        # pg_stat_activity (connection kills).
        return make_conninfo(slot.dsn or self.dsn, application_name=f"deadman-chaos-w{slot.index}")

    def spawn(self, slot: Slot) -> None:
        slot.generation += 1
        slot.killed = slot.stopped = slot.terminating = False
        slot.log_path = self.log_dir / f"worker-{slot.index}-{slot.generation}.log"
        env = dict(os.environ, **self.env, DEADMAN_DATABASE_URL=self.worker_dsn(slot))
        argv = [
            *slot.prefix,
            sys.executable,
            "-m",
            "deadman",
            "worker",
            "--processes",
            "1",
            "--app",
            APP,
        ]
        with slot.log_path.open("wb") as log:
            slot.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.spawns += 1

    def start_all(self) -> None:
        for slot in self.slots:
            self.spawn(slot)

    def pids(self) -> dict[int, int]:
        """slot index -> pid, for live processes."""
        return {
            s.index: s.proc.pid for s in self.slots if s.proc is not None and s.proc.poll() is None
        }

    def kill(self, index: int) -> int | None:
        """SIGKILL the slot's process (and wait for it); returns its pid."""
        slot = self.slots[index]
        if slot.proc is None or slot.proc.poll() is not None:
            return None
        self.sample_rss()
        slot.killed = True
        slot.proc.send_signal(signal.SIGKILL)
        slot.proc.wait(timeout=10)
        self.kills += 1
        return slot.proc.pid

    def stacks(self, index: int, timeout: float = 5.0) -> str:
        """The slot's process's every thread's stack (deadman.stackdump), as it wrote
        them to its log; empty if it is gone or wrote none within ``timeout``."""
        slot = self.slots[index]
        if slot.proc is None or slot.proc.poll() is not None or slot.log_path is None:
            return ""
        return request_dump(slot.proc.pid, slot.log_path, timeout)

    def pause(self, index: int) -> int | None:
        slot = self.slots[index]
        if slot.proc is None or slot.proc.poll() is not None:
            return None
        slot.proc.send_signal(signal.SIGSTOP)
        slot.stopped = True
        return slot.proc.pid

    def resume(self, index: int) -> None:
        slot = self.slots[index]
        if slot.proc is not None and slot.stopped:
            slot.proc.send_signal(signal.SIGCONT)
        slot.stopped = False

    def reap(self) -> None:
        """Notice exited processes; refill their slots (if respawning is on)."""
        for slot in self.slots:
            proc = slot.proc
            if proc is not None:
                code = proc.poll()
                if code is None:
                    continue
                # SIGTERM before a booting worker installed its handler kills it
                # with -SIGTERM: as expected as a clean exit at the end of a run.
                stopped_by_us = slot.terminating and code in (0, -signal.SIGTERM)
                if not (slot.killed or stopped_by_us):
                    self.unexpected.append(
                        Exit(
                            slot.index,
                            proc.pid,
                            code,
                            time.monotonic() - self.started_at,
                            _tail(slot.log_path),
                        )
                    )
                slot.proc = None
            if self.respawn:
                self.spawn(slot)

    def sample_rss(self) -> None:
        for pid in self.pids().values():
            hwm = vm_hwm_kib(pid)
            if hwm is not None:
                self.peak_rss_kib[pid] = max(hwm, self.peak_rss_kib.get(pid, 0))

    def stop_all(self, timeout: float = 20.0) -> None:
        """SIGCONT the paused, SIGTERM all (graceful), SIGKILL what is left at the deadline."""
        self.respawn = False
        self.sample_rss()
        live = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        for s in live:
            self.resume(s.index)
            assert s.proc is not None
            s.terminating = True
            s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for s in live:
            assert s.proc is not None
            try:
                s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.killed = True
                s.proc.kill()
                s.proc.wait(timeout=10)
        self.reap()

    def summary(self) -> dict[str, Any]:
        rss = sorted(self.peak_rss_kib.values())
        return {
            "spawns": self.spawns,
            "sigkills": self.kills,
            "unexpected_exits": [e.__dict__ for e in self.unexpected],
            "worker_peak_rss_mib_max": round(rss[-1] / 1024, 1) if rss else None,
            "worker_peak_rss_mib_median": round(rss[len(rss) // 2] / 1024, 1) if rss else None,
            "worker_processes_sampled": len(rss),
        }


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set size of a live process (Linux /proc), in KiB."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def children_of(ppid: int) -> list[int]:
    """Direct children of a process (Postgres backends of a postmaster)."""
    out: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="utf-8")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(ppid):
            out.append(int(entry.name))
    return out


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
