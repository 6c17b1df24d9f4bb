"""``python -m deadman``: the ``deadman`` command."""

from __future__ import annotations

from deadman.cli import main

raise SystemExit(main())
