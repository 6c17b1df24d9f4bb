"""The workflow endpoints: create a DAG of jobs, read its state, cancel it.

A workflow is created whole or not at all (one transaction). Releasing nodes,
cancelling downstream of a failure and finalising the workflow happen in the
database, in the transaction that ends each node (migrations/0005_workflows.sql);
these routes only read and request.
"""

from __future__ import annotations

from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deadman.api import idempotency, schema
from deadman.api.limits import check_queue_depth
from deadman.api.problems import Problem
from deadman.api.routes_jobs import traced
from deadman.api.serialize import workflow_json
from deadman.api.state import api_state


async def create_workflow(request: Request) -> Response:
    """201 and the workflow with its nodes, after the transaction committed; with an
    Idempotency-Key already used for the same workflow, 200 and that workflow."""
    state = api_state(request)
    key = schema.parse_idempotency_key(request.headers.get("idempotency-key"))
    wf = schema.parse_workflow(await schema.read_json(request), idempotency_key=key)
    names = [n for n, _ in wf.nodes]  # every node carries the request's trace context
    wf = replace(
        wf, nodes=tuple(zip(names, traced(request, [j for _, j in wf.nodes]), strict=True))
    )
    await check_queue_depth(
        state.store, state.settings.max_queue_depth, [j for _, j in wf.nodes], workflow_key=key
    )
    created = await state.store.workflow_insert(wf, state.settings.max_attempts)
    replayed = created is None
    if created is None:
        assert key is not None  # only a key conflict inserts nothing
        created = await state.store.workflow_get_by_idempotency_key(key)
        if created is None:
            raise Problem("conflict", "the idempotency key's workflow vanished; retry")
        if created[0]["request_hash"] != wf.request_hash():
            raise idempotency.reused(key, f"workflow {created[0]['id']}")
    row, nodes = created
    headers = {"Location": f"/workflows/{row['id']}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(workflow_json(row, nodes), 200 if replayed else 201, headers=headers)


async def get_workflow(request: Request) -> Response:
    workflow_id = schema.parse_workflow_id(request.path_params["id"])
    found = await api_state(request).store.workflow_get(workflow_id)
    if found is None:
        raise Problem("not-found", f"no workflow {workflow_id}")
    return JSONResponse(workflow_json(*found))


async def cancel_workflow(request: Request) -> Response:
    """202 while running nodes still have to stop; 200 when the workflow is finished
    (by this cancel or already: cancelling a finished workflow changes nothing)."""
    store = api_state(request).store
    workflow_id = schema.parse_workflow_id(request.path_params["id"])
    await store.workflow_cancel(workflow_id)
    found = await store.workflow_get(workflow_id)
    if found is None:
        raise Problem("not-found", f"no workflow {workflow_id}")
    row, nodes = found
    return JSONResponse(workflow_json(row, nodes), 202 if row["state"] == "running" else 200)


ROUTES = [
    Route("/workflows", create_workflow, methods=["POST"]),
    Route("/workflows/{id}", get_workflow, methods=["GET"]),
    Route("/workflows/{id}/cancel", cancel_workflow, methods=["POST"]),
]
