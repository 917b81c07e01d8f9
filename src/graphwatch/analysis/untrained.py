"""Parameters an optimizer steps but never trains: an ``untrained-parameters`` finding at the session's end.

A GAN whose generator step detaches the generator's output (a "fix" for
torch's backward-twice error) runs without error and never trains the
generator: its optimizer steps every iteration and none of its parameters ever
holds a gradient.  The session's :class:`~graphwatch.capture.causes.parameters.ParameterLedger`
counts, per parameter, its optimizer's steps at which it required a gradient
and held none (``ParameterRecord.bare_steps``) until a gradient first arrived
(``first_held_step``); a parameter with at least :data:`MIN_STEPS` such steps
and no gradient ever is *starved*.  Silent on a frozen parameter
(``requires_grad=False``), on one that gets gradients on some steps only, on a
gradient of zeros (a gradient arrived), and on short runs.  One finding per
optimizer names it and its starved parameters, and says in words what can cut
them off (no patch: which part should train takes judgement): the line of the ``.detach()``, ``.data`` or
``torch.no_grad()`` that cuts them off from the loss backwarded before the step, where the capture found one
(:mod:`graphwatch.capture.causes.parameter_cuts`), else in general words.

Example::

    >>> from graphwatch.model import OptimizerRecord, ParameterRecord, Trace
    >>> trace = Trace()
    >>> trace.optimizers = [OptimizerRecord(index=0, kind="Adam", name="opt_G", first_step=0, steps=50)]
    >>> trace.parameters = [ParameterRecord(optimizer=0, group=0, index=i, shape=(4,), name=f"G.fc.{n}",
    ...                                     bare_steps=50) for i, n in enumerate(("weight", "bias"))]
    >>> [finding.evidence["parameters_text"] for finding in untrained_parameters(trace)]
    ['all 2 parameters of G.fc']
"""

from __future__ import annotations

from ..model import Finding, OptimizerRecord, ParameterRecord, Remedy, Trace
from .evidence import counted, describe, optimizer_name
from .findings import make_finding, renderer

MIN_STEPS = 10  # steps of its optimizer at which a parameter required a gradient and held none
LISTED = 4  # names (or modules) a finding lists before "and N more"


def untrained_parameters(trace: Trace) -> list[Finding]:
    """One finding per optimizer that stepped parameters requiring a gradient that never held one."""
    findings = []
    for optimizer in trace.optimizers:
        owned = [p for p in trace.parameters if p.optimizer == optimizer.index]
        starved = [p for p in owned if p.first_held_step is None and p.bare_steps >= MIN_STEPS]
        if starved:
            findings.append(_finding(trace, optimizer, owned, starved))
    return findings


def _finding(trace: Trace, optimizer: OptimizerRecord, owned: list, starved: list) -> Finding:
    site, cut, block = trace.site(optimizer.site), trace.site(optimizer.cut_at), trace.site(optimizer.cut_block_at)
    name = optimizer.name or (optimizer_name(site.source) if site is not None and site.source else "")
    others = [o.label for o in trace.optimizers if o is not optimizer and _trains(trace, o)]
    evidence = {
        "key": f"untrained:{optimizer.index}:{optimizer.kind}:{name}",
        "sites": [s.where for s in (cut, block, site) if s is not None],
        "steps": [optimizer.first_step or 0],
        "optimizer": name or f"optimizer {optimizer.index}",
        "optimizer_kind": optimizer.kind,
        "optimizer_at": site.where if site is not None else None,
        "optimizer_steps": optimizer.steps,
        "bare_steps": min(p.bare_steps for p in starved),
        "parameters": len(starved),
        "owned": len(owned),
        "names": [p.label for p in starved],
        "parameters_text": _summary(starved, owned),
        "others_train": others,
        # a backward reached each of them at some of those steps: their gradients were reset before the step
        "reset_after_backward": all(p.reset_steps for p in starved),
        # the line that cuts them off from the loss backwarded before the step (that loss's graph reaches none)
        "cut": describe(cut) if cut is not None else None,
        "cut_at": cut.where if cut is not None else None,
        "cut_op": optimizer.cut_op,
        "cut_what": optimizer.cut_what,
        "cut_block": describe(block) if block is not None else None,
    }
    last = max(len(trace.steps) - 1, 0)
    return make_finding("untrained-parameters", "warning", last, evidence, [_advice(evidence)])


def _trains(trace: Trace, optimizer: OptimizerRecord) -> bool:
    return any(p.first_held_step is not None for p in trace.parameters if p.optimizer == optimizer.index)


def _module(name: str) -> str:
    """``G.fc`` for ``G.fc.weight``; "" for a name without a module."""
    return name.rpartition(".")[0]


def _common_module(names: list[str]) -> str:
    """The longest dotted prefix every name shares (``G`` for ``G.fc.weight`` and ``G.out.bias``), or ""."""
    parts = [name.split(".")[:-1] for name in names]
    common: list[str] = []
    for column in zip(*parts):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return ".".join(common)


def _summary(starved: list[ParameterRecord], owned: list[ParameterRecord]) -> str:
    """The starved parameters as the user's frames name them: a whole optimizer or module in a few words."""
    if len(starved) == len(owned) > 1:
        module = _common_module([p.name for p in owned]) if all(p.name for p in owned) else ""
        return f"all {counted(len(owned), 'parameter')} " + (f"of {module}" if module else "it owns")
    groups: dict[str, list[ParameterRecord]] = {}
    for param in starved:
        groups.setdefault(_module(param.name), []).append(param)
    parts = []
    for module, group in groups.items():
        whole = module and len(group) > 1 and len(group) == sum(_module(p.name) == module for p in owned)
        parts += [f"all {counted(len(group), 'parameter')} of {module}"] if whole else [p.label for p in group]
    shown = ", ".join(parts[:LISTED])
    return shown + (f" and {len(parts) - LISTED} more" if len(parts) > LISTED else "")


def _advice(ev: dict) -> Remedy:
    """Words, never an edit: which part should train takes judgement (and where a ``zero_grad()`` goes, whose
    line graphwatch does not see)."""
    if ev.get("cut"):
        if ev.get("cut_block"):
            where = f"compute `{ev['cut_what']}` at {ev['cut_at']} outside the `with torch.no_grad():` block"
        else:
            where = f"drop the {ev['cut_op']} at {ev['cut_at']}, on the way from them to that loss"
        return Remedy(
            f"if `{ev['optimizer']}` is meant to train {ev['parameters_text']} with the loss whose backward runs "
            f"before `{ev['optimizer']}.step()`, {where} (a GAN detaches the generator's output for the "
            "discriminator's loss only, never at the generator's step); if they are meant to stay fixed, call "
            f"`requires_grad_(False)` on them or leave them out of `{ev['optimizer']}`"
        )
    if ev.get("reset_after_backward"):
        return Remedy(
            f"find what resets the gradients of {ev['parameters_text']} between the backward and "
            f"`{ev['optimizer']}.step()`, most likely `{ev['optimizer']}.zero_grad()` (or the model's) called after "
            "the backward: call it before the backward, or after the step"
        )
    return Remedy(
        f"find what cuts {ev['parameters_text']} off from the loss whose backward runs before "
        f"`{ev['optimizer']}.step()`: a `.detach()`, `.data` or `torch.no_grad()` between them and that loss "
        "(a GAN detaches the generator's output for the discriminator's loss only, never at the generator's step), "
        "or a module the forward never calls; if they are meant to stay fixed, call `requires_grad_(False)` on "
        f"them or leave them out of `{ev['optimizer']}`"
    )


@renderer("untrained-parameters")
def _render_untrained(ev: dict) -> str:
    at = f" at {ev['optimizer_at']}" if ev["optimizer_at"] else ""
    some = ev["parameters"] < ev["owned"]
    ran = (f"`{ev['optimizer']}.step()`{at} ({ev['optimizer_kind']}) ran {counted(ev['optimizer_steps'], 'time')}, "
           f"but {ev['parameters_text']} never held a gradient at any of them (at least {ev['bare_steps']} of those "
           "steps while requiring one)")
    if ev.get("cut"):
        under = f", run under the `with torch.no_grad():` at {ev['cut_block']}," if ev.get("cut_block") else ""
        op = "statement computing " if ev.get("cut_block") else f"{ev['cut_op']} of "
        return (f"{ran}: the statement at {ev['cut']}{under} cuts them off from the loss whose backward runs "
                f"before `{ev['optimizer']}.step()` (the {op}`{ev['cut_what']}` on their way to that loss, whose "
                "graph reaches none of them), so the optimizer never changes them")
    if ev.get("reset_after_backward"):
        return (f"{ran}, although a backward reached them before some of those steps: something between the "
                "backward and the step reset their gradients, most likely a `zero_grad()` called after the backward "
                "instead of before it, so the optimizer never changes them")
    if some:
        cause = ("it trains the others, so these are most likely in a module the forward never calls, or one whose "
                 "output is cut from the loss by `.detach()`, `.data` or `torch.no_grad()`")  # fmt: skip
    else:
        trained = f" while {', '.join(ev['others_train'])} trains" if ev["others_train"] else ""
        cause = (f"it trains nothing{trained}: the network it owns is cut off from the loss, most likely by a "
                 "`.detach()`, `.data` or `torch.no_grad()` between its output and that loss, or it is never called")  # fmt: skip
    return f"{ran}: no backward reached them, so the optimizer never changes them; {cause}"
