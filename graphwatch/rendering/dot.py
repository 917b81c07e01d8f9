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
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import graphviz
import torch

from ..analysis.evidence import human_bytes
from ..capture.graph_walk import node_record
from ..capture.saved import SavedHandle
from ..model import NodeRecord, Trace

PARAM_FILL, SAVED_FILL, OUTPUT_FILL, BASE_FILL = "lightblue", "orange", "darkolivegreen1", "darkolivegreen3"
FREED_FILL, FREED_SAVED_FILL, SUMMARY_FILL, EARLIER_COLOR = "gray95", "#ffe4bf", "white", "red"
NODE_ATTR = {"style": "filled", "shape": "box", "align": "left", "fontsize": "10",
             "ranksep": "0.1", "height": "0.2", "fontname": "monospace"}  # torchviz's
FADED = {"style": "filled,dashed", "fontcolor": "gray40"}
# What an item draws.  A tensor met twice (a parameter an op saved) is drawn as torchviz leaves it:
# as the role it was drawn in last, in torchviz's walk order, which this module's walk follows.
_FN, _SAVED, _TENSOR = range(3)
_HEAD = 40  # nodes nearest the outputs kept when a large graph is summarised
_IMPORTANT = 40  # at most this many crossing / freed-frontier nodes kept besides
_SUMMARY_OPS = 3  # op names listed in a collapsed node's label


@dataclass(slots=True)
class _Item:
    """One node of the drawing: a backward node, a tensor, or a collapsed part of the graph."""

    label: str  # a tensor's name (its label is made when it is drawn)
    role: int
    owner: int  # backward node a tensor hangs off (-1: an output); a backward node's own index
    fill: str | None = None  # None: Graphviz's default (lightgrey), as torchviz draws backward nodes
    value: Any = None  # a tensor's Tensor or SavedHandle
    op: str = ""
    record: NodeRecord | None = None
    freed: bool = False
    done: bool = False
    collapsed: bool = False
    attrs: dict[str, str] | None = None


class _Kind(NamedTuple):
    """What is cached per autograd node class (``dir()`` is slow)."""

    name: str
    saved: tuple[tuple[str, bool], ...]  # (attribute after "_saved_", holds tensors)
    custom: bool  # a custom autograd.Function: its saved tensors are always drawn
    accumulates: bool  # AccumulateGrad: draws its .variable


_KINDS: dict[type, _Kind] = {}


def _kind(node: Any) -> _Kind:
    kind = _KINDS.get(type(node))
    if kind is None:
        names = dir(node)
        raw = {n[11:] for n in names if n.startswith("_raw_saved_")}
        saved = tuple((n[7:], n[7:] in raw) for n in names if n.startswith("_saved_"))
        kind = _Kind(type(node).__name__, saved, "_raw_saved_tensors" in names, "variable" in names)
        _KINDS[type(node)] = kind
    return kind


def _read_slot(node: Any, name: str) -> tuple[bool, list[Any]] | None:
    """(holds a tuple, values) of a saved-tensor slot, or None once freed.

    Values are Tensors (outside a session), graphwatch SavedHandles (inside one) or None (an
    undefined optional tensor).  Nothing is unpacked.
    """
    try:
        raw = getattr(node, "_raw_saved_" + name)
    except RuntimeError:  # a freed list of tensors
        return None
    many = isinstance(raw, tuple)
    values = [saved.data for saved in raw] if many else [raw.data]
    if all(value is None for value in values):
        try:
            getattr(node, "_saved_" + name)  # None for undefined tensors; raises once freed
        except RuntimeError:
            return None
    return many, values


def _shape_bytes(value: Any) -> tuple[Sequence[int], int] | None:
    """Shape and bytes of a drawn tensor, or None for what a user's pack hook returned (opaque)."""
    if isinstance(value, SavedHandle):
        return value.shape(), value.nbytes
    if isinstance(value, tuple):  # e.g. save_on_cpu's (device, tensor)
        value = next((v for v in value if isinstance(v, torch.Tensor)), None)
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value.shape, value.nbytes
    except RuntimeError:  # sparse tensors have no nbytes
        return value.shape, 0


def _tensor_label(item: _Item, with_bytes: bool) -> str:
    known = _shape_bytes(item.value)
    if known is None:
        return f"{item.label}\n (packed by saved-tensor hooks)"
    label = "%s\n (%s)" % (item.label, ", ".join(str(int(d)) for d in known[0]))
    if not with_bytes:
        return label
    shared = isinstance(item.value, SavedHandle) and not known[1]
    return label + "\n " + ("shared storage" if shared else human_bytes(known[1]))


def _attr_table(name: str, attrs: Mapping[str, str], max_chars: int) -> str:
    """torchviz's ``show_attrs`` label: the op name over an aligned ``key: value`` table."""
    if not attrs:
        return name
    key_width = max(len(k) for k in attrs)
    width = min(max(len(v) for v in attrs.values()), max(max_chars, 3))
    cut = {k: v if len(v) <= width else v[: width - 3] + "..." for k, v in attrs.items()}
    rows = [f"{k.ljust(key_width)}: {v.rjust(width)}" for k, v in cut.items()]
    return "\n".join([name, "-" * max(key_width + width + 2, len(name)), *rows])


class _GraphBuilder:
    """Walks the graph once (iteratively, in torchviz's preorder) into items and edges."""

    def __init__(self, params: Mapping[str, torch.Tensor] | None, attrs: bool, saved: bool, max_chars: int) -> None:
        self.names = {id(t): name for name, t in (params or {}).items()}
        self.show_attrs, self.show_saved, self.max_chars = attrs, saved, max_chars
        self.items: list[_Item] = []
        self.flow: list[tuple[int, int]] = []  # (input node, node using it): backward-node edges
        self.links: list[tuple[int, int, dict[str, str]]] = []  # edges to and from tensors
        self.roots: list[int] = []
        self._nodes: dict[Any, int] = {}  # holds the node wrappers (so their ids stay unique) while building
        self._tensors: dict[int, int] = {}  # id(tensor) -> item; items hold the tensors

    def add_output(self, var: torch.Tensor) -> None:
        if not isinstance(var, torch.Tensor):
            raise TypeError(f"make_dot draws tensors, got {type(var).__name__}")
        if id(var) in self._tensors:
            return
        chain = [(var, OUTPUT_FILL)] + ([(var._base, BASE_FILL)] if var._is_view() else [])
        for tensor, fill in chain:  # a view's base is never a view: at most two
            if id(tensor) not in self._tensors:
                index = self._tensor(tensor, self.names.get(id(tensor), ""), _TENSOR, -1, fill)
                if tensor.grad_fn is not None:
                    self.links.append((self.add_root(tensor.grad_fn), index, {}))
        if len(chain) == 2:
            self.links.append((self._tensors[id(var._base)], self._tensors[id(var)], {"style": "dotted"}))

    def add_root(self, root: Any) -> int:
        """Walk the graph below the backward node ``root``; return its item."""
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, after_inputs = stack.pop()
            item = self.items[self._node(node)]
            if after_inputs:  # torchviz draws a custom Function's saved tensors after its inputs
                self._custom_saved(node, item.owner)
            elif not item.done:
                item.done = True
                inputs = self._visit(node, item)
                if _kind(node).custom:
                    stack.append((node, True))
                stack.extend((child, False) for child in reversed(inputs))
        self.roots.append(self._nodes[root])
        return self.roots[-1]

    def _tensor(self, value: Any, name: str, role: int, owner: int, fill: str) -> int:
        index = self._tensors.get(id(value))
        if index is None:
            index = self._tensors[id(value)] = len(self.items)
            self.items.append(_Item(name, role, owner, fill, value))
        else:
            item = self.items[index]
            item.label, item.role, item.owner, item.fill = name, role, owner, fill
        return index

    def _node(self, node: Any) -> int:
        index = self._nodes.get(node)
        if index is None:
            index = self._nodes[node] = len(self.items)
            self.items.append(_Item("", _FN, index))
        return index

    def _visit(self, node: Any, item: _Item) -> list[Any]:
        """Fill in one backward node and its tensors; return its inputs."""
        kind, index = _kind(node), item.owner
        item.op, item.record = kind.name, node_record(node)
        item.label = kind.name
        if self.show_attrs:
            item.label = _attr_table(kind.name, self._attrs(node, kind, item), self.max_chars)
        for name, holds_tensors in kind.saved if self.show_saved else ():
            if holds_tensors:
                self._saved_slot(node, name, index)
        if kind.accumulates:
            var = node.variable
            self.links.append((self._tensor(var, self.names.get(id(var), ""), _TENSOR, index, PARAM_FILL), index, {}))
        children = [child for child, _ in node.next_functions if child is not None]
        self.flow.extend((self._node(child), index) for child in children)
        return children

    def _custom_saved(self, node: Any, index: int) -> None:
        """A custom Function's ``ctx.saved_tensors`` (read without unpacking, as in :func:`_read_slot`)."""
        try:
            values = [saved.data for saved in node._raw_saved_tensors]
        except RuntimeError:  # freed
            self._saved(index, None, "", True, toward_node=True)
            return
        for value in values:
            if value is not None:
                self._saved(index, value, "", False, toward_node=True)

    def _attrs(self, node: Any, kind: _Kind, item: _Item) -> dict[str, str]:
        attrs = {}
        for name, holds_tensors in kind.saved:
            slot = _read_slot(node, name) if holds_tensors else None
            if holds_tensors and slot is None:
                attrs[name], item.freed = "[freed]", True
            elif slot and any(value is not None for value in slot[1]):
                attrs[name] = "[saved tensors]" if slot[0] else "[saved tensor]"
            else:
                attrs[name] = str(getattr(node, "_saved_" + name))
        return attrs

    def _saved_slot(self, node: Any, name: str, owner: int) -> None:
        slot = _read_slot(node, name)
        if slot is None:
            self._saved(owner, None, name, True)
            return
        many, values = slot
        for i, value in enumerate(values):
            if value is not None:
                self._saved(owner, value, f"{name}[{i}]" if many else name, False)

    def _saved(self, owner: int, value: Any, name: str, freed: bool, toward_node: bool = False) -> None:
        if freed:
            index = len(self.items)
            label = f"{name}\n freed" if name else "freed"
            self.items.append(_Item(label, _SAVED, owner, FREED_SAVED_FILL, attrs=dict(FADED)))
            self.items[owner].freed = True
        else:
            index = self._tensor(value, name or self.names.get(id(value), ""), _SAVED, owner, SAVED_FILL)
        self.links.append((index, owner, {"dir": "none"}) if toward_node else (owner, index, {"dir": "none"}))


def _step_text(step: int) -> str:
    return "before the session" if step < 0 else f"step {step}"


def _is_freed(item: _Item) -> bool:
    return item.freed or (item.record is not None and item.record.freed_by is not None)


def _decorate(item: _Item, current_step: int | None, retained: Collection[int]) -> None:
    """Add the lifecycle marks of one backward node to its label and attributes."""
    record, lines, attrs = item.record, [], {}
    if _is_freed(item):
        item.fill = FREED_FILL
        attrs.update(FADED)
        lines.append("freed" if record is None or record.freed_by is None else f"freed by backward #{record.freed_by}")
    if record is not None and current_step is not None and record.step < current_step:
        attrs.update(color=EARLIER_COLOR, penwidth="2")
        lines.append(_step_text(record.step))
    if record is not None and record.id in retained:
        attrs["peripheries"] = "2"
        lines.append("retained graph")
    if lines:
        item.label += "\n" + "\n".join(lines)
        item.attrs = attrs


def _overlay(graph: _GraphBuilder, trace: Trace | None, current_step: int | None,
             retained: Collection[int]) -> dict[int, dict]:
    """Mark the nodes' lifecycle; return the attributes of the flow edges that carry the graph across steps."""
    items = graph.items
    if current_step is None:
        current_step = max((item.record.step for item in items if item.record is not None), default=None)
    for item in items:
        if item.role == _FN:
            _decorate(item, current_step, retained)
    carried = {}
    for k, (child, parent) in enumerate(graph.flow):
        old, new = items[child].record, items[parent].record
        if old is not None and new is not None and new.step > old.step:
            where = trace.where(old.site) if trace is not None and old.site is not None else _step_text(old.step)
            carried[k] = {"color": EARLIER_COLOR, "fontcolor": EARLIER_COLOR, "style": "bold", "label": where}
    return carried


def _freed_frontier(items: list[_Item], index: int, parents: list[int]) -> bool:
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


def _summarise(graph: _GraphBuilder, carried: Iterable[tuple[int, int]], max_nodes: int) -> list[int]:
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


def _collapsed(items: list[_Item], part: list[int]) -> _Item:
    ops = Counter(items[i].op for i in part).most_common()
    listed = ", ".join(f"{op} ×{count:,}" for op, count in ops[:_SUMMARY_OPS]) + (", …" * (len(ops) > _SUMMARY_OPS))
    label = f"… {len(part):,} nodes ({listed}) …"
    return _Item(label, _FN, -1, SUMMARY_FILL, collapsed=True, attrs=dict(FADED))


def _emit(graph: _GraphBuilder, rep: list[int], carried: dict[int, dict], overlaid: bool,
          legend: bool) -> graphviz.Digraph:
    """The Digraph of the drawn items, named ``n0, n1, ...`` in walk order."""
    dot = graphviz.Digraph(node_attr=NODE_ATTR, graph_attr={"size": "12,12"})
    items, names = graph.items, {}
    for index, item in enumerate(items):
        if rep[index] == index:
            names[index] = f"n{len(names)}"
            label = item.label if item.value is None else _tensor_label(item, overlaid and item.role == _SAVED)
            dot.node(names[index], label, **({"fillcolor": item.fill} if item.fill else {}), **(item.attrs or {}))
    collapsed_edges: set[tuple[str, str]] = set()
    for k, (tail, head, attrs) in enumerate([(c, p, {}) for c, p in graph.flow] + graph.links):
        tail, head = rep[tail], rep[head]
        if tail < 0 or head < 0 or tail == head:
            continue
        pair = (names[tail], names[head])
        if items[tail].collapsed or items[head].collapsed:
            if pair in collapsed_edges:
                continue
            collapsed_edges.add(pair)
        dot.edge(*pair, **carried.get(k, attrs))
    if legend:
        _add_legend(dot, summarised=any(item.collapsed for item in items))
    size = max(12, len(dot.body) * 0.15)  # torchviz's sizing: grows with the number of statements
    dot.graph_attr["size"] = f"{size},{size}"
    return dot


def _add_legend(dot: graphviz.Digraph, summarised: bool) -> None:
    """A cluster explaining the colours and lifecycle marks, in one column."""
    entries = [
        ("parameter (named from params)", {"fillcolor": PARAM_FILL}),
        ("saved tensor (shape, bytes)", {"fillcolor": SAVED_FILL}),
        ("output", {"fillcolor": OUTPUT_FILL}),
        ("backward node", {}),
        ("freed by backward #k", {"fillcolor": FREED_FILL, **FADED}),
        ("from an earlier step (step k)", {"color": EARLIER_COLOR, "penwidth": "2"}),
        ("retained graph (retain_graph=True)", {"peripheries": "2"}),
        ("red edge: carries the graph across steps,\nlabelled with the line that made it",
         {"fontcolor": EARLIER_COLOR, "shape": "plaintext", "style": ""}),
    ]
    if summarised:
        entries.append(("… n nodes …: a collapsed part of the graph", {"fillcolor": SUMMARY_FILL, **FADED}))
    with dot.subgraph(name="cluster_legend") as legend:
        legend.attr(label="graphwatch legend", fontsize="10", fontname="monospace", style="dashed", color="gray60")
        for k, (label, attrs) in enumerate(entries):
            legend.node(f"legend{k}", label, **attrs)
            if k:
                legend.edge(f"legend{k - 1}", f"legend{k}", style="invis")


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


def _finish(graph: _GraphBuilder, trace: Trace | None, current_step: int | None, retained: Collection[int] | None,
            legend: bool | None, max_nodes: int) -> graphviz.Digraph:
    """Overlay, summarise and emit a walked graph."""
    overlaid = trace is not None or current_step is not None or bool(retained)
    overlaid = overlaid or any(item.record is not None or item.freed for item in graph.items)
    carried = _overlay(graph, trace, current_step, retained or ()) if overlaid else {}
    rep = list(range(len(graph.items)))
    if len(graph.items) > max_nodes:
        rep = _summarise(graph, [graph.flow[k] for k in carried], max_nodes)
    return _emit(graph, rep, carried, overlaid, overlaid if legend is None else legend)


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
        graph = _GraphBuilder(params, show_attrs, show_saved, max_attr_chars)
        for tensor in var if isinstance(var, (tuple, list)) else [var]:
            graph.add_output(tensor)
        return _finish(graph, trace, current_step, retained, legend, max_nodes)


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


def snapshot_dot(roots: Iterable[Any], trace: Trace, step: int, *, retained: Collection[int] | None = None,
                 max_nodes: int = 300) -> str:
    """DOT source of a session's snapshot: the graph under the backward nodes ``roots`` at ``step``.

    Saved tensors are drawn (with their bytes), the overlay and the legend always.

    Example::

        >>> import torch
        >>> from graphwatch.model import Trace
        >>> from graphwatch.rendering.dot import snapshot_dot
        >>> y = torch.ones(2, requires_grad=True).exp().sum()
        >>> "cluster_legend" in snapshot_dot([y.grad_fn], Trace(), step=0)
        True
    """
    with _gc_paused():
        graph = _GraphBuilder(None, False, True, 50)
        for root in roots:
            if root is not None:
                graph.add_root(root)
        return _finish(graph, trace, step, retained, True, max_nodes).source
