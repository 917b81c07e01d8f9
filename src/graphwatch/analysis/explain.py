"""Explain torch's "Trying to backward through the graph a second time" error.

Given the failing backward, the first stale node it reached (whose saved
tensors an earlier backward freed) and the path to it, say which node, which
backward freed it, how the graph reaches it, and the fixes, best first (made
from what graphwatch saw: :mod:`~graphwatch.analysis.error_remedies`).  Six
shapes of the bug get their own words and fixes:

- ``same-tensor``: one tensor backwarded twice in a step (``y.backward(); y.backward()``);
- ``same-step``: two outputs of one graph (``d.backward(); e.backward()``), or a tensor both reach;
- ``grad``: an ``autograd.grad`` freed the graph a later backward needs (force matching);
- ``recurrent``: a loop feeds a tensor into the next step without ``.detach()`` (an RNN state);
- ``cached``: a tensor made in one step is kept and reused (a cache of a parameter's function);
- ``handoff``: two different backwards across an optimizer step share a graph (a GAN's D and G steps).

Example::

    >>> from graphwatch.analysis.explain import is_backward_twice
    >>> is_backward_twice(RuntimeError("Trying to backward through the graph a second time (or ...)"))
    True
"""

from __future__ import annotations

from itertools import pairwise

from ..model import BackwardRecord, Finding, NodeRecord, Remedy, Trace
from ..model.causes import BackwardCause
from .carried_fixes import crossing_carriers, remedies_for_all
from .error_remedies import RemedyMaker
from .evidence import (
    backward_name,
    carried_pattern,
    carrier_line,
    describe,
    describe_site,
    made_when,
    same_line,
    step_name,
    use_line,
)

KIND = "backward-through-freed-graph"
_MARKER = "backward through the graph a second time"


def is_backward_twice(error: BaseException) -> bool:
    """True for torch's error about backwarding through a freed graph."""
    return isinstance(error, RuntimeError) and _MARKER in str(error)


def _crossing(
    path: list[NodeRecord], stale: NodeRecord, backward: BackwardRecord
) -> tuple[NodeRecord | None, NodeRecord | None]:
    """(the first node of an earlier step on the path, the newer node that uses it), or (None, None).

    When the backward's own root is old (nothing was computed on top of the
    graph since), the graph is simply backwarded again: no tensor carries it,
    whichever step boundary fell between the two backwards.
    """
    if not path:
        return (stale, None) if stale.step < backward.step else (None, None)
    index = next((i for i, node in enumerate(path) if node.step < backward.step), None)
    if not index:  # None: all of this step; 0: the root itself is old
        return None, None
    return path[index], path[index - 1]


def handed_off(path: list[NodeRecord], before_seq: int) -> tuple[NodeRecord | None, NodeRecord | None]:
    """(the first node on the path made before sequence number ``before_seq`` — when the freeing backward
    started —, the newer node that uses it), or (None, None): the tensor handed from one loss to the other."""
    index = next((i for i, node in enumerate(path) if node.seq < before_seq), None)
    if not index:  # None: the whole path is newer; 0: the root itself was backwarded
        return None, None
    return path[index], path[index - 1]


def _not_retain(names: dict[str, str]) -> Remedy:
    """The last row of a graph carried across steps, after the carried state's own remedies
    (:func:`~graphwatch.analysis.carried_fixes.carried_remedies`)."""
    return Remedy(
        f"not `retain_graph=True` at {names['freeing_where']}: the graph would then grow with every step, and every "
        "backward would be slower than the last"
    )


def _pair(first: str, second: str) -> str:
    """The two tensors two backwards ran from, as their lines name them: "`loss_a` and `loss_b`", else "the two
    losses" (a line that names no tensor: ``(a + b).backward()``).

    >>> _pair("loss_d", "loss_g"), _pair("", "loss_g")
    ('`loss_d` and `loss_g`', 'the two losses')
    """
    return f"`{first}` and `{second}`" if first and second else "the two losses"


def _how(pattern: str, names: dict[str, str], shared_named: bool = False) -> str:
    if pattern == "same-step" and shared_named:
        pattern = "shared"
    table = {
        "shared": "{carrier_text}{made} is reached by two backwards in {step}: the one at "
        "{freeing_where} ran through its graph first and freed it; the one at {backward_where} needs it again.",
        "grad": "the `torch.autograd.grad` at {freeing_where} ran through the graph ({carrier_text}) without "
        "keeping it, and the backward at {backward_where} ({step}) runs through it again{fed}.",
        "same-tensor": "{second} is backwarded twice in {step}: the backward at {freeing_where} freed its graph, "
        "and the one at {backward_where} needs it again.",
        "same-step": "{pair} share one graph in {step}: the backward at {freeing_where} freed the "
        "shared part, and the one at {backward_where} runs through it again.",
        "recurrent": "The graph of {carrier_step} is carried into {step} by {carrier_text}{produced}: "
        "each step feeds it into the next without `.detach()`{used}, so this backward runs on into the previous "
        "step's graph, which that step's backward freed.",
        "parameters": "The graph of {carrier_step} is carried into {step} by {carrier_text}, updated in place "
        "outside `torch.no_grad()`{at}: each update records a graph that the next step's forward uses, so this "
        "backward runs on into the previous step's graph, which that step's backward freed.",
        "cached": "{carrier_text} made{at} {carrier_made} is kept and used again in {step}{used}: "
        "its graph was freed by {carrier_step}'s backward.",
        "handoff": "{carrier_text} produced{at} in {carrier_step} is used by two backwards: the one at "
        "{freeing_where} ran through its graph first and freed it; the one at {backward_where} ({step}) needs it "
        "again.",
    }
    at = names["carrier_at"]  # (empty: the line that made it is not known)
    known = {"at": f" at {at}" if at else "", "made": f" made at {at}" if at else "", "produced": f" produced at {at}" if at else ""}
    made = names.get("carrier_made") or f"in {names['carrier_step']}"  # ("before the loop at ...": a set-up line's)
    return table[pattern].format(**{**names, "carrier_made": made}, **known)


def _also_carried(trace: Trace, others: list[NodeRecord], step: str) -> str:
    """The sentence naming the other values that carry an earlier step's graph into the failing backward's
    step (each one's fix is part of the first one's), or ''."""
    if not others:
        return ""
    spelled = []
    for other in others:
        site, name = carrier_line(trace, other)
        spelled.append((f"`{name}`" if name else "a tensor") + (f" made at {describe(site)}" if site is not None else ""))
    verb = "carries" if len(spelled) == 1 else "carry"
    return f" {'; '.join(spelled)} {verb} the graph of {step_name(others[0].step)} into {step} too."


def _pattern_of(
    trace: Trace, backward: BackwardRecord, freeing: BackwardRecord | None, carrier: NodeRecord | None,
    cause: BackwardCause,
) -> str:
    """The shape of the bug: the carried rows when a tensor crosses steps (unless a loss crossed into another
    optimizer's graph), else what the two backwards are."""
    if carrier is not None and not cause.cuts:
        site, _ = carrier_line(trace, carrier)
        return carried_pattern(trace, carrier, site, backward)
    if freeing is not None and freeing.api == "grad":
        return "grad"
    if freeing is not None and freeing.roots and freeing.roots == backward.roots:
        return "same-tensor"
    if cause.cuts or cause.stepped_between:
        return "handoff"
    return "same-step"


def _remedies(pattern: str, maker: RemedyMaker | None) -> list[Remedy]:
    """The remedies, best first, of a graph not carried across steps: what the cause supports."""
    if maker is None:
        return []
    found: list[Remedy | None] = [maker.framework_backward(), maker.cuts(), maker.create_graph()]
    if pattern == "same-tensor":
        found.append(maker.remove_second())
    found.append(maker.detach_made())
    remedies = [r for r in found if r is not None]
    return remedies or maker.together(sum_ok=pattern == "same-step")


def _shared_names(trace: Trace, cause: BackwardCause, names: dict[str, str]) -> None:
    """Name the shared tensor as the frames hold it, with the line that ran and assigned it."""
    if cause.shared is None:
        return
    site = trace.site(cause.shared_at)
    names["carrier"], names["carrier_text"] = cause.shared, f"`{cause.shared}`"
    if site is not None:
        names["carrier_at"], names["carrier_where"] = describe(site), site.where


def explain_backward_twice(
    trace: Trace,
    backward: BackwardRecord,
    stale: NodeRecord | None,
    path: list[NodeRecord],
    shared: NodeRecord | None = None,
    cause: BackwardCause | None = None,
) -> Finding:
    """The finding for a failed backward; its ``message`` is what the error says after torch's text.

    ``shared``: the first node on the path made before the freeing backward started (the tensor handed
    from one loss to the other: a GAN's ``fake``, a critic's gap); ``cause``: what graphwatch saw about
    the optimizers, the parameters each loss reaches and the shared tensor
    (:class:`~graphwatch.model.causes.BackwardCause`); the remedies are made from it.
    """
    where = trace.where(backward.site)
    if stale is None:
        fix = ("detach tensors kept from an earlier iteration (`x = x.detach()`), or pass retain_graph=True to the "
               "earlier backward if both backwards truly need the graph")
        return Finding(
            KIND,
            "error",
            backward.step,
            f"graphwatch: the backward at {describe_site(trace, backward.site)} reached a graph whose saved tensors "
            "were freed before graphwatch saw them (made before the session, or under saved-tensor hooks it cannot "
            "see, or at level='light')",
            fix,
            {"key": where, "sites": [where], "steps": [backward.step], "pattern": None, "fixes": []},
        )
    cause = cause or BackwardCause()
    freeing = trace.backwards[stale.freed_by] if stale.freed_by is not None else None
    carrier, used = _crossing(path, stale, backward)
    across = carrier is not None
    if carrier is None and shared is not None:
        carrier, used = shared, next((a for a, b in pairwise(path) if b is shared), None)
    pattern = _pattern_of(trace, backward, freeing, carrier if across else None, cause)
    carrier_site, carrier_name = carrier_line(trace, carrier) if carrier else (None, None)
    used_site = use_line(trace, used, carrier_name)  # (a line read off the op before it: only where it reads it)
    names = {
        "step": step_name(path[0].step if path and carrier is None else backward.step),
        "backward_where": where,
        "freeing_where": trace.where(freeing.site) if freeing else "the earlier backward",
        "second": f"`{second}`" if (second := backward_name(trace, backward, "")) else "the loss",
        "pair": _pair(backward_name(trace, freeing, "") if freeing else "", second),
        "carrier": carrier_name or "the tensor",
        "carrier_text": f"`{carrier_name}`" if carrier_name else "the tensor",
        "carrier_at": describe(carrier_site) if carrier_site is not None else "",
        "carrier_where": carrier_site.where if carrier_site else "the line that makes it",
        "carrier_step": step_name(carrier.step) if carrier else "",
        "carrier_made": made_when(trace, carrier.step, carrier_site, trace.site(backward.site)) if carrier else "",
        "used_where": used_site.where if used_site else where,
        "used": f" (it is used at {describe(used_site)})" if used_site and used_site is not carrier_site else "",
        "fed": f" (its loss is made from `{cause.grad_result}`, that call's result)" if cause.grad_result else "",
    }
    if not across:
        _shared_names(trace, cause, names)
    if carrier is None and cause.cuts and cause.cuts[0].name:  # the whole failing loss is older: name the cut
        cut_site = trace.site(cause.cuts[0].made_at)
        names.update(carrier_text=f"`{cause.cuts[0].name}`", carrier_at=describe(cut_site) if cut_site else "",
                     carrier_step=step_name(backward.step), carrier_made="")
    if freeing is not None and same_line(trace, freeing.site, backward.site):
        names["backward_where"] += " (the same line, run again)"
    maker = RemedyMaker(trace, cause, freeing, backward) if freeing is not None else None
    if pattern in ("recurrent", "cached", "parameters") and carrier is not None:
        carriers = crossing_carriers(trace, backward, carrier)
        remedies = [*remedies_for_all(trace, carriers, backward, names["used_where"]), _not_retain(names)]
        also = _also_carried(trace, carriers[1:], names["step"])
    else:
        remedies, also = _remedies(pattern, maker), ""
    fixes = [remedy.text for remedy in remedies]
    freed = (
        f"the backward at {describe_site(trace, freeing.site)} ({step_name(freeing.step)}, "
        f"retain_graph={freeing.retain_graph}) had already freed"
        if freeing
        else "something had already freed"
    )
    made = f" at {describe_site(trace, stale.site)}" if not stale.site_inferred else ""  # (an inferred line: none)
    when = made_when(trace, stale.step, None if stale.site_inferred else trace.site(stale.site), trace.site(backward.site))
    lines = [
        f"graphwatch: the backward at {describe_site(trace, backward.site)} ({step_name(backward.step)}) reached "
        f"{stale.op}, created{made} {when}, whose saved "
        f"tensors {freed}.",
        _how(pattern, names, shared_named=cause.shared is not None and not across) + also,
    ]
    if fixes:
        lines += ["Fixes, best first:", *(f"  {i}. {fix}" for i, fix in enumerate(fixes, 1))]
    fix = fixes[0] if fixes else (maker.no_fix() if maker else "graphwatch offers no fix")
    if not fixes:
        lines.append(fix)
    sites = [where] + ([trace.where(stale.site)] if not stale.site_inferred else [])
    sites += [w for w in (names["freeing_where"] if freeing else None, carrier_site and carrier_site.where) if w]
    sites += [s.where for s in (used_site,) if s is not None]
    sites += [e.where for r in remedies for e in r.edits]
    evidence = {
        "key": f"{where} -> {trace.where(stale.site)}",
        "sites": list(dict.fromkeys(sites)),
        "steps": sorted({backward.step, stale.step} | ({freeing.step} if freeing else set())),
        "stale_op": stale.op,
        "stale_at": trace.where(stale.site),
        "stale_step": stale.step,
        "freed_by": stale.freed_by,
        "freeing_at": trace.where(freeing.site) if freeing else None,
        "freeing_step": freeing.step if freeing else None,
        "freeing_retain_graph": freeing.retain_graph if freeing else None,
        "carrier": names["carrier"] if carrier is not None else None,
        "carrier_at": names["carrier_where"] if carrier is not None and carrier_site is not None else None,
        "carrier_node": None if carrier is None else carrier.id,
        "pattern": pattern,
        "fixes": fixes,
        "optimizers": {trace.where(trace.backwards[i].site): n for i, n in cause.optimizers.items() if n},
        "cuts": [{"name": c.name, "used_at": trace.where(c.used_at) if c.used_at is not None else None,
                  "optimizer": c.optimizer, "owner": c.owner} for c in cause.cuts],
        "one_owner": cause.one_owner,
        "path": [node.id for node in path],
    }
    return Finding(KIND, "error", backward.step, "\n".join(lines), fix, evidence, remedies=remedies)
