"""The old home of the rescuer, kept so ``from deadman.rescuer import Rescuer`` still
works; the maintenance services live in ``deadman.maintenance``."""

from __future__ import annotations

from deadman.maintenance.rescuer import Rescuer, RescueReport

__all__ = ["RescueReport", "Rescuer"]
