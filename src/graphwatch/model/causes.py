"""What graphwatch saw about the cause of a backward through a freed graph, as plain data.

At the error, while the graphs and the user's frames are still there, the
capture side (``capture/causes/second_backward.py``) looks at which optimizer steps after each
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


@dataclass(slots=True)
class InplaceCause:
    """What graphwatch found about a saved tensor changed in place (torch's "modified by an inplace
    operation" error): the line that changed it, and for a module built with ``inplace=True`` the line
    that built it.  Sites are CallSite ids; None where it could not be told."""

    saved_at: int | None  # the line whose op saved the tensor
    saved_step: int
    changed_at: int | None = None  # the line that ran the in-place operation
    found_by: str = ""  # "node": the in-place op's node; "save": a later save of the changed tensor;
    # "source": the in-place statements between the lines that ran before and after it; "optimizer": an
    # optimizer.step() of this step (``optimizer_at``)
    op: str | None = None  # the in-place op's node (``CopySlices``, ``ReluBackward0``)
    target: str | None = None  # the tensor's name on that line, for the edit (empty for ``inplace=True``)
    module: str | None = None  # the module that did it, as its owner names it (``self.drop``)
    module_type: str | None = None  # its class (``Dropout``)
    built_at: int | None = None  # the line that built that module with ``inplace=True``
    note: str | None = None  # why the module's line is not named
    safe: bool = False  # the out-of-place form keeps what the program computes (not a view's base to change)
    unsafe: str = ""  # why not, when the line is named: "view" (the changed tensor views another), "alias" (a
    # later line reads it through another name), "helper" (a function changed a tensor it was given: its caller's), "outside"
    # (a tensor that required no grad, which graphwatch cannot tell the function made: an input, data, a buffer)
    changed_also: list[int] = field(default_factory=list)  # the later lines that changed it too (same name)
    called_at: int | None = None  # the caller's line that ran the function holding ``changed_at`` (a helper)
    loop_at: int | None = None  # the loop whose steps write the tensor from its own earlier slices (a recurrence)
    optimizer_at: int | None = None  # the optimizer.step() of this step that updated the saved parameter
    backward_at: int | None = None  # the backward that needed the saved tensor
    update: bool = False  # the saved tensor is a parameter (or a view of one): an update changed it, as training does


@dataclass(slots=True)
class NoGraphCause:
    """A loss backwarded without a graph ("element 0 of tensors does not require grad"): the ``no_grad``
    block or decorator it was made under, from the frames of the failing backward; else, where the graph was cut
    on the loss's way when that has left the stack (``capture/causes/graph_cuts.py``)."""

    backward_at: int | None  # the failing backward's line
    block_at: int | None = None  # the ``with torch.no_grad():`` line, or the ``@torch.no_grad()`` decorator's
    kind: str = ""  # "with", "decorator", "op", "frozen" or "" (not found)
    function: str | None = None  # the function the block or decorator belongs to
    first: int | None = None  # for ``enable-grad``: the first and last line of the statements to wrap
    last: int | None = None
    grad_enabled_outside: bool = True
    cut_at: int | None = None  # off the stack: the line that made the loss's input without a graph (the op's,
    # the one run in the block), the decorated function's ``def``, or the ``requires_grad_(False)`` call
    op: str | None = None  # the ops of that line that make no graph: "`.argmax()`", "`>`", "`.detach()`"
    call_at: int | None = None  # the call that ran the decorated function (or the frozen module)
    loop_at: int | None = None  # the loop that set ``requires_grad = False`` parameter by parameter
    optimizer: str | None = None  # the optimizer that owns the parameters that require no grad
    frozen: list[str] = field(default_factory=list)  # those parameters, as the frames name them
    owned: int = 0  # how many parameters that optimizer owns
