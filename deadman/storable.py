"""What Postgres's jsonb can store, checked before a value goes anywhere near it:
nesting depth, NUL and lone surrogates in strings and keys, numbers that overflowed
to infinity. Shared by the HTTP API (request bodies) and the worker (handler
results), so neither has to import the other."""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypedDict

#: deepest nesting of a payload or a result (Postgres itself refuses ~10,000+)
MAX_DEPTH = 64


class FieldError(TypedDict):
    field: str
    message: str


def check_storable(value: Any, max_depth: int = MAX_DEPTH) -> list[FieldError]:
    """Depth, and values Postgres's jsonb refuses: NUL and lone surrogates in strings
    and keys, numbers that overflowed to infinity. Iterative, so depth costs no stack.
    """
    errors: list[FieldError] = []
    # (value, depth, path node); a path node is (segment, parent node) or None, turned
    # into text only for an error, so the walk allocates no strings for clean bodies.
    stack: list[tuple[Any, int, Any]] = [(value, 1, None)]
    while stack and len(errors) < 10:
        item, depth, node = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                errors.append(
                    {"field": _path(node), "message": f"nested deeper than {max_depth} levels"}
                )
                continue
            if isinstance(item, dict):
                for key, child in item.items():
                    if not _storable_text(key):
                        errors.append({"field": _path((key, node)), "message": _BAD_TEXT})
                    stack.append((child, depth + 1, (key, node)))
            else:
                stack.extend((child, depth + 1, (i, node)) for i, child in enumerate(item))
        elif isinstance(item, str):
            if not _storable_text(item):
                errors.append({"field": _path(node), "message": _BAD_TEXT})
        elif isinstance(item, float) and not math.isfinite(item):
            errors.append({"field": _path(node), "message": "number out of range"})
    return errors


_BAD_TEXT = "contains \\u0000 or an unpaired surrogate, which cannot be stored"
_SURROGATES = re.compile("[\ud800-\udfff\x00]")


def _storable_text(text: str) -> bool:
    return _SURROGATES.search(text) is None


def _path(node: Any) -> str:
    parts: list[str] = []
    while node is not None:
        segment, node = node
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        elif re.fullmatch(r"[A-Za-z0-9_-]+", segment):
            parts.append(f".{segment}")
        else:
            parts.append(f"[{json.dumps(segment)}]")
    path = "".join(reversed(parts)).lstrip(".")
    return path or "body"
