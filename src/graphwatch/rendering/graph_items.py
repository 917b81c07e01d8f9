"""Collect an autograd graph into drawable items: torchviz's walk, without recursion, on freed graphs too.

:class:`GraphBuilder` walks backward nodes from their roots in torchviz's
order and records an :class:`Item` per backward node, tensor and saved tensor
(reading saved slots without unpacking them, so a freed graph draws as
freed); :mod:`graphwatch.rendering.dot` decorates, summarises and emits them.

Example::

    >>> import torch
    >>> from graphwatch.rendering.graph_items import FN, GraphBuilder
    >>> w = torch.ones(2, requires_grad=True)
    >>> graph = GraphBuilder(None, False, True, 50)
    >>> graph.add_output((w * 2).sum())
    >>> [item.op for item in graph.items if item.role == FN]
    ['SumBackward0', 'MulBackward0', 'AccumulateGrad']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..analysis.evidence import human_bytes
from ..capture.graph.graph_walk import node_record
from ..capture.hooks.saved import SavedHandle
from ..capture.hooks.saved_views import raw_data
from ..model import NodeRecord
from .visible import one_line

PARAM_FILL, SAVED_FILL, OUTPUT_FILL, BASE_FILL = "lightblue", "orange", "darkolivegreen1", "darkolivegreen3"
FREED_FILL, FREED_SAVED_FILL, SUMMARY_FILL, EARLIER_COLOR = "gray95", "#ffe4bf", "white", "red"
BACKWARD_FILL, HOLDER_FILL = "lightgrey", "white"  # Graphviz's default fill (torchviz's backward nodes); a holder
NODE_ATTR = {"style": "filled", "shape": "box", "align": "left", "fontsize": "10",
             "ranksep": "0.1", "height": "0.2", "fontname": "monospace"}  # torchviz's
FADED = {"style": "filled,dashed", "fontcolor": "gray40"}
# What an item draws.  A tensor met twice (a parameter an op saved) is drawn as torchviz leaves it:
# as the role it was drawn in last, in torchviz's walk order, which this module's walk follows.
FN, SAVED, TENSOR = range(3)


@dataclass(slots=True)
class Item:
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
    note: str = ""  # a last line for a tensor's label (what a kept output holds)
    tooltip: str = ""  # the hover title of a snapshot's box, when it is not the record's op, line and step


class Kind(NamedTuple):
    """What is cached per autograd node class (``dir()`` is slow)."""

    name: str  # the class's name on one line (a custom Function's is the user's: any string)
    saved: tuple[tuple[str, bool], ...]  # (attribute after "_saved_", holds tensors)
    custom: bool  # a custom autograd.Function: its saved tensors are always drawn
    accumulates: bool  # AccumulateGrad: draws its .variable


_KINDS: dict[type, Kind] = {}


def node_kind(node: Any) -> Kind:
    kind = _KINDS.get(type(node))
    if kind is None:
        names = dir(node)
        raw = {n[11:] for n in names if n.startswith("_raw_saved_")}
        saved = tuple((n[7:], n[7:] in raw) for n in names if n.startswith("_saved_"))
        kind = Kind(one_line(type(node).__name__), saved, "_raw_saved_tensors" in names, "variable" in names)
        _KINDS[type(node)] = kind
    return kind


def read_slot(node: Any, name: str) -> tuple[bool, list[Any]] | None:
    """(holds a tuple, values) of a saved-tensor slot, or None once freed.

    Values are Tensors (outside a session), graphwatch SavedHandles (inside one) or None (an
    undefined optional tensor).  Nothing is unpacked.
    """
    try:
        raw = getattr(node, "_raw_saved_" + name)
    except RuntimeError:  # a freed list of tensors
        return None
    many = isinstance(raw, tuple)
    values = [raw_data(saved) for saved in raw] if many else [raw_data(raw)]
    if all(value is None for value in values):
        try:
            getattr(node, "_saved_" + name)  # None for undefined tensors; raises once freed
        except RuntimeError:
            return None
    return many, values


def shape_bytes(value: Any) -> tuple[Sequence[int], int] | None:
    """Shape and bytes of a drawn tensor, or None for what a user's pack hook returned (opaque)."""
    if isinstance(value, SavedHandle):
        return value.shape(), value.nbytes
    if isinstance(value, tuple):  # e.g. save_on_cpu's (device, tensor)
        value = next((v for v in value if isinstance(v, torch.Tensor)), None)
    if not isinstance(value, torch.Tensor):
        return None
    if value.is_nested:  # no single shape: NestedTensorImpl raises on .shape
        return (), 0
    try:
        return value.shape, value.nbytes
    except RuntimeError:  # sparse tensors have no nbytes
        return value.shape, 0


def tensor_label(item: Item, with_bytes: bool) -> str:
    known = shape_bytes(item.value)
    note = f"\n {item.note}" if item.note else ""
    if known is None:
        return f"{item.label}\n (packed by saved-tensor hooks){note}"
    label = "{}\n ({})".format(item.label, ", ".join(str(int(d)) for d in known[0]))
    if not with_bytes:
        return label + note
    shared = isinstance(item.value, SavedHandle) and not known[1]
    return label + "\n " + ("shared storage" if shared else human_bytes(known[1])) + note


def attr_table(name: str, attrs: Mapping[str, str], max_chars: int) -> str:
    """torchviz's ``show_attrs`` label: the op name over an aligned ``key: value`` table."""
    if not attrs:
        return name
    key_width = max(len(k) for k in attrs)
    width = min(max(len(v) for v in attrs.values()), max(max_chars, 3))
    cut = {k: v if len(v) <= width else v[: width - 3] + "..." for k, v in attrs.items()}
    rows = [f"{k.ljust(key_width)}: {v.rjust(width)}" for k, v in cut.items()]
    return "\n".join([name, "-" * max(key_width + width + 2, len(name)), *rows])


class GraphBuilder:
    """Walks the graph once (iteratively, in torchviz's preorder) into items and edges."""

    def __init__(self, params: Mapping[str, torch.Tensor] | None, attrs: bool, saved: bool, max_chars: int) -> None:
        self.names = {id(t): one_line(name) for name, t in (params or {}).items()}  # a box's first line
        self.show_attrs, self.show_saved, self.max_chars = attrs, saved, max_chars
        self.items: list[Item] = []
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
        chain: list[tuple[Any, str]] = [(var, OUTPUT_FILL)] + ([(var._base, BASE_FILL)] if var._is_view() else [])
        for tensor, fill in chain:  # a view's base is never a view: at most two
            if id(tensor) not in self._tensors:
                index = self._tensor(tensor, self.names.get(id(tensor), ""), TENSOR, -1, fill)
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
                if node_kind(node).custom:
                    stack.append((node, True))
                stack.extend((child, False) for child in reversed(inputs))
        self.roots.append(self._nodes[root])
        return self.roots[-1]

    def _tensor(self, value: Any, name: str, role: int, owner: int, fill: str) -> int:
        index = self._tensors.get(id(value))
        if index is None:
            index = self._tensors[id(value)] = len(self.items)
            self.items.append(Item(name, role, owner, fill, value))
        else:
            item = self.items[index]
            item.label, item.role, item.owner, item.fill = name, role, owner, fill
        return index

    def _node(self, node: Any) -> int:
        index = self._nodes.get(node)
        if index is None:
            index = self._nodes[node] = len(self.items)
            self.items.append(Item("", FN, index))
        return index

    def _visit(self, node: Any, item: Item) -> list[Any]:
        """Fill in one backward node and its tensors; return its inputs."""
        kind, index = node_kind(node), item.owner
        item.op, item.record = kind.name, node_record(node)
        item.label = kind.name
        if self.show_attrs:
            item.label = attr_table(kind.name, self._attrs(node, kind, item), self.max_chars)
        for name, holds_tensors in kind.saved if self.show_saved else ():
            if holds_tensors:
                self._saved_slot(node, name, index)
        if kind.accumulates:
            var = node.variable
            self.links.append((self._tensor(var, self.names.get(id(var), ""), TENSOR, index, PARAM_FILL), index, {}))
        children = [child for child, _ in node.next_functions if child is not None]
        self.flow.extend((self._node(child), index) for child in children)
        return children

    def _custom_saved(self, node: Any, index: int) -> None:
        """A custom Function's ``ctx.saved_tensors`` (read without unpacking, as in :func:`read_slot`)."""
        try:
            values = [raw_data(saved) for saved in node._raw_saved_tensors]
        except RuntimeError:  # freed
            self._saved(index, None, "", True, toward_node=True)
            return
        for value in values:
            if value is not None:
                self._saved(index, value, "", False, toward_node=True)

    def _attrs(self, node: Any, kind: Kind, item: Item) -> dict[str, str]:
        attrs = {}
        for name, holds_tensors in kind.saved:
            slot = read_slot(node, name) if holds_tensors else None
            if holds_tensors and slot is None:
                attrs[name], item.freed = "[freed]", True
            elif slot and any(value is not None for value in slot[1]):
                attrs[name] = "[saved tensors]" if slot[0] else "[saved tensor]"
            else:
                attrs[name] = str(getattr(node, "_saved_" + name))
        return attrs

    def _saved_slot(self, node: Any, name: str, owner: int) -> None:
        slot = read_slot(node, name)
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
            self.items.append(Item(label, SAVED, owner, FREED_SAVED_FILL, attrs=dict(FADED)))
            self.items[owner].freed = True
        else:
            index = self._tensor(value, name or self.names.get(id(value), ""), SAVED, owner, SAVED_FILL)
        self.links.append((index, owner, {"dir": "none"}) if toward_node else (owner, index, {"dir": "none"}))
