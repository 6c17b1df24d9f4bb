"""The maintenance services: rescuer, expirer, cleaner, scheduler, on one restartable service
base (``service``), each tick acting only on the leader (``leadership``)."""

from __future__ import annotations

from deadman.config import Settings
from deadman.maintenance.cleaner import Cleaner, CleanReport
from deadman.maintenance.expirer import Expirer
from deadman.maintenance.leadership import Leadership
from deadman.maintenance.rescuer import Rescuer, RescueReport
from deadman.maintenance.scheduler import Scheduler
from deadman.maintenance.service import Service
from deadman.store import AsyncStore

__all__ = [
    "CleanReport",
    "Cleaner",
    "Expirer",
    "Leadership",
    "RescueReport",
    "Rescuer",
    "Scheduler",
    "Service",
    "services",
]


def services(store: AsyncStore, settings: Settings) -> list[Service]:
    """The maintenance services every worker (and ``deadman rescuer``) runs, sharing
    one Leadership (one connection at a time)."""
    leadership = Leadership(store)
    return [
        Rescuer(store, settings, leadership),
        Expirer(store, settings, leadership),
        Cleaner(store, settings, leadership),
        Scheduler(store, settings, leadership),
    ]
