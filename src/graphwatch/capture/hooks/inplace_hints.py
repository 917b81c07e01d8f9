"""What graphwatch adds to torch's "modified by an inplace operation" error, after torch's own text.

One paragraph, the same whether the pack hook saw the tensor saved (a step seen in full detail:
:func:`~graphwatch.capture.hooks.saved.inplace_message`) or it is read from the graph still alive when the error is
raised (a step seen light: :mod:`graphwatch.capture.causes.light_errors`):

- the session's finding (:mod:`graphwatch.capture.causes.inplace` finds the cause): the line(s) that changed the
  tensor, or an ``optimizer.step()`` of this step that updated the saved parameter
  (:class:`~graphwatch.capture.hooks.optimizer.OptimizerSteps` notes every step the session saw);
- an optimizer step of a later step than the graph's (a graph carried across steps, whose own finding the
  session records), or any optimizer step without a session, named with its line;
- otherwise the line that saved it, and the out-of-place form to use.

Example::

    >>> import torch
    >>> from types import SimpleNamespace
    >>> from graphwatch.capture.recorder import Recorder
    >>> recorder = Recorder()
    >>> weight = torch.nn.Parameter(torch.ones(2))
    >>> optimizer = torch.optim.SGD([weight], lr=0.1)
    >>> recorder.optimizer_steps.stepped(optimizer, site=None, step=0)
    >>> handle = SimpleNamespace(storage=(weight.untyped_storage().data_ptr(), False), kind="parameter", step=0,
    ...                          site=None)
    >>> print(inplace_addition(recorder, handle, weight).strip())
    graphwatch: the tensor was saved at <unknown> (step 0). optimizer.step() at <unknown> updated this parameter ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ...errors import notify

if TYPE_CHECKING:
    from ...model import BackwardRecord, Trace
    from .optimizer import OptimizerSteps

_GRAPHWATCH_INPLACE = "\n\ngraphwatch: the tensor was saved at {where} (step {step}). {hint}"
_INPLACE_HINT = (
    "Something changed it in place after autograd saved it; use the out-of-place form "
    "(e.g. x = x.add(1) instead of x.add_(1)) or .clone() it first."
)


class HintRecorder(Protocol):
    """What the paragraph reads from the recorder (:class:`~graphwatch.capture.recorder.Recorder` is one)."""

    trace: Trace
    step: int
    backward: BackwardRecord | None
    optimizer_steps: OptimizerSteps

    @property
    def inplace_explainer(self) -> Callable[[Any, torch.Tensor], str | None] | None:
        """The session's explainer of a failed version check, if any."""


def inplace_addition(recorder: HintRecorder, handle: Any, tensor: torch.Tensor) -> str:
    """graphwatch's paragraph after torch's message about ``handle``'s saved tensor (``tensor``, as it is now),
    changed in place: the session's (an optimizer step of this step, or the line that changed it), else an
    optimizer step that did it, else the line that saved it."""
    update = optimizer_update(recorder, handle)
    reused = update is not None and handle.step < recorder.step  # a graph carried across steps: its own finding
    explained = _explained(recorder, handle, tensor) if not reused else None
    if explained:
        return f"\n\n{explained}"
    hint = _optimizer_hint(recorder, handle, update[1]) if update is not None else _INPLACE_HINT
    where = recorder.trace.where(handle.site)
    return _GRAPHWATCH_INPLACE.format(where=where, step=handle.step, hint=hint)


def _explained(recorder: HintRecorder, handle: Any, tensor: torch.Tensor) -> str | None:
    """The session's paragraph naming the line that changed the tensor (None: the plain hint)."""
    if recorder.inplace_explainer is None:
        return None
    try:
        return recorder.inplace_explainer(handle, tensor)
    except Exception as error:  # looking closer must never hide torch's error; the plain hint follows it
        notify(f"graphwatch: could not look into the in-place change ({error!r})", stacklevel=2)
        return None


def optimizer_update(recorder: HintRecorder, handle: Any) -> tuple[torch.optim.Optimizer, int | None] | None:
    """(the optimizer, the site of its ``step()``) that updated ``handle``'s saved parameter in place after
    its graph saved it; None when no optimizer step did."""
    if handle.storage is None or handle.kind != "parameter":
        return None
    return recorder.optimizer_steps.updating(handle.storage[0], since=handle.step)


def _optimizer_hint(recorder: HintRecorder, handle: Any, site: int | None) -> str:
    """Why a saved parameter's version moved: the ``optimizer.step()`` at ``site`` updated it."""
    where = recorder.trace.where(site)
    if handle.step < recorder.step:
        return (
            f"optimizer.step() at {where} updated this parameter in place after step {handle.step}'s "
            f"graph saved it, and step {recorder.step}'s backward runs into that graph again: a graph of an "
            f"earlier step is reused{_carried_name(recorder)}. Cut what carries it, so that each backward uses only "
            f"its own step's graph{_and_drop_retain(recorder, handle.step)}: a state fed into the next step (an "
            "RNN's hidden state) is detached at the start of each step, a value made once and reused (a regularizer "
            "computed before the loop) is made anew in each step: detached, it would no longer train what made it."
        )
    return (
        f"optimizer.step() at {where} updated this parameter in place after the graph saved it, and "
        "this backward ran after that step through the same graph. Run this backward before that "
        "optimizer step, or recompute the forward after the step (a GAN: the generator's loss on a fresh "
        "D(fake) made after D's step)."
    )


def _and_drop_retain(recorder: HintRecorder, step: int) -> str:
    """``, and drop retain_graph=True`` where a backward of ``step`` (whose graph was reused) or the running one
    passed it; nothing where none did."""
    trace = recorder.trace
    steps = [trace.steps[step]] if step < len(trace.steps) else []
    retained = any(trace.backwards[i].retain_graph for record in steps for i in record.backwards)
    running = recorder.backward is not None and recorder.backward.retain_graph
    return ", and drop retain_graph=True" if retained or running else ""


def _carried_name(recorder: HintRecorder) -> str:
    """`` (carried by `h`)``: the name of what carried the graph the running backward reached into, if known."""
    backward = recorder.backward
    if backward is None or not backward.crossings:
        return ""
    node = recorder.trace.nodes.get(backward.crossings[0][1])
    name = node.carried_as if node is not None else None
    return f" (carried by `{name}`)" if name else ""
