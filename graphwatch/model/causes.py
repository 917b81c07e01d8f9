"""What graphwatch saw about the cause of a backward through a freed graph, as plain data.

At the error, while the graphs and the user's frames are still there, the
capture side (``capture/causes.py``) looks at which optimizer steps after each
of the two backwards, which parameters each owns, where each loss reaches
parameters its optimizer does not own, what the shared tensor is and what made
it.  It hands this to the analysis as a :class:`BackwardCause`; the analysis
makes the finding's remedies from it (``analysis/explain.py``).

Example::

    >>> from graphwatch.model.causes import BackwardCause, Cut
    >>> cut = Cut(backward=1, name="fake", used_at=4, made_at=2, optimizer="optimizerD", owner="optimizerG")
    >>> BackwardCause(cuts=[cut]).cuts[0].name
    'fake'
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Cut:
    """A tensor one backward's loss reaches but must not: made from parameters that the optimizer stepping
    after that backward does not own.  The fix is ``name.detach()`` on the line where that loss uses it."""

    backward: int  # BackwardRecord id of the backward whose loss uses it
    name: str | None  # as the line using it spells it (None: the line does not name it)
    used_at: int | None  # CallSite id of the line, in the function that runs the backward, that uses it
    made_at: int | None  # CallSite id of the line that made it, in that function where it was made there
    optimizer: str  # the optimizer that steps after that backward
    owner: str | None  # the optimizer that owns the parameters it was made from


@dataclass(slots=True)
class BackwardCause:
    """The facts the remedies of a backward through a freed graph are made from (names as the user's code
    spells them; sites are CallSite ids).  Unknown facts are None / empty: no remedy rests on them."""

    # backward id -> the optimizer that steps after it ("" when none could be told)
    optimizers: dict[int, str] = field(default_factory=dict)
    optimizers_seen: list[str] = field(default_factory=list)  # every optimizer found (stepped, or in the frames)
    stepped_between: list[str] = field(default_factory=list)  # optimizers that stepped between the two backwards
    cuts: list[Cut] = field(default_factory=list)
    # the tensor both backwards reach (made before the freeing backward ran), as the code names it
    shared: str | None = None
    shared_at: int | None = None  # CallSite id of the line that assigns it (a line that ran)
    # who owns the parameters the shared tensor was made from: "nobody" (a constant: none is trained),
    # "one" (the optimizer both backwards serve), "other" (another optimizer), None: not known
    shared_owner: str | None = None
    # the one optimizer that owns every parameter both backwards reach, with no step of it between them:
    # only then are summing the losses or retain_graph=True offered
    one_owner: str | None = None
    owned_reached: int = 0  # parameters both backwards reach, all owned by ``one_owner``
    grad_result: str | None = None  # the name of an autograd.grad's result that the failing loss is made from
