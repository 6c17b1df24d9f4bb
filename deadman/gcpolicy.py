"""How a long-running process's cyclic garbage collector runs (``DEADMAN_GC``).

CPython starts a generation-0 collection after every 700 net allocations of
container objects (dicts, lists, coroutines, futures, rows). A worker allocates
a few dozen per job, so at 10,000 jobs/s a process collected ~400 times a second,
and every tenth of those also walked generation 1; each older collection walked
the whole import graph and the handlers' modules too. ``tuned`` (the default):

- ``gc.freeze()`` once the process has started (modules imported, handlers
  loaded, the app built): what exists then lives as long as the process, and the
  collector stops walking it;
- generation 0 collected after ``GEN0`` net allocations instead of 700. The count
  is of allocations minus deallocations, and a job's objects are freed by reference
  counting as it ends, so a worker running jobs that leave no cycles stays under it
  and never collects after startup (measured: none in 100,000 no-op jobs or 30,000
  failing ones); when a collection does come, it walks the young objects alive then.

Reference counting frees everything that is not in a cycle at once, whatever the
setting; only cyclic garbage waits longer, at most ``GEN0`` objects of it before a
collection. ``python`` leaves the interpreter's own thresholds (DECISIONS 78 has
the measurement and the memory it costs).
"""

from __future__ import annotations

import gc
from typing import Any

from deadman import logs

CHOICES = ("tuned", "python")
#: Net container allocations between two generation-0 collections under ``tuned``.
GEN0 = 50_000
#: Generation-0 collections per generation-1 collection, and generation-1 per
#: generation-2 (CPython's defaults are 10 and 10; with gen0 this large, 20 keeps
#: the older generations from being walked every few seconds).
GEN1 = 20
GEN2 = 20


def apply(choice: str) -> None:
    """Set this process's collector as ``choice`` says, and log what it now is; call it
    once, when the process has finished starting and before it serves (its startup
    objects get frozen)."""
    if choice not in CHOICES:
        raise ValueError(f"gc policy must be one of {CHOICES}, not {choice!r}")
    if choice == "tuned":
        gc.collect()  # what startup left in cycles is freed, not frozen
        gc.freeze()
        gc.set_threshold(GEN0, GEN1, GEN2)
    logs.get("deadman.gc").info("gc_policy", policy=choice, **state())


def state() -> dict[str, Any]:
    """The collector as it runs now: thresholds and how many objects are frozen."""
    return {"thresholds": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}
