"""``deadman chaos --hosts``: which scenarios the flags choose (no database, no
processes), and the hosts' command prefixes."""

from __future__ import annotations

import pytest

from deadman.chaos.hosts import FAKETIME_LIB, SKEW, skewed
from deadman.chaos.options import OPT_IN, SCENARIOS, Options
from deadman.cli import build_parser
from deadman.config import Settings
from deadman.errors import DeadmanError


def options(*flags: str) -> Options:
    return Options.from_args(build_parser().parse_args(["chaos", *flags]))


def test_all_and_no_flag_leave_the_hosts_out() -> None:
    every = set(SCENARIOS) - OPT_IN
    assert options().scenarios == every == options("--all").scenarios
    assert "hosts" not in every and "partition" in every


def test_hosts_alone_and_with_all_take_the_partitions_place() -> None:
    assert options("--hosts").scenarios == {"hosts"}
    chosen = options("--hosts", "--all").scenarios
    assert "hosts" in chosen and "partition" not in chosen
    assert chosen == set(SCENARIOS) - {"partition"}


def test_hosts_and_partition_together_are_refused() -> None:
    opts = options("--hosts", "--partition", "--jobs", "10")
    with pytest.raises(DeadmanError, match="not with --partition"):
        opts.validate()


@pytest.mark.parametrize("bad", ["--hosts=1", "--hosts=yes", "--hostsx", "--hosts\x00"])
def test_hostile_hosts_flags_are_usage_errors(bad: str) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["chaos", bad])
    assert exc.value.code == 2


def test_the_skewed_prefix_preloads_libfaketime_with_the_offset() -> None:
    assert skewed() == ("env", f"LD_PRELOAD={FAKETIME_LIB}", f"FAKETIME={SKEW}")
    assert skewed("-90m")[-1] == "FAKETIME=-90m"


def test_max_rescues_reaches_the_workers_and_defaults_to_the_workers_own() -> None:
    assert options().worker_env()["DEADMAN_MAX_RESCUES"] == str(Settings().max_rescues)
    assert options("--max-rescues", "10").worker_env()["DEADMAN_MAX_RESCUES"] == "10"
    assert options("--max-rescues", "10").summary(True)["max_rescues"] == 10


@pytest.mark.parametrize("bad", ["-1", "1001", "x", "1.5", "", "1e3", "\x00"])
def test_hostile_max_rescues_are_usage_errors(bad: str) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["chaos", "--max-rescues", bad])
    assert exc.value.code == 2
