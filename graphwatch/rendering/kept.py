"""What a kept-alive snapshot adds to a drawing: a box for the list or dict that holds the kept outputs, and
under each output the nodes and saved bytes its graph keeps.

Example::

    >>> import torch
    >>> from graphwatch.rendering.graph_items import GraphBuilder
    >>> w = torch.ones(2, requires_grad=True)
    >>> kept = {"losses[0]": (w * 2).sum(), "losses[1]": (w * 3).exp().sum()}
    >>> graph = GraphBuilder(kept, False, True, 50)
    >>> for tensor in kept.values():
    ...     graph.add_output(tensor)
    >>> add_holders(graph, kept)
    >>> note_what_each_keeps(graph)
    >>> [item.label for item in graph.items if item.op == "losses"], [item.note for item in graph.items if item.note]
    (['losses\\n(list)'], ['keeps 2 nodes, 8 B saved', 'keeps 3 nodes, 16 B saved'])
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..analysis.evidence import counted, human_bytes
from .graph_items import FN, HOLDER_FILL, SAVED, TENSOR, GraphBuilder, Item, shape_bytes


def reached_from(start: int, kids: list[list[int]]) -> list[int]:
    """The items reached from ``start`` along ``kids``, breadth first."""
    order, seen = [start], {start}
    for index in order:  # grows while iterating
        for kid in kids[index]:
            if kid not in seen:
                seen.add(kid)
                order.append(kid)
    return order


def note_what_each_keeps(graph: GraphBuilder) -> None:
    """Below each output's name: the nodes and saved bytes its graph keeps alive (parameters not counted)."""
    kids: list[list[int]] = [[] for _ in graph.items]
    for child, parent in graph.flow:
        kids[parent].append(child)
    saved: dict[int, int] = {}
    for item in graph.items:
        if item.role == SAVED and item.owner >= 0 and (known := shape_bytes(item.value)):
            saved[item.owner] = saved.get(item.owner, 0) + known[1]
    for tail, head, _ in graph.links:
        output = graph.items[head]
        if graph.items[tail].role == FN and output.owner == -1 and output.role == TENSOR:
            reached = reached_from(tail, kids)
            nodes = [i for i in reached if graph.items[i].op != "AccumulateGrad"]
            held = sum(saved.get(i, 0) for i in nodes)
            output.note = f"keeps {counted(len(nodes), 'node')}" + (f", {human_bytes(held)} saved" if held else "")


def add_holders(graph: GraphBuilder, outputs: Mapping[str, torch.Tensor]) -> None:
    """A box for each list or dict that holds outputs (``losses`` for ``losses[0]``, ``losses[1]``), below them."""
    tensors = {id(item.value): index for index, item in enumerate(graph.items) if item.owner == -1}
    held: dict[str, list[tuple[str, int]]] = {}  # holder -> (the key in it, the output's item)
    for name, tensor in outputs.items():
        holder, bracket, key = name.partition("[")
        if bracket and id(tensor) in tensors:
            held.setdefault(holder, []).append((key, tensors[id(tensor)]))
    for holder, members in held.items():
        kind = "list" if all(key[:1].isdigit() for key, _ in members) else "dict"
        graph.items.append(Item(f"{holder}\n({kind})", TENSOR, -1, HOLDER_FILL, op=holder))
        graph.links.extend((member, len(graph.items) - 1, {}) for _, member in members)
