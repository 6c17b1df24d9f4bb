"""The OpenAPI 3.1 document of the API, served at /openapi.json.

The request bodies are generated from deadman.spec, the models that validate them
(schemas.py); the paths, responses and headers are written here (paths.py,
common.py), because the contract is the product: every status code and header is
deliberate. The schemathesis test checks the server against the whole document (no
5xx, no response that breaks it).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from deadman.api.openapi.common import _shared_responses
from deadman.api.openapi.paths import LINKS, _paths, _with_links
from deadman.api.openapi.paths_flow import _limit_paths, _schedule_paths, _workflow_paths
from deadman.api.openapi.schemas import _schemas, _spec_schemas, _workflow_schemas
from deadman.config import Settings

__all__ = ["LINKS", "document"]


def _version() -> str:
    try:
        return version("deadman")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def document(settings: Settings) -> dict[str, Any]:
    """The document as this server is configured (auth on or off, the size limit)."""
    secured = settings.api_token is not None
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Deadman",
            "version": _version(),
            "description": "A Postgres-backed job queue. Every error is "
            "application/problem+json (RFC 9457). Submission is durable when "
            "acknowledged; execution is at-least-once. "
            + (
                "Every endpoint but /health needs `Authorization: Bearer <token>`."
                if secured
                else "Authentication is off (DEADMAN_API_TOKEN unset)."
            ),
        },
        "paths": _with_links(
            {**_paths(), **_workflow_paths(), **_limit_paths(), **_schedule_paths()}
        ),
        "components": {
            "schemas": {**_schemas(), **_workflow_schemas(), **_spec_schemas()},
            "responses": _shared_responses(settings),
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearerAuth": []}] if secured else [],
    }
