"""A network partition for one worker: its own network namespace, a veth pair to the
host, and a small TCP forwarder on the host end that relays to Postgres.

Cutting the partition takes the host end of the veth down: packets are dropped, not
refused, so the worker's connections hang exactly as they would behind a broken
switch (no RST, no error) until the link comes back and TCP retransmits. Everything
stays on addresses and namespaces this module creates (10.231.x.0/30) and on the
forwarder's connections to the database the run already uses.

Needs root (or CAP_NET_ADMIN) and ``ip netns``; :func:`available` says why not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def available() -> str | None:
    """None if network namespaces can be made here, else the reason they cannot."""
    name = f"dmprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", name)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns` is not usable: {exc}"
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", name)
    return None


@dataclass
class Partition:
    """One namespace + veth + forwarder. ``exec_prefix`` runs a command inside it."""

    target_host: str
    target_port: int
    tag: str = field(default_factory=lambda: str(os.getpid()))
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _socks: list[socket.socket] = field(default_factory=list)
    _closed: threading.Event = field(default_factory=threading.Event)
    cut_count: int = 0

    @property
    def netns(self) -> str:
        return f"dmchaos{self.tag}"

    @property
    def host_if(self) -> str:
        return f"dmh{self.tag}"[:15]

    @property
    def ns_if(self) -> str:
        return f"dmn{self.tag}"[:15]

    @property
    def subnet(self) -> int:
        return int(self.tag) % 250

    @property
    def host_ip(self) -> str:
        return f"10.231.{self.subnet}.1"

    @property
    def exec_prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.netns)

    @classmethod
    def for_dsn(cls, dsn: str) -> Partition:
        params = conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1")
        return cls(host, int(str(params.get("port") or 5432)))

    def setup(self) -> None:
        """Create the namespace and the link, start the forwarder. Raises RuntimeError."""
        ns_ip = f"10.231.{self.subnet}.2"
        steps = [
            ("netns", "add", self.netns),
            ("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if),
            ("link", "set", self.ns_if, "netns", self.netns),
            ("addr", "add", f"{self.host_ip}/30", "dev", self.host_if),
            ("link", "set", self.host_if, "up"),
            ("netns", "exec", self.netns, "ip", "addr", "add", f"{ns_ip}/30", "dev", self.ns_if),
            ("netns", "exec", self.netns, "ip", "link", "set", self.ns_if, "up"),
            ("netns", "exec", self.netns, "ip", "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                self.teardown()
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")
        self._listener = socket.create_server((self.host_ip, 0))
        thread = threading.Thread(target=self._accept, name="chaos-forwarder", daemon=True)
        thread.start()
        self._threads.append(thread)

    def dsn(self, dsn: str) -> str:
        """The same database, reached from inside the namespace through the forwarder."""
        assert self._listener is not None
        return make_conninfo(dsn, host=self.host_ip, port=self._listener.getsockname()[1])

    def cut(self) -> None:
        self.cut_count += 1
        _check(_ip("link", "set", self.host_if, "down"))

    def heal(self) -> None:
        _check(_ip("link", "set", self.host_if, "up"))
        # Taking a link down drops its address's routes on some kernels; restore.
        _ip("addr", "replace", f"{self.host_ip}/30", "dev", self.host_if)

    def teardown(self) -> None:
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        for s in list(self._socks):
            with contextlib.suppress(OSError):
                s.close()
        _ip("link", "del", self.host_if)  # deletes the peer too
        _ip("netns", "del", self.netns)

    # -- the forwarder ----------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.target_host, self.target_port), 10)
            except OSError:
                client.close()
                continue
            self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                t.start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(ValueError):
                self._socks.remove(src)
            src.close()


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(done.args)}: {done.stderr.strip()}")
