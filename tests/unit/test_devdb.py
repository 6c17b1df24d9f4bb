"""devdb without a real server: binary discovery and the cheap parts of Cluster."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from deadman import devdb

SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")


def make_bindir(path: Path, names: tuple[str, ...] = SERVER_BINARIES) -> Path:
    path.mkdir(parents=True)
    for name in names:
        exe = path / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return path


@pytest.fixture
def nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No override, an empty PATH and no Debian tree: every lookup comes up empty."""
    monkeypatch.delenv("DEADMAN_PG_BINDIR", raising=False)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(devdb, "_DEBIAN_ROOT", tmp_path / "no-debian")
    return empty


def test_env_override_wins_over_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = make_bindir(tmp_path / "custom")
    monkeypatch.setenv("DEADMAN_PG_BINDIR", str(bindir))
    assert devdb.find_pg_bindir() == bindir


def test_env_override_without_binaries_is_an_error_not_a_fallthrough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = make_bindir(tmp_path / "partial", names=("initdb", "pg_ctl"))
    monkeypatch.setenv("DEADMAN_PG_BINDIR", str(bindir))
    with pytest.raises(RuntimeError, match=r"DEADMAN_PG_BINDIR=.*partial"):
        devdb.find_pg_bindir()


def test_nothing_found_lists_everything_tried(nothing_installed: Path) -> None:
    with pytest.raises(RuntimeError) as excinfo:
        devdb.find_pg_bindir()
    message = str(excinfo.value)
    for tried in ("DEADMAN_PG_BINDIR", "pg_config", "initdb on PATH", "<version>/bin"):
        assert tried in message


def test_pg_config_bindir_is_used(nothing_installed: Path, tmp_path: Path) -> None:
    bindir = make_bindir(tmp_path / "pg" / "bin")
    pg_config = nothing_installed / "pg_config"
    pg_config.write_text(f"#!/bin/sh\necho {bindir}\n")
    pg_config.chmod(0o755)
    assert devdb.find_pg_bindir() == bindir


def test_initdb_symlink_on_path_is_followed_to_the_full_bindir(
    nothing_installed: Path, tmp_path: Path
) -> None:
    # /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb, without a postgres
    # binary beside the link: the link's own directory is not a usable bindir.
    real = make_bindir(tmp_path / "real" / "bin")
    (nothing_installed / "initdb").symlink_to(real / "initdb")
    assert devdb.find_pg_bindir() == real


def test_lone_initdb_copy_on_path_is_skipped(nothing_installed: Path, tmp_path: Path) -> None:
    lone = nothing_installed / "initdb"
    lone.write_text("#!/bin/sh\n")
    lone.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"initdb on PATH: .*initdb \(no pg_ctl/postgres"):
        devdb.find_pg_bindir()


def test_debian_layout_picks_the_highest_version_numerically(
    nothing_installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "debian"
    for version in ("9.6", "10", "15"):
        make_bindir(root / version / "bin")
    make_bindir(root / "16" / "bin", names=("initdb",))  # client-only: not a server
    (root / "not-a-version").mkdir()
    monkeypatch.setattr(devdb, "_DEBIAN_ROOT", root)
    assert devdb.find_pg_bindir() == root / "15" / "bin"


def test_dsn_and_explicit_port(tmp_path: Path) -> None:
    cluster = devdb.Cluster(tmp_path / "data", port=54321)
    assert cluster.port == 54321
    assert cluster.dsn() == "postgresql://postgres@127.0.0.1:54321/postgres"
    assert cluster.dsn("deadman") == "postgresql://postgres@127.0.0.1:54321/deadman"


def test_port_defaults_to_a_free_one_then_to_the_recorded_one(tmp_path: Path) -> None:
    datadir = tmp_path / "data"
    port = devdb.Cluster(datadir).port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # it was free when picked
    datadir.mkdir()
    (datadir / "deadman-port").write_text("54999\n")
    assert devdb.Cluster(datadir).port == 54999


def test_a_cluster_that_was_never_created_is_not_running(tmp_path: Path) -> None:
    cluster = devdb.Cluster(tmp_path / "data")
    assert not cluster.is_running()
    cluster.stop()  # no-op, not an error


def test_unknown_stop_mode_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stop mode"):
        devdb.Cluster(tmp_path / "data").stop("graceful")


def test_init_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    datadir = tmp_path / "data"
    datadir.mkdir()
    (datadir / "precious.txt").write_text("keep me")
    with pytest.raises(RuntimeError, match="not empty"):
        devdb.Cluster(datadir).init()
    assert (datadir / "precious.txt").read_text() == "keep me"
