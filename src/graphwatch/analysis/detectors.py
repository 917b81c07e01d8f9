"""Detectors: pure functions from a finished step's records to findings.

``step_findings`` runs at each step end on that step's records (and the trace
so far); :func:`graphwatch.analysis.session_findings` runs once at the end.
Repeats of one problem merge into one finding (see :mod:`.findings`).

Example::

    >>> from graphwatch.model import StepRecord, Trace
    >>> from graphwatch.analysis import step_findings
    >>> step_findings(Trace(), StepRecord(index=0, source="optimizer"))
    []
"""

from __future__ import annotations

from ..model import BackwardRecord, CallSite, Edit, Finding, NodeRecord, Remedy, StepRecord, Trace
from .carried_fixes import carried_detach, carried_shape, crossing_carriers, remedies_for_all, use_in_step
from .evidence import (
    backwards_of,
    carrier_line,
    counted,
    describe,
    describe_site,
    human_bytes,
    made_when,
    optimizer_name,
    step_name,
    use_line,
)
from .explain import is_backward_twice
from .findings import make_finding, renderer
from .leaks import graph_kept_alive
from .retained import retained_graph

# .codemods (LibCST) is imported inside the functions that use it: not at `import graphwatch` (test_import_cost.py)

FINDING_KINDS = (
    "backward-through-freed-graph",
    "graph-carried-across-steps",
    "retained-graph",
    "graph-kept-alive",
    "memory-growth",
    "missing-zero-grad",
    "modified-in-place",  # torch's in-place error, explained (analysis/torch_errors.py)
    "loss-without-graph",  # torch's "does not require grad" error, explained (analysis/torch_errors.py)
    "non-scalar-backward",  # torch's "only for scalar outputs" error, explained (analysis/torch_errors.py)
    "unused-grad-input",  # torch's "not have been used in the graph" error of autograd.grad, explained (same)
    "leaf-modified-in-place",  # torch's "a leaf Variable ... in-place operation" error, explained (same)
    "ddp-ready-twice",  # DDP's "Expected to mark a variable ready only once", explained (analysis/ddp_errors.py)
    "ddp-unused-parameters",  # DDP's "Expected to have finished reduction ...", explained (same)
    "untrained-parameters",  # an optimizer steps parameters no backward ever reaches (analysis/untrained.py)
)
# Kinds that mean a graph outlives the step that made it: a strict session fails on them.
LEAK_KINDS = frozenset({"graph-carried-across-steps", "retained-graph", "graph-kept-alive", "memory-growth"})

__all__ = ["FINDING_KINDS", "LEAK_KINDS", "carried_across_steps", "loops_back", "missing_zero_grad", "step_findings"]


def loops_back(trace: Trace, backward: BackwardRecord) -> bool:
    """True if the earlier-step nodes ``backward`` reached were made after a backward on the same line.

    That is a training loop coming round with a graph from its previous
    iteration (an RNN state, a cached tensor); two different backwards
    sharing one forward across an optimizer step (a GAN's D and G steps) is not.
    """
    earlier = [s for s in backward.earlier_steps if s < backward.step]
    if not earlier:
        return False
    where, first = trace.where(backward.site), min(earlier)
    for index in range(backward.id - 1, -1, -1):
        earlier_backward = trace.backwards[index]
        if earlier_backward.step < first:
            return False
        if earlier_backward.step < backward.step and trace.where(earlier_backward.site) == where:
            return True
    return False


def carried_across_steps(trace: Trace, step: StepRecord) -> list[Finding]:
    """A backward of this step ran through nodes that a backward of an earlier iteration already ran through."""
    findings = []
    for bw in backwards_of(trace, step):
        if not bw.earlier_nodes_reached or not loops_back(trace, bw):
            continue
        pairs = [(trace.nodes.get(p), trace.nodes.get(c)) for p, c in bw.crossings]
        user, carrier = next(((p, c) for p, c in pairs if c is not None), (None, None))
        site, name = carrier_line(trace, carrier) if carrier else (None, None)
        made = trace.site(carrier.site) if carrier and not carrier.site_inferred else None
        earliest = min(s for s in bw.earlier_steps if s < bw.step)
        used = use_line(trace, user, name)
        shape = carried_shape(trace, carrier, bw) if carrier is not None else "cached"
        carriers = crossing_carriers(trace, bw, carrier) if carrier is not None else []
        also = [_carried_by(trace, other) for other in carriers[1:]]  # (each named: its fix is part of this one's)
        lines = (site, used, use_in_step(trace, user, bw), trace.site(bw.site))
        evidence = {
            "key": site.where if site else trace.where(bw.site),
            "sites": list(dict.fromkeys([*(w.where for w in lines if w), *(o["where"] for o in also if o["where"])])),
            "steps": [bw.step],
            "backward": describe_site(trace, bw.site),
            "carrier": name,
            "detach": carried_detach(trace, carrier, bw) if carrier is not None else None,  # as its fix writes it
            "made_at": describe(made) if made is not None and site is not None and made.where != site.where else None,
            "carrier_at": describe(site) if site else None,
            "carrier_where": site.where if site else None,
            "carrier_step": carrier.step if carrier else earliest,
            # "before the loop at train.py:12" for a tensor made by a set-up line before the loop, else "in step 3"
            "carrier_made": made_when(trace, carrier.step, site, trace.site(bw.site)) if carrier else None,
            "used_at": describe(used) if used and used is not site else None,
            "pattern": shape if shape in ("recurrent", "parameters") else "cached",
            "constant": shape == "constant",
            "per_step": [[bw.step, bw.earlier_nodes_reached, bw.nodes_reached, round(bw.seconds, 6), earliest]],
            "failed": bw.error is not None,
            "failed_because": _failure_cause(trace, bw, earliest) if bw.error is not None else None,
            "bytes": sum(b for s, b in step.saved_alive_by_step.items() if s < step.index),
            "also_carried": also,
        }
        severity = "error" if bw.error else "warning"
        if carrier is not None:
            remedies = remedies_for_all(trace, carriers, bw, used.where if used is not None else None)
        else:
            remedies = [Remedy("detach the tensor the step carries over at the start of each step")]
        findings.append(make_finding("graph-carried-across-steps", severity, bw.step, evidence, remedies))
    return findings


def _carried_by(trace: Trace, carrier: NodeRecord) -> dict:
    """Another value that carries an earlier step's graph into the same backward: its name and line."""
    site, name = carrier_line(trace, carrier)
    return {"name": name, "at": describe(site) if site is not None else None, "where": site.where if site else None}


_FREED = "an earlier step's backward had freed that graph"
_INPLACE_ERROR = "modified by an inplace operation"  # torch's in-place error, which graphwatch's paragraph follows


def _failure_cause(trace: Trace, backward: BackwardRecord, earliest: int) -> str:
    """Why ``backward``, run into the graph of step ``earliest``, failed, as its error's paragraph names it: an
    ``optimizer.step()`` since that step that updated the parameters the graph saved (the first one, as the
    paragraph finds it), a tensor changed in place, or the graph freed by an earlier backward."""
    error = backward.error or ""
    if _INPLACE_ERROR not in error:
        return _FREED if is_backward_twice(RuntimeError(error)) else "of the error it raised"
    stepped = next((s.optimizer_site for s in trace.steps[earliest : backward.step] if s.optimizer_site is not None), None)
    if stepped is None:
        return "a tensor that graph had saved was changed in place since"
    return f"optimizer.step() at {describe_site(trace, stepped)} updated in place the parameters that graph had saved"


def _share(row: list) -> str:
    step, earlier, total, seconds = row[:4]
    share = earlier / max(total, 1)
    return (
        f"step {step}: {earlier} of its {counted(total, 'node')} ({share:.0%}, about {share * seconds * 1e3:.2f} ms "
        f"of {seconds * 1e3:.2f} ms)"
    )


@renderer("graph-carried-across-steps")
def _render_carried(ev: dict) -> str:
    name = ev["carrier"]
    tensor = f"`{name}`" if name else "a tensor"
    made = f" produced at {ev['carrier_at']}" if ev["carrier_at"] else ""
    if ev.get("made_at"):
        made += f" (made inside at {ev['made_at']})"
    used = f" (used at {ev['used_at']})" if ev["used_at"] else ""
    if ev["pattern"] == "recurrent":
        how = f"{tensor}{made} in one step is fed into the next{used} without `.detach()`"
    elif ev["pattern"] == "parameters":
        at = f" at {ev['carrier_at']}" if ev["carrier_at"] else ""
        how = f"{tensor}, updated in place outside `torch.no_grad()`{at}, records a graph that the next step's forward uses"
    else:
        when = ev.get("carrier_made") or f"in {step_name(ev['carrier_step'])}"
        how = f"{tensor}{made} {when} is kept and used again in later steps{used}"
    for other in ev.get("also_carried") or []:  # (each named: its fix is part of this one's)
        tensor = f"`{other['name']}`" if other["name"] else "a tensor"
        produced = f" produced at {other['at']}" if other["at"] else ""
        how += f"; {tensor}{produced} is carried over too"
    rows = ev["per_step"]
    spent = _share(rows[0]) if len(rows) == 1 else f"{_share(rows[0])}; ... {_share(rows[-1])}"
    growth = ""
    if len(rows) > 1 and rows[-1][1] > rows[0][1]:
        per = (rows[-1][1] - rows[0][1]) / max(rows[-1][0] - rows[0][0], 1)
        growth = f": it grows by about {per:.1f} nodes per step, so every backward is slower than the last"
    tail = f"; the backward failed because {ev.get('failed_because') or _FREED}" if ev["failed"] else ""
    if ev.get("bytes"):
        tail += f"; up to {human_bytes(ev['bytes'])} of earlier steps' saved tensors stay alive with it"
    return (
        f"the backward at {ev['backward']} runs on into the graphs of earlier steps: {how}, so each step's graph "
        f"stays attached to the ones before it. Time spent in earlier steps' nodes, {spent}{growth}{tail}"
    )


def missing_zero_grad(trace: Trace, step: StepRecord) -> list[Finding]:
    """``optimizer.step()`` ran on gradients that were never reset since its previous step."""
    if not step.stale_grads:
        return []
    backwards = [bw for bw in backwards_of(trace, step) if bw.api == "backward"]
    stepped = step.stale_site if step.stale_site is not None else step.optimizer_site  # (a trace before the field)
    where = trace.where(stepped)
    site = trace.site(stepped)
    own = _own_backwards(trace, backwards, site)
    backward_at = trace.where(own[0].site) if own else None
    evidence = {
        "key": where,
        "sites": [where, *([backward_at] if backward_at else [])],
        "steps": [step.index],
        "parameters": step.stale_grads,
        "optimizer_at": describe(site),
        "optimizer": _stepped_optimizer(trace, stepped),
        "backward_at": backward_at,
    }
    return [make_finding("missing-zero-grad", "warning", step.index, evidence, [_zero_grad_remedy(trace, own, evidence, site)])]


def _own_backwards(trace: Trace, backwards: list[BackwardRecord], stepping: CallSite | None) -> list[BackwardRecord]:
    """The step's backwards whose gradients the optimizer stepped at ``stepping`` uses: all of them, unless another
    optimizer's ``.step()`` runs between the first and this one in the same function (a GAN's generator step before
    the discriminator's: the generator's backward reaches the discriminator's parameters too, and a zero before it
    would add them to the discriminator's update), then those after that step's line and before this one's."""
    sites = [trace.site(bw.site) for bw in backwards]
    first = sites[0] if sites else None
    if first is None or stepping is None:
        return backwards
    others = [line for line in _other_steps(trace, stepping) if first.line < line < stepping.line]
    if not others:
        return backwards
    after = max(others)
    return [bw for bw, site in zip(backwards, sites) if site is not None and after < site.line < stepping.line]


def _stepped_optimizer(trace: Trace, site_id: int | None) -> str:
    """The variable holding the optimizer stepped at ``site_id``: as the session found it in the frame that stepped
    it (``optimizer`` in ``scaler.step(optimizer)``, a ``GradScaler``'s line), else the name the line calls
    ``.step()`` on, else ``optimizer``."""
    named = next((o.name for o in trace.optimizers if o.site == site_id and o.name), None)
    site = trace.site(site_id)
    return named or (optimizer_name(site.source) if site is not None else "optimizer")


def _other_steps(trace: Trace, stepping: CallSite) -> list[int]:
    """The lines of the other optimizers' ``.step()`` in the function that steps the optimizer at ``stepping``."""
    return [
        site.line for o in trace.optimizers
        if (site := trace.site(o.site)) is not None and site.where != stepping.where
        and (site.file, site.function) == (stepping.file, stepping.function)
    ]  # fmt: skip


def _zero_grad_remedy(trace: Trace, backwards: list[BackwardRecord], ev: dict, stepping: CallSite | None) -> Remedy:
    """``optimizer.zero_grad()`` (of the optimizer stepped at ``stepping``) before the first of ``backwards``, the
    step's backwards whose gradients it uses (:func:`_own_backwards`): a patch when that backward runs in the
    function that steps the optimizer (where the optimizer's name means that optimizer).  Where that backward's
    line ran more than once in the step (gradients accumulated over micro-batches on purpose), a zero before it
    would keep only the last micro-batch's gradients: the call goes right after the optimizer's step instead."""
    call = f"{ev['optimizer']}.zero_grad()"
    repeats = sum(bw.site == backwards[0].site for bw in backwards) if backwards else 0
    why = f"`{ev['optimizer']}.step()` at {ev['optimizer_at']} used gradients no `zero_grad()` reset since its last step"
    if repeats > 1 and stepping is not None:
        text = (f"call `{call}` right after the optimizer step at {stepping.where}, once per step: its "
                f"{repeats} backwards at {ev['backward_at']} accumulate into one update, and a zero before each "
                "would keep only the last one's gradients")
        others = _other_steps(trace, stepping)
        if others:  # another optimizer's backward may run after the zero (a GAN's generator): no patch
            return Remedy(text + f"; but another optimizer steps beside it (line {others[0]}): if the backward for it "
                          "reaches these parameters (a GAN's generator loss reaches the discriminator), zero them "
                          "before the first of these backwards instead")
        return Remedy(text, [Edit("insert-after", stepping.file, stepping.line, call)], why, mechanical=True)
    before = f"before the backward at {ev['backward_at']}" if ev["backward_at"] else "before each backward"
    text = f"call `{call}` {before} (to accumulate over micro-batches on purpose, step and zero once every N backwards)"
    backward = trace.site(backwards[0].site) if backwards else None
    if backward is None or stepping is None or (backward.file, backward.function) != (stepping.file, stepping.function):
        return Remedy(text)
    return Remedy(text, [Edit("insert-before", backward.file, backward.line, call)], why, mechanical=True)


@renderer("missing-zero-grad")
def _render_zero_grad(ev: dict) -> str:
    steps = ev["steps"]
    count = max(len(steps), ev.get("occurrences", 1))
    when = f"in step {steps[0]}" if count == 1 else f"in {count} steps from step {steps[0]} on"
    return (
        f"optimizer.step() at {ev['optimizer_at']} {when} used the gradients of {ev['parameters']} parameters "
        "that still held the sum of every earlier step's gradients: nothing reset them after the previous "
        "optimizer step, so each update uses stale gradients"
    )


def _quiet(trace: Trace, step: StepRecord) -> bool:
    """True when no detector has anything to look at (most steps of a healthy loop): a cheap pre-check.

    Each condition is one a detector starts from: a stale gradient, a holder,
    an earlier step's graph alive, a backward into earlier steps, a retained
    graph in the step before (or no backward there to tell).
    """
    index = step.index
    if step.stale_grads or step.holders or not index:
        return False
    if any(s < index for s in step.saved_alive_by_step) or any(s < index for s in step.nodes_alive_by_step):
        return False
    backwards = trace.backwards
    if any(backwards[i].earlier_nodes_reached for i in step.backwards):
        return False
    previous = trace.steps[index - 1].backwards
    return bool(previous) and not any(backwards[i].retain_graph for i in previous)


def step_findings(
    trace: Trace, step: StepRecord, refresh: bool = True, before: StepRecord | None = None
) -> list[Finding]:
    """Every finding the records of one finished step support.

    ``refresh=False``: a holder already reported as keeping graphs alive is not looked at again (its
    evidence grows with every step it keeps; the session refreshes it at steps 1, 2, 4, 8, ... and at
    the end, so that a run of n steps spends O(n log n) on it, not O(n²)).  ``before``: the step end growth
    is judged against (see :func:`~graphwatch.analysis.leaks.graph_kept_alive`).
    """
    if _quiet(trace, step):
        return []
    findings: list[Finding] = []
    findings.extend(carried_across_steps(trace, step))
    findings.extend(retained_graph(trace, step))
    findings.extend(graph_kept_alive(trace, step, refresh, before))
    findings.extend(missing_zero_grad(trace, step))
    return findings
