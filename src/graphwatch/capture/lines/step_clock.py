"""Which step, and which line, created an autograd node: from its sequence number.

Autograd numbers the nodes a thread creates in order (``node._sequence_nr()``)
and ``torch._C._autograd._get_sequence_nr()`` reads the number the next node
will get.  The clock notes that number at each step start; a node's step is
the number of step starts at or before it, found by bisection (-1: made
before the session).  The pack hook runs inside the op whose node was just
numbered, so it also notes (number, line) whenever the line changes, and the
number of each node that packed (:meth:`StepClock.packed`: its line is its
own): a node that saves no tensor takes the line of the nearest pack at or
before it.  That is exact for the tensors a call returns (its last nodes); the
first nodes of a composite call that saves nothing before them take the line
of the call before.  A step seen light runs no pack hook: its start is noted
as "no line from here" (:meth:`StepClock.note_unknown`), so that its nodes get
no line rather than a wrong one.  The numbers are per thread: the clock speaks
for the thread that trains.

Example::

    >>> import torch
    >>> from graphwatch.capture.lines.step_clock import StepClock
    >>> clock = StepClock()
    >>> _ = clock.mark()                      # step 0 starts
    >>> a = torch.ones(1, requires_grad=True) * 2
    >>> _ = clock.mark()                      # step 1 starts
    >>> b = a * 3
    >>> clock.step_of(a.grad_fn._sequence_nr()), clock.step_of(b.grad_fn._sequence_nr())
    (0, 1)
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

import torch

from ...model.packed import PackedArray

next_sequence_nr = torch._C._autograd._get_sequence_nr
_PRUNE_AT = 8192  # timeline entries before old ones are dropped


class StepClock:
    """Step starts and line changes, both as node sequence numbers."""

    def __init__(self) -> None:
        self.bounds = PackedArray("q")  # packed: a steady loop's bounds take almost nothing
        self._line_seqs: list[int] = []
        self._line_sites: list[int | None] = []
        self._last_site: int | None = None
        self._packed = array("q")  # numbers of the nodes whose op packed a tensor: their lines are their own

    def mark(self) -> int:
        """Start a step: record (and return) the sequence number its first node will get."""
        seq = next_sequence_nr()
        self.bounds.append(seq)
        return seq

    def step_of(self, seq: int) -> int:
        """The step in which the node with sequence number ``seq`` was created (-1: before)."""
        return self.bounds.bisect_right(seq) - 1

    def note_site(self, site: int | None, seq: int) -> None:
        """A pack hook at ``site`` runs inside the op whose node was numbered last, ``seq``."""
        self._packed.append(seq)
        if site != self._last_site:
            self._last_site = site
            self._line_seqs.append(seq)
            self._line_sites.append(site)

    def packed_between(self, first: int, end: int) -> frozenset[int]:
        """The offsets from ``first`` of the nodes numbered ``first`` to ``end - 1`` whose op packed a tensor."""
        start, stop = bisect_right(self._packed, first - 1), bisect_right(self._packed, end - 1)
        return frozenset(seq - first for seq in self._packed[start:stop])

    def packed(self, seq: int) -> bool:
        """Whether the op of node ``seq`` packed a tensor (so :meth:`site_of` is its own line, not the line of an
        op before it)."""
        i = bisect_right(self._packed, seq) - 1
        return i >= 0 and self._packed[i] == seq

    def note_unknown(self) -> None:
        """The nodes numbered from now on have no line (until the next pack): a step seen light starts."""
        if self._last_site is not None or not self._line_seqs:
            self._last_site = None
            self._line_seqs.append(next_sequence_nr())
            self._line_sites.append(None)

    def note_call(self, first_seq: int, site: int | None) -> None:
        """A torch call at ``site`` made the nodes numbered from ``first_seq`` on (the precise level)."""
        self._line_seqs.append(first_seq)
        self._line_sites.append(site)
        self._last_site = site

    def site_of(self, seq: int) -> int | None:
        """The line of the last pack (or, at the precise level, call) at or before node ``seq``."""
        i = bisect_right(self._line_seqs, seq) - 1
        if i < 0:  # made before the first pack: the first line seen is the best guess
            i = 0 if self._line_sites else -1
        return self._line_sites[i] if i >= 0 else None

    def lines_between(self, first: int, end: int) -> list[tuple[int, int | None]]:
        """The line changes of the nodes numbered ``first`` to ``end - 1``, as (offset from ``first``, site),
        starting with the line in effect at ``first``."""
        start = max(0, bisect_right(self._line_seqs, first) - 1)
        stop = bisect_right(self._line_seqs, end - 1)
        return [(max(0, seq - first), site) for seq, site in zip(self._line_seqs[start:stop], self._line_sites[start:stop])]

    def forget_before(self, step: int) -> None:
        """Drop line changes older than step ``step``'s start once the timeline is long (nodes that old are
        pruned)."""
        if len(self._line_seqs) > _PRUNE_AT:
            cut = max(0, bisect_right(self._line_seqs, self.bounds[step]) - 1)
            del self._line_seqs[:cut], self._line_sites[:cut]
        if len(self._packed) > _PRUNE_AT:
            del self._packed[: bisect_right(self._packed, self.bounds[step] - 1)]
