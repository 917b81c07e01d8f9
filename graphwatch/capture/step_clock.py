"""Which step created an autograd node, from its sequence number.

Autograd numbers the nodes a thread creates in order (``node._sequence_nr()``).
The clock creates one tiny probe node at each step boundary and remembers its
number; a node's step is then the number of boundaries before it, found by
bisection.  Nodes made before the session get step -1.  The numbers are per
thread: the clock speaks for the thread that trains.

Example::

    >>> import torch
    >>> from graphwatch.capture.step_clock import StepClock
    >>> clock = StepClock()
    >>> _ = clock.mark()                      # step 0 starts
    >>> a = torch.ones(1, requires_grad=True) * 2
    >>> _ = clock.mark()                      # step 1 starts
    >>> b = a * 3
    >>> clock.step_of(a.grad_fn._sequence_nr()), clock.step_of(b.grad_fn._sequence_nr())
    (0, 1)
"""

from __future__ import annotations

from bisect import bisect_right

import torch


class StepClock:
    """Boundary sequence numbers, one per step start."""

    def __init__(self) -> None:
        self.bounds: list[int] = []
        self._leaf = torch.zeros((), requires_grad=True)

    def mark(self) -> int:
        """Start a step: record (and return) the current sequence number."""
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            seq = self._leaf.view(()).grad_fn._sequence_nr()
        else:
            with torch.inference_mode(False), torch.enable_grad():
                seq = self._leaf.view(()).grad_fn._sequence_nr()
        self.bounds.append(seq)
        return seq

    def step_of(self, seq: int) -> int:
        """The step in which the node with sequence number ``seq`` was created (-1: before)."""
        return bisect_right(self.bounds, seq) - 1
