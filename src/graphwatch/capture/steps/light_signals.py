"""What the cheap path watches for on a light step: each is a reason to look closer (:mod:`.detail`).

On a light step no saved-tensor hook runs and no graph is walked; what is
left costs a few attribute reads per backward and per step end:

- a backward with ``retain_graph=True`` or ``create_graph=True`` at a line where no step seen in full
  detail had one (a gradient penalty's ``create_graph`` every step is looked at once, not every step);
- a backward whose root an earlier step made (its sequence number is below the
  step's first): a graph reused across steps;
- a backward or ``optimizer.step()`` at a line not seen before: a new code path;
- ``model.eval()`` at a line not seen before: a first validation pass, seen in full detail as it runs when
  its step has made nothing yet (:mod:`.eval_mode`);
- a step that made more, or fewer, autograd nodes than any step before it (the
  node sequence numbers at its bounds): a first validation pass without
  ``no_grad``, a branch first taken, an accumulator that starts adding graphs;
  since the last finding, each such signal widens the margin the next needs
  (:data:`MADE_SLACK_FIRST`): episodes that grow as an agent learns are looked
  at a few times, not at every new longest one;
- resident memory grown by :data:`RSS_GROWTH` (and at least :data:`RSS_MINIMUM`)
  since the last step seen in full detail;
- at the first light step ends (:data:`CENSUS_AT`), a tensor the user's frames
  name (one level into lists, dicts, modules) whose ``grad_fn`` an older step
  than the last made: a list of validation losses kept from the start, which
  the first steps' own node counts do not tell from a clean loop, or an
  evaluation's loss held from one evaluation to the next (later, the sampled
  steps look at every graph the frames hold).

Example::

    >>> signals = LightSignals(where=str)
    >>> signals.step_made(0, 120), signals.step_made(1, 120)
    (None, None)
    >>> signals.step_made(2, 151)
    'a new code path: step 2 made 151 autograd nodes (120 before)'
    >>> signals.step_made(3, 160), signals.step_made(4, 200)  # (160 is within an eighth of 151)
    (None, 'a new code path: step 4 made 200 autograd nodes (120 to 160 before)')
"""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType
from typing import Any

from ..causes.holders import tensors_in_user_frames

# light step ends (counted from the session's start) that look at what the frames hold: up to the first sampled
# step (detail.SAMPLED_EARLY), which looks at every graph they hold (an evaluation every 20 steps without no_grad,
# whose graph a variable holds until the next: only the steps after its second are left to tell)
CENSUS_AT = (1, 2, 4, 8, 16, 32)
# A loop whose steps differ in length (a reinforcement-learning episode per step, longer as the agent learns)
# makes more nodes than any step before again and again, on the same code path: each node-count signal since the
# last finding widens the margin the next one needs, an eighth, a quarter, ... up to twice the most (or half the
# fewest) before; a finding resets it.
MADE_SLACK_FIRST, MADE_SLACK_MOST = 1 / 8, 1.0
RSS_GROWTH = 0.25  # growth since the last full step that asks for a look: a quarter...
RSS_MINIMUM = 64 << 20  # ...and at least this many bytes


class LightSignals:
    """The signals of light steps, and what full steps taught them (lines seen, nodes made per step)."""

    def __init__(self, where: Callable[[int | None], str]) -> None:
        self._where = where  # "file:line" of a site id
        self._backward_sites: set[int | None] = set()
        self._keeping_sites: set[int | None] = set()  # lines of retain_graph/create_graph backwards seen in full
        self._optimizer_sites: set[int | None] = set()
        self._eval_sites: set[int | None] = set()
        self._made: tuple[int, int] | None = None  # fewest and most nodes a step made so far
        self._made_slack = 0.0  # how far past them a count must lie to be a signal: earned by signals since a finding
        self._rss_base = 0  # resident memory at the last full step's end
        self._light_ends = 0
        self._old_roots: set[int] = set()  # sequence numbers of the old graphs' roots already signalled

    def backward(self, site: int | None, retain_graph: bool, create_graph: bool, roots: list[Any], first_seq: int) -> str | None:
        """Why a backward of a light step needs a closer look (None: it does not)."""
        if (retain_graph or create_graph) and site not in self._keeping_sites:
            return self.learn_backward(site, retain_graph, create_graph)
        for root in roots:
            if root._sequence_nr() < first_seq:
                return f"a backward at {self._where(site)} of a graph an earlier step made"
        if site not in self._backward_sites:
            self._backward_sites.add(site)
            return f"a backward at a line not seen before, {self._where(site)}"
        return None

    def learn_backward(self, site: int | None, retain_graph: bool, create_graph: bool) -> str | None:
        """A backward ran at ``site`` on a step seen in full detail; with ``retain_graph`` or ``create_graph`` at
        a line where none had, why the next steps need a look too (a retained graph is judged a step later)."""
        self._backward_sites.add(site)
        if (retain_graph or create_graph) and site not in self._keeping_sites:
            self._keeping_sites.add(site)
            return f"a {'retain_graph' if retain_graph else 'create_graph'}=True backward at {self._where(site)}"
        return None

    def optimizer(self, site: int | None) -> str | None:
        """Why an ``optimizer.step()`` at ``site`` needs a closer look (a line not seen before), or None."""
        if site in self._optimizer_sites:
            return None
        self._optimizer_sites.add(site)
        return f"an optimizer.step() at a line not seen before, {self._where(site)}"

    def evaluation(self, site: int | None) -> str | None:
        """Why a module switched to evaluation mode at ``site`` needs a closer look (a line not seen before),
        or None."""
        if site in self._eval_sites:
            return None
        self._eval_sites.add(site)
        return f"a new code path: a module switched to evaluation mode at {self._where(site)}"

    def step_made(self, step: int, nodes: int, learn: bool = False) -> str | None:
        """Step ``step`` made ``nodes`` autograd nodes: a new code path when no step before made as many (or as
        few), by more than the slack that earlier such signals earned (``learn``: a step seen in full detail,
        whose count is only learnt)."""
        made = self._made
        if made is None:
            self._made = (nodes, nodes)
            return None
        low, high = made
        if low <= nodes <= high:
            return None
        self._made = (min(low, nodes), max(high, nodes))
        slack = 1 + self._made_slack
        if learn or (low <= nodes * slack and nodes <= high * slack):  # (within the slack)
            return None
        self._made_slack = min(MADE_SLACK_MOST, max(MADE_SLACK_FIRST, 2 * self._made_slack))
        before = f"{low:,}" if low == high else f"{low:,} to {high:,}"
        return f"a new code path: step {step} made {nodes:,} autograd nodes ({before} before)"

    def found_something(self) -> None:
        """A finding was made: a step's node count is a signal again at any change (no slack)."""
        self._made_slack = 0.0

    def looks_at_held(self) -> bool:
        """Whether this light step's end is one that looks at what the frames hold (:meth:`held_graph`)."""
        return self._light_ends < CENSUS_AT[-1]

    def held_graph(
        self, start: FrameType | None, bound: int, step_of: Callable[[int], int], reported: set[str]
    ) -> str | None:
        """At one of the first light step ends: a tensor the user's frames name holds a graph made before
        ``bound`` (the node sequence number at which the step before this one started), not signalled before,
        whose holder no finding names (``reported``)."""
        self._light_ends += 1
        if self._light_ends not in CENSUS_AT:
            return None
        for name, tensor in tensors_in_user_frames(start):
            seq = tensor.grad_fn._sequence_nr()  # type: ignore[union-attr]  # (tensors with a graph only)
            if seq < bound and seq not in self._old_roots and name.split("[")[0] not in reported:
                self._old_roots.add(seq)
                return f"`{name}` holds a graph of step {step_of(seq)}"
        return None

    def full_step_ended(self, rss: int) -> None:
        """A step seen in full detail ended with ``rss`` bytes resident."""
        self._rss_base = rss

    def resident(self, rss: int) -> str | None:
        """A light step ended with ``rss`` bytes resident: grown too much since the last full step?"""
        if not self._rss_base:
            return None
        grown = rss - self._rss_base
        if grown < max(RSS_MINIMUM, RSS_GROWTH * self._rss_base):
            return None
        self._rss_base = rss
        return f"resident memory grew by {grown / 2**20:,.0f} MB since the last step seen in full detail"
