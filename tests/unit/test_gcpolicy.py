"""deadman.gcpolicy (DEADMAN_GC, DECISIONS 78): each policy in a fresh interpreter, so
the test process's own collector is never touched."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deadman import gcpolicy

PROBE = """
import gc, json, sys
from deadman import gcpolicy
before = list(gc.get_threshold())
gcpolicy.apply(sys.argv[1])
print(json.dumps({"before": before, **gcpolicy.state()}))
"""


def _applied(choice: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, choice], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    return dict(json.loads(lines[-1]))


def test_tuned_freezes_startup_and_raises_generation_0() -> None:
    got = _applied("tuned")
    assert got["thresholds"] == [gcpolicy.GEN0, gcpolicy.GEN1, gcpolicy.GEN2]
    assert got["before"] != got["thresholds"]
    frozen = got["frozen"]
    assert isinstance(frozen, int) and frozen > 10_000  # the imported modules, at least


def test_python_leaves_the_interpreter_alone() -> None:
    got = _applied("python")
    assert got["thresholds"] == got["before"]
    assert got["frozen"] == 0


@pytest.mark.parametrize("choice", ["", "TUNED", "off", "700,10,10", "tuned\u200b"])
def test_anything_else_is_refused(choice: str) -> None:
    with pytest.raises(ValueError, match="gc policy"):
        gcpolicy.apply(choice)
