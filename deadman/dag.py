"""The rules of a workflow's graph, written once: node names unique, edges between
known nodes, no self-edge, no edge twice, no cycle. The spec reports them by field;
``NewWorkflow`` (built in Python) raises the first."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from deadman.model import find_cycle
from deadman.storable import FieldError


def graph_problems(
    names: Sequence[str | None], edges: Sequence[tuple[str | None, str | None]]
) -> Iterator[FieldError]:
    """Each broken rule, named as the API names fields (``nodes[2].name``, ``edges[0].to``).
    A name of None is a node whose name is already refused."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in seen:
            yield {
                "field": f"nodes[{i}].name",
                "message": f"repeats the name of nodes[{seen[name]}]",
            }
        else:
            seen[name] = i
    good: list[tuple[str, str]] = []
    for i, (src, dst) in enumerate(edges):
        known = True
        for end, value in (("from", src), ("to", dst)):
            if value is None or value not in seen:
                yield {"field": f"edges[{i}].{end}", "message": "must name a node"}
                known = False
        if not known or src is None or dst is None:
            continue
        if src == dst:
            yield {"field": f"edges[{i}]", "message": "a node cannot depend on itself"}
        elif (src, dst) in good:
            yield {"field": f"edges[{i}]", "message": "repeats an earlier edge"}
        else:
            good.append((src, dst))
    if len(good) == len(edges):
        cycle = find_cycle(list(seen), good)
        if cycle:
            yield {"field": "edges", "message": "form a cycle: " + " -> ".join(cycle)}
