"""``retain_graph=True`` for nothing: a backward that retained its graph, which no later backward ran through.

Judged one step late, on purpose: only the next step shows whether a retained graph was backwarded again (an RNN
state carried on is another finding, ``graph-carried-across-steps``).

Example::

    >>> import torch, graphwatch
    >>> with graphwatch.watch(summary=False) as gw:
    ...     for _ in range(3):
    ...         w = torch.ones(1000, requires_grad=True)
    ...         loss = w.exp().sum()  # exp saves its output: 4 kB kept by `loss` until the next step
    ...         loss.backward(retain_graph=True)
    ...         gw.end_step()
    >>> [f.kind for f in gw.findings][:1]
    ['retained-graph']
"""

from __future__ import annotations

from ..model import BackwardRecord, Edit, Finding, Remedy, StepRecord, Trace
from ..model.columns import field_values
from .evidence import backward_name, backwards_of, describe_site, human_bytes, steps_text
from .findings import make_finding, renderer


def _reused_later(backward: BackwardRecord, later: list[BackwardRecord]) -> bool:
    """Whether a later backward ran through the graph ``backward`` retained: through its step's nodes, or through
    an earlier step's that it ran through too (a graph made before the loop, which every step's backward runs
    into: the retain keeps that part for the next backward, and the graph carried so is the finding)."""
    mine = {backward.step, *backward.earlier_steps}
    # (a backward of a step seen light walked no graph, nodes_reached 0: whether it ran through this one is unknown)
    return any(not b.nodes_reached or (b.earlier_nodes_reached and not mine.isdisjoint(b.earlier_steps)) for b in later)


def _unused_retains(trace: Trace, step: StepRecord, later: list[BackwardRecord]) -> list[Finding]:
    findings = []
    for bw in backwards_of(trace, step):
        if not bw.retain_graph or bw.graph_reused or not bw.held_bytes or bw.error or _reused_later(bw, later):
            continue
        where = trace.where(bw.site)
        in_a_loop = any(
            other.graph_reused and other.retain_graph and trace.where(other.site) == where
            for other in backwards_of(trace, step)
        )
        evidence = {
            "key": where,
            "sites": [where],
            "steps": [bw.step],
            "bytes": bw.held_bytes,
            "backward": describe_site(trace, bw.site),
            "backward_where": where,
            "tensor": backward_name(trace, bw, ""),
            "same_line_reused": in_a_loop,
        }
        findings.append(make_finding("retained-graph", "warning", bw.step, evidence, _retained_remedies(trace, bw, in_a_loop)))
    return findings


def _retained_remedies(trace: Trace, backward: BackwardRecord, in_a_loop: bool) -> list[Remedy]:
    where = trace.where(backward.site)
    if in_a_loop:
        return [Remedy(
            f"the last backward through a graph must free it: at {where} pass retain_graph=True only to the calls "
            "that another backward follows (e.g. `retain_graph=i < len(losses) - 1`), or sum the losses and call "
            "`.backward()` once"
        )]  # fmt: skip
    site = trace.site(backward.site)
    return [Remedy(
        f"drop retain_graph=True at {where}: it is the last backward through this graph; keep it only on a "
        "backward that another backward of the same graph follows",
        [Edit("drop-retain", site.file, site.line)] if site is not None else [],
        why="no later backward ran through the graph it retained, in this step or the next",
        mechanical=site is not None,
    )]  # fmt: skip


def retained_graph(trace: Trace, step: StepRecord) -> list[Finding]:
    """``retain_graph=True`` on a backward of the previous step whose graph no later backward used.

    Judged at the end of the next step that runs a backward: if that one ran
    into the retained graph, the graph was carried on (a different finding).
    """
    later = backwards_of(trace, step)
    if not later:
        return []
    steps = trace.steps  # walked back by index: a slice would copy every step, at every step end
    previous = next((steps[i] for i in range(step.index - 1, -1, -1) if steps[i].backwards), None)
    return _unused_retains(trace, previous, later) if previous is not None else []


def final_retained(trace: Trace) -> list[Finding]:
    """At the session's end: the retains of the last step with backwards, which no later step could judge.

    Skipped when an earlier retain on the same line was backwarded again by a
    later step (a loop carrying its graph on; the last iteration is no different).
    """
    last = next((s for s in reversed(trace.steps) if s.backwards), None)
    if last is None:
        return []
    backwards = trace.backwards  # a long run's are columns: look at one field first, build the few that matter
    reaching = [i for i, n in enumerate(field_values(backwards, "earlier_nodes_reached")) if n]
    reentered = {s for i in reaching for s in backwards[i].earlier_steps if s < backwards[i].step}
    retaining = [i for i, retain in enumerate(field_values(backwards, "retain_graph")) if retain]
    carried = {
        trace.where(bw.site) for bw in (backwards[i] for i in retaining) if bw.step < last.index and bw.step in reentered
    }
    return [f for f in _unused_retains(trace, last, []) if f.evidence["backward_where"] not in carried]


@renderer("retained-graph")
def _render_retained(ev: dict) -> str:
    steps = ev["steps"]
    when = f"step {steps[0]}" if len(steps) == 1 else f"each of {steps_text(steps)}"
    return (
        f"the backward at {ev['backward']} passes retain_graph=True, but no later backward ran through its "
        f"graph: up to {human_bytes(ev['bytes'])} of saved tensors outlived {when} for nothing, until "
        f"{f'`{tensor}`' if (tensor := ev['tensor']) else 'the loss'} and its graph were dropped"
    )
