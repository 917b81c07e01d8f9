"""What a kept-alive snapshot adds to a drawing: a box for the list or dict that holds the kept outputs, and
under each output what the finding says its graphs hold (the figures come from the finding's evidence and
the step's record, not from this drawing, so that the picture, the caption and the message agree).

Example::

    >>> import torch
    >>> from graphwatch.rendering.graph_items import GraphBuilder
    >>> w = torch.ones(2, requires_grad=True)
    >>> kept = {"losses[0]": (w * 2).sum(), "losses[1]": (w * 3).exp().sum()}
    >>> graph = GraphBuilder(kept, False, True, 50)
    >>> for tensor in kept.values():
    ...     graph.add_output(tensor)
    >>> add_holders(graph, kept)
    >>> note_what_each_keeps(graph, {"losses[0]": "keeps step 3: 2 nodes"})
    >>> [item.label for item in graph.items if item.op == "losses"], [item.note for item in graph.items if item.note]
    (['losses\\n(list)'], ['keeps step 3: 2 nodes'])
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .graph_items import HOLDER_FILL, TENSOR, GraphBuilder, Item


def note_what_each_keeps(graph: GraphBuilder, notes: Mapping[str, str]) -> None:
    """Below each output named in ``notes`` (``{"total_loss": "keeps steps 50..73: 167 nodes"}``), its note."""
    for item in graph.items:
        if item.owner == -1 and item.role == TENSOR and item.label in notes:
            item.note = notes[item.label]


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
