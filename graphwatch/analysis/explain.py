"""Explain torch's "Trying to backward through the graph a second time" error.

Given the failing backward, the first stale node it reached (whose saved
tensors an earlier backward freed) and the path to it, say which node, which
backward freed it, how the graph reaches it, and the fixes, best first.  Five
shapes of the bug get their own words and fixes:

- ``same-tensor``: one tensor backwarded twice in a step (``y.backward(); y.backward()``);
- ``same-step``: two outputs of one graph (``d.backward(); e.backward()``);
- ``recurrent``: a loop feeds a tensor into the next step without ``.detach()`` (an RNN state);
- ``cached``: a tensor made in one step is kept and reused (a cache of a parameter's function);
- ``handoff``: two different backwards across an optimizer step share a graph (a GAN's D and G steps).

Example::

    >>> from graphwatch.analysis.explain import is_backward_twice
    >>> is_backward_twice(RuntimeError("Trying to backward through the graph a second time (or ...)"))
    True
"""

from __future__ import annotations

from ..model import BackwardRecord, CallSite, Finding, NodeRecord, Remedy, Trace
from .carried_fixes import carried_remedies
from .evidence import (
    backward_name,
    carried_pattern,
    carrier_line,
    describe,
    describe_site,
    line_in,
    same_line,
    step_name,
)

KIND = "backward-through-freed-graph"
_MARKER = "backward through the graph a second time"


def is_backward_twice(error: BaseException) -> bool:
    """True for torch's error about backwarding through a freed graph."""
    return isinstance(error, RuntimeError) and _MARKER in str(error)


def _pattern(
    trace: Trace, backward: BackwardRecord, freeing: BackwardRecord | None, carrier: NodeRecord | None, handoff: bool
) -> str:
    if handoff:
        return "handoff"
    if carrier is None:
        same_roots = freeing is not None and freeing.roots and freeing.roots == backward.roots
        return "same-tensor" if same_roots else "same-step"
    site, _ = carrier_line(trace, carrier)
    return carried_pattern(trace, carrier, site, backward)


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


def _feeding_line(
    trace: Trace, path: list[NodeRecord], used: NodeRecord | None, backward: BackwardRecord
) -> CallSite | None:
    """The loop's line that feeds the tensor in: of the nearest node from ``used`` towards the root whose line
    was seen (not taken from a neighbour), its frame in the function that runs the failing backward."""
    site = trace.site(backward.site)
    if used is None or site is None:
        return None
    index = next((i for i, node in enumerate(path) if node is used), 0)
    exact = next((n for n in reversed(path[: index + 1]) if not n.site_inferred and n.site is not None), used)
    return line_in(trace, exact.site, {(site.file, site.function)}) if exact.site is not None else None


def _fixes(pattern: str, names: dict[str, str]) -> list[str]:
    """The ranked fixes for one shape of the bug; ``names`` fills in the user's own words."""
    retain_earlier = (
        "`retain_graph=True` on the earlier backward at {freeing_where}; the last backward, at {backward_where}, "
        "must not retain"
    )
    not_retain = (
        "not `retain_graph=True` at {freeing_where}: the graph would then grow with every step, and every "
        "backward would be slower than the last"
    )
    table = {
        "same-tensor": [
            "backward once: drop the second `{second}.backward()` at {backward_where} (it would add the same "
            "gradients to `.grad` again)",
            "if you mean to backward twice, " + retain_earlier,
        ],
        "same-step": [
            "backward once through the sum: `({first} + {second}).backward()` in place of the backwards at "
            "{freeing_where} and {backward_where}",
            "if the backwards must stay separate, " + retain_earlier,
        ],
        "carried": [not_retain],  # after the carried state's own remedies (analysis.carried_fixes)
        "handoff": [
            "the backward at {detach_where} should not reach what made {carrier_text} (a GAN's discriminator "
            "step): detach it in that loss, `{carrier}.detach()` where the loss of that backward uses it (as in "
            "`D({carrier}.detach())`, at {used_outer})",
            "if both backwards need that graph, " + retain_earlier,
            "or recompute {carrier_text} before the backward at {backward_where}",
        ],
    }
    return [fix.format(**names) for fix in table[pattern]]


def _how(pattern: str, names: dict[str, str]) -> str:
    table = {
        "same-tensor": "`{second}` is backwarded twice in {step}: the backward at {freeing_where} freed its graph, "
        "and the one at {backward_where} needs it again.",
        "same-step": "`{first}` and `{second}` share one graph in {step}: the backward at {freeing_where} freed the "
        "shared part, and the one at {backward_where} runs through it again.",
        "recurrent": "The graph of {carrier_step} is carried into {step} by {carrier_text} produced at {carrier_at}: "
        "each step feeds it into the next without `.detach()`{used}, so this backward runs on into the previous "
        "step's graph, which that step's backward freed.",
        "cached": "{carrier_text} made at {carrier_at} in {carrier_step} is kept and used again in {step}{used}: "
        "its graph was freed by {carrier_step}'s backward.",
        "handoff": "{carrier_text} produced at {carrier_at} in {carrier_step} is used by two backwards: the one at "
        "{freeing_where} ran through its graph first and freed it; the one at {backward_where} ({step}) needs it "
        "again.",
    }
    return table[pattern].format(**names)


def explain_backward_twice(
    trace: Trace,
    backward: BackwardRecord,
    stale: NodeRecord | None,
    path: list[NodeRecord],
    handoff: tuple[NodeRecord, NodeRecord] | None = None,
    detach_in_failing: bool = False,
) -> Finding:
    """The finding for a failed backward; its ``message`` is what the error says after torch's text.

    ``handoff``: (the tensor's node, the node using it) when an ``optimizer.step()`` ran between the backward
    that freed ``stale`` and this one, and the graph was handed from one to the other through that tensor
    (a GAN's D and G losses sharing ``fake``), in one step or across two; see :func:`handed_off`.
    ``detach_in_failing``: the optimizer that stepped between them trains what made the shared tensor (G's
    step came first): the failing backward's loss is the one to detach it in, not the freeing one's.
    """
    where = trace.where(backward.site)
    if stale is None:
        return Finding(
            KIND,
            "error",
            backward.step,
            f"graphwatch: the backward at {describe_site(trace, backward.site)} reached a graph whose saved tensors "
            "were freed before graphwatch saw them (made before the session, or under saved-tensor hooks it cannot "
            "see, or at level='light')",
            "detach tensors kept from an earlier iteration (`x = x.detach()`), or pass retain_graph=True to the "
            "earlier backward if both backwards truly need the graph",
            {"key": where, "sites": [where], "steps": [backward.step], "pattern": None, "fixes": []},
        )
    freeing = trace.backwards[stale.freed_by] if stale.freed_by is not None else None
    carrier, used = _crossing(path, stale, backward)
    handed = handoff is not None and freeing is not None and not same_line(trace, freeing.site, backward.site)
    if handed and carrier is None and handoff is not None:
        carrier, used = handoff
    pattern = _pattern(trace, backward, freeing, carrier, handed and carrier is not None)
    carrier_site, carrier_name = carrier_line(trace, carrier) if carrier else (None, None)
    used_site = trace.site(used.site) if used is not None else None
    used_outer = _feeding_line(trace, path, used, backward)
    names = {
        "step": step_name(path[0].step if path and carrier is None else backward.step),
        "backward_where": where,
        "freeing_where": trace.where(freeing.site) if freeing else "the earlier backward",
        "detach_where": where if detach_in_failing or not freeing else trace.where(freeing.site),
        "first": backward_name(trace, freeing, "loss_a") if freeing else "loss_a",
        "second": backward_name(trace, backward, "loss_b"),
        "carrier": carrier_name or "the tensor",
        "carrier_text": f"`{carrier_name}`" if carrier_name else "the tensor",
        "carrier_at": describe(carrier_site),
        "carrier_where": carrier_site.where if carrier_site else "the line that makes it",
        "carrier_step": step_name(carrier.step) if carrier else "",
        "used_where": used_site.where if used_site else where,
        "used_outer": used_outer.where if used_outer else where,
        "used": f" (it is used at {describe(used_site)})" if used_site and used_site is not carrier_site else "",
    }
    freed = (
        f"the backward at {describe_site(trace, freeing.site)} ({step_name(freeing.step)}, "
        f"retain_graph={freeing.retain_graph}) had already freed"
        if freeing
        else "something had already freed"
    )
    if pattern in ("recurrent", "cached") and carrier is not None:
        remedies = carried_remedies(trace, carrier, backward, names["used_where"])
        remedies += [Remedy(text) for text in _fixes("carried", names)]
    else:
        remedies = [Remedy(text) for text in _fixes(pattern, names)]
    fixes = [remedy.text for remedy in remedies]
    lines = [
        f"graphwatch: the backward at {describe_site(trace, backward.site)} ({step_name(backward.step)}) reached "
        f"{stale.op}, created at {describe_site(trace, stale.site)} in {step_name(stale.step)}, whose saved "
        f"tensors {freed}.",
        _how(pattern, names),
        "Fixes, best first:",
        *(f"  {i}. {fix}" for i, fix in enumerate(fixes, 1)),
    ]
    sites = [where, trace.where(stale.site)]
    sites += [w for w in (names["freeing_where"] if freeing else None, carrier_site and carrier_site.where) if w]
    sites += [s.where for s in (used_site, used_outer) if s is not None]
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
        "carrier": carrier_name,
        "carrier_at": carrier_site.where if carrier_site else None,
        "carrier_node": None if carrier is None else carrier.id,
        "pattern": pattern,
        "fixes": fixes,
        "path": [node.id for node in path],
    }
    return Finding(KIND, "error", backward.step, "\n".join(lines), fixes[0], evidence, remedies=remedies)
