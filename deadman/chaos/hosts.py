"""Many hosts on one machine: three network namespaces, one of them on a clock hours off.

Each host is made as the partition scenario makes one
(:class:`deadman.chaos.netns.Partition`: loopback, a veth pair to the machine, a
forwarder on the machine's end that relays to Postgres), so that a host can be cut
off and healed like any partitioned worker, and so that what runs on it reaches
Postgres the way a process on another machine would.

A host's clock can be set hours off: its commands then run under libfaketime
(Debian's ``faketime`` package), which moves every clock the process reads (wall
and monotonic) by the same offset. Nothing may change because of it: every time
that decides anything (a lease, a schedule's tick, a start_by or deadline,
retention, a rate window) is read from the database's clock, and a worker's own
clock only times its local waits.

Needs root (or CAP_NET_ADMIN) and ``ip netns``, like the partition (netns.available
says why not); :func:`faketime_missing` says whether a skewed host can be had.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from deadman.chaos.netns import Partition

#: Where Debian's ``libfaketime`` package puts the library (``apt-get install faketime``).
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
#: How far the skewed host's clock is off: hours, far beyond any lease, tick, deadline
#: or retention window used with it, so a decision taken on that clock shows at once.
SKEW = "+3h"
#: The three hosts: the API on the first, a worker fleet on each of the others.
NAMES = ("api", "workers-a", "workers-b")


def faketime_missing() -> str | None:
    """None if libfaketime is installed, else what to install."""
    if FAKETIME_LIB.exists():
        return None
    return f"{FAKETIME_LIB} is missing: apt-get install faketime (it pulls in libfaketime)"


def skewed(skew: str = SKEW) -> tuple[str, ...]:
    """A command prefix that runs the rest of the command with its clocks ``skew`` off
    (libfaketime's offset syntax: ``+3h``, ``-90m``)."""
    return ("env", f"LD_PRELOAD={FAKETIME_LIB}", f"FAKETIME={skew}")


def _free_tags(n: int) -> list[str]:
    """``n`` Partition tags (numbers: the subnet is the tag modulo 250) whose subnets
    no namespace on this machine uses now, so that a partition or hosts run of a
    test running alongside (pytest-xdist) does not collide with these."""
    shown = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10)
    used = set(re.findall(r"10\.231\.(\d+)\.", shown.stdout))
    pid = os.getpid()
    base = pid * 1000 + pid % 250  # processes start at different subnets
    tags = [str(base + k) for k in range(250) if str((base + k) % 250) not in used]
    return tags[:n]


@dataclass
class Host:
    """One host: its namespace (and link), and how its processes are started."""

    name: str
    net: Partition
    #: libfaketime offset of this host's clock; None: the machine's clock.
    skew: str | None = None

    @property
    def address(self) -> str:
        """The host's own address (its end of the veth), reachable from the machine."""
        return f"10.231.{self.net.subnet}.2"

    def prefix(self) -> tuple[str, ...]:
        """Put before a command to run it on this host (and under its clock)."""
        clock = skewed(self.skew) if self.skew is not None else ()
        return (*self.net.exec_prefix, *clock)

    def dsn(self, dsn: str) -> str:
        """The database ``dsn`` names, as this host reaches it (through its link)."""
        return self.net.dsn(dsn)

    def cut(self) -> None:
        """Drop the host's link: its packets are lost, its connections hang."""
        self.net.cut()

    def heal(self) -> None:
        self.net.heal()


@dataclass
class Hosts:
    """The three hosts of :data:`NAMES`, each a namespace whose forwarder relays to
    the database of ``dsn``; the last one's clock is ``skew`` off. ``setup`` makes
    them all or none (RuntimeError says why); ``teardown`` removes them."""

    dsn: str
    skew: str | None = SKEW
    hosts: list[Host] = field(default_factory=list)

    def setup(self) -> Hosts:
        tags = _free_tags(len(NAMES))
        try:
            for i, name in enumerate(NAMES):
                net = Partition.for_dsn(self.dsn)
                net.tag = tags[i]
                net.setup()
                skew = self.skew if i == len(NAMES) - 1 else None
                self.hosts.append(Host(name, net, skew))
        except RuntimeError:
            self.teardown()
            raise
        return self

    def teardown(self) -> None:
        for host in self.hosts:
            host.net.teardown()
        self.hosts.clear()

    @property
    def api(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        """The worker hosts: the one on the machine's clock first, the skewed one last."""
        return self.hosts[1:]
