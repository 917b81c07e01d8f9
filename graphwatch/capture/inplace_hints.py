"""What graphwatch adds to torch's "modified by an inplace operation" error, after torch's own text.

One paragraph, the same whether the pack hook saw the tensor saved (a step seen in full detail:
:func:`~graphwatch.capture.saved.inplace_message`) or it is read from the graph still alive when the error is
raised (a step seen light: :mod:`graphwatch.capture.light_errors`):

- an ``optimizer.step()`` that updated the saved parameter after its graph saved it, named with its line
  (:class:`OptimizerSteps` notes every step the session saw);
- otherwise the line that changed the tensor, where the session finds it (:mod:`graphwatch.capture.inplace`);
- otherwise the line that saved it, and the out-of-place form to use.

Example::

    >>> import torch
    >>> from graphwatch.capture.inplace_hints import OptimizerSteps
    >>> weight = torch.nn.Parameter(torch.ones(2))
    >>> optimizer = torch.optim.SGD([weight], lr=0.1)
    >>> steps = OptimizerSteps()
    >>> steps.stepped(optimizer, site=None, step=3)
    >>> steps.parameters() == {id(weight)}
    True
    >>> steps.updating(weight.untyped_storage().data_ptr(), since=2) == (optimizer, None)
    True
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .recorder import Recorder

_GRAPHWATCH_INPLACE = "\n\ngraphwatch: the tensor was saved at {where} (step {step}). {hint}"
_INPLACE_HINT = (
    "Something changed it in place after autograd saved it; use the out-of-place form "
    "(e.g. x = x.add(1) instead of x.add_(1)) or .clone() it first."
)


class OptimizerSteps:
    """The optimizer steps a session saw: each optimizer (weakly), the line of its last ``step()`` and the step it
    ran in.  An in-place update of parameters that a graph saved is what an ``optimizer.step()`` between a
    forward and its backward does."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[weakref.ref, int | None, int]] = {}  # id(optimizer) -> (ref, site, step)

    def stepped(self, optimizer: torch.optim.Optimizer, site: int | None, step: int) -> None:
        """``optimizer.step()`` at ``site`` just updated its parameters in place, in step ``step``."""
        known = self._last.get(id(optimizer))
        ref = known[0] if known is not None and known[0]() is optimizer else weakref.ref(optimizer)
        self._last[id(optimizer)] = (ref, site, step)

    def parameters(self, optimizers: list[torch.optim.Optimizer] | None = None) -> set[int]:
        """``id()`` of every parameter of ``optimizers`` (default: of those that stepped so far)."""
        if optimizers is None:
            optimizers = [o for ref, _, _ in self._last.values() if (o := ref()) is not None]
        return {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}

    def updating(self, data_ptr: int, since: int) -> tuple[torch.optim.Optimizer, int | None] | None:
        """(the optimizer, the site of its last ``step()``) of an optimizer holding the parameter whose storage
        starts at ``data_ptr`` that stepped in step ``since`` or later (None: none did)."""
        for ref, site, step in self._last.values():
            optimizer = ref()
            if optimizer is None or step < since:
                continue
            if any(p.data_ptr() == data_ptr for g in optimizer.param_groups for p in g["params"]):
                return optimizer, site
        return None


def inplace_addition(recorder: Recorder, handle: Any, tensor: torch.Tensor) -> str:
    """graphwatch's paragraph after torch's message about ``handle``'s saved tensor (``tensor``, as it is now),
    changed in place: an optimizer step that did it, the line that did it, or the line that saved it."""
    hint = _optimizer_hint(recorder, handle)
    explained = _explained(recorder, handle, tensor) if hint is None else None
    if explained:
        return f"\n\n{explained}"
    where = recorder.trace.where(handle.site)
    return _GRAPHWATCH_INPLACE.format(where=where, step=handle.step, hint=hint or _INPLACE_HINT)


def _explained(recorder: Recorder, handle: Any, tensor: torch.Tensor) -> str | None:
    """The session's paragraph naming the line that changed the tensor (None: the plain hint)."""
    if recorder.inplace_explainer is None:
        return None
    try:
        return recorder.inplace_explainer(handle, tensor)
    except Exception:  # looking closer must never hide torch's error
        return None


def _optimizer_hint(recorder: Recorder, handle: Any) -> str | None:
    """Why a saved parameter's version moved, when an ``optimizer.step()`` did it; else None."""
    if handle.storage is None or handle.kind != "parameter":
        return None
    found = recorder.optimizer_steps.updating(handle.storage[0], since=handle.step)
    if found is None:
        return None
    where = recorder.trace.where(found[1])
    if handle.step < recorder.step:
        return (
            f"optimizer.step() at {where} updated this parameter in place after step {handle.step}'s "
            f"graph saved it, and step {recorder.step}'s backward runs into that graph again: a graph of an "
            f"earlier step is reused{_carried_name(recorder)}. Detach what carries it at the start of each step "
            "(and drop retain_graph=True), so that each backward uses only its own step's graph."
        )
    return (
        f"optimizer.step() at {where} updated this parameter in place after the graph saved it, and "
        "this backward ran after that step through the same graph. Run this backward before that "
        "optimizer step, or recompute the forward after the step (a GAN: the generator's loss on a fresh "
        "D(fake) made after D's step)."
    )


def _carried_name(recorder: Recorder) -> str:
    """`` (carried by `h`)``: the name of what carried the graph the running backward reached into, if known."""
    backward = recorder.backward
    if backward is None or not backward.crossings:
        return ""
    node = recorder.trace.nodes.get(backward.crossings[0][1])
    name = node.carried_as if node is not None else None
    return f" (carried by `{name}`)" if name else ""
