"""The ``loss-without-graph`` finding when the cut had left the stack before the backward ran (issue 38): the
``@torch.no_grad()`` function that had returned (its ``def`` and the call that ran it), the ``with
torch.no_grad():`` block that had been left (and the line run in it), the op that makes no graph (its name and
line), or the module whose parameters all require no grad (the ``requires_grad_(False)`` line, and which of
the optimizer's parameters are frozen).  Which part should train is the user's judgement: each fix is said in
words, with the lines, and patches nothing.

Example::

    >>> from graphwatch.analysis.graph_cuts import op_fix
    >>> op_fix("`.detach()`", "train.py:9").startswith("compute the loss from the tensor itself")
    True
"""

from __future__ import annotations

from ..model import Finding, Remedy, Trace
from ..model.causes import NoGraphCause
from .evidence import describe

_COPIES = ("`.detach()`", "`.data`", "`.item()`", "`.numpy()`", "`.tolist()`", "tensor()`", "from_numpy()`",
           "as_tensor()`", "array()`", "asarray()`", "Tensor()`")  # fmt: skip
_LISTED = 6  # frozen parameters named, the rest counted


def op_fix(op: str, where: str) -> str:
    """The fix, in words, for the ``op`` (as the cause spells it) that made a value without a graph at ``where``."""
    if any(op.endswith(copy) for copy in _COPIES):
        return (f"compute the loss from the tensor itself, without {op}, at {where} (keep the detached copy or "
                "the number only for logging and metrics)")
    return (f"a loss needs a differentiable function of the model's output: {op} at {where} gives indices, "
            "booleans or integers, which have no gradient; train on the scores themselves (e.g. "
            "`F.cross_entropy(logits, y)`, `F.binary_cross_entropy_with_logits(pred, y)`) and keep "
            f"{op} for metrics")


def _frozen_list(cause: NoGraphCause) -> str:
    listed = ", ".join(f"`{name}`" for name in cause.frozen[:_LISTED])
    more = len(cause.frozen) - _LISTED
    return listed + (f" and {more} more" if more > 0 else "")


def cut_message(trace: Trace, cause: NoGraphCause) -> tuple[str, str]:
    """(message, fix) of a loss whose graph was cut off the stack, as the cause says how."""
    backward, cut, call = trace.site(cause.backward_at), trace.site(cause.cut_at), trace.site(cause.call_at)
    block, loop = trace.site(cause.block_at), trace.site(cause.loop_at)
    head = f"graphwatch: the tensor backwarded at {describe(backward)}"
    cut_where = cut.where if cut else "?"
    if cause.kind == "decorator":
        text = (f"{head} was made by `{cause.function}`, whose `def` at {describe(cut)} is decorated with "
                f"`@torch.no_grad()` ({block.where if block else '?'}); the call at {describe(call)} ran it, and "
                "it had returned when the backward ran: nothing it computes has a graph.")
        fix = (f"if `{cause.function}` makes a loss to train on, remove `@torch.no_grad()` from its `def` at "
               f"{cut_where}, or call it at {call.where if call else '?'} under `with torch.enable_grad():`; "
               "keep the decorator on what must not train (evaluation)")
    elif cause.kind == "with":
        text = (f"{head} was made from {describe(cut)}, run inside the `with torch.no_grad():` block at "
                f"{describe(block)}, which had been left when the backward ran: nothing computed in the block "
                "has a graph.")
        fix = (f"compute what the loss needs (the line at {cut_where}) outside the block at "
               f"{block.where if block else '?'}, or keep it there only if that part must not train")
    elif cause.kind == "op":
        text = (f"{head} was computed from {cause.op} at {describe(cut)}: its result has no graph, so nothing "
                "before it gets a gradient.")
        fix = op_fix(cause.op or "the op", cut_where)
    else:
        text = f"{head} was computed by `{cause.function}`" + (f" at {describe(call)}" if call else "")
        text += ", none of whose parameters requires grad"
        if cut is not None:
            text += (f": the loop at {describe(loop)} sets `requires_grad = False` at {describe(cut)}" if loop
                     else f": they were frozen at {describe(cut)}")
        if cause.optimizer:
            text += (f"; the optimizer `{cause.optimizer}` owns {cause.owned} parameters, {len(cause.frozen)} of "
                     f"which require no grad ({_frozen_list(cause)})")
        text += "."
        fix = (f"decide which part should train: freeze only what must stay fixed (the line at {cut_where}), "
               f"let the parameters `{cause.function}` should learn require grad, and give "
               f"`{cause.optimizer or 'the optimizer'}` only parameters that train")
    return f"{text}\nFix: {fix}", fix


def cut_finding(trace: Trace, cause: NoGraphCause, step: int, kind: str) -> Finding:
    """The ``kind`` finding of a loss whose graph was cut off the stack; its lines cited, the cut's first."""
    message, fix = cut_message(trace, cause)
    sites = (cause.cut_at, cause.block_at, cause.call_at, cause.loop_at, cause.backward_at)
    where = list(dict.fromkeys(trace.where(s) for s in sites if s is not None))
    backward = trace.site(cause.backward_at)
    evidence = {"key": where[0] if where else "?", "sites": where, "steps": [step],
                "block_at": trace.where(cause.block_at) if cause.block_at is not None else None,
                "block": cause.kind, "op": cause.op, "optimizer": cause.optimizer, "frozen": list(cause.frozen)}
    remedy = Remedy(fix, [], f"the backward at {backward.where if backward else '?'} got a loss without a graph")
    return Finding(kind, "error", step, message, fix, evidence, remedies=[remedy])
