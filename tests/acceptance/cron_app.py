"""``--app tests.acceptance.cron_app:registry``: the built-in handlers plus one
schedule declared in code, ticking every second into the queue ``cron``."""

from __future__ import annotations

from datetime import timedelta

from deadman.registry import Registry

registry = Registry()
registry.periodic(timedelta(seconds=1), "noop", name="every-second", queue="cron")
