"""Detectors: pure functions from recorded steps to findings.

``step_findings`` runs at each step end on that step's records;
``session_findings`` runs once at the end on the whole trace.  A
:class:`FindingLog` merges repeats of one problem (same kind, same line) into
one finding whose evidence lists every step it was seen in.

Example::

    >>> from graphwatch.model import StepRecord, Trace
    >>> from graphwatch.analysis import step_findings
    >>> step_findings(Trace(), StepRecord(index=0, source="optimizer"))
    []
"""

from __future__ import annotations

from ..model import BackwardRecord, Finding, StepRecord, Trace
from .evidence import describe_site, human_bytes, outermost_assignment

FINDING_KINDS = (
    "backward-through-freed-graph",
    "graph-carried-across-steps",
    "retained-graph",
    "graph-kept-alive",
    "memory-growth",
    "missing-zero-grad",
)
# Kinds that mean a graph outlives the step that made it: a strict session fails on them.
LEAK_KINDS = frozenset({"graph-carried-across-steps", "retained-graph", "graph-kept-alive", "memory-growth"})
_MAX_STEPS_LISTED = 50


class FindingLog:
    """Findings of a session, one per (kind, key line), in the order first seen."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        self._index = {(f.kind, f.evidence.get("key")): f for f in findings}

    def add(self, finding: Finding) -> bool:
        """Add ``finding``; True if it is new, False if it merged into an earlier one."""
        key = (finding.kind, finding.evidence.get("key"))
        old = self._index.get(key)
        if old is None:
            self._index[key] = finding
            self.findings.append(finding)
            return True
        steps = sorted(set(old.evidence.get("steps", [])) | set(finding.evidence.get("steps", [])))
        per_step = (old.evidence.get("per_step", []) + finding.evidence.get("per_step", []))[-_MAX_STEPS_LISTED:]
        old.message, old.fix = finding.message, finding.fix
        old.evidence.update(finding.evidence)
        old.evidence["steps"] = steps[:_MAX_STEPS_LISTED] + steps[-1:] if len(steps) > _MAX_STEPS_LISTED else steps
        old.evidence["occurrences"] = old.evidence.get("occurrences", 1) + 1
        if per_step:
            old.evidence["per_step"] = per_step
        return False


def _backwards_of(trace: Trace, step: StepRecord) -> list[BackwardRecord]:
    return [trace.backwards[i] for i in step.backwards]


def carried_across_steps(trace: Trace, step: StepRecord) -> list[Finding]:
    """A backward of this step ran through nodes an earlier step's backward already ran through."""
    findings = []
    for bw in _backwards_of(trace, step):
        if not bw.earlier_nodes_reached:
            continue
        carriers = [trace.nodes.get(child) for _, child in bw.crossings]
        carrier = next((c for c in carriers if c is not None), None)
        site, name = outermost_assignment(trace, carrier.site if carrier else None)
        where = f"{site.where} (`{site.source}`)" if site else "<unknown line>"
        tensor = f"`{name}`" if name else "a tensor"
        share = bw.earlier_nodes_reached / max(bw.nodes_reached, 1)
        steps_back = sorted(s for s in bw.earlier_steps if s < bw.step)
        message = (
            f"the backward at {describe_site(trace, bw.site)} in step {bw.step} runs through "
            f"{bw.earlier_nodes_reached} nodes of earlier steps ({share:.0%} of the {bw.nodes_reached} it "
            f"reaches, about {share * bw.seconds * 1e3:.2f} ms of its {bw.seconds * 1e3:.2f} ms), back to "
            f"{'before the session' if steps_back and steps_back[0] < 0 else f'step {steps_back[0]}' if steps_back else 'an earlier step'}: "
            f"{tensor} produced at {where} carries the graph from one step into the next, so every "
            "backward is slower than the last"
        )
        target = name or "the tensor"
        fix = f"`{target} = {target}.detach()` at the start of each step (after {site.where if site else 'the line that makes it'})"
        findings.append(
            Finding(
                "graph-carried-across-steps",
                "error" if bw.error else "warning",
                bw.step,
                message,
                fix,
                {
                    "key": site.where if site else None,
                    "sites": [trace.where(bw.site)] + ([site.where] if site else []),
                    "steps": [bw.step],
                    "per_step": [[bw.step, bw.earlier_nodes_reached, bw.nodes_reached, round(bw.seconds, 6)]],
                    "carrier": name,
                },
            )
        )
    return findings


def retained_graph(trace: Trace, step: StepRecord) -> list[Finding]:
    """``retain_graph=True`` on a backward whose graph no later backward used."""
    findings = []
    for bw in _backwards_of(trace, step):
        if not bw.retain_graph or bw.graph_reused or not bw.held_bytes or bw.error:
            continue
        where = describe_site(trace, bw.site)
        findings.append(
            Finding(
                "retained-graph",
                "warning",
                bw.step,
                f"the backward at {where} passes retain_graph=True, but no later backward in step {bw.step} "
                f"runs through that graph: {human_bytes(bw.held_bytes)} of saved tensors stay alive past the "
                "step instead of being freed",
                f"drop retain_graph=True at {trace.where(bw.site)}: keep it only on a backward that another "
                "backward of the same graph follows; the last backward must not retain",
                {"key": trace.where(bw.site), "sites": [trace.where(bw.site)], "steps": [bw.step], "bytes": bw.held_bytes},
            )
        )
    return findings


def graph_kept_alive(trace: Trace, step: StepRecord) -> list[Finding]:
    """Graphs of earlier steps alive at this step's end that its backwards did not use."""
    used = {s for bw in _backwards_of(trace, step) for s in bw.earlier_steps}
    findings = []
    for holder in step.holders:
        kept = [s for s in holder.steps if s not in used]
        if not kept:
            continue
        site = trace.site(holder.site)
        made = f"made at {site.where} (`{site.source}`)" if site else f"in {holder.scope}"
        live = sum(b for s, b in step.saved_alive_by_step.items() if s in kept)
        findings.append(
            Finding(
                "graph-kept-alive",
                "warning",
                step.index,
                f"`{holder.name}` ({made}) keeps the graphs of {_steps_text(kept)} alive at the end of step "
                f"{step.index}: {holder.nodes} nodes"
                + (f" and {human_bytes(live)} of saved tensors" if live else "")
                + " that no backward will use",
                f"keep a number, not the graph: `{holder.name.split('[')[0]} += loss.item()` (or `.detach()`) "
                f"at {site.where if site else holder.scope}; run evaluation under `torch.no_grad()`",
                {
                    "key": site.where if site else holder.name,
                    "sites": [site.where] if site else [],
                    "steps": [step.index],
                    "holder": holder.name,
                    "bytes": live,
                    "nodes": holder.nodes,
                },
            )
        )
    if not step.holders:
        findings.extend(_unnamed_kept(trace, step, used))
    return findings


def _unnamed_kept(trace: Trace, step: StepRecord, used: set[int]) -> list[Finding]:
    kept = sorted(
        s for s in set(step.saved_alive_by_step) | set(step.nodes_alive_by_step) if s < step.index and s not in used
    )
    if not kept:
        return []
    live = sum(step.saved_alive_by_step.get(s, 0) for s in kept)
    nodes = sum(step.nodes_alive_by_step.get(s, 0) for s in kept)
    sites = sorted({trace.where(r.site) for r in trace.saved.values() if r.alive and r.step in kept})[:5]
    return [
        Finding(
            "graph-kept-alive",
            "warning",
            step.index,
            f"graphs of {_steps_text(kept)} are still alive at the end of step {step.index} ({nodes} nodes, "
            f"{human_bytes(live)} of saved tensors) and no backward used them; something outside the "
            "training loop's frames holds them (a list, an attribute, a global)"
            + (f"; their tensors were saved at {', '.join(sites)}" if sites else ""),
            "keep numbers (`loss.item()`) or detached tensors (`.detach()`) across steps; run evaluation "
            "under `torch.no_grad()`",
            {"key": sites[0] if sites else None, "sites": sites, "steps": [step.index], "bytes": live, "nodes": nodes},
        )
    ]


def missing_zero_grad(trace: Trace, step: StepRecord) -> list[Finding]:
    """``optimizer.step()`` ran on gradients that were never reset since its previous step."""
    if not step.stale_grads:
        return []
    backward_sites = [trace.where(bw.site) for bw in _backwards_of(trace, step) if bw.api == "backward"]
    where = trace.where(step.optimizer_site)
    before = backward_sites[0] if backward_sites else "the backward"
    return [
        Finding(
            "missing-zero-grad",
            "warning",
            step.index,
            f"optimizer.step() at {where} in step {step.index} used gradients of {step.stale_grads} parameters "
            "that still held the sum of every earlier step's gradients: nothing reset them after the previous "
            "optimizer step",
            f"call `optimizer.zero_grad()` before the backward at {before} (for intended accumulation over "
            "micro-batches, zero once every N steps, after optimizer.step())",
            {"key": where, "sites": [where] + backward_sites[:1], "steps": [step.index], "parameters": step.stale_grads},
        )
    ]


def step_findings(trace: Trace, step: StepRecord) -> list[Finding]:
    """Every finding the records of one finished step support."""
    findings: list[Finding] = []
    for detector in (carried_across_steps, retained_graph, graph_kept_alive, missing_zero_grad):
        findings.extend(detector(trace, step))
    return findings


def _steps_text(steps: list[int]) -> str:
    named = ["before the session" if s < 0 else str(s) for s in steps]
    if len(named) == 1:
        return "the session's start" if steps[0] < 0 else f"step {named[0]}"
    return f"steps {named[0]}..{named[-1]}" if len(named) > 3 else "steps " + ", ".join(named)
