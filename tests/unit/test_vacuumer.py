"""When the vacuumer vacuums (Vacuumer.due) and which processes run it (services);
tests/integration/test_vacuumer.py runs it on Postgres."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from deadman.config import Settings
from deadman.maintenance import Vacuumer, services
from deadman.maintenance.vacuumer import VACUUM_EVERY
from deadman.store import AsyncStore
from deadman.store.maintenance import VacuumLook

SETTINGS = replace(Settings(), vacuum_dead_tuples=1000, rescue_s=2.0)
STORE = cast(AsyncStore, object())  # due() and the constructor never touch it


def look(**kw: Any) -> VacuumLook:
    base: dict[str, Any] = {
        "dead_tuples": 1000,
        "since_vacuum_s": None,
        "running": False,
        "may_vacuum": True,
    }
    return VacuumLook(**(base | kw))


@pytest.mark.parametrize(
    ("seen", "due"),
    [
        (look(), True),  # at the threshold, never vacuumed
        (look(dead_tuples=999), False),
        (look(since_vacuum_s=10.0), True),  # the tick interval: 5 x 2 s
        (look(since_vacuum_s=9.99), False),  # someone (autovacuum too) just did
        (look(running=True), False),  # one is under way
        (look(may_vacuum=False), False),
        (look(dead_tuples=10**9, since_vacuum_s=0.0), False),
    ],
)
def test_due(seen: VacuumLook, due: bool) -> None:
    vacuumer = Vacuumer(STORE, SETTINGS)
    assert vacuumer.interval_s == SETTINGS.rescue_s * VACUUM_EVERY
    assert vacuumer.due(seen) is due


def test_every_worker_runs_it_unless_it_is_off() -> None:
    names = [s.name for s in services(STORE, Settings())]
    assert names == ["rescuer", "expirer", "cleaner", "scheduler", "vacuumer"]
    off = [s.name for s in services(STORE, replace(Settings(), vacuum_dead_tuples=0))]
    assert "vacuumer" not in off
