"""A workflow as the store inserts it (`NewWorkflow`) and its parameters."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from deadman.bounds import MAX_EDGES, MAX_NODES, NAME_RE, NAME_RULE
from deadman.dag import graph_problems
from deadman.errors import InvalidJob
from deadman.storable import FieldError
from deadman.store.jobs import NewJob, job_columns


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
        for n, job in self.nodes:
            if job.depends_on or job.idempotency_key is not None:
                raise InvalidWorkflow(
                    f"node {n!r}: use edges, not depends_on; the key is the workflow's"
                )
        # WorkflowSpec's rules, for workflows built in Python from Client.job nodes.
        problems = [f"{p['field']}: {p['message']}" for p in self._graph_problems()]
        if not 1 <= len(self.name) <= 128:
            problems.append("name: must be 1-128 characters")
        if not 1 <= len(self.nodes) <= MAX_NODES:
            problems.append(f"nodes: must be 1 to {MAX_NODES} nodes")
        if len(self.edges) > MAX_EDGES:
            problems.append(f"edges: must be at most {MAX_EDGES} edges")
        if problems:
            raise InvalidWorkflow("; ".join(problems))

    def _graph_problems(self) -> list[FieldError]:
        bad = [n for n, _ in self.nodes if not NAME_RE.fullmatch(n)]
        if bad:
            return [{"field": "nodes", "message": f"node name {bad[0]!r} {NAME_RULE}"}]
        return list(graph_problems([n for n, _ in self.nodes], self.edges))

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
