"""Findings for DistributedDataParallel's two reducer errors, each explained after torch's own text:

- ``ddp-ready-twice``: "Expected to mark a variable ready only once".  The finding names the parameter as
  DDP names it, the module that holds it and the lines of the forward that use that module; when those are
  reentrant ``checkpoint`` calls (each runs a backward of its own, so the parameter's hook fires once per
  call), the fix is ``use_reentrant=False`` on them.
- ``ddp-unused-parameters``: "Expected to have finished reduction in the prior iteration".  The finding names
  the parameters that got no gradient on this rank (torch gives their indices; graphwatch names them), the
  module that holds them and the forward's line that chose (or skipped) it, and the line that builds the
  wrapper.

Both fixes need judgement (is the branch meant? does the graph change between iterations?): words with the
lines, no patch.  The cause is read from the frames the error's traceback keeps (``capture/causes/ddp_frames.py``),
once DDP has raised: nothing runs on a step where nothing goes wrong.

Example::

    >>> from graphwatch.analysis.ddp_errors import parameters_text
    >>> parameters_text(["heads.0.weight", "heads.0.bias"])
    '`heads.0.weight` and `heads.0.bias`'
"""

from __future__ import annotations

from ..model import Finding, Remedy, Trace
from ..model.error_causes import DDPCause
from .evidence import describe, step_name

READY_TWICE_KIND = "ddp-ready-twice"
UNUSED_KIND = "ddp-unused-parameters"
_NAMED = 6  # parameters named in the message; the evidence keeps them all


def parameters_text(names: list[str]) -> str:
    """The parameters in backticks, joined for a sentence (the first few, then how many more)."""
    shown = [f"`{name}`" for name in names[:_NAMED]]
    if len(names) > _NAMED:
        shown.append(f"{len(names) - _NAMED} more")
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _lines(trace: Trace, sites: list[int]) -> str:
    return " and ".join(describe(trace.site(s)) for s in sites)


def ddp_finding(trace: Trace, cause: DDPCause, step: int) -> Finding:
    """The finding of DDP's reducer error ``cause``; its message follows torch's."""
    on_rank = f"on rank {cause.rank}, " if cause.rank is not None else ""
    model = f"`{cause.model}`" if cause.model else "the DistributedDataParallel model"
    what = parameters_text(cause.parameters) if cause.parameters else "a parameter"
    owner = f"`{cause.owner}`" if cause.owner else "the module"
    built = trace.site(cause.built_at)
    built_text = f" (built at {describe(built)})" if built is not None else ""
    uses = _lines(trace, cause.uses)
    used = f"`{cause.used_as}`" if cause.used_as else owner
    if cause.error == "ready-twice":
        kind = READY_TWICE_KIND
        text = f"graphwatch: {on_rank}{what} of {model}{built_text} got its gradient twice in one iteration"
        text += f": it belongs to {owner}" + (f", and the forward uses {used} at {uses}" if cause.uses else "") + "."
        if cause.reentrant:
            text += (" Each reentrant `checkpoint` runs a backward of its own, so DDP's hook of the parameter fires "
                     "once per call.")
            fix = (f"pass `use_reentrant=False` to the `checkpoint` calls at {_where(trace, cause.uses)} (one "
                   "backward then reaches the parameter, so its gradient is marked ready once)")
        else:
            fix = ("make every use of the parameter run in the forward of the DDP model and reach the loss through "
                   "one backward per iteration; if the model runs the same graph every iteration, build it with "
                   f"`static_graph=True`{' at ' + built.where if built is not None else ''}")
        why = "how the model is meant to reuse the parameter needs your judgement"
    else:
        kind = UNUSED_KIND
        text = (f"graphwatch: {on_rank}{what} of {model}{built_text} got no gradient in the iteration before "
                f"{step_name(step)}: this rank's loss did not use {owner}")
        text += (f"; the forward chooses from {used} at {uses}" if cause.uses else "") + "."
        if cause.find_unused:
            fix = ("the model was built with `find_unused_parameters=True`, so DDP could not find the outputs that "
                   "reach these parameters: make every output of the forward take part in the loss")
        else:
            fix = ("if leaving them out on some ranks is meant, build the model with `find_unused_parameters=True`"
                   f"{' at ' + built.where if built is not None else ''} (DDP then walks the graph each iteration "
                   "to mark them); if not, make every rank's loss use them"
                   + (f" (the choice at {_where(trace, cause.uses)})" if cause.uses else ""))
        why = "whether every rank is meant to train these parameters needs your judgement"
    text += f"\nFix (no patch: {why}): {fix}."
    sites = [s for s in (*cause.uses, cause.built_at, cause.call_at) if s is not None]
    where = list(dict.fromkeys(trace.where(s) for s in sites))
    evidence = {"key": f"{cause.owner or '?'} @ {where[0] if where else '?'}", "sites": where, "steps": [step],
                "rank": cause.rank, "parameters": list(cause.parameters), "owner": cause.owner,
                "built_at": built.where if built is not None else None, "find_unused_parameters": cause.find_unused}
    return Finding(kind, "error", step, text, fix, evidence, remedies=[Remedy(fix, [], why)])


def _where(trace: Trace, sites: list[int]) -> str:
    return " and ".join(trace.where(s) for s in sites)
