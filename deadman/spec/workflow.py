"""What a client may submit as a workflow (``WorkflowSpec``): named nodes, each a job,
and the edges between them. The body of ``POST /workflows``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, ClassVar

from pydantic import Field

from deadman import bounds as b
from deadman.dag import graph_problems
from deadman.spec.fields import Name, Rule, WorkflowName
from deadman.spec.job import JobFields, Spec
from deadman.storable import FieldError
from deadman.store.workflows import NewWorkflow


class NodeSpec(JobFields):
    """A node: a job (without depends_on: edges say that) and its name."""

    name: Name = Field(description="Unique within the workflow; edges use it.")


class EdgeSpec(Spec):
    """``to`` runs after ``from`` succeeded."""

    noun: ClassVar[str] = "an edge"
    from_: Name = Field(alias="from")
    to: Name


class WorkflowSpec(Spec):
    """A DAG of jobs, created in one transaction."""

    noun: ClassVar[str] = "a workflow"
    name: WorkflowName
    nodes: Annotated[
        list[NodeSpec],
        Field(min_length=1, max_length=b.MAX_NODES),
        Rule.array(1, b.MAX_NODES, "nodes"),
    ]
    edges: Annotated[
        list[EdgeSpec],
        Field(max_length=b.MAX_EDGES),
        Rule.array(0, b.MAX_EDGES, "edges"),
    ] = Field(
        default_factory=list,
        description="`to` runs after `from` succeeded. Unknown node names, repeated edges "
        "and cycles are 422.",
    )

    def problems(self, prefix: str = "") -> Iterator[FieldError]:
        for i, node in enumerate(self.nodes):
            yield from node.problems(f"{prefix}nodes[{i}].")
        yield from graph_problems(
            [n.name for n in self.nodes], [(e.from_, e.to) for e in self.edges]
        )

    def to_new_workflow(self, idempotency_key: str | None = None) -> NewWorkflow:
        return NewWorkflow(
            name=self.name,
            nodes=tuple((n.name, n.to_new_job()) for n in self.nodes),
            edges=tuple((e.from_, e.to) for e in self.edges),
            idempotency_key=idempotency_key,
        )
