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

A holder of more than :data:`GRAPHS_DRAWN` outputs has the first ones and the last drawn, and the others
counted in one box (:func:`count_graphs_not_drawn`): "+5 more graphs of steps 3..7, each like the ones
drawn" (below the holder), so that the picture stays as narrow, and its text as large, however many graphs
are kept.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..analysis.evidence import counted, steps_text
from .graph_items import FADED, FN, HOLDER_FILL, SUMMARY_FILL, TENSOR, GraphBuilder, Item
from .visible import one_line

GRAPHS_DRAWN = 3  # the outputs of one holder drawn with their graphs: the first ones and the last


def note_what_each_keeps(graph: GraphBuilder, notes: Mapping[str, str]) -> None:
    """Below each output named in ``notes`` (``{"total_loss": "keeps steps 50..73: 167 nodes"}``), its note."""
    shown = {one_line(name): note for name, note in notes.items()}  # (an output's label is its name on one line)
    for item in graph.items:
        if item.owner == -1 and item.role == TENSOR and item.label in shown:
            item.note = shown[item.label]


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
        graph.items.append(Item(f"{one_line(holder)}\n({kind})", TENSOR, -1, HOLDER_FILL, op=one_line(holder)))
        graph.links.extend((member, len(graph.items) - 1, {}) for _, member in members)


def count_graphs_not_drawn(graph: GraphBuilder) -> list[int]:
    """Per item of ``graph``, the index of the item that draws it: itself, or -1 (not drawn) for the outputs of a
    holder of more than :data:`GRAPHS_DRAWN` but its first ones and its last (the graph of the step the picture
    is the end of), and the nodes only their graphs reach.  A box appended to ``graph.items`` counts them
    ("+5 more graphs of steps 3..7, each like the ones drawn"), linked to their holder from below it (a row of
    its own: the picture is as wide as the graphs drawn); the caller takes the box and its link out again."""
    items = graph.items
    rep = list(range(len(items)))
    uses: dict[int, list[int]] = {}  # an output -> the node it is the tensor of
    for tail, head, _ in graph.links:
        if items[tail].role == FN and items[head].owner == -1:
            uses.setdefault(head, []).append(tail)
    kids: dict[int, list[int]] = {}
    for child, parent in graph.flow:
        kids.setdefault(parent, []).append(child)
    for holder, members in _holders(graph).items():
        if len(members) <= GRAPHS_DRAWN:
            continue
        hidden = members[GRAPHS_DRAWN - 1 : -1]
        drawn = _below(kids, [root for i, r in enumerate(rep) if r == i and i not in hidden for root in uses.get(i, ())])
        roots = [root for output in hidden for root in uses.get(output, ())]
        steps = [record.step for root in roots if (record := items[root].record) is not None]
        for node in _below(kids, roots) - drawn:
            rep[node] = -1
        rep.append(len(items))
        items.append(_more_graphs(len(hidden), steps, [items[output].label for output in hidden]))
        graph.links.append((holder, rep[-1], {"dir": "back"}))  # an arrow into the holder, from below it
        for output in hidden:
            rep[output] = -1
    for index, item in enumerate(items):  # the tensors of the nodes not drawn (saved ones, parameters) neither
        if item.role != FN and item.owner >= 0 and rep[item.owner] < 0:
            rep[index] = -1
    return rep


def _holders(graph: GraphBuilder) -> dict[int, list[int]]:
    """Each holder's box -> the outputs it holds, in the holder's order."""
    items, held = graph.items, dict[int, list[int]]()
    for tail, head, _ in graph.links:
        item = items[head]
        if item.role == TENSOR and item.owner == -1 and item.value is None and not item.collapsed:
            held.setdefault(head, []).append(tail)
    return held


def _below(kids: Mapping[int, list[int]], roots: list[int]) -> set[int]:
    """The backward nodes reached from ``roots`` (themselves included) through their inputs ``kids``."""
    seen, todo = set(roots), list(roots)
    while todo:
        for kid in kids.get(todo.pop(), ()):
            if kid not in seen:
                seen.add(kid)
                todo.append(kid)
    return seen


def _more_graphs(count: int, steps: list[int], names: list[str]) -> Item:
    """The box counting the graphs of a holder not drawn; their outputs' names are its hover title."""
    head = f"+{counted(count, 'more graph')}" + (f" of {steps_text(steps)}" if steps else "")
    return Item(f"{head},\neach like the ones drawn", TENSOR, -1, SUMMARY_FILL, op=head, collapsed=True,
                attrs=dict(FADED), tooltip=f"{head}: {', '.join(names)}")
