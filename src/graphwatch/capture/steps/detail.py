"""Which steps the default level sees in full detail, and why.

Training loops repeat themselves, so watching every step closely buys little
and costs 2-5x bare torch: every saved tensor goes through a Python pack hook.
The default level watches in full detail (saved-tensor hooks, graph walks, the
holder search, the step detectors) only

- the first :data:`FIRST_STEPS` steps;
- sampled steps: step 64, then every :data:`SAMPLE_EVERY` th (each looks at every graph the user's frames
  hold, a holder census that costs about a millisecond in a script with many names);
- the :data:`HOLD_STEPS` steps after a *signal*, something the cheap path saw
  that looks new or wrong (a ``retain_graph`` or ``create_graph`` backward, a
  backward of an earlier step's graph, a backward or ``optimizer.step()`` line
  not seen before, a step that made more or fewer nodes than any before it,
  resident memory grown, a finding, more graphs of earlier steps alive than at
  the last full step's end (so a loop that keeps every step's graph is seen in
  full detail for as long as its kept graphs grow, and its growth is measured),
  a graph carried in from a step seen light, ``model.eval()`` at a line not seen
  before);

and every other step at the light level's cost: the backward calls, the
optimizer steps and each step's totals, with no saved-tensor hook installed
(saved-tensor hooks are thread-local and pushed and popped at step
boundaries).  An error on a light step is explained from the graph still
alive when it is raised (:mod:`graphwatch.capture.graph.post_hoc`).  The trace lists
the steps seen in full detail and why (:class:`~graphwatch.model.DetailSpan`).

Example::

    >>> plan = DetailPlan()
    >>> [step for step in range(600) if plan.decide(step)[0]]
    [0, 1, 2, 64, 256, 512]
    >>> plan.suspect(20, "a retain_graph=True backward at train.py:12")
    >>> full, reason = plan.decide(21)
    >>> plan.begin(21, full, reason)
    >>> plan.spans
    [DetailSpan(first=21, end=22, reason='a retain_graph=True backward at train.py:12')]
"""

from __future__ import annotations

from bisect import bisect_right

from ...model import DetailSpan

FIRST_STEPS = 3  # steps 0, 1, 2: a retained graph is judged one step late, a kept graph two
SAMPLED_EARLY = (64,)  # sampled before the regular schedule
SAMPLE_EVERY = 256  # then every this many steps
HOLD_STEPS = 4  # a signal asks for full detail for this many steps: long enough for the held-graph rule


class DetailPlan:
    """Decides, as each step starts, whether it is seen in full detail; ``spans`` lists those steps and why.

    ``always``: every step in full detail (``level="full"`` and ``"precise"``); ``never``: none
    (``level="light"``).
    """

    def __init__(self, spans: list[DetailSpan] | None = None, always: bool = False, never: bool = False) -> None:
        self.spans: list[DetailSpan] = spans if spans is not None else []
        self.always = always
        self.never = never
        self._until = -1  # a signal asked for full detail up to this step
        self._reason = ""
        self._last = (-1, False)  # the last step begun, and whether it is seen in full detail
        self._before = (-1, False)  # the one begun before it
        self._firsts = [span.first for span in self.spans]  # (spans are noted in order of their steps)

    def decide(self, step: int) -> tuple[bool, str]:
        """(whether step ``step`` should be seen in full detail, why)."""
        if self.never:
            return False, ""
        if self.always:
            return True, "every step"
        if step < FIRST_STEPS:
            return True, "first steps"
        if step <= self._until:
            return True, self._reason
        if step in SAMPLED_EARLY or (step > SAMPLED_EARLY[-1] and step % SAMPLE_EVERY == 0):
            return True, "sampled"
        return False, ""

    def begin(self, step: int, full: bool, reason: str) -> None:
        """Step ``step`` starts, in full detail (for ``reason``) or not; noted in :attr:`spans`."""
        self._before, self._last = self._last, (step, full)
        if full:
            self._note(step, reason)

    def upgrade(self, step: int, reason: str) -> None:
        """Step ``step``, the last begun and begun light, is seen in full detail from its start after all (for
        ``reason``): nothing of it was made before the switch."""
        if self._last == (step, False):
            self._last = (step, True)
            self._note(step, reason)

    def _note(self, step: int, reason: str) -> None:
        last = self.spans[-1] if self.spans else None
        if last is not None and last.end == step and last.reason == reason:
            last.end = step + 1
        else:
            self.spans.append(DetailSpan(step, step + 1, reason))
            self._firsts.append(step)

    def is_full(self, step: int) -> bool:
        """Whether ``step`` (one of the last two begun, or an earlier one) is seen in full detail."""
        last = self._last
        if step == last[0]:
            return last[1]
        if step == self._before[0]:
            return self._before[1]
        if self.always or self.never:
            return self.always
        i = bisect_right(self._firsts, step) - 1
        return i >= 0 and step < self.spans[i].end

    def suspect(self, step: int, reason: str, hold: int = HOLD_STEPS) -> None:
        """A signal seen in ``step``: the ``hold`` steps after it are seen in full detail."""
        if self.never or self.always:
            return
        if step + hold > self._until:
            if step >= self._until:  # a new suspicion names itself; one inside a running hold extends it
                self._reason = reason
            self._until = step + hold
