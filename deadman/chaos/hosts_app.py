"""The skewed host's app: the chaos handlers and a per-second schedule declared in code.

``deadman worker --app deadman.chaos.hosts_app:registry``: the chaos handlers
(deadman/chaos/app.py) plus one schedule declared in code, every second, into a queue no
worker serves, so its ticks stay in the table to be read: each tick's idempotency key
names the second it is for, and those seconds must be the database's, whatever the
declaring worker's own clock says."""

from __future__ import annotations

from datetime import timedelta

from deadman.chaos.app import registry as chaos_registry
from deadman.registry import Registry

#: The schedule's name, and the queue its tick jobs wait in (nothing serves it).
SCHEDULE = "hosts-every-second"
TICK_QUEUE = "hosts-ticks"

_ticks = Registry()
_ticks.periodic(timedelta(seconds=1), "chaos-effect", {"ms": 0}, name=SCHEDULE, queue=TICK_QUEUE)
registry = chaos_registry.merged(_ticks)
