"""The maintenance services: rescuer, expirer, cleaner, scheduler, on one restartable service
base (``service``), each tick acting only on the leader (``leadership``); and the
vacuumer, which needs no leader (VACUUM's own lock keeps it to one at a time)."""

from __future__ import annotations

from deadman.config import Settings
from deadman.maintenance.cleaner import Cleaner, CleanReport
from deadman.maintenance.expirer import Expirer
from deadman.maintenance.leadership import Leadership
from deadman.maintenance.rescuer import Rescuer, RescueReport
from deadman.maintenance.scheduler import Scheduler
from deadman.maintenance.service import Service
from deadman.maintenance.vacuumer import Vacuumer, VacuumReport
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
    "VacuumReport",
    "Vacuumer",
    "services",
]


def services(store: AsyncStore, settings: Settings) -> list[Service]:
    """The maintenance services every worker (and ``deadman rescuer``) runs, sharing
    one Leadership (one connection at a time); and the vacuumer unless it is off."""
    leadership = Leadership(store)
    out: list[Service] = [
        Rescuer(store, settings, leadership),
        Expirer(store, settings, leadership),
        Cleaner(store, settings, leadership),
        Scheduler(store, settings, leadership),
    ]
    if settings.vacuum_dead_tuples:
        out.append(Vacuumer(store, settings))
    return out
