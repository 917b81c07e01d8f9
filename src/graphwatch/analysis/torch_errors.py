"""Findings for more of torch's autograd errors, each explained after torch's own text:

- ``modified-in-place``: "one of the variables needed for gradient computation has been modified by an
  inplace operation".  The finding names the line that changed the saved tensor (not only the one that saved
  it) and, where the out-of-place form keeps what the program computes, patches it there (``out-of-place``):
  ``x = x.relu()`` for ``x.relu_()``, ``inplace=False`` on the line that built a module with ``inplace=True``,
  ``att = att.clone()`` before ``att[...] = 0`` (before the first of several such lines, all named).  A
  recurrence written into one tensor (``h[:, t + 1] = f(h[:, t])``) gets words: the states in a list, stacked
  (a ``.clone()`` before the loop does not help); an ``optimizer.step()`` that ran between the forward and a
  backward needing its parameters gets words naming both lines, to reorder.
- ``loss-without-graph``: "element 0 of tensors does not require grad and does not have a grad_fn".  The
  finding names the ``with torch.no_grad():`` block or ``@torch.no_grad()`` decorator the loss was made
  under, and, for a block, puts the statements from the loss's first line to the backward under
  ``torch.enable_grad()`` (``enable-grad``).
- ``non-scalar-backward``: "grad can be implicitly created only for scalar outputs".  The finding names the
  line that made the loss, its shape, and the criterion built with ``reduction='none'`` that made it (where it
  is built); the fix, ``.mean()`` or ``.sum()``, is the user's choice: no patch.
- ``unused-grad-input``: "... appears to not have been used in the graph" (``torch.autograd.grad``).  The
  finding names the input, where it was made, and the tensors of its shape the outputs were computed from
  instead (a gradient penalty's critic run on ``interp`` while ``interp_copy`` is differentiated); no patch.
- ``leaf-modified-in-place``: "a leaf Variable that requires grad is being used in an in-place operation".
  The finding names the parameter as the frames do (``model.fc.weight``) and the statement; for a parameter,
  the update goes under ``with torch.no_grad():`` (``no-grad``: the loop over the parameters when it only
  updates them).

A non-scalar backward and a leaf changed in place are raised by the user's own call, before any engine run
graphwatch sees: they are explained as they leave the session, from the frames their traceback keeps
(:meth:`graphwatch.backwards.BackwardWatch.explain_escaped`).

Example::

    >>> from graphwatch.analysis.torch_errors import is_no_graph_error
    >>> is_no_graph_error(RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn"))
    True
"""

from __future__ import annotations

import re

from ..model import CallSite, Edit, Finding, Remedy, Trace
from ..model.causes import InplaceCause, NoGraphCause
from ..model.error_causes import LeafInplaceCause, NonScalarCause, UnusedInputCause
from .error_remedies import edited_line
from .evidence import describe, step_name
from .graph_cuts import cut_finding
from .kept_fixes import training_lines

INPLACE_KIND = "modified-in-place"
CARRIED_KIND = "graph-carried-across-steps"
NO_GRAPH_KIND = "loss-without-graph"
_NO_GRAPH = "does not require grad and does not have a grad_fn"


def is_no_graph_error(error: BaseException) -> bool:
    """True for torch's error about backwarding a tensor that has no graph."""
    return isinstance(error, RuntimeError) and _NO_GRAPH in str(error)


def carried_update(trace: Trace, cause: InplaceCause, step: int) -> bool:
    """Whether the parameter changed in place was updated after an earlier step's graph saved it, and the trace
    has that graph's ``graph-carried-across-steps`` finding: the finding of the cause, with its fix (as for an
    ``optimizer.step()``, :mod:`graphwatch.capture.hooks.inplace_hints`); the error's paragraph says the rest."""
    return cause.update and cause.saved_step < step and any(f.kind == CARRIED_KIND for f in trace.findings)


def inplace_finding(trace: Trace, cause: InplaceCause, step: int) -> Finding:
    """The finding of a saved tensor changed in place; its message follows torch's text."""
    saved, changed = trace.site(cause.saved_at), trace.site(cause.changed_at)
    twice = saved is not None and changed is not None and cause.called_at is not None and saved.where == changed.where
    saving_call = trace.site(saved.caller) if twice and saved is not None else None  # a helper's line, run twice
    by = f", in the function called at {describe(saving_call)}" if saving_call is not None else ""
    lines = [f"graphwatch: the tensor was saved at {describe(saved)}{by} ({step_name(cause.saved_step)})"]
    remedies: list[Remedy] = []
    also = [s for s in map(trace.site, cause.changed_also) if s is not None]
    if cause.found_by == "optimizer":
        fix = _optimizer_step(trace, cause, lines)
        remedies.append(Remedy(fix, [], "which update comes first, and which gradients each optimizer step sees, "
                               "need your judgement"))
    elif cause.update:
        fix = _parameter_update(trace, cause, lines, step, [changed, *also] if changed is not None else [])
        remedies.append(Remedy(fix, [], "the update is what trains the parameter: which graph each backward reaches "
                               "needs your judgement"))
    elif changed is None:
        lines[0] += (". Something changed it in place after autograd saved it; use the out-of-place form "
                     "(e.g. x = x.add(1) instead of x.add_(1)) or .clone() it first (graphwatch could not tell "
                     "which line changed it).")
        fix = "use the out-of-place form where the tensor is changed after it is saved"
    else:
        found = {"node": "its node in the graph", "save": "a later save of the changed tensor",
                 "source": "the in-place statements between the lines that ran around it"}.get(cause.found_by, "")
        named = ", ".join(describe(s) for s in [changed, *also][:-1]) + " and " if also else ""
        lines[0] += f", then changed in place at {named}{describe(also[-1] if also else changed)}"
        called = trace.site(cause.called_at)
        lines[0] += f", in the function called at {describe(called)}" if called is not None else ""
        lines[0] += (f" (found from {found})" if found else "") + "."
        remedy = _recurrence(trace, cause) or _through_call(trace, cause) or _out_of_place(trace, cause, changed.where)
        if cause.module:
            built = trace.site(cause.built_at)
            lines.append(f"The change is made by `{cause.module}`, an nn.{cause.module_type} built with "
                         + (f"inplace=True at {describe(built)}." if built else f"inplace=True ({cause.note})."))
        if remedy is not None:
            remedies.append(remedy)
            lines.append(("Fix (no patch: it needs your judgement): " if not remedy.edits else "Fix: ") + remedy.text)
        fix = remedy.text if remedy else f"make the in-place operation at {changed.where} out of place"
    cited = (changed, *also, trace.site(cause.optimizer_at), trace.site(cause.backward_at) if cause.optimizer_at
             else None, saved, trace.site(cause.built_at), trace.site(cause.loop_at), trace.site(cause.called_at))  # fmt: skip
    where = [s.where for s in cited if s is not None]
    evidence = {
        "key": f"{where[0] if where else '?'} -> {saved.where if saved else '?'}",
        "sites": list(dict.fromkeys(where)),
        "steps": [step],
        "saved_at": saved.where if saved else None,
        "changed_at": changed.where if changed else None,
        "changed_also": [s.where for s in also],
        "called_at": trace.where(cause.called_at) if cause.called_at is not None else None,
        "found_by": cause.found_by,
        "op": cause.op,
        "module": cause.module,
        "built_at": trace.where(cause.built_at) if cause.built_at is not None else None,
        "optimizer_at": trace.where(cause.optimizer_at) if cause.optimizer_at is not None else None,
    }
    return Finding(INPLACE_KIND, "error", step, "\n".join(lines), fix, evidence, remedies=remedies)


def _optimizer_step(trace: Trace, cause: InplaceCause, lines: list[str]) -> str:
    """What ``lines`` say of an ``optimizer.step()`` that updated a parameter the running backward needs (saved by
    this step's forward), and the fix: that backward before that step, or the forward recomputed after it."""
    stepped, backward = trace.site(cause.optimizer_at), trace.site(cause.backward_at)
    lines[0] += (f". optimizer.step() at {stepped.where if stepped else '<unknown line>'} updated this parameter in "
                 f"place after the graph saved it, and the backward at {describe(backward)} ran after that step "
                 "through the same graph.")
    order = (f" (`{backward.source}` at {backward.where} above `{stepped.source}` at {stepped.where}, each "
             "optimizer's `zero_grad()` placed so that its step sees only its own loss's gradients)"
             if backward is not None and stepped is not None else "")  # fmt: skip
    fix = (f"run this backward before that optimizer step{order}, or recompute the forward after the step (a GAN: "
           "the generator's loss on a fresh D(fake) made after D's step)")
    lines.append(f"Fix (no patch: the order of the updates needs your judgement): {fix}.")
    return fix


def _parameter_update(trace: Trace, cause: InplaceCause, lines: list[str], step: int, updates: list[CallSite]) -> str:
    """What ``lines`` say of a saved parameter that an update changed in place (the user's own, ``updates``, or an
    optimizer's the session did not see), and the fix: the backward kept off the graph saved before the update,
    never the update out of place or on a copy (the parameter would not train)."""
    backward = trace.site(cause.backward_at)
    if updates:
        named = ", ".join(describe(s) for s in updates[:-1]) + " and " if len(updates) > 1 else ""
        lines[0] += f", a parameter, then updated in place at {named}{describe(updates[-1])}"
        update = f"the update at {updates[0].where}"
    else:
        lines[0] += (", a parameter; an update changed it in place after the graph saved it (graphwatch could not "
                     "tell which line: your own update, or an optimizer's step)")
        update = "that update"
    if cause.saved_step < step:
        lines[0] += (f"; step {step}'s backward at {describe(backward)} runs into step {cause.saved_step}'s graph "
                     f"again, which saved the parameter before {update}: a graph of an earlier step is reused.")
        fix = ("cut what carries the graph into the next step, so that each backward uses only its own step's "
               "graph, and drop retain_graph=True (the graph-carried-across-steps finding names what carries it and "
               "how: a state fed on is detached at the start of each step, a value made once and reused is made anew "
               "in each step); the update itself is right: out of place, or on a copy, the parameter would not train")
    else:
        lines[0] += f"; the backward at {describe(backward)} ran after {update} through the same graph."
        fix = (f"run this backward before {update} (each backward of a graph first, then the update), or recompute "
               "the forward after the update; the update itself is right: out of place, or on a copy, the parameter "
               "would not train")
    lines.append(f"Fix (no patch: it needs your judgement): {fix}.")
    return fix


def _recurrence(trace: Trace, cause: InplaceCause) -> Remedy | None:
    """For a tensor written one slice per step of a loop from its own earlier slices: the states kept in a list
    and stacked (words: the stacking and what the loop reads need judgement); never a ``.clone()`` first."""
    loop, changed = trace.site(cause.loop_at), trace.site(cause.changed_at)
    if loop is None or changed is None:
        return None
    name = cause.target or "the tensor"
    text = (f"`{name}` is written one slice per step of the loop at {describe(loop)}, each step from a slice an "
            f"earlier step wrote and autograd saved; keep the states in a list instead (append what the assignment "
            f"at {changed.where} computes, reading the last state from the list) and `torch.stack` them after the "
            f"loop. A `.clone()` of `{name}` before the loop does not help: the clone is itself written in place "
            "at every step.")
    return Remedy(text, [], "the dimension to stack on and the slices the loop reads need your judgement")


def _through_call(trace: Trace, cause: InplaceCause) -> Remedy | None:
    """For a function that changed in place the tensor its caller passed it (a helper called between the forward
    and the loss): words, as which callers need the change is the user's to judge."""
    called, changed = trace.site(cause.called_at), trace.site(cause.changed_at)
    if called is None or changed is None:
        return None
    text = (f"the function called at {describe(called)} changes the tensor it is given in place at {changed.where}, "
            "after autograd saved it: pass it a copy autograd did not save (`.clone()` the tensor and assign the clone "
            "to the caller's name before the call, so that what follows reads the changed copy), or make the function "
            "out of place and assign what it returns at the call")
    return Remedy(text, [], "the function changes its caller's tensor: where the change is needed is your judgement")


# why the out-of-place form is not patched (InplaceCause.unsafe): the remedy's words, and its reason
_UNSAFE = {
    "view": ("the in-place operation at {where} changed a view whose base may need the change: make it out of place "
             "only if nothing reads the base afterwards", "the changed tensor is a view of another"),
    "alias": ("the in-place operation at {where} changed {name}, which a later line reads through another name: make "
              "it out of place only if that name need not see the change", "the changed tensor has another name"),
    "helper": ("the in-place operation at {where} changed {name}, a tensor its function was given (the caller's "
               "tensor changes too): make it out of place only if the caller need not see the change",
               "the changed tensor is the caller's"),
    "outside": ("the in-place operation at {where} changed {name}, a tensor that required no grad (an input, data or a "
                "buffer) and that graphwatch cannot tell the function made: make it out of place only if nothing "
                "else holds it and reads the change", "the changed tensor may be held outside its function"),
}  # fmt: skip


def _out_of_place(trace: Trace, cause: InplaceCause, changed_where: str) -> Remedy | None:
    site = trace.site(cause.built_at) if cause.module else trace.site(cause.changed_at)
    if site is None or (cause.module is None and cause.target is None):
        return None
    edit = Edit("out-of-place", site.file, site.line, cause.target or "")
    line = edited_line(site, edit)
    if line is None:
        return None
    if not cause.safe:
        text, why = _UNSAFE.get(cause.unsafe, _UNSAFE["view"])
        name = f"`{cause.target}`" if cause.target else "the tensor"
        return Remedy(text.format(where=changed_where, name=name) + f" (e.g. `{line}`)", [], why, False)
    why = (f"`{cause.module}` changes its input in place (its result is the same out of place)" if cause.module
           else f"the statement at {changed_where} changes `{cause.target}` in place after autograd saved it")
    text = f"`{line}` at {site.where}" + (f" (where `{cause.module}` is built)" if cause.module else "")
    if cause.changed_also:
        text += f" (the first line that changes `{cause.target}`: the later ones then change the new tensor)"
    return Remedy(text, [edit], why, True)


def no_graph_finding(trace: Trace, cause: NoGraphCause, step: int) -> Finding:
    """The finding of a loss backwarded without a graph; its message follows torch's text."""
    if cause.cut_at is not None or cause.kind in ("op", "frozen"):  # the cut had left the stack
        return cut_finding(trace, cause, step, NO_GRAPH_KIND)
    backward, block = trace.site(cause.backward_at), trace.site(cause.block_at)
    remedies: list[Remedy] = []
    if block is None:
        text = (f"graphwatch: the tensor backwarded at {describe(backward)} was made without a graph, and no "
                "`torch.no_grad()` block or decorator around it is on the stack: look for a `.detach()`, "
                "`.item()`, `.data` or a tensor made from numbers on its way.")
        fix = "make the loss from tensors that require grad (no `.detach()`, `.data` or `torch.no_grad()` on its way)"
    else:
        how = "the `with torch.no_grad():` block" if cause.kind == "with" else "the `@torch.no_grad()` decorator"
        text = (f"graphwatch: the tensor backwarded at {describe(backward)} was made under {how} at "
                f"{describe(block)}" + (f" (of `{cause.function}`)" if cause.function else "")
                + ": nothing it computes has a graph.")
        first, last = trace.site(cause.first), trace.site(cause.last)
        if first is not None and last is not None:
            edit = Edit("enable-grad", first.file, first.line, until=last.line)
            remedies.append(Remedy(
                f"run lines {first.line}..{last.line} of {first.file} (from the first line the loss needs to its "
                f"backward) under `with torch.enable_grad():`; the rest of {how} keeps running without a graph",
                [edit], f"the backward at {backward.where if backward else '?'} runs inside {how} at {block.where}",
                True,
            ))
        else:
            remedies.append(Remedy(
                f"compute the loss outside {how} at {block.where}, or under `with torch.enable_grad():` there",
                [], f"the backward runs inside {how} at {block.where}",
            ))
        fix = remedies[0].text
        text += f"\nFix: {fix}"
    where = [s.where for s in (backward, block) if s is not None]
    evidence = {"key": where[0] if where else "?", "sites": where, "steps": [step],
                "block_at": block.where if block else None, "block": cause.kind or None}
    return Finding(NO_GRAPH_KIND, "error", step, text, fix, evidence, remedies=remedies)


# ------------------------------------------------------------------ errors of the user's own calls
NON_SCALAR_KIND = "non-scalar-backward"
UNUSED_INPUT_KIND = "unused-grad-input"
LEAF_INPLACE_KIND = "leaf-modified-in-place"
_NON_SCALAR = "grad can be implicitly created only for scalar outputs"
_UNUSED = "appears to not have been used in the graph"
_LEAF_INPLACE = "a leaf Variable that requires grad is being used in an in-place operation"
_INDEX = re.compile(r"Tensor at index (\d+) appears")


def is_non_scalar_error(error: BaseException) -> bool:
    """True for torch's error about a backward without a gradient from a tensor of more than one element."""
    return isinstance(error, RuntimeError) and str(error).startswith(_NON_SCALAR)


def is_unused_input_error(error: BaseException) -> bool:
    """True for torch's error about an input of ``torch.autograd.grad`` the outputs were not computed from."""
    return isinstance(error, RuntimeError) and _UNUSED in str(error)


def is_leaf_inplace_error(error: BaseException) -> bool:
    """True for torch's error about a leaf that requires grad changed in place."""
    return isinstance(error, RuntimeError) and str(error).startswith(_LEAF_INPLACE)


def unused_index(error: BaseException) -> int | None:
    """The input's position as torch's message gives it (torch >= 2.6), else None.

    >>> unused_index(RuntimeError("The differentiated Tensor at index 2 appears to not have been used in the graph."))
    2
    """
    found = _INDEX.search(str(error))
    return int(found.group(1)) if found else None


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _named(name: str | None, default: str) -> str:
    return f"`{name}`" if name else default


def _evidence(trace: Trace, step: int, *sites: int | None, **found: object) -> dict:
    """A finding's evidence: its key (the first site's line), the cited lines, the step, and what was found."""
    where = list(dict.fromkeys(trace.where(s) for s in sites if s is not None))
    return {"key": where[0] if where else "?", "sites": where, "steps": [step], **found}


def non_scalar_finding(trace: Trace, cause: NonScalarCause, step: int) -> Finding:
    """The finding of a backward called on a tensor of more than one element; its message follows torch's."""
    backward, made, built = trace.site(cause.backward_at), trace.site(cause.made_at), trace.site(cause.built_at)
    loss = _named(cause.name, "the tensor")
    text = f"graphwatch: {loss} backwarded at {describe(backward)}"
    text += f" holds one value per element, shape {_shape(cause.shape)}, not one number" if cause.shape else " is not one number"
    text += f"; it was made at {describe(made)}" if made is not None else ""
    if cause.criterion:
        how = "the only module built with reduction='none' the frames hold" if cause.criterion_only else "it"
        text += (f" by `{cause.criterion}`, an nn.{cause.criterion_type} built with reduction='none'"
                 + (f" at {describe(built)}" if built is not None else "") + f" ({how} keeps one loss per element)")
    elif cause.unreduced_op:
        text += f" by a loss computed with reduction='none' (its graph's {cause.unreduced_op} keeps one loss per element)"
    text += "."
    fix = (f"reduce {loss} to one number before the backward, as you mean it: `.mean()` (what the default "
           "reduction='mean' does) or `.sum()` (gradients then grow with the batch size)"
           + (f"; or build `{cause.criterion}` without reduction='none'" if cause.criterion else ""))
    text += f"\nFix (your choice, so no patch): {fix}."
    evidence = _evidence(trace, step, cause.backward_at, cause.made_at, cause.built_at, shape=list(cause.shape),
                         criterion=cause.criterion, built_at=built.where if built else None,
                         made_at=made.where if made else None)
    why = "which reduction the loss means (a mean, a sum, a weighting) needs the user's judgement"
    return Finding(NON_SCALAR_KIND, "error", step, text, fix, evidence, remedies=[Remedy(fix, [], why)])


def unused_input_finding(trace: Trace, cause: UnusedInputCause, step: int) -> Finding:
    """The finding of an input of ``torch.autograd.grad`` the outputs were not computed from."""
    call, made = trace.site(cause.call_at), trace.site(cause.made_at)
    unused = _named(cause.name, "the tensor")
    position = f"input {cause.index}" if cause.count > 1 else "the input"
    text = (f"graphwatch: {position} of the `torch.autograd.grad` at {describe(call)}, {unused}"
            + (f" (made at {describe(made)})" if made is not None else "")
            + ", is not in the graph of the outputs: nothing they were computed from comes from it.")
    seen = [s for s in cause.seen if s.requires_grad] + [s for s in cause.seen if not s.requires_grad]
    for tensor in seen[:3]:
        used, built = trace.site(tensor.used_at), trace.site(tensor.made_at)
        text += (f"\nThey were computed from `{tensor.name}`, of the same shape {_shape(cause.shape)}"
                 + (f", made at {describe(built)}" if built is not None else "")
                 + (f", which the model ran on at {describe(used)}" if used is not None else "") + ".")
    target = seen[0] if seen else None
    if target is not None and target.requires_grad:
        fix = (f"pass `{target.name}`, the tensor the outputs were computed from, to `torch.autograd.grad` in place "
               f"of {unused}, or compute the outputs from {unused} (run the model on the tensor you differentiate)")
    elif target is not None:
        fix = (f"compute the outputs from {unused} (run the model on the tensor you differentiate, not on "
               f"`{target.name}`, which does not require grad)")
    else:
        fix = f"compute the outputs from {unused}, or differentiate with respect to a tensor they were computed from"
    fix += "; `allow_unused=True` only if that input is meant to have no gradient (it then gets None)"
    text += f"\nFix (no patch: which tensor is meant needs your judgement): {fix}."
    evidence = _evidence(trace, step, cause.call_at, cause.made_at, *(s.used_at for s in seen[:3]),
                         index=cause.index, input=cause.name, computed_from=[s.name for s in seen])
    return Finding(UNUSED_INPUT_KIND, "error", step, text, fix, evidence,
                   remedies=[Remedy(fix, [], "the outputs and the inputs disagree: only the user knows which is meant")])


def leaf_inplace_finding(trace: Trace, cause: LeafInplaceCause, step: int) -> Finding:
    """The finding of a leaf that requires grad changed in place outside ``torch.no_grad()``."""
    changed = trace.site(cause.changed_at)
    what = _named(cause.target, "a leaf tensor that requires grad")
    named = f"`{cause.parameter}`, " if cause.parameter and cause.parameter != cause.target else ""
    is_what = f"{named}a parameter (a leaf that requires grad)" if cause.is_parameter else "a leaf that requires grad"
    text = (f"graphwatch: the statement at {describe(changed)} changes {what} in place"
            + (f", and {what} is {is_what}" if cause.target else "")
            + ": autograd cannot record an in-place change of a leaf that requires grad outside `torch.no_grad()`.")
    remedies: list[Remedy] = []
    if cause.is_parameter and changed is not None:
        edit = Edit("no-grad", changed.file, changed.line, training=training_lines(trace).get(changed.file, []))
        fix = (f"run the update at {changed.where} under `with torch.no_grad():` (the loop over the parameters "
               "that holds it, when that loop only updates them): a hand-written optimizer step changes the "
               "parameters' values and must record no graph")
        remedies.append(Remedy(fix, [edit], f"{what} is a parameter: changing it in place is an update of what "
                               "trains, never a step of the graph", True))
    else:
        fix = ("put the change under `with torch.no_grad():` if it updates a tensor you train by hand; if it belongs "
               f"to the graph, make it out of place (`{cause.target or 'x'} = {cause.target or 'x'} + ...`)")
        remedies.append(Remedy(fix, [], "graphwatch cannot tell an update of what trains from a step of the graph"))
    text += f"\nFix: {fix}."
    evidence = _evidence(trace, step, cause.changed_at, target=cause.target, parameter=cause.parameter,
                         shape=list(cause.shape))
    return Finding(LEAF_INPLACE_KIND, "error", step, text, fix, evidence, remedies=remedies)
