"""The OS side of devdb: Postgres's tools run as the postgres user when we are root,
and the files, directories, ports, pids and lock they need."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

PG_USER = "postgres"
PORT_NAME = "deadman-port"


def as_postgres() -> bool:
    return os.geteuid() == 0


def postgres_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, but there is no {PG_USER!r} OS user to run Postgres as "
            "(Postgres refuses to run as root); create one or run as a normal user"
        ) from None


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Postgres tool, as the postgres user when we are root.

    PG* variables are dropped so the caller's PGDATA/PGPORT/PGHOST cannot redirect the
    tools. start_new_session keeps the terminal's Ctrl-C from reaching the postmaster
    pg_ctl leaves behind; stopping it is our job.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if not as_postgres():
        return subprocess.run(
            args, capture_output=True, text=True, env=env, cwd="/", start_new_session=True
        )
    user = postgres_user()
    env.update(HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        start_new_session=True,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=os.getgrouplist(user.pw_name, user.pw_gid),
    )


def make_dirs(path: Path) -> None:
    """mkdir -p, leaving every directory we create (as root) enterable by postgres."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    if as_postgres():
        for created in missing:
            created.chmod(0o755)


def prepare_datadir(datadir: Path) -> None:
    make_dirs(datadir.parent)
    datadir.mkdir(mode=0o700, exist_ok=True)
    if not as_postgres():
        return
    user = postgres_user()
    os.chown(datadir, user.pw_uid, user.pw_gid)
    # access(2) as the postgres user checks search permission on every ancestor.
    if not reachable(datadir):
        raise RuntimeError(
            f"the {PG_USER!r} user cannot reach {datadir}: every parent directory must "
            "be traversable by it (e.g. chmod o+x), and pytest's /tmp/pytest-of-root is "
            "not; use a directory such as one made by tempfile.mkdtemp(dir='/tmp') + chmod 755"
        )


def write_owned(path: Path, text: str) -> None:
    """Write a file in the datadir, owned by the user the server runs as."""
    path.write_text(text, encoding="utf-8")
    if as_postgres():
        user = postgres_user()
        os.chown(path, user.pw_uid, user.pw_gid)


def read_port(datadir: Path) -> int | None:
    try:
        return int((datadir / PORT_NAME).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def postmaster_pid(datadir: Path) -> int | None:
    """The pid in postmaster.pid; None if the file is missing or (being written) unparsable."""
    try:
        return int((datadir / "postmaster.pid").read_text(encoding="utf-8").split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def is_zombie(pid: int) -> bool:
    """True if ``pid`` has exited but not been reaped (Linux /proc; False elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return False
    # Field 3, after the parenthesised command name (which may itself contain ')').
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def free_port() -> int:
    """A port nothing listens on now. Another process could take it before Postgres
    binds it; start() then fails loudly with the log tail rather than misbehaving."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR as Postgres sets it: TIME_WAIT leftovers do not count as taken,
    # a listener does.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def reachable(path: Path) -> bool:
    """Can the postgres user enter ``path`` (search permission on every ancestor)?"""
    return run(["test", "-x", str(path)]).returncode == 0
