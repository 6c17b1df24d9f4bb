"""The HTTP API: a stateless Starlette app over the store (``create_app``).

``create_app`` is imported when first used (PEP 562): the CLI imports this package's
problem, schema and serializer modules, which need no Starlette app (DECISIONS 101).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deadman.api.app import create_app

__all__ = ["create_app"]


if not TYPE_CHECKING:  # hidden from type checkers: a misspelt name stays an error there

    def __getattr__(name: str) -> object:
        if name != "create_app":
            raise AttributeError(f"module 'deadman.api' has no attribute {name!r}")
        from deadman.api.app import create_app

        globals()["create_app"] = create_app
        return create_app
