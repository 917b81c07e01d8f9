"""The lines of a step seen light, taken from a step seen in full detail that ran the same code.

On a light step no pack hook notes which line made each node
(:mod:`.step_clock`).  But a training loop runs the same code step after
step, and autograd numbers the nodes of a thread in order, so the node made
``k``-th in a light step is made by the same line as the ``k``-th node of a
full step that ran the same code.  A full step's :class:`Template` keeps, by
node offset from its start, the op of each node its walks met and the line
of each pack.  A node of a light step takes the template's line when the
light step made as many nodes as the full step (the current step: no more so
far), and the node and its children of the same step are the ops the
template has at their offsets; otherwise its line stays unknown.

Example::

    >>> templates = LineTemplates()
    >>> templates.keep(Template(3, ["MulBackward0", "SumBackward0", None], [(0, 7), (1, 8)], frozenset({0})))
    >>> templates.site(3, True, [(1, "SumBackward0"), (0, "MulBackward0")])  # the node, then its children
    (8, False)
    >>> templates.site(3, True, [(1, "ExpBackward0")])  # another op there: not the same code
    (None, False)
    >>> templates.keep(Template(5, ["MulBackward0", "SumBackward0", None, None, None], [(0, 9)], frozenset({0})))
    >>> templates.site(2, False, [(1, "SumBackward0")])  # a step half made: either code, two lines
    (None, False)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .step_clock import StepClock, next_sequence_nr

MAX_TEMPLATES = 16  # node counts kept (one template each, the latest)
MAX_NODES = 100_000  # a bigger step seen in full detail leaves no lines for light steps


@dataclass(slots=True)
class Template:
    """A full step's nodes: ``count`` made, each one's op by offset (None: no walk met it), its lines as
    (offset of the first node, site) from each line change on, and the offsets of the nodes whose op packed a
    tensor (their lines are their own; the others' are the line of an op before them)."""

    count: int
    ops: list[str | None]
    lines: list[tuple[int, int | None]]
    packed: frozenset[int] = frozenset()

    def site_at(self, offset: int) -> int | None:
        i = bisect_right(self.lines, offset, key=lambda line: line[0]) - 1
        return self.lines[i][1] if i >= 0 else None


class LineTemplates:
    """The latest full step's template for each number of nodes a step made."""

    def __init__(self) -> None:
        self._by_count: dict[int, Template] = {}

    def keep(self, template: Template) -> None:
        self._by_count.pop(template.count, None)
        self._by_count[template.count] = template
        if len(self._by_count) > MAX_TEMPLATES:
            del self._by_count[next(iter(self._by_count))]

    def keep_step(self, clock: StepClock, first: int, end: int, ops_met: list[tuple[int, str]]) -> None:
        """Keep the template of a step seen in full detail that made the nodes numbered ``first`` up to ``end``:
        ``ops_met`` are (sequence number, op) of the nodes its walks met, its lines are the ``clock``'s."""
        count = end - first
        if not 0 < count <= MAX_NODES:
            return
        ops: list[str | None] = [None] * count
        for seq, op in ops_met:
            if first <= seq < end:
                ops[seq - first] = op
        self.keep(Template(count, ops, clock.lines_between(first, end), clock.packed_between(first, end)))

    def node_site(self, clock: StepClock, node: Any, seq: int, op: str, step: int) -> tuple[int | None, bool]:
        """(the line of ``node`` (sequence number ``seq``, ``op``), made in step ``step`` (seen light), from the
        template of a full step that ran the same code (None: none did); whether the node at its place there
        packed a tensor, so that the line is its own)."""
        bounds = clock.bounds
        first = bounds[step]
        finished = step + 1 < len(bounds)
        count = (bounds[step + 1] if finished else next_sequence_nr()) - first
        nodes = [(seq - first, op)]
        for child, _ in node.next_functions:
            child_seq = -1 if child is None else child._sequence_nr()
            if first <= child_seq < first + count:
                nodes.append((child_seq - first, child.name()))
        return self.site(count, finished, nodes)

    def site(self, count: int, finished: bool, nodes: Sequence[tuple[int, str]]) -> tuple[int | None, bool]:
        """(the line of a light step's node, ``nodes[0]`` as (offset, op), whose children of the same step are
        ``nodes[1:]``, in a step that made ``count`` nodes (``finished``; else so far), None when no template
        ran the same code there; whether that template's node packed a tensor)."""
        if finished:
            found = self._by_count.get(count)
            templates = [found] if found is not None else []
        else:
            templates = [t for t in self._by_count.values() if t.count >= count]
        answers = {
            (template.site_at(nodes[0][0]), nodes[0][0] in template.packed)
            for template in templates
            if all(offset < len(template.ops) and template.ops[offset] == op for offset, op in nodes)
        }
        # a step not finished yet may run the code of any template that made as many nodes so far (the training
        # step, or the evaluation that starts the one before it with the same ops): a line only where they agree
        return answers.pop() if len(answers) == 1 else (None, False)
