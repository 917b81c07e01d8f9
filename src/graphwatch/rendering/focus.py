"""The focused picture of a snapshot: the part of the graph that shows the problem, the rest folded into counts.

A report shows this picture by default (the whole graph is one click away). It holds, in this order while
about :data:`FOCUS_BOXES` boxes allow: the backward's roots; where the problem is (the carried edge of a
graph that crosses steps, the stale node a failing backward met, or for a kept graph the first node of each
step it keeps); the path from a root to each of them (a long path keeps both ends, its middle folded); the
parameters feeding the kept nodes, each drawn as one box by its name (its ``AccumulateGrad``, and a
transpose or view before it, are the same box); and the saved tensors of what is kept (a freed one is said
by its node's "freed by backward #k"; a node whose tensors find no room, and every node under a holder,
says how many it saved and their bytes).  Everything else folds into one box per step: "+37 nodes of step 3".

Example::

    >>> import torch
    >>> from graphwatch.rendering.graph_items import GraphBuilder
    >>> h = torch.zeros(2, requires_grad=True)
    >>> for _ in range(100):
    ...     h = torch.tanh(h * 2)
    >>> graph = GraphBuilder(None, False, True, 50)
    >>> graph.add_output(h)
    >>> rep = focus(graph, carried=[], targets=[])
    >>> sum(1 for i, r in enumerate(rep) if r == i) <= FOCUS_BOXES
    True
    >>> [(item.label, item.tooltip) for item in graph.items if item.collapsed]  # doctest: +NORMALIZE_WHITESPACE
    [('+175 nodes\\n1.4 KiB saved', '+175 nodes: MulBackward0 ×88, TanhBackward0 ×87'),
     ('+1 parameter', '+1 parameter')]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from ..analysis.evidence import counted, human_bytes, steps_text
from .graph_items import FADED, FN, SAVED, SUMMARY_FILL, GraphBuilder, Item, shape_bytes
from .kept import count_graphs_not_drawn

FOCUS_BOXES = 30  # about this many boxes in a focused picture (backward nodes, tensors, folds)
_NODE_SHARE = 2 / 3  # of the boxes, for backward nodes and parameters first; then their tensors
_FOLD_RESERVE = 4  # boxes kept free for the folds
_PATH_ENDS = 3  # a root's nearest nodes kept on a long path, besides the target's side
_TARGETS = 3  # at most this many places of interest (crossings, stale nodes, kept steps: each a path)
_CHAIN = 2  # a parameter drawn at a node through at most this many single-input nodes (TBackward0, a view)
_STEP_FOLDS = 4  # above this many steps' folds, the steps with no node drawn fold into one box together
PARAMETERS = "parameters"  # the fold of the parameters not drawn by name


def focus(graph: GraphBuilder, carried: Sequence[tuple[int, int]], targets: Collection[int],
          budget: int = FOCUS_BOXES) -> list[int]:
    """Per item of ``graph``, the index of the item that draws it: itself, a parameter's box, a fold (appended
    to ``graph.items``), or -1 (not drawn).  A graph of at most ``budget`` items is drawn whole.

    ``carried``: the (earlier node, later node) flow edges where the graph crosses steps; ``targets``: item
    indices of other nodes that show the problem (a stale node).  Without either, a graph under named
    outputs (what holds kept graphs) is focused on the first node of each step it reaches, and any other
    graph on the nodes nearest its roots; a holder's graphs past the first few are counted in one box
    (:func:`~graphwatch.rendering.kept.count_graphs_not_drawn`).  A kept node whose tensors find no room says
    how many it saved.
    """
    rep = count_graphs_not_drawn(graph)
    if sum(1 for index, drawn_as in enumerate(rep) if drawn_as == index) <= budget:
        return rep
    picture = _Focus(graph, budget, rep)
    places = picture.places(carried, targets)
    for place in places:
        picture.keep(place, must=True)
    near, middles = picture.paths(places)
    nodes_first = int(budget * _NODE_SHARE)
    for nodes in (near, middles, picture.order):  # (then the nodes nearest the roots)
        for node in nodes:
            picture.keep(node, limit=nodes_first)
        picture.keep_parameters(limit=nodes_first)
    picture.keep_tensors()
    for node in picture.order:  # room the tensors left
        picture.keep(node)
    picture.keep_parameters()
    return picture.fold()


class _Focus:
    """What :func:`focus` keeps, as it decides."""

    def __init__(self, graph: GraphBuilder, budget: int, rep: list[int]) -> None:
        self.graph, self.items, self.budget = graph, graph.items, budget
        n = len(self.items)
        self.kids: list[list[int]] = [[] for _ in range(n)]  # a node's inputs
        self.parents: list[list[int]] = [[] for _ in range(n)]  # the nodes using it
        for child, parent in graph.flow:
            self.kids[parent].append(child)
            self.parents[child].append(parent)
        self.tensors: list[list[int]] = [[] for _ in range(n)]  # the tensors drawn with a node
        for index, item in enumerate(self.items):
            if item.role != FN and item.owner >= 0 and not _freed_saved(item):
                self.tensors[item.owner].append(index)
        self.param = {item.owner: i for i, item in enumerate(self.items) if item.role != FN and item.role != SAVED
                      and item.owner >= 0 and self.items[item.owner].op == "AccumulateGrad"}
        self.rep = rep  # (the graphs a holder's count box draws are not walked)
        self.order, self.previous = self._walk()
        self.kept: dict[int, None] = {}  # in the order kept: the most telling first
        self.drawn_tensors: set[int] = set()
        self.used = sum(1 for i, item in enumerate(self.items) if item.role != FN and item.owner == -1 and rep[i] == i)
        self.holds = bool(self.used)  # graphs under named outputs: what a holder keeps
        self.steps: set[int] | None = None  # kept graphs: the steps whose nodes are drawn (None: any step's)
        for root in graph.roots:
            self.keep(root, must=True)

    def _walk(self) -> tuple[list[int], dict[int, int]]:
        """Breadth first from the roots drawn: the order met, and the node each was first met from."""
        previous = {root: -1 for root in self.graph.roots if self.rep[root] == root}
        order = list(previous)
        for node in order:  # grows while iterating
            for kid in self.kids[node]:
                if kid not in previous and self.rep[kid] == kid:
                    previous[kid] = node
                    order.append(kid)
        return order, previous

    def places(self, carried: Sequence[tuple[int, int]], targets: Collection[int]) -> list[int]:
        """The nodes that show the problem, nearest the roots first."""
        rank = {node: k for k, node in enumerate(self.order)}
        found = [node for edge in sorted(carried, key=lambda e: rank.get(e[0], len(rank))) for node in edge[::-1]]
        found += sorted((t for t in targets if t in rank), key=rank.__getitem__)
        if not found and self.holds:  # kept graphs under their holder: the first node of each step
            steps: dict[int, int] = {}
            for node in self.order:
                record = self.items[node].record
                if record is not None and self.items[node].op != "AccumulateGrad":
                    steps.setdefault(record.step, node)
            found = sorted(steps.values(), key=rank.__getitem__)
        found = list(dict.fromkeys(found))
        if self.holds:  # kept graphs: a few places, and only their steps' nodes drawn
            found = found[:_TARGETS]
            self.steps = {record.step for node in found if (record := self.items[node].record) is not None} or None
        return found[: 2 * _TARGETS]

    def paths(self, places: list[int]) -> tuple[list[int], list[int]]:
        """The nodes on the way from a root to each place: those beside each place or a root, and the
        middles of long ways (what the budget leaves out of them is folded)."""
        ways = []
        for place in places:
            way = []  # from the place up to its root
            node = self.previous.get(place, -1)
            while node >= 0:
                way.append(node)
                node = self.previous[node]
            ways.append(way)
        ends = 2 * _PATH_ENDS  # kept beside the place
        near = [node for way in ways for node in way[:ends]] + [node for way in ways for node in way[ends:][-_PATH_ENDS:][::-1]]
        return near, [node for way in ways for node in way[ends:-_PATH_ENDS]]

    def keep(self, node: int, must: bool = False, limit: int | None = None) -> None:
        """Keep a backward node (its tensors come later, where room is left) if it fits under ``limit``."""
        if node in self.kept or self.items[node].role != FN or self.rep[node] != node:
            return
        chain = [] if must else self._chain_to_parameter(node)
        if chain:  # a parameter (through its AccumulateGrad): its named box
            self._draw_parameter(chain, limit)
        elif must or (self._fits(1, limit) and self._of_steps_drawn(node)):
            self.kept[node] = None
            self.used += 1

    def _of_steps_drawn(self, node: int) -> bool:
        """Whether ``node`` is of a step whose nodes are drawn: of kept graphs, only those of the steps of their
        places are (the other steps fold into one box), so that the picture stays as wide however many steps
        are kept."""
        record = self.items[node].record
        return self.steps is None or (record is not None and record.step in self.steps)

    def _fits(self, boxes: int, limit: int | None = None) -> bool:
        return self.used + boxes <= (self.budget - _FOLD_RESERVE if limit is None else limit)

    def keep_parameters(self, limit: int | None = None) -> None:
        """Each parameter feeding a kept node, as one box (its name), while it fits under ``limit``."""
        for node in list(self.kept):
            for kid in self.kids[node]:
                chain = self._chain_to_parameter(kid)
                if chain:
                    self._draw_parameter(chain, limit)

    def _draw_parameter(self, chain: list[int], limit: int | None) -> None:
        """Draw the nodes of ``chain`` (single-input nodes, then an AccumulateGrad) as their parameter's box."""
        param = self.param[chain[-1]]
        drawn = self.rep[chain[-1]] == param
        if drawn or self._fits(1, limit):
            self.used += 0 if drawn else 1
            for link in chain:
                self.rep[link] = param

    def keep_tensors(self) -> None:
        """The tensors of the kept nodes with storage of their own, the most telling nodes first, where room
        is left; a node says how many of its tensors are not drawn (a view of storage drawn elsewhere, or no
        room) and their bytes.  Under a holder no tensor is drawn: each output says what its graph keeps,
        and the steps' graphs stand side by side."""
        for node in self.kept:
            own = [t for t in self.tensors[node] if _bytes(self.items[t])]
            if not self.holds and own and self._fits(len(own)):
                self.drawn_tensors.update(own)
                self.used += len(own)
            left = [t for t in self.tensors[node] if t not in self.drawn_tensors]
            if left:
                held = sum(_bytes(self.items[t]) for t in left)
                self.items[node].label += f"\n+{counted(len(left), 'saved tensor')}" + (f", {human_bytes(held)}" if held else "")

    def _chain_to_parameter(self, node: int) -> list[int]:
        """[node, ..., AccumulateGrad] when ``node`` leads to a parameter through single-input nodes only it uses."""
        chain = [node]
        while chain[-1] not in self.param:
            last = chain[-1]
            if len(chain) > _CHAIN or last in self.kept or len(self.kids[last]) != 1 or len(self.parents[last]) != 1:
                return []
            chain.append(self.kids[last][0])
        return chain if chain[-1] not in self.kept else []

    def fold(self) -> list[int]:
        """Fold every node not kept into one box per step (parameters into one box of their own; above
        :data:`_STEP_FOLDS` steps, those with no node drawn into one box together); return the items'
        representatives."""
        items, rep = self.items, self.rep
        groups: dict[int | tuple[int, ...] | str | None, list[int]] = {}
        for index, item in enumerate(items):
            if item.role == FN and index not in self.kept and rep[index] == index:
                key = PARAMETERS if index in self.param else None if item.record is None else item.record.step
                groups.setdefault(key, []).append(index)
        if sum(isinstance(key, int) for key in groups) > _STEP_FOLDS:
            drawn = {record.step for node in self.kept if (record := items[node].record) is not None}
            steps = [key for key in groups if isinstance(key, int) and key not in drawn]
            if len(steps) > 1:
                groups[tuple(steps)] = [index for step in steps for index in groups.pop(step)]
        for index, item in enumerate(items):
            if item.role != FN and item.owner >= 0 and rep[index] == index:
                owner = item.owner
                shown = index in self.drawn_tensors or rep[owner] == index
                rep[index] = index if shown else -1
        for group, members in groups.items():
            rep.append(len(items))
            items.append(self._parameters_item(members) if group == PARAMETERS else self._fold_item(group, members))
            for index in members:
                rep[index] = rep[-1]
        return rep

    def _parameters_item(self, members: list[int]) -> Item:
        names = [name for i in members if (name := self.items[self.param[i]].label)]
        head = f"+{counted(len(members), 'parameter')}"
        return _fold(head, [], head + (": " + ", ".join(names) if names else ""))

    def _fold_item(self, step: int | tuple[int, ...] | str | None, members: list[int]) -> Item:
        """The fold of the nodes of one step (``step``), of several (a tuple of them), or of no known step."""
        items = self.items
        if isinstance(step, tuple):
            of = f" of {steps_text(step)}"
        else:
            of = "" if not isinstance(step, int) else f" of step {step}" if step >= 0 else " from before the session"
        head = f"+{counted(len(members), 'node')}{of}"
        held = sum(_bytes(items[t]) for i in members for t in self.tensors[i] if items[t].role == SAVED)
        freed_by = {record.freed_by for i in members if (record := items[i].record) is not None}
        facts = [f"{human_bytes(held)} saved"] if held else []
        if len(freed_by) == 1 and None not in freed_by:
            facts.append(f"freed by backward #{freed_by.pop()}")
        ops = ", ".join(f"{op} ×{count:,}" for op, count in Counter(items[i].op for i in members).most_common())
        return _fold(head, facts, f"{head}: {ops}")


def _fold(head: str, facts: list[str], tooltip: str) -> Item:
    """A box standing for a folded part: ``head`` ("+37 nodes of step 3") over its ``facts``; what it holds
    (each op and how many) is its hover title, so that the box stays narrow."""
    return Item("\n".join([head, ", ".join(facts)] if facts else [head]), FN, -1, SUMMARY_FILL, op=head,
                collapsed=True, attrs=dict(FADED), tooltip=tooltip)


def _bytes(item: Item) -> int:
    """The bytes of a drawn tensor's own storage (0 for a view of storage counted elsewhere)."""
    known = shape_bytes(item.value)
    return known[1] if known else 0


def _freed_saved(item: Item) -> bool:
    """A saved tensor a backward already freed: its node's label says so, it needs no box of its own."""
    return item.role == SAVED and item.value is None
