"""What is alive, by the step that made it: tagged autograd nodes and saved activation bytes.

Finalizers count down and walks and pack hooks count up, per step.  A step
end snapshots both tables into its :class:`~graphwatch.model.StepRecord`.  A
loop that keeps every step's graph (``total_loss += loss``) has as many steps
alive as steps run, so the tables are split: the recent steps, copied at each
step end, and the older ones, which change only when one of their graphs dies
and are copied once per change and shared by the snapshots in between
(:class:`~graphwatch.model.StepTable`).  A step end then costs O(recent steps
+ old steps / batch), not O(steps alive).

Example::

    >>> live = LiveSteps()
    >>> live.node_born(0); live.node_born(0); live.count_bytes(512, 0)
    >>> nodes, saved = live.snapshot()
    >>> dict(nodes), dict(saved), live.nodes_total
    ({0: 2}, {0: 512}, 2)
"""

from __future__ import annotations

from ...model import StepTable

OLD_BATCH = 256  # steps moved at once from the recent tables into the old ones


class LiveSteps:
    """Per step: tagged nodes alive and live activation bytes; their totals; and which steps came alive or
    died since the last look (:meth:`changes`)."""

    def __init__(self) -> None:
        self.boundary = 0  # steps before it are in the old tables
        self.nodes: dict[int, int] = {}  # recent step -> tagged nodes alive
        self.activation: dict[int, int] = {}  # recent step -> live activation bytes
        self.old_nodes: dict[int, int] = {}
        self.old_activation: dict[int, int] = {}
        self.nodes_total = 0
        self.activation_total = 0
        self._old_version = 0  # changes whenever an old table does
        self._shared: tuple[int, dict[int, int], dict[int, int]] = (-1, {}, {})  # (version, copies) of the old
        self._version = 0  # changes whenever any table does
        self._last: tuple[int, StepTable, StepTable] | None = None  # the last snapshot, shared while nothing changes
        self._emptied: list[int] = []  # steps whose count reached 0 (finalizers only append here)
        self._appeared: list[int] = []  # steps that came alive in a table since the last changes()
        self._vanished: list[int] = []  # steps gone from both tables since then

    def node_born(self, step: int, count: int = 1) -> None:
        """A walk tagged ``count`` nodes of ``step``."""
        self._add(step, count, self.nodes, self.old_nodes)
        self.nodes_total += count

    def node_died(self, step: int, count: int = 1) -> None:
        """``count`` tagged nodes of ``step`` were destroyed."""
        self._add(step, -count, self.nodes, self.old_nodes)
        self.nodes_total -= count

    def count_bytes(self, nbytes: int, step: int) -> None:
        """Saved activation bytes of ``step`` became live (``nbytes`` > 0) or were released (< 0)."""
        self._add(step, nbytes, self.activation, self.old_activation)
        self.activation_total += nbytes

    def _add(self, step: int, amount: int, recent: dict[int, int], old: dict[int, int]) -> None:
        self._version += 1
        if step >= self.boundary:
            table = recent
        else:
            table = old
            self._old_version += 1
        before = table.get(step, 0)
        if not before:
            self._appeared.append(step)
        left = table[step] = before + amount
        if not left:
            self._emptied.append(step)

    def is_alive(self, step: int) -> bool:
        """Whether nodes or saved tensors of ``step`` are alive (as of the last :meth:`forget_emptied`)."""
        if step >= self.boundary:
            return step in self.nodes or step in self.activation
        return step in self.old_nodes or step in self.old_activation

    def forget_emptied(self) -> None:
        """Drop the steps whose counts reached zero from the tables."""
        emptied, self._emptied = self._emptied, []
        for step in emptied:
            recent = step >= self.boundary
            dropped = False
            for table in (self.activation, self.nodes) if recent else (self.old_activation, self.old_nodes):
                if not table.get(step, 1):
                    del table[step]
                    dropped = True
                    self._version += 1
            if dropped and not self.is_alive(step):  # (the count that reached 0 already changed the version)
                self._vanished.append(step)

    def changes(self) -> tuple[list[int], list[int]]:
        """(steps that came alive, steps all of whose graphs died) since the last call."""
        self.forget_emptied()
        appeared, vanished = self._appeared, self._vanished
        self._appeared, self._vanished = [], []
        return appeared, vanished

    def snapshot(self) -> tuple[StepTable, StepTable]:
        """(nodes alive by step, live activation bytes by step) as they are now, for a step's record: the
        last snapshot's tables again while nothing changed (a step seen light, whose graphs are not counted)."""
        self.forget_emptied()
        last = self._last
        if last is not None and last[0] == self._version:
            return last[1], last[2]
        version, old_nodes, old_activation = self._shared
        if version != self._old_version:
            old_nodes, old_activation = dict(self.old_nodes), dict(self.old_activation)
            self._shared = (self._old_version, old_nodes, old_activation)
        nodes, activation = StepTable(dict(self.nodes), old_nodes), StepTable(dict(self.activation), old_activation)
        self._last = (self._version, nodes, activation)
        return nodes, activation

    def advance(self, step: int) -> None:
        """The run reached ``step``: once the recent tables span two batches, move the older batch out (the
        recorder calls it only then)."""
        if step - self.boundary < 2 * OLD_BATCH:
            return
        self.forget_emptied()  # (emptied steps are looked up on the side of the boundary they were counted)
        self.boundary = step - OLD_BATCH
        self._version += 1
        for recent, old in ((self.nodes, self.old_nodes), (self.activation, self.old_activation)):
            for moved in [s for s in list(recent) if s < self.boundary]:  # (list: a copy in C, whatever the finalizers do)
                old[moved] = recent.pop(moved)
                self._old_version += 1
