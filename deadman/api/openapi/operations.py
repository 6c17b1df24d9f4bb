"""The operations of the OpenAPI document by kind: one operation and its shared error
responses, an operation on a job or on a name, a collection's listing, pause and
resume, and the list, PUT, GET and DELETE of a named resource (deadman.api.named)."""

from __future__ import annotations

from typing import Any

from deadman.api.openapi.common import (
    _BY_NAME,
    _FOUND_BY_NAME,
    _READ,
    _body,
    _job_id_param,
    _json,
    _queue_name_param,
    _ref,
    _responses,
)


def _op(
    operation_id: str,
    summary: str,
    ok: dict[str, Any],
    *errors: str,
    **more: Any,
) -> dict[str, Any]:
    """One operation: its id, summary, answers on success and the shared error
    responses it may give (``_responses``); ``more``: description, parameters, ..."""
    return {
        "operationId": operation_id,
        "summary": summary,
        **more,
        "responses": {**ok, **_responses(*errors)},
    }


def _ok(body: dict[str, Any], description: str) -> dict[str, Any]:
    """The one success answer of most operations: 200 with a JSON ``body``."""
    return {"200": _json(body, description)}


def _on_job(
    operation_id: str,
    summary: str,
    ok: dict[str, Any],
    *errors: str,
    query: tuple[dict[str, Any], ...] = (),
    **more: Any,
) -> dict[str, Any]:
    """An operation on the job the path's ``{id}`` names (``_op`` with that parameter,
    and the ``query`` parameters after it)."""
    return _op(operation_id, summary, ok, *errors, **more, parameters=[_job_id_param(), *query])


def _on_name(
    operation_id: str,
    summary: str,
    ok: dict[str, Any],
    *errors: str,
    param: str = "name",
    **more: Any,
) -> dict[str, Any]:
    """An operation on the queue, limit or schedule the path's ``{<param>}`` names."""
    return _op(operation_id, summary, ok, *errors, **more, parameters=[_queue_name_param(param)])


def _listing(schema: str, summary: str, said: str, **more: Any) -> dict[str, Any]:
    """``GET /<schema>s`` (``/queues``): ``list<Schema>s``, 200 with a ``<Schema>s`` body."""
    plural = f"{schema}s"
    return {
        f"/{plural.lower()}": {
            "get": _op(f"list{plural}", summary, _ok(_ref(plural), said), *_READ, **more)
        }
    }


#: what an operation says: its summary, what its 200 answer says, its description
Words = tuple[str, str, str | None]


def _pause_resume(
    schema: str, errors: tuple[str, ...], pause: Words, resume: Words
) -> dict[str, Any]:
    """``POST /<schema>s/{name}/pause`` and ``.../resume`` (deadman.api.named's
    pause_routes): 200 with the ``schema`` as it now stands."""
    paths: dict[str, Any] = {}
    for verb, (summary, said, description) in (("pause", pause), ("resume", resume)):
        more = {} if description is None else {"description": description}
        paths[f"/{schema.lower()}s/{{name}}/{verb}"] = {
            "post": _on_name(f"{verb}{schema}", summary, _ok(_ref(schema), said), *errors, **more)
        }
    return paths


def _named_paths(
    schema: str,
    param: str,
    summaries: dict[str, str],
    put_ok: dict[str, Any],
    put_description: str,
) -> dict[str, Any]:
    """A resource addressed by a name (deadman.api.named): ``GET /<plural>``, and PUT, GET
    and DELETE of ``/<plural>/{<param>}``, each with its summary in ``summaries`` (by
    verb: list, put, get, delete). ``schema`` names the bodies (Limit, Limits,
    LimitSpec) and the operations (listLimits, putLimit, getLimit, deleteLimit)."""
    noun = schema.lower()
    return {
        **_listing(schema, summaries["list"], f"The {noun}s (at most 1000)."),
        f"/{noun}s/{{{param}}}": {
            "put": _on_name(
                f"put{schema}",
                summaries["put"],
                put_ok,
                "MalformedJson",
                "ContentTooLarge",
                "UnsupportedMediaType",
                *_BY_NAME,
                description=put_description,
                requestBody=_body(f"{schema}Spec"),
                param=param,
            ),
            "get": _on_name(
                f"get{schema}",
                summaries["get"],
                _ok(_ref(schema), f"The {noun}."),
                *_FOUND_BY_NAME,
                param=param,
            ),
            "delete": _on_name(
                f"delete{schema}",
                summaries["delete"],
                {"204": {"description": "Removed."}},
                *_FOUND_BY_NAME,
                param=param,
            ),
        },
    }
