"""Draw an autograd graph as Graphviz DOT: torchviz's picture plus graphwatch's lifecycle overlay.

:func:`make_dot` draws what ``torchviz.make_dot`` draws, in its colours, without recursion, on
freed graphs too, summarising large ones; for nodes a session recorded it adds when they were made
and freed and the edge that carries a graph across steps.  :func:`snapshot_dot` is the session's
entry point.  Nodes are named ``n0, n1, ...`` in walk order: a graph always gives the same source.

Example::

    >>> import torch
    >>> from graphwatch.rendering.dot import make_dot
    >>> w = torch.ones(2, 3, requires_grad=True)
    >>> y = (w * 2).exp().sum()
    >>> "fillcolor=lightblue" in make_dot(y, params={"w": w}).source
    True
    >>> y.backward()                  # frees the saved tensors: torchviz raises now
    >>> 'label="result\\n freed"' in make_dot(y, show_saved=True).source
    True
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import torch

from ..analysis.evidence import carrier_line
from ..model import NodeRecord, Trace
from . import dot_writer
from .focus import FOCUS_BOXES, focus
from .graph_items import (
    BACKWARD_FILL,
    EARLIER_COLOR,
    FADED,
    FN,
    FREED_FILL,
    NODE_ATTR,
    OUTPUT_FILL,
    PARAM_FILL,
    SAVED,
    SAVED_FILL,
    SUMMARY_FILL,
    GraphBuilder,
    Item,
    tensor_label,
)
from .kept import add_holders, note_what_each_keeps
from .visible import one_line

if TYPE_CHECKING:  # (the graphviz package only for make_dot's return: a session's pictures are DOT text)
    import graphviz

_HEAD = 40  # nodes nearest the outputs kept when a large graph is summarised
_IMPORTANT = 40  # at most this many crossing / freed-frontier nodes kept besides
_SUMMARY_OPS = 3  # op names listed in a collapsed node's label


def _step_text(step: int) -> str:
    return "before the session" if step < 0 else f"step {step}"


def _is_freed(item: Item) -> bool:
    return item.freed or (item.record is not None and item.record.freed_by is not None)


def _decorate(item: Item, current_step: int | None, retained: Collection[int]) -> None:
    """Add the lifecycle marks of one backward node to its label and attributes."""
    record, lines, attrs = item.record, [], {}
    if _is_freed(item):
        item.fill = FREED_FILL
        attrs.update(FADED)
        lines.append("freed" if record is None or record.freed_by is None else f"freed by backward #{record.freed_by}")
    if record is not None and current_step is not None and record.step < current_step:
        attrs.update(color=EARLIER_COLOR, penwidth="2")
        item.fill = item.fill or BACKWARD_FILL  # (a box without a fill colour is filled with its outline's)
        lines.append(_step_text(record.step))
    if record is not None and record.id in retained:
        attrs["peripheries"] = "2"
        lines.append("retained graph")
    if lines:
        item.label += "\n" + "\n".join(lines)
        item.attrs = attrs


def _overlay(graph: GraphBuilder, trace: Trace | None, current_step: int | None,
             retained: Collection[int]) -> dict[int, dict]:
    """Mark the nodes' lifecycle; return the attributes of the flow edges that carry the graph across steps."""
    items = graph.items
    if current_step is None:
        current_step = max((item.record.step for item in items if item.record is not None), default=None)
    for item in items:
        if item.role == FN:
            _decorate(item, current_step, retained)
    carried = {}
    for k, (child, parent) in enumerate(graph.flow):
        old, new = items[child].record, items[parent].record
        if old is not None and new is not None and new.step > old.step:
            where = _carrier_where(trace, old) if trace is not None and old.site is not None else _step_text(old.step)
            carried[k] = {"color": EARLIER_COLOR, "fontcolor": EARLIER_COLOR, "style": "bold", "label": where,
                          "fontname": "monospace", "fontsize": "10"}
    return carried


def _carrier_where(trace: Trace, carrier: NodeRecord) -> str:
    """The line a carried edge is labelled with: the one the finding cites for its earlier node (the loop's
    line that assigns the carried value, ``h = model(x, h)``, rather than the line inside the model that made
    the node), else the node's own line where it was recorded (not inferred), else its step; on one line."""
    site, _ = carrier_line(trace, carrier)
    if site is None and carrier.site_inferred:  # a line read off an op before it: maybe another line's
        return _step_text(carrier.step)
    return one_line(site.where if site is not None else trace.where(carrier.site))


def _freed_frontier(items: list[Item], index: int, parents: list[int]) -> bool:
    """A freed node used by a live one: where the graph still reaches freed buffers."""
    return _is_freed(items[index]) and not all(_is_freed(items[p]) for p in parents)


def _bfs(starts: Iterable[int], near: Sequence[Sequence[int]], allowed: Callable[[int], bool] | None = None
         ) -> list[int]:
    seen = dict.fromkeys(starts)
    order = list(seen)
    for index in order:  # grows while iterating: breadth first
        for other in near[index]:
            if other not in seen and (allowed is None or allowed(other)):
                seen[other] = None
                order.append(other)
    return order


def _summarise(graph: GraphBuilder, carried: Iterable[tuple[int, int]], max_nodes: int) -> list[int]:
    """Keep the nodes near the outputs, where steps cross and where a freed graph is reached; collapse the rest.

    Returns, per item, the index of the item that draws it: itself, a collapsed item (appended
    to ``graph.items``), or -1 (not drawn).  Parts touching the same kept nodes collapse together.
    """
    items, n = graph.items, len(graph.items)
    kids: list[list[int]] = [[] for _ in range(n)]
    parents: list[list[int]] = [[] for _ in range(n)]
    for child, parent in graph.flow:
        kids[parent].append(child)
        parents[child].append(parent)
    order, budget, ends = _bfs(graph.roots, kids), max(1, max_nodes // 4), {i for edge in carried for i in edge}
    frontier = [i for i in order if i in ends or _freed_frontier(items, i, parents[i])]
    kept = set(order[: min(_HEAD, budget)]) | set(frontier[: min(_IMPORTANT, budget)])
    near = [k + p for k, p in zip(kids, parents)]
    parts, claimed = [], set()
    for start in order:
        if start not in kept and start not in claimed:
            parts.append(_bfs([start], near, lambda i: i not in kept))
            claimed.update(parts[-1])
    kept.update(i for part in parts if len(part) < 3 for i in part)  # collapsing those would not shorten
    rep = [i if i in kept or items[i].owner == -1 or items[i].owner in kept else -1 for i in range(n)]
    groups: dict[frozenset[int], list[int]] = {}
    for part in parts:
        if len(part) >= 3:
            groups.setdefault(frozenset(j for i in part for j in near[i] if j in kept), []).extend(part)
    for part in groups.values():
        rep.append(len(items))
        items.append(_collapsed(items, part))
        for i in part:
            rep[i] = rep[-1]
    return rep


def _collapsed(items: list[Item], part: list[int]) -> Item:
    ops = Counter(items[i].op for i in part).most_common()
    listed = ", ".join(f"{op} ×{count:,}" for op, count in ops[:_SUMMARY_OPS]) + (", …" * (len(ops) > _SUMMARY_OPS))
    steps = sorted({record.step for i in part if (record := items[i].record) is not None})
    of = "" if not steps else f" of step {steps[0]}" if len(steps) == 1 else f" of steps {steps[0]}–{steps[-1]}"
    label = f"… {len(part):,} nodes{of} ({listed}) …"
    return Item(label, FN, -1, SUMMARY_FILL, collapsed=True, attrs=dict(FADED))


def _tooltip(item: Item, label: str, trace: Trace | None) -> dict[str, str]:
    """What hovering a session snapshot's node shows: the op (or tensor), its line (where it was recorded, not
    inferred) and its step."""
    if trace is None:
        return {}
    if item.tooltip:
        return {"tooltip": item.tooltip}
    record = item.record
    if record is None:
        return {"tooltip": " ".join(label.split())}
    # a line read off an op before it (this one saved no tensor) may be another line's: not shown as its line
    at = "" if record.site_inferred else f" at {trace.where(record.site)}"
    return {"tooltip": f"{record.op}{at}, step {record.step}" + (" (freed)" if item.freed else "")}


def _emit(graph: GraphBuilder, rep: list[int], carried: dict[int, dict], overlaid: bool,
          legend: bool, trace: Trace | None = None) -> tuple[list[str], dict[str, str]]:
    """The DOT body lines of the drawn items, named ``n0, n1, ...`` in walk order (with hover titles from
    ``trace`` for a session's snapshot; :func:`make_dot` without a trace stays torchviz's), and the graph's
    attributes."""
    items, names, body = graph.items, cast(dict[int, str], {}), []
    for index, item in enumerate(items):
        if rep[index] == index:
            names[index] = f"n{len(names)}"
            label = item.label if item.value is None else tensor_label(item, overlaid and item.role == SAVED)
            attrs = {**({"fillcolor": item.fill} if item.fill else {}), **(item.attrs or {}), **_tooltip(item, label, trace)}
            body.append(dot_writer.node(names[index], label, attrs))
    edges: list[tuple[int, int, dict[str, str]]] = [(c, p, {}) for c, p in graph.flow] + graph.links
    ways = Counter((rep[t], rep[h]) for t, h, _ in edges if rep[t] != t or rep[h] != h)
    merged: set[tuple[str, str]] = set()  # edges between boxes that draw several items: each drawn once
    for k, (tail, head, attrs) in enumerate(edges):
        remapped = rep[tail] != tail or rep[head] != head
        tail, head = rep[tail], rep[head]
        if tail < 0 or head < 0 or tail == head:
            continue
        pair = (names[tail], names[head])
        if remapped:  # one arrow between a fold and a box: the way most of its edges go (else the first met)
            if pair in merged or pair[::-1] in merged or ways[(head, tail)] > ways[(tail, head)]:
                continue
            merged.add(pair)
        edge = carried.get(k, attrs)
        if trace is not None and "tooltip" not in edge:
            tail_op, head_op = items[tail].op or items[tail].label.split("\n")[0] or "tensor", items[head].op or "tensor"
            edge = {**edge, "tooltip": f"{tail_op} → {head_op}"}
        body.append(dot_writer.edge(*pair, edge))
    if legend:
        body.extend(_legend_lines(summarised=any(item.collapsed for item in items)))
    size = max(12, len(body) * 0.15)  # torchviz's sizing: grows with the number of statements
    return body, {"size": f"{size},{size}"}


def legend_entries(summarised: bool = True) -> list[tuple[str, dict[str, str]]]:
    """(text, Graphviz node attributes) of each legend entry: what each colour and mark of a drawing means.

    >>> legend_entries()[0]
    ('parameter (named from params)', {'fillcolor': 'lightblue'})
    """
    entries = [
        ("parameter (named from params)", {"fillcolor": PARAM_FILL}),
        ("saved tensor (shape, bytes)", {"fillcolor": SAVED_FILL}),
        ("output", {"fillcolor": OUTPUT_FILL}),
        ("backward node", {}),
        ("freed by backward #k", {"fillcolor": FREED_FILL, **FADED}),
        ("from an earlier step (step k)", {"fillcolor": BACKWARD_FILL, "color": EARLIER_COLOR, "penwidth": "2"}),
        ("retained graph (retain_graph=True)", {"peripheries": "2"}),
        ("red edge: carries the graph across steps,\nlabelled with the line that made it",
         {"fontcolor": EARLIER_COLOR, "shape": "plaintext", "style": ""}),
    ]
    if summarised:
        entries.append(("+n nodes of step k (… n nodes …): a folded part of the graph", {"fillcolor": SUMMARY_FILL, **FADED}))
    return entries


@lru_cache(maxsize=2)
def _legend_lines(summarised: bool) -> tuple[str, ...]:
    """A cluster explaining the colours and lifecycle marks, in one column (the same lines for every drawing)."""
    lines = []
    for k, (label, attrs) in enumerate(legend_entries(summarised)):
        lines.append(dot_writer.node(f"legend{k}", label, attrs))
        if k:
            lines.append(dot_writer.edge(f"legend{k - 1}", f"legend{k}", {"style": "invis"}))
    legend = {"label": "graphwatch legend", "fontsize": "10", "fontname": "monospace", "style": "dashed", "color": "gray60"}
    return tuple(dot_writer.subgraph("cluster_legend", legend, lines))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Building allocates per node; cyclic GC passes over a big graph's tensors would double the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _finish(graph: GraphBuilder, trace: Trace | None, current_step: int | None, retained: Collection[int] | None,
            legend: bool | None, max_nodes: int, focus_on: Collection[int] | None = None
            ) -> tuple[list[str], dict[str, str]]:
    """Overlay, summarise (or focus on the NodeRecord ids ``focus_on`` and where steps cross) and emit a walked
    graph: its body lines and graph attributes."""
    overlaid, carried = _lifecycle(graph, trace, current_step, retained)
    return _draw(graph, overlaid, carried, legend, max_nodes, focus_on, trace)


def _lifecycle(graph: GraphBuilder, trace: Trace | None, current_step: int | None,
               retained: Collection[int] | None) -> tuple[bool, dict[int, dict]]:
    """(whether the overlay is drawn, the carried edges' attributes); marks the nodes' lifecycle, once per graph."""
    overlaid = trace is not None or current_step is not None or bool(retained)
    overlaid = overlaid or any(item.record is not None or item.freed for item in graph.items)
    return overlaid, _overlay(graph, trace, current_step, retained or ()) if overlaid else {}


def _draw(graph: GraphBuilder, overlaid: bool, carried: dict[int, dict], legend: bool | None, max_nodes: int,
          focus_on: Collection[int] | None, trace: Trace | None) -> tuple[list[str], dict[str, str]]:
    """Summarise (or focus; that adds to the labels of the nodes it folds into: draw it last) and emit; the boxes
    (and their links) either adds to the graph for this picture are taken out again."""
    drawn, links = len(graph.items), len(graph.links)
    rep = list(range(drawn))
    if focus_on is not None:
        targets = [i for i, item in enumerate(graph.items) if item.record is not None and item.record.id in focus_on]
        rep = focus(graph, [graph.flow[k] for k in carried], targets, max_nodes)
    elif len(graph.items) > max_nodes:
        rep = _summarise(graph, [graph.flow[k] for k in carried], max_nodes)
    drawing = _emit(graph, rep, carried, overlaid, overlaid if legend is None else legend, trace)
    del graph.items[drawn:], graph.links[links:]
    return drawing


def _source(drawing: tuple[list[str], dict[str, str]]) -> str:
    body, graph_attrs = drawing
    return dot_writer.digraph(body, graph_attrs, NODE_ATTR)


def make_dot(var: torch.Tensor | Sequence[torch.Tensor], params: Mapping[str, torch.Tensor] | None = None,
             show_attrs: bool = False, show_saved: bool = False, max_attr_chars: int = 50, *,
             trace: Trace | None = None, current_step: int | None = None, retained: Collection[int] | None = None,
             legend: bool | None = None, max_nodes: int = 2000) -> graphviz.Digraph:
    """Draw the autograd graph behind ``var`` (a tensor, or a tuple/list of them).

    The first five arguments are ``torchviz.make_dot``'s: ``params`` names parameters
    (``dict(model.named_parameters())``), ``show_attrs`` lists each backward node's saved
    attributes, ``show_saved`` draws the tensors it saved ("freed" once a backward released them),
    ``max_attr_chars`` cuts long attribute values.  The lifecycle overlay is drawn for nodes a
    graphwatch session recorded, and when any of these is given: ``trace`` (the session's Trace:
    carried edges get their ``file:line``), ``current_step`` (nodes from earlier steps are outlined
    red, and edges from a later step's node into them red; default: the newest step drawn),
    ``retained`` (NodeRecord ids kept by ``retain_graph=True``).  ``legend`` draws the legend
    (default: with the overlay).  Above ``max_nodes`` nodes only the part near the outputs and the
    nodes where steps cross or a freed graph is reached are drawn; the rest is collapsed.

    Example::

        >>> import torch
        >>> from graphwatch.rendering.dot import make_dot
        >>> w = torch.ones(3, requires_grad=True)
        >>> h = torch.zeros(3)
        >>> for _ in range(3000):
        ...     h = torch.tanh(h * w)
        >>> [line.split('"')[1] for line in make_dot(h, max_nodes=100).body if "nodes (" in line]
        ['… 5,976 nodes (TanhBackward0 ×2,988, MulBackward0 ×2,988) …']
    """
    _check_options(params, max_attr_chars, trace, current_step, retained, max_nodes)
    with _gc_paused():
        graph = GraphBuilder(params, show_attrs, show_saved, max_attr_chars)
        outputs: Sequence[torch.Tensor] = var if isinstance(var, (tuple, list)) else [cast(torch.Tensor, var)]
        for tensor in outputs:
            graph.add_output(tensor)
        body, graph_attrs = _finish(graph, trace, current_step, retained, legend, max_nodes)
    import graphviz  # (here: a session draws its snapshots as DOT text, without the graphviz package)

    return graphviz.Digraph(node_attr=NODE_ATTR, graph_attr=graph_attrs, body=body)


def _check_options(params: Any, max_attr_chars: Any, trace: Any, current_step: Any, retained: Any, max_nodes: Any) -> None:
    """A TypeError naming the make_dot option that has the wrong type, before anything is drawn."""

    def wrong(name: str, expected: str, value: Any) -> TypeError:
        return TypeError(f"make_dot({name}=...) takes {expected}, got {type(value).__name__}")

    if params is not None and not isinstance(params, Mapping):
        raise wrong("params", "a dict of names to tensors, e.g. dict(model.named_parameters())", params)
    for name, value in (("max_attr_chars", max_attr_chars), ("max_nodes", max_nodes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong(name, "a number", value)
    if trace is not None and not isinstance(trace, Trace):
        raise wrong("trace", "a session's trace (gw.trace) or None", trace)
    if current_step is not None and (isinstance(current_step, bool) or not isinstance(current_step, int)):
        raise wrong("current_step", "a step number or None", current_step)
    if retained is not None and (isinstance(retained, (str, bytes, torch.Tensor)) or not isinstance(retained, Collection)):
        raise wrong("retained", "a collection of node record ids or None", retained)


FOCUS_NODES = FOCUS_BOXES  # a focused snapshot's budget of boxes (backward nodes, tensors, folds)


def snapshot_dot(roots: Iterable[Any], trace: Trace, step: int, *, retained: Collection[int] | None = None,
                 max_nodes: int = 300, params: Mapping[str, Any] | None = None, legend: bool = True,
                 outputs: Mapping[str, torch.Tensor] | None = None, focus_on: Collection[int] | None = None,
                 notes: Mapping[str, str] | None = None) -> str:
    """DOT source of a session's snapshot: the graph under the backward nodes ``roots`` at ``step``.

    Saved tensors are drawn (with their bytes) and the overlay always, the legend unless ``legend`` is
    False (:func:`legend_entries` lists it); ``params`` names parameters (``{"model.0.weight": tensor}``),
    as in :func:`make_dot`.  ``outputs`` (``{"total_loss": tensor}``, ``{"losses[0]": ..., "losses[1]": ...}``)
    are drawn as named outputs above their graphs, and the list or dict that holds them as one more box:
    what holds a kept graph; ``notes`` (output name -> text) is written under those outputs (what the
    finding says each keeps).  ``focus_on`` (NodeRecord ids, e.g. the stale node of a failing
    backward; may be empty) gives the focused picture instead (:mod:`graphwatch.rendering.focus`: those
    nodes, where steps cross, and the way there from the roots, in about ``max_nodes`` boxes).

    Example::

        >>> import torch
        >>> from graphwatch.model import Trace
        >>> from graphwatch.rendering.dot import snapshot_dot
        >>> y = torch.ones(2, requires_grad=True).exp().sum()
        >>> "cluster_legend" in snapshot_dot([y.grad_fn], Trace(), step=0)
        True
        >>> 'label="kept\\n(list)"' in snapshot_dot([], Trace(), 0, outputs={"kept[0]": y, "kept[1]": y * 2})
        True
    """
    with _gc_paused():
        graph = _snapshot_graph(roots, params, outputs, notes)
        return _source(_finish(graph, trace, step, retained, legend, max_nodes, focus_on))


def snapshot_dots(roots: Iterable[Any], trace: Trace, step: int, *, retained: Collection[int] | None = None,
                  params: Mapping[str, Any] | None = None, outputs: Mapping[str, torch.Tensor] | None = None,
                  focus_on: Collection[int] = (), max_nodes: int = 300,
                  notes: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The (whole, focused) pictures of one snapshot, as :func:`snapshot_dot` draws them (the whole one with
    its legend and at most ``max_nodes`` boxes, the focused one in :data:`FOCUS_NODES`), from one walk of the
    graph instead of two.

        >>> import torch
        >>> from graphwatch.model import Trace
        >>> y = torch.ones(2, requires_grad=True).exp().sum()
        >>> whole, focused = snapshot_dots([y.grad_fn], Trace(), step=0)
        >>> whole == snapshot_dot([y.grad_fn], Trace(), 0), focused == snapshot_dot([y.grad_fn], Trace(), 0,
        ...     max_nodes=FOCUS_NODES, legend=False, focus_on=())
        (True, True)
    """
    with _gc_paused():
        graph = _snapshot_graph(roots, params, outputs, notes)
        overlaid, carried = _lifecycle(graph, trace, step, retained)
        whole = _source(_draw(graph, overlaid, carried, True, max_nodes, None, trace))
        return whole, _source(_draw(graph, overlaid, carried, False, FOCUS_NODES, focus_on, trace))


def _snapshot_graph(roots: Iterable[Any], params: Mapping[str, Any] | None,
                    outputs: Mapping[str, torch.Tensor] | None, notes: Mapping[str, str] | None) -> GraphBuilder:
    """The walked graph of a snapshot: ``outputs`` (with their ``notes``) and their holders, then the graph
    below ``roots``."""
    graph = GraphBuilder({**(params or {}), **(outputs or {})} or None, False, True, 50)
    for tensor in (outputs or {}).values():
        graph.add_output(tensor)
    add_holders(graph, outputs or {})
    for root in roots:
        if root is not None:
            graph.add_root(root)
    if outputs and notes:
        note_what_each_keeps(graph, notes)
    return graph
