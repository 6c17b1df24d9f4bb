"""What a client may submit as a workflow (`NewWorkflow`) and its parameters."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from deadman.errors import InvalidJob
from deadman.model import (
    TYPE_RE,
    find_cycle,
)
from deadman.store.jobs import NewJob, job_columns

MAX_NODES = 1000
MAX_EDGES = 10_000


class InvalidWorkflow(InvalidJob):
    """A workflow that is not a DAG of uniquely named nodes."""


@dataclass(frozen=True)
class NewWorkflow:
    """A validated DAG: node names unique, edges between known nodes, no cycle.

    The API checks each field first to name it in its 422; this is the same rule for
    every other caller (``Client.workflow``)."""

    name: str
    nodes: tuple[tuple[str, NewJob], ...]
    edges: tuple[tuple[str, str], ...]  # (from, to): `to` waits for `from`
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 128:
            raise InvalidWorkflow("a workflow's name must be 1-128 characters")
        if not 1 <= len(self.nodes) <= MAX_NODES:
            raise InvalidWorkflow(f"a workflow has 1 to {MAX_NODES} nodes")
        if len(self.edges) > MAX_EDGES:
            raise InvalidWorkflow(f"a workflow has at most {MAX_EDGES} edges")
        names = [n for n, _ in self.nodes]
        seen: set[str] = set()
        for n in names:
            if not TYPE_RE.fullmatch(n):  # node names follow the job type rule
                raise InvalidWorkflow(f"node name {n!r}: 1-128 of A-Z a-z 0-9 _ . : -")
            if n in seen:
                raise InvalidWorkflow(f"two nodes are named {n!r}")
            seen.add(n)
        for n, job in self.nodes:
            if job.depends_on or job.idempotency_key is not None:
                raise InvalidWorkflow(
                    f"node {n!r}: use edges, not depends_on; the key is the workflow's"
                )
        if len(set(self.edges)) != len(self.edges):
            raise InvalidWorkflow("an edge is given twice")
        for src, dst in self.edges:
            if src not in seen or dst not in seen:
                raise InvalidWorkflow(f"edge {src!r} -> {dst!r} names an unknown node")
            if src == dst:
                raise InvalidWorkflow(f"node {src!r} cannot depend on itself")
        cycle = find_cycle(names, self.edges)
        if cycle:
            raise InvalidWorkflow("the edges form a cycle: " + " -> ".join(cycle))
        if self.idempotency_key is not None and not 1 <= len(self.idempotency_key) <= 255:
            raise InvalidWorkflow("idempotency_key must be 1-255 characters")

    def request_hash(self) -> str:
        """A fingerprint of the whole request (name, each node, edges), as for jobs."""
        body = {
            "name": self.name,
            "nodes": [[n, j.request_hash()] for n, j in self.nodes],
            "edges": sorted(self.edges),
        }
        raw = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(raw.encode()).hexdigest()


def workflow_params(wf: NewWorkflow, default_max_attempts: int) -> dict[str, Any]:
    indegree = {name: 0 for name, _ in wf.nodes}
    outgoing: set[str] = set()
    for src, dst in wf.edges:
        indegree[dst] += 1
        outgoing.add(src)
    jobs = [j for _, j in wf.nodes]
    return {
        "name": wf.name,
        "nodes_count": len(jobs),
        "idempotency_key": wf.idempotency_key,
        "request_hash": wf.request_hash() if wf.idempotency_key is not None else None,
        "ords": list(range(len(jobs))),
        "nodes": [name for name, _ in wf.nodes],
        **job_columns(jobs, default_max_attempts),
        "pending": [indegree[name] for name, _ in wf.nodes],
        "has_dependents": [name in outgoing for name, _ in wf.nodes],
        "froms": [a for a, _ in wf.edges],
        "tos": [b for _, b in wf.edges],
    }
