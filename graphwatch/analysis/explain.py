"""Explain torch's "Trying to backward through the graph a second time" error.

Given the failing backward, the first stale node it reached (whose saved
tensors an earlier backward freed) and the path to it, say which node, which
backward freed it, which tensor carried the graph there, and how to fix it.

Example::

    >>> from graphwatch.analysis.explain import is_backward_twice
    >>> is_backward_twice(RuntimeError("Trying to backward through the graph a second time (or ...)"))
    True
"""

from __future__ import annotations

from ..model import BackwardRecord, Finding, NodeRecord, Trace
from .evidence import describe_site, outermost_assignment

KIND = "backward-through-freed-graph"
_MARKER = "backward through the graph a second time"


def is_backward_twice(error: BaseException) -> bool:
    """True for torch's error about backwarding through a freed graph."""
    return isinstance(error, RuntimeError) and _MARKER in str(error)


def _step_name(step: int) -> str:
    return "before the session" if step < 0 else f"step {step}"


def explain_backward_twice(
    trace: Trace,
    backward: BackwardRecord,
    stale: NodeRecord | None,
    path: list[NodeRecord],
) -> Finding:
    """The finding for a failed backward; its ``message`` is what the error says after torch's text."""
    if stale is None:
        return Finding(
            KIND,
            "error",
            backward.step,
            f"backward at {describe_site(trace, backward.site)} reached a graph whose saved tensors were "
            "freed before graphwatch saw them (made before the session or under hooks it cannot see)",
            "detach tensors kept from an earlier iteration (x = x.detach()), or pass retain_graph=True to the "
            "earlier backward if both backwards truly need the graph",
            {"sites": [trace.where(backward.site)], "steps": [backward.step]},
        )
    freeing = trace.backwards[stale.freed_by] if stale.freed_by is not None else None
    carrier = next((node for node in path if node.step < backward.step), None)
    lines = [
        f"graphwatch: the backward at {describe_site(trace, backward.site)} (step {backward.step}) reached "
        f"{stale.op}, created at {describe_site(trace, stale.site)} in {_step_name(stale.step)}, "
        + (
            f"whose saved tensors were freed by the backward at {describe_site(trace, freeing.site)} "
            f"(step {freeing.step}, retain_graph=False)."
            if freeing
            else "whose saved tensors were already freed."
        )
    ]
    fixes: list[str] = []
    sites = [trace.where(backward.site), trace.where(stale.site)]
    if freeing:
        sites.append(trace.where(freeing.site))
    if carrier is not None:
        site, name = outermost_assignment(trace, carrier.site)
        where = describe_site(trace, carrier.site) if site is None else f"{site.where} (`{site.source}`)"
        tensor = f"`{name}`" if name else "the tensor"
        lines.append(
            f"The graph of {_step_name(carrier.step)} is carried into step {backward.step} by {tensor} "
            f"produced at {where}: step {backward.step} uses it without detaching it."
        )
        target = name or "the tensor"
        fixes.append(
            f"detach {tensor} where it is produced so each step's graph ends there: "
            f"`{target} = {target}.detach()` after {site.where if site else where}"
            + (" (or `.detach()` the cached value)" if carrier.step < 0 else "")
        )
        fixes.append(f"or compute {tensor} inside the step instead of keeping it from {_step_name(carrier.step)}")
        if site is not None:
            sites.append(site.where)
    else:
        lines.append(f"Both backwards run in step {backward.step} through the same graph: the first freed it.")
        fixes.append("backward once through the sum of the losses: `(loss_a + loss_b).backward()`")
    if freeing:
        fixes.append(
            f"only if both backwards truly need the graph: `retain_graph=True` on the earlier backward at "
            f"{trace.where(freeing.site)}; the last backward must not retain it"
        )
    lines.append("Fixes, best first:")
    lines.extend(f"  {i}. {fix}" for i, fix in enumerate(fixes, 1))
    evidence = {
        "sites": sites,
        "steps": sorted({backward.step, stale.step} | ({freeing.step} if freeing else set())),
        "stale_op": stale.op,
        "freed_by": stale.freed_by,
        "carrier": None if carrier is None else carrier.id,
        "path": [node.id for node in path],
    }
    return Finding(KIND, "error", backward.step, "\n".join(lines), fixes[0], evidence)
