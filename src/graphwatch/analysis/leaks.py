"""Graphs that outlive their step because a Python value keeps them (``graph-kept-alive``); graphs retained for
nothing are :mod:`.retained`'s.

Judged one step late, on purpose: a variable that is reassigned once per iteration legitimately holds the previous
iteration's graph until then (in a GAN, the generator's loss survives the discriminator's step).

Example::

    >>> from graphwatch.analysis.leaks import LAG_STEPS, HELD_STEPS
    >>> LAG_STEPS, HELD_STEPS
    (1, 3)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..capture.lines.source import assigned_names, kept_in
from ..model import CallSite, Finding, Holder, Remedy, StepRecord, StepSpans, Trace
from ..model.records import held_value, within
from .evidence import (
    alive_graph_sites,
    backward_name,
    backwards_of,
    counted,
    describe,
    human_bytes,
    reads_name,
    site_chain,
    spans_text,
)
from .findings import make_finding, renderer, same_cause
from .kept_fixes import (
    GENERIC,
    evaluation_remedy,
    holder_remedy,
    inplace_update_remedy,
    parameters_remedy,
    part_remedy,
    returned_origin,
)

# --------------------------------------------------------------- kept alive
# A variable reassigned once an iteration holds the previous iteration's graph until it is reassigned:
# a graph of the step just before is normal lag, never a finding.
LAG_STEPS = 1
# Growing: graphs of at least this many earlier steps, each older than the lag, alive at once, and more
# of them than at the previous step's end (``total_loss += loss``, a list of losses: found at step 3).
GROWING_STEPS = 2
# Held: one step's graph that still holds saved tensors (no backward ever ran through it: a validation
# forward without ``no_grad``) alive this many steps after its own.
HELD_STEPS = 3
# Graphs of step 0 and before are also the set-up's (a graph made before the loop and kept in a global):
# one of them held is never a finding; only growth beyond them is.
FIRST_LOOP_STEP = 1


def _beyond_lag(kept: list[int], index: int) -> list[int]:
    """The kept steps that are older than the lag at the end of step ``index``."""
    return [s for s in kept if s < index - LAG_STEPS]


def _leaks(kept: list[int], step: StepRecord, before: list[int], before_index: int, holds_saved: bool) -> bool:
    """Growing (several old graphs, more than at the end of step ``before_index``, when it kept ``before``), or
    one graph held for long."""
    old = _beyond_lag(kept, step.index)
    if len(old) >= GROWING_STEPS and len(old) > len(_beyond_lag(before, before_index)):
        return True
    loop = [s for s in old if s >= FIRST_LOOP_STEP]
    return holds_saved and bool(loop) and loop[0] <= step.index - HELD_STEPS


def _previous(trace: Trace, step: StepRecord, before: StepRecord | None) -> StepRecord | None:
    """The step end to compare with: ``before`` when given, else the step before ``step`` (None: none)."""
    if before is not None:
        return before
    return trace.steps[step.index - 1] if 0 < step.index <= len(trace.steps) else None


def _kept_before(previous: StepRecord | None, key: tuple) -> list[int]:
    """The steps the same holder kept at the end of ``previous`` (empty when unknown)."""
    if previous is None:
        return []
    return sorted({s for h in previous.holders if _holder_key(h) == key for s in h.steps})


def _holder_key(holder: Holder) -> tuple:
    return held_value(holder.name), holder.site


def _backwarded_names(trace: Trace, step: StepRecord) -> set[str]:
    """The names this step's backwards are called on (``loss`` for ``loss.backward()``)."""
    return {backward_name(trace, bw, "") for bw in backwards_of(trace, step)} - {""}


def _evaluation_lines(trace: Trace, kept: set[int]) -> list[CallSite]:
    """The lines of the kept graphs' forwards that only evaluate, safe to put under ``no_grad``, most bytes first.

    For each saved tensor of a kept step that no backward freed: the innermost frame of its calls that no
    training forward ran through (the training loop's function first, when one is). A training forward is
    told by the call sites of the saved tensors a backward freed (``CallSite.backwarded``) or of the nodes
    one ran through (recorded in the window), and every frame that called them: a model's own line runs the
    training forward too, so the evaluation's call of the model is the line, never the model's. None for a
    tensor every frame of whose calls also trained, and none at all where backwards ran but no call site was
    seen to train (a trace without the mark)."""
    trained: set[str] = set()
    sites = [i for i, site in enumerate(trace.sites) if site.backwarded]
    sites += [  # a node a backward ran through: a retained graph's, whose tensors it did not free (not a line
        node.site for node in trace.nodes.values()  # taken from a neighbour, nor a parameter's AccumulateGrad)
        if node.backward is not None and node.site is not None and not node.site_inferred and node.op != "AccumulateGrad"
    ]
    for site_id in sites:
        trained.update(s.where for s in site_chain(trace, site_id))
    if not trained and len(trace.backwards):
        return []
    loops = {(s.file, s.function) for b in trace.backwards[-64:] if (s := trace.site(b.site)) is not None}
    alive: dict[str, int] = {}
    lines: dict[str, CallSite] = {}
    for record in trace.saved.values():
        if record.site is None or record.freed_by is not None or not record.alive or record.step not in kept:
            continue
        untrained = [s for s in site_chain(trace, record.site) if s.where not in trained]
        if not untrained:
            continue
        line = next((s for s in untrained if (s.file, s.function) in loops), untrained[0])
        alive[line.where] = alive.get(line.where, 0) + max(record.nbytes, 1)
        lines.setdefault(line.where, line)
    return [lines[w] for w in sorted(alive, key=lambda w: -alive[w])]


def graph_kept_alive(
    trace: Trace, step: StepRecord, refresh: bool = True, before: StepRecord | None = None
) -> list[Finding]:
    """Graphs of earlier steps alive at this step's end that its backwards did not use (see the thresholds).

    ``refresh=False`` skips the holders already reported (see :func:`~graphwatch.analysis.step_findings`).
    ``before``: the step end that growth is judged against (default: the previous step's; at the default level
    the last one looked at in full detail, as it was then).
    """
    previous = _previous(trace, step, before)
    used = {s for bw in backwards_of(trace, step) for s in bw.earlier_steps}
    groups: dict[tuple, list[Holder]] = {}
    for holder in step.holders:
        groups.setdefault(_holder_key(holder), []).append(holder)
    reported = set() if refresh else {f.evidence.get("key") for f in trace.findings if f.kind == "graph-kept-alive"}
    findings = []
    for key, holders in groups.items():
        if reported and _finding_key(trace, holders[0]) in reported:
            continue
        kept = sorted({s for h in holders for s in h.steps if s not in used})
        moment = kept_moment(step, kept)
        if not _leaks(kept, step, _kept_before(previous, key), previous.index if previous else -1, moment["bytes"] > 0):
            continue
        findings.append(_kept_finding(trace, step, holders, kept, moment))
    if not step.holders:  # a named holder's walk stops at freed nodes: what lies below it is its, too
        findings.extend(_unnamed_kept(trace, step, used, previous))
    return findings


def kept_moment(step: StepRecord, kept: Iterable[int]) -> dict:
    """What the graphs of the steps ``kept`` hold at the end of ``step``, counted once for every view of a
    kept-alive finding (its message, its picture's caption and boxes, the trace): ``{"step": the step at whose
    end it was seen, "spans": the kept steps as inclusive [first, last] spans, "nodes": their autograd nodes
    alive, "bytes": their saved tensors' bytes alive}``, all from the step's record.

    >>> step = StepRecord(index=9, source="optimizer", nodes_alive_by_step={5: 7, 6: 7, 9: 7}, saved_alive_by_step={6: 512})
    >>> kept_moment(step, [5, 6])
    {'step': 9, 'spans': [[5, 6]], 'nodes': 14, 'bytes': 512}
    """
    steps = StepSpans.of(kept)
    return {
        "step": step.index,
        "spans": [[start, end - 1] for start, end in steps.spans],
        "nodes": sum(step.nodes_alive_by_step.get(s, 0) for s in steps),
        "bytes": sum(step.saved_alive_by_step.get(s, 0) for s in steps),
    }


def kept_size(moment: dict, short: bool = False) -> str:
    """The size of a :func:`kept_moment`: '14 autograd nodes, 512 B of saved tensors' ('14 nodes, 512 B saved'
    when ``short``); '' when it holds neither.

    >>> kept_size({"nodes": 14, "bytes": 512}), kept_size({"nodes": 1, "bytes": 0}, short=True)
    ('14 autograd nodes, 512 B of saved tensors', '1 node')
    """
    node, saved = ("node", "{} saved") if short else ("autograd node", "{} of saved tensors")
    parts = [counted(moment["nodes"], node)] * bool(moment["nodes"])
    parts += [saved.format(human_bytes(moment["bytes"]))] * bool(moment["bytes"])
    return ", ".join(parts)


def _finding_key(trace: Trace, holder: Holder) -> str:
    """The key of a holder's kept-alive finding: its line, or where the name lives and the name."""
    name, site_id = _holder_key(holder)
    site = trace.site(site_id)
    return site.where if site else f"{holder.namespace}: {name}"


def _kept_finding(trace: Trace, step: StepRecord, holders: list[Holder], kept: list[int], moment: dict) -> Finding:
    _, site_id = _holder_key(holders[0])
    live = moment["bytes"]
    site = trace.site(site_id)
    name = _container(holders[0].name, site)
    graph = alive_graph_sites(trace, kept)
    backwarded = name in _backwarded_names(trace, step)  # its value is backwarded: no .item() or no_grad
    evaluation = _evaluation_lines(trace, set(kept))
    never_backwarded = live > 0 and not backwarded and not any(h.nodes for h in holders) and bool(evaluation)
    evaluation_at = [line.where for line in evaluation]
    fixed_at = evaluation_at if never_backwarded else []  # the evaluation's lines, where its fix goes
    origin = returned_origin(site) if site is not None else None  # the `return` whose value it keeps
    returned = None if site is None or origin is None else {
        "function": origin.function, "at": f"{site.file}:{origin.line}", "value": origin.value
    }  # fmt: skip
    evidence: dict[str, Any] = {
        "key": _finding_key(trace, holders[0]),
        "sites": list(dict.fromkeys(([site.where] if site else []) + fixed_at + graph)),
        "steps": [step.index],
        "kept": moment | {"items": _items(holders, name) if holders[0].name != name else None},
        "holder": name,
        "holder_at": describe(site) if site else f"in {holders[0].scope}",
        "holder_source": site.source if site else None,  # what the line that feeds it reads (see _same_holding)
        "item_path": holders[-1].name if within(holders[-1].name, name) else None,  # inside each item: ``buffer[8][1]``
        "graph_at": graph,
        "never_backwarded": never_backwarded,
        "evaluation_at": evaluation_at,
        "parameters": name.endswith(".parameters()"),
        "returned": returned,
    }
    remedies: list[Remedy] = []
    if evidence["parameters"]:
        through = any(h.backwarded for h in holders)  # no_grad would change the gradients that flow there
        remedies.append(parameters_remedy(trace, name[: -len(".parameters()")], None if through else site))
    elif never_backwarded:
        remedies.append(evaluation_remedy(trace, _evaluation_line(evaluation, site)))
    spelled = _spelled(site, name) if site is not None and not backwarded and not evidence["parameters"] else None
    if site is not None and evidence["item_path"]:  # the line stores more than the tensor: a tuple holding it
        remedies.append(part_remedy(site, name, holders))
        spelled = None
    keep = holder_remedy(site, spelled, holders) if site is not None and spelled is not None else None
    if keep is None and site is not None and spelled is not None:
        keep = inplace_update_remedy(trace, site, spelled, holders)
    remedies += [keep] if keep is not None else [] if remedies else [Remedy(GENERIC)]
    source = _made_from_holder(step, name, site) if site is not None else None
    if source is not None and site is not None:  # (its own patch, beside that holder's, would meet a number there)
        remedies = [Remedy(f"`{name}` is made from `{source}` (its line, {site.where}, reads it), which keeps the "
                           f"same graphs: the fix of `{source}`'s finding frees these too")]
    edited = [f"{edit.file}:{edit.line}" for remedy in remedies for edit in remedy.edits]  # where its fix goes too
    evidence["sites"] = list(dict.fromkeys(evidence["sites"][:1] + edited + evidence["sites"][1:]))
    return make_finding("graph-kept-alive", "warning", step.index, evidence, remedies)


def _items(holders: list[Holder], container: str) -> int:
    """How many items of ``container`` the holders run through (a dict item holding two tensors is one item)."""
    return len({h.name[: len(h.name) - len(within(h.name, container))] for h in holders})


def _evaluation_line(evaluation: list[CallSite], site: CallSite | None) -> CallSite:
    """Which of the ``evaluation`` lines to run under ``no_grad`` for the holder whose line is ``site``: the first
    one whose names that line reads (the forward ``out = model(xv)`` of ``history.append(F.mse_loss(out, yv))``),
    else the holder's own line where it is one (``test_b = net_b(x)`` beside ``test_a = net_a(x)``), else the
    first."""
    if site is None or all(line.where != site.where for line in evaluation):
        return evaluation[0]
    for line in evaluation:
        if line.where == site.where:
            return line
        if any(reads_name(site.source, name, dotted=True) for name in assigned_names(line.source)):
            return line
    return evaluation[0]


def _made_from_holder(step: StepRecord, name: str, site: CallSite) -> str | None:
    """Another holder of the same object whose attribute ``name``'s line reads (``self.avg = self.sum /
    self.count`` for ``meter.avg`` beside ``meter.sum``), or None: the graphs ``name`` keeps come through it."""
    owner, _, _ = name.rpartition(".")
    if not owner:
        return None
    for holder in step.holders:
        other_owner, _, attr = holder.name.rpartition(".")
        if holder.name != name and other_owner == owner and reads_name(site.source, f"self.{attr}", dotted=True):
            return holder.name
    return None


def _container(name: str, site: CallSite | None) -> str:
    """What the holder ``name`` is kept in: the container its line adds to or assigns, where its path runs through
    it by literal keys (``history['loss']`` for ``history['loss'][3]``, a dict of lists appended to by key), else
    :func:`held_value` (``buffer`` for ``buffer[3][1]``)."""
    held = held_value(name)
    kept = kept_in(site.source) if site is not None else None
    if kept is not None and len(kept) > len(held) and (name == kept or name.startswith(kept + "[")):
        return kept
    return held


def _spelled(site: CallSite, name: str) -> str | None:
    """The holder as ``site``'s line spells it (``self.baseline`` for ``policy.baseline``): the name it assigns
    or adds to; the holder's name when the line appends to it."""
    attr = name.rsplit(".", 1)[-1]
    assigned = [n for n in assigned_names(site.source) if n == name or ("." in name and n.endswith(f".{attr}"))]
    return assigned[0] if assigned else name


def _alive_in(trace: Trace, step: StepRecord, s: int) -> bool:
    """Is a graph of step ``s`` really alive (not just bytes of a shared storage counted under ``s``)?"""
    if step.nodes_alive_by_step.get(s):
        return True
    detail = s < 0 or (s < len(trace.steps) and trace.steps[s].detail)
    return not detail or any(r.alive and r.step == s for r in trace.saved.values())


def _unnamed_kept(trace: Trace, step: StepRecord, explained: set[int], previous: StepRecord | None) -> list[Finding]:
    candidates = set(step.saved_alive_by_step) | set(step.nodes_alive_by_step)
    kept = sorted(s for s in candidates if s < step.index and s not in explained and _alive_in(trace, step, s))
    moment = kept_moment(step, kept)
    live = moment["bytes"]
    before: list[int] = []
    if previous is not None:
        alive = set(previous.saved_alive_by_step) | set(previous.nodes_alive_by_step)
        before = sorted(s for s in alive if s < previous.index)
    if not _leaks(kept, step, before, previous.index if previous else -1, live > 0):
        return []
    graph = alive_graph_sites(trace, kept)
    evidence = {
        "key": graph[0] if graph else None,
        "sites": graph,
        "steps": [step.index],
        "kept": moment | {"items": None},
        "holder": None,
        "holder_at": None,
        "graph_at": graph,
        "never_backwarded": False,
        "evaluation_at": [],
    }
    return [make_finding("graph-kept-alive", "warning", step.index, evidence, [Remedy(GENERIC)])]


@same_cause("graph-kept-alive")
def _same_holding(old: Finding, new: Finding) -> int:
    """A finding that could not name its holder and one that could are one cause when the same lines made the
    graphs they keep (or, both keeping graphs without saved tensors, the same steps' graphs): 2 when the new
    one names it.  A holder fed from another one (``all_losses.append(current_loss / 4)`` after ``current_loss
    += loss``) is that one's cause: fixing the line that feeds the first fixes both (1)."""
    a, b = old.evidence, new.evidence
    if a.get("holder") is not None and b.get("holder") is not None:
        return 1 if _feeds(a, b) or _same_return(a, b) else 0
    if (a.get("holder") is None) == (b.get("holder") is None):
        return 0
    shared = bool(set(a.get("graph_at") or []) & set(b.get("graph_at") or []))
    if not shared and not (a.get("graph_at") or b.get("graph_at")):
        spans = b["kept"]["spans"]
        shared = any(first <= last_b and first_b <= last for first, last in a["kept"]["spans"] for first_b, last_b in spans)
    return (2 if a.get("holder") is None else 1) if shared else 0


def _feeds(upstream: dict, downstream: dict) -> bool:
    """Whether the line that feeds the holder of ``downstream`` reads the holder of ``upstream``, in the same file
    (which then gets the name and line of ``downstream`` as its ``fed``, and its later moments)."""
    up, down = upstream.get("sites") or [""], downstream.get("sites") or [""]
    source = downstream.get("holder_source")
    same_file = up[0].rpartition(":")[0] == down[0].rpartition(":")[0]
    if not (source and same_file and reads_name(source, upstream["holder"])):
        return False
    downstream.setdefault("fed", {"holder": downstream["holder"], "at": down[0]})
    return True


def _same_return(kept: dict, new: dict) -> bool:
    """Whether both holders keep what one ``return`` gave (the seq2seq tutorial's ``print_loss_total`` and
    ``plot_loss_total``, both fed by what ``train()`` returns): one root cause, fixed by one edit there.  ``kept``
    then lists ``new``'s holder and line among those that keep it (``also``)."""
    returned = kept.get("returned")
    if returned is None or returned != new.get("returned"):
        return False
    also = kept.setdefault("also", [])
    holder = {"holder": new["holder"], "at": (new.get("sites") or [""])[0]}
    if holder not in also and holder["holder"] != kept["holder"]:
        also.append(holder)
    return True


@renderer("graph-kept-alive")
def _render_kept(ev: dict) -> str:
    kept = ev["kept"]  # one moment: the last step end it was seen at (the picture's caption says the same)
    size = kept_size(kept)
    made = f" (their tensors were saved at {', '.join(ev['graph_at'])})" if ev["graph_at"] else ""
    if ev["holder"] is None:
        who = "something outside the training loop's frames (a list, an attribute, a global) keeps"
    else:
        fed, also = ev.get("fed"), ev.get("also") or []  # (its items are the fed holder's, or another's, then)
        items = f"through {kept['items']} of its items" if kept.get("items") and not (fed or also) else ""
        where = "" if ev.get("parameters") else ev["holder_at"]
        detail = ", ".join(part for part in (where, items) if part)
        path = f", e.g. `{ev['item_path']}`" if ev.get("item_path") and not (fed or also) else ""
        through = f" and `{fed['holder']}`, fed from it at {fed['at']}," if fed else ""
        if also:  # holders fed by what one `return` gave (see _same_return)
            others, returned = ", ".join(f"`{h['holder']}` at {h['at']}" for h in also), ev["returned"]
            every = "both" if len(also) == 1 else "all"
            through += f" and {others}, {every} fed by what `{returned['function']}()` returns at {returned['at']},"
        keep = " keep" if fed or also else " keeps"
        who = f"`{ev['holder']}`" + (f" ({detail}{path})" if detail else "") + through + keep
    return (
        f"{who} the graphs of {spans_text(kept['spans'])} alive at the end of step {kept['step']}"
        + (f": {size}" if size else "")
        + f" that no backward will use{made}"
    )
