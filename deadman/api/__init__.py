"""The HTTP API: a stateless Starlette app over the store (``create_app``)."""

from __future__ import annotations

from deadman.api.app import create_app

__all__ = ["create_app"]
