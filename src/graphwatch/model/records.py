"""Plain records of what happened to autograd graphs during a session.

Every record is a dataclass of plain Python values (no tensors, no autograd
nodes), so a trace can outlive the graphs it describes, be serialised to JSON
and be read back by :func:`graphwatch.load`.  Records refer to each other and
to call sites by integer id.

Example::

    >>> from graphwatch.model import CallSite, SavedRecord
    >>> site = CallSite(file="train.py", line=18, function="main", source="h = cell(x, h)")
    >>> site.where
    'train.py:18'
    >>> SavedRecord(id=0, step=3, site=0, nbytes=512, kind="activation").alive
    True
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from .patch_check import PatchCheck
from .remedies import Remedy

# Where a step boundary came from.
STEP_SOURCES = ("explicit", "optimizer", "backward", "session-end")
_REPR_CHARS = 100  # characters of a finding's message its repr shows
# The part of Trace.own_seconds that is counted x a measured cost, not timed (graphwatch.capture.hooks.own_time)
OWN_ESTIMATED = "saved-tensor hooks (estimated)"
# What a saved tensor is: a leaf that requires grad, a leaf that does not, or
# the output of an op inside the graph.
SAVED_KINDS = ("parameter", "input", "activation")


@dataclass(slots=True)
class CallSite:
    """One line of user code, with the user frame that called it (if any)."""

    file: str
    line: int
    function: str
    source: str = ""
    caller: int | None = None  # id of the CallSite of the calling user frame
    backwarded: bool = False  # a backward freed a tensor saved here (seen on a step in full detail): it trains

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(slots=True)
class NodeRecord:
    """An autograd node (``grad_fn``) seen during the session."""

    id: int
    op: str
    step: int  # step in which the node was created; -1: before the session
    seq: int  # the node's sequence number (creation order within its thread)
    site: int | None = None  # CallSite id of the line that created it
    site_inferred: bool = False  # site taken from an op before it (its own packed no tensor): maybe another line's
    freed_by: int | None = None  # BackwardRecord id that freed its saved tensors
    backward: int | None = None  # BackwardRecord id of the last backward that ran through it
    died_step: int | None = None  # step in which the node itself was destroyed
    saved: list[int] = field(default_factory=list)  # SavedRecord ids
    # When a later step's graph runs into this node: the name of the value that carried it, as the
    # training loop's frame spells it ("hidden", "self.target"), the line assigning it, and the fix there.
    carried_as: str | None = None
    carried_at: int | None = None  # CallSite id
    carried_fix: str | None = None
    # "recurrent": a loop variable fed back in; "cached": the same value reused; "constant": cached, and
    # made from nothing an optimizer trains (a fixed target: detach it); "parameters": a module's parameters
    # updated in place outside no_grad (an EMA teacher: ``carried_as`` is "teacher.parameters()"); "buffer": a
    # module's registered buffer renewed each step outside no_grad (a running statistic: fed back, as recurrent)
    carried_kind: str | None = None
    # The carried value's type as the loop held it (:data:`~graphwatch.model.remedies.VALUE_TYPES`: "Tensor",
    # "tuple[Tensor]", "Optional[tuple[Tensor]]" when the code that ran sets it to None, ...), and the names the
    # carrier's line assigns with it that the loop carries too (an LSTMCell's ``h, c``), in the line's order
    carried_type: str | None = None
    carried_with: list[str] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.died_step is None


@dataclass(slots=True)
class SavedRecord:
    """A tensor autograd saved for backward (through a saved-tensor pack hook)."""

    id: int
    step: int
    site: int | None
    nbytes: int  # bytes this tensor adds to live memory (0 if its storage was already counted)
    kind: str  # one of SAVED_KINDS
    shape: tuple[int, ...] = ()
    dtype: str = ""
    device: str = "cpu"
    node: int | None = None  # NodeRecord id, once a graph walk has linked it
    unpacked: int = 0  # how many times backward read it
    freed_by: int | None = None  # BackwardRecord id, when a backward released it
    freed_step: int | None = None  # step in which it was released (by backward or collection)

    @property
    def alive(self) -> bool:
        return self.freed_step is None


@dataclass(slots=True)
class BackwardRecord:
    """One call into the autograd engine (``backward`` or ``autograd.grad``)."""

    id: int
    step: int
    site: int | None
    api: str  # "backward" or "grad"
    retain_graph: bool
    create_graph: bool
    nodes_reached: int = 0
    nodes_counted_only: int = 0  # of those, reached past the step's tracked budget: counted, not tagged
    # non-leaf nodes of earlier steps that a backward of an earlier step already ran through
    earlier_nodes_reached: int = 0
    earlier_steps: list[int] = field(default_factory=list)  # every earlier step whose nodes it reached
    # (node created this step, such an earlier node): where the graph crosses steps
    crossings: list[tuple[int, int]] = field(default_factory=list)
    saved_freed: int = 0
    bytes_freed: int = 0
    seconds: float = 0.0  # wall-clock time of the engine call
    # CPU time of the process (all its threads) meanwhile: what load elsewhere cannot inflate (0: not measured, on a
    # step seen light, where the clock's system call would cost more than the figure is worth)
    cpu_seconds: float = 0.0
    error: str | None = None
    roots: list[int] = field(default_factory=list)  # NodeRecord ids of the graph's roots
    # For retain_graph=True: did a later backward of the same step run through this graph,
    # and how many saved bytes of it were still alive when the step ended.
    graph_reused: bool = False
    held_bytes: int = 0


class StepTable(Mapping[int, int]):
    """``{step: count}`` read from two tables with no step in common: the recent steps' (the record's own
    copy) and the older steps' (a copy shared by the records of the steps in which it did not change).

    Example::

        >>> table = StepTable({7: 2}, {3: 5})
        >>> table[3], table.get(9, 0), sorted(table), table == {3: 5, 7: 2}
        (5, 0, [3, 7], True)
    """

    __slots__ = ("_old", "_recent")

    def __init__(self, recent: dict[int, int], old: dict[int, int]) -> None:
        self._recent = recent
        self._old = old

    def __getitem__(self, step: int) -> int:
        found = self._recent.get(step)
        return found if found is not None else self._old[step]

    def get(self, step: int, default: Any = None) -> Any:  # type: ignore[override]
        found = self._recent.get(step)
        return found if found is not None else self._old.get(step, default)

    def __contains__(self, step: object) -> bool:
        return step in self._recent or step in self._old

    def __iter__(self) -> Iterator[int]:
        yield from self._old
        yield from self._recent

    def __len__(self) -> int:
        return len(self._old) + len(self._recent)

    def __repr__(self) -> str:
        return repr(dict(self))


class StepSpans(Sequence[int]):
    """Step numbers kept as sorted, disjoint ``[start, end)`` spans: the steps a holder keeps alive.

    A list that keeps one graph a step holds every step since it began, so
    its holder's steps are one span however long the run: looking at it
    each step costs O(spans), not O(steps).  It reads like a list of ints.

    Example::

        >>> steps = StepSpans([(3, 6), (8, 9)])
        >>> list(steps), len(steps), 4 in steps, steps[-1]
        ([3, 4, 5, 8], 4, True, 8)
        >>> steps.without([4]) == [3, 5, 8]
        True
    """

    __slots__ = ("_ends", "_length", "_spans")

    def __init__(self, spans: Iterable[tuple[int, int]] = ()) -> None:
        self._spans = tuple((start, end) for start, end in spans if end > start)
        ends, length = [], 0
        for start, end in self._spans:
            length += end - start
            ends.append(length)
        self._ends = tuple(ends)  # steps up to and including each span
        self._length = length

    @classmethod
    def of(cls, steps: Iterable[int]) -> StepSpans:
        """The spans of some step numbers (in any order, repeats allowed); spans stay as they are."""
        if isinstance(steps, StepSpans):
            return steps
        spans: list[tuple[int, int]] = []
        for step in sorted(set(steps)):
            if spans and spans[-1][1] == step:
                spans[-1] = (spans[-1][0], step + 1)
            else:
                spans.append((step, step + 1))
        return cls(spans)

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        return self._spans

    def without(self, steps: Iterable[int]) -> StepSpans:
        """These steps less ``steps``."""
        gone = sorted(set(steps))
        spans = []
        for start, end in self._spans:
            for step in gone[bisect_right(gone, start - 1) : bisect_right(gone, end - 1)]:
                spans.append((start, step))
                start = step + 1
            spans.append((start, end))
        return StepSpans(spans)

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[int]:
        for start, end in self._spans:
            yield from range(start, end)

    def __contains__(self, step: object) -> bool:
        i = bisect_right(self._spans, (step, float("inf"))) - 1 if isinstance(step, int) else -1
        return i >= 0 and self._spans[i][0] <= step < self._spans[i][1]  # type: ignore[operator]

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("step index out of range")
        i = bisect_right(self._ends, index)
        return self._spans[i][1] - (self._ends[i] - index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepSpans):
            return self._spans == other._spans
        if isinstance(other, (list, tuple)):
            return len(other) == self._length and list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._spans)

    def __repr__(self) -> str:
        return repr(list(self)) if self._length <= 16 else f"StepSpans({list(self._spans)!r})"


GLOBALS_SCOPE = " (its globals)"  # a Holder's scope when a finished script's globals hold it: "train.py (its globals)"


def held_value(name: str) -> str:
    """The value a holder's name names, less the items of a container it ends in.

    >>> held_value("buffer[3][1]"), held_value("meters['loss'].sum"), held_value("self.outputs[7]")
    ('buffer', "meters['loss'].sum", 'self.outputs')
    """
    while name.endswith("]") and "[" in name:
        name = name[: name.rindex("[")]
    return name


@dataclass(slots=True)
class Holder:
    """A live Python value that keeps a graph of earlier steps alive (found at a step end)."""

    name: str  # how the user's code spells it: "total_loss", "self.cache", "losses[3]"
    site: int | None  # CallSite id of the line that made the tensor (its grad_fn's line)
    scope: str  # "train.py:12 in main": the frame or object where the name lives
    steps: Sequence[int] = field(default_factory=StepSpans)  # earlier steps whose nodes it reaches
    nodes: int = 0  # earlier-step nodes it reaches
    numel: int | None = None  # elements of the tensor it holds (one item's, for a container's items); None: unknown
    backwarded: bool = False  # a backward ran through the held tensor itself (a loss, or a part of one)

    @property
    def namespace(self) -> str:
        """Where the name lives, whatever line its frame stood at when it was found: a finished script's globals
        (scope ``"train.py (its globals)"``) are its module's.

        >>> Holder("total", None, "train.py:12 in main").namespace, Holder("total", None, "t.py (its globals)").namespace
        ('train.py in main', 't.py in <module>')
        """
        if self.scope.endswith(GLOBALS_SCOPE):
            return f"{self.scope[: -len(GLOBALS_SCOPE)]} in <module>"
        where, _, function = self.scope.rpartition(" in ")
        return f"{where.rpartition(':')[0] or where} in {function}" if where else self.scope

    @property
    def within(self) -> str:
        """The path from the item a container holds down to the tensor: ``[1]`` for ``buffer[3][1]`` (the
        action of a tuple appended to a replay buffer), ``""`` when the item is the tensor or there is no item.

        >>> Holder("buffer[3][1]", None, "").within, Holder("losses[3]", None, "").within
        ('[1]', '')
        """
        return within(self.name, held_value(self.name))


def within(name: str, container: str) -> str:
    """The path from the item of ``container`` that the holder ``name`` runs through down to its tensor (see
    :attr:`Holder.within`).

    >>> within("history['loss'][3]", "history['loss']"), within("history['loss'][3]", "history")
    ('', '[3]')
    """
    items = name[len(container) :]
    return items[items.index("]") + 1 :] if items else ""


@dataclass(slots=True)
class StepRecord:
    """Totals for one iteration of the training loop, taken at its end."""

    index: int
    source: str  # one of STEP_SOURCES
    nodes_created: int = 0
    saved_packed: int = 0
    saved_bytes_packed: int = 0
    saved_counted_only: int = 0  # saved past the step's tracked budget: counted, no lifetime, bytes or record
    live_activation_bytes: int = 0
    live_leaf_bytes: int = 0
    live_nodes: int = 0
    nodes_alive_by_step: Mapping[int, int] = field(default_factory=dict)
    saved_alive_by_step: Mapping[int, int] = field(default_factory=dict)  # live activation bytes
    backwards: list[int] = field(default_factory=list)
    backward_seconds: float = 0.0  # wall clock
    backward_cpu_seconds: float = 0.0  # CPU time of the process during them (measured on steps seen in full detail)
    seconds: float = 0.0  # wall clock, from the previous step's end
    cpu_seconds: float = 0.0  # CPU time of the process (all its threads) in the same span (steps seen in full detail)
    rss_bytes: int = 0
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    optimizer_steps: int = 0
    optimizer_site: int | None = None
    stale_grads: int = 0  # parameters whose gradients were not reset since the previous optimizer step
    stale_site: int | None = None  # CallSite id of the first optimizer.step() of the step that found such gradients
    holders: list[Holder] = field(default_factory=list)
    detail: bool = True  # False once per-node records of this step were dropped

    @property
    def live_saved_bytes(self) -> int:
        return self.live_activation_bytes + self.live_leaf_bytes


@dataclass(slots=True, repr=False)
class Finding:
    """A diagnosis: what is wrong, where, and how to fix it.

    ``kind`` is one of the strings in :data:`graphwatch.analysis.FINDING_KINDS`.
    ``evidence`` holds plain values: ``sites`` ("file:line" strings), ``steps``,
    ``bytes`` and whatever else the kind needs.  ``remedies`` are the ways to fix
    it, best first, as data (:class:`~graphwatch.model.remedies.Remedy`); ``fix``
    is the first one's sentence and ``patch`` the diff made from the first
    mechanical one; ``check`` what ``graphwatch run --check-fixes`` saw when it
    applied that patch and ran the script again.
    """

    kind: str
    severity: str  # "error", "warning" or "info"
    step: int
    message: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    patch: str | None = None  # a unified diff of the user's file that applies ``fix`` (analysis.patches)
    remedies: list[Remedy] = field(default_factory=list)
    check: PatchCheck | None = None

    # (Jupyter shows a finding as HTML: graphwatch.rendering.notebook registers that view with IPython, so
    # that the model imports nothing above it)

    def __str__(self) -> str:
        head = f"[{self.kind}] step {self.step}: {self.message}"
        return head if self.fix in self.message else f"{head}\n  fix: {self.fix}"  # (an explanation lists its fixes)

    def __repr__(self) -> str:
        """One line: kind, severity, step and the start of the message (a debugger's or a list's view).

        >>> Finding("retained-graph", "warning", 3, "the backward at a.py:4 retains its graph", "drop it")
        <Finding retained-graph (warning) at step 3: the backward at a.py:4 retains its graph>
        """
        message = self.message.splitlines()[0] if self.message else ""
        message = message if len(message) <= _REPR_CHARS else message[: _REPR_CHARS - 1] + "…"
        patch = ", with a patch" if self.patch else ""
        return f"<Finding {self.kind} ({self.severity}{patch}) at step {self.step}: {message}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's text view (a notebook's text/plain, the ``IPython`` prompt): the whole finding.  Its patch is
        shown, with the patch's check state, by the text formatter ``import graphwatch`` registers in IPython
        (:func:`graphwatch.rendering.notebook.register_displays`): never a patch without saying whether it was
        checked."""
        printer.text(str(self))


@dataclass(slots=True)
class Snapshot:
    """A graph drawing taken during the session (DOT source; SVG when rendered): ``dot`` the whole graph
    (up to a few hundred nodes), ``focus`` the part that shows the problem (the path from the backward's
    root to where steps cross or a freed graph is reached, its saved tensors and parameters; the rest
    folded into counts), drawn without a legend (a report shows one legend)."""

    step: int
    reason: str
    dot: str
    focus: str | None = None


@dataclass(slots=True)
class DetailSpan:
    """Steps ``first`` to ``end - 1`` were seen in full detail (saved tensors, graph walks, holders, the step
    detectors), and why: ``"first steps"``, ``"sampled"``, ``"every step"`` (``level="full"``) or the signal
    that asked for a closer look.  Steps in no span were seen at the light level's cost."""

    first: int
    end: int
    reason: str
