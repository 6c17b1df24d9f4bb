"""Pydantic's errors in our words: one ``{field, message}`` per broken field, with the
field written as the API names it (``jobs[3].backoff.base_ms``) and the message
taken from the field's :class:`~deadman.spec.fields.Rule`."""

from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from deadman.errors import InvalidJob
from deadman.spec.fields import OWN_ERROR, Rule
from deadman.storable import FieldError

M = TypeVar("M", bound=BaseModel)
_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})


class SpecError(InvalidJob):
    """What a client submitted breaks the spec; ``errors`` names every broken field.
    The HTTP API answers it as a 422, the CLI prints it, ``Client`` raises it."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors: list[FieldError] = list(errors)
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in self.errors))


def path(loc: Iterable[int | str], prefix: str = "") -> str:
    """``('jobs', 3, 'type')`` as ``jobs[3].type``; the empty path is ``body``."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "body"


def validate(model: type[M], data: Any) -> M:
    """``data`` as a ``model``, or :class:`SpecError` naming every broken field; then
    the model's own cross-field checks (``problems()``), if it has any."""
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        raise SpecError([_field_error(model, e) for e in exc.errors()]) from None
    problems = getattr(spec, "problems", None)
    found = list(problems()) if problems is not None else []
    if found:
        raise SpecError(found)
    return spec


def _field_error(model: type[BaseModel], error: ErrorDetails) -> FieldError:
    owner, metadata = _resolve(model, error["loc"])
    kind = error["type"]
    if kind == OWN_ERROR:
        message = error["msg"]
    elif kind == "missing":
        message = "is required"
    elif kind == "extra_forbidden":
        message = f"is not a field of {getattr(owner, 'noun', 'this object')}"
    elif kind in _NOT_AN_OBJECT:
        message = "must be a JSON object"
    else:
        rules = [m for m in metadata if isinstance(m, Rule)]
        message = rules[-1].text if rules else error["msg"][:1].lower() + error["msg"][1:]
    return {"field": path(error["loc"]), "message": message}


def _resolve(model: type[BaseModel], loc: Sequence[int | str]) -> tuple[type, list[Any]]:
    """The model that owns the field at ``loc`` and the field's metadata."""
    tp: Any = model
    owner: type = model
    metadata: list[Any] = []
    for part in loc:
        tp, _ = _strip(tp)
        if isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
            owner = tp
            info = next(
                (f for n, f in tp.model_fields.items() if part in (n, f.alias)),
                None,
            )
            if info is None:
                return owner, []
            tp, metadata = info.annotation, list(info.metadata)
        elif isinstance(part, int):
            args = get_args(tp)
            tp, metadata = (args[0] if args else Any), []
    _, more = _strip(tp)
    return owner, metadata + more


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, ...] | None`` as (X, the metadata)."""
    metadata: list[Any] = []
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            metadata.extend(tp.__metadata__)
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return tp, metadata
            tp = rest[0]
        else:
            return tp, metadata
