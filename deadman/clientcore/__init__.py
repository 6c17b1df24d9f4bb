"""What ``deadman.Client`` and ``deadman.AsyncClient`` share: every operation of their
surface written once (``jobs``, ``admin``: arguments checked by ``deadman.spec``, then a
plan of store statements), listed once (``surface``), and bound by ``core.Op`` to
each client, which only says how a plan runs: blocking, or awaited."""

from __future__ import annotations

from deadman.clientcore.core import Call, Core, Op
from deadman.clientcore.options import JobOptions

__all__ = ["Call", "Core", "JobOptions", "Op"]
