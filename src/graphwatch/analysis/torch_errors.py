"""Findings for two more of torch's autograd errors, each explained after torch's own text:

- ``modified-in-place``: "one of the variables needed for gradient computation has been modified by an
  inplace operation".  The finding names the line that changed the saved tensor (not only the one that saved
  it) and, where the out-of-place form keeps what the program computes, patches it there (``out-of-place``):
  ``x = x.relu()`` for ``x.relu_()``, ``inplace=False`` on the line that built a module with ``inplace=True``,
  ``att = att.clone()`` before ``att[...] = 0``.
- ``loss-without-graph``: "element 0 of tensors does not require grad and does not have a grad_fn".  The
  finding names the ``with torch.no_grad():`` block or ``@torch.no_grad()`` decorator the loss was made
  under, and, for a block, puts the statements from the loss's first line to the backward under
  ``torch.enable_grad()`` (``enable-grad``).

Example::

    >>> from graphwatch.analysis.torch_errors import is_no_graph_error
    >>> is_no_graph_error(RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn"))
    True
"""

from __future__ import annotations

from ..model import Edit, Finding, Remedy, Trace
from ..model.causes import InplaceCause, NoGraphCause
from .error_remedies import edited_line
from .evidence import describe, step_name

INPLACE_KIND = "modified-in-place"
NO_GRAPH_KIND = "loss-without-graph"
_NO_GRAPH = "does not require grad and does not have a grad_fn"


def is_no_graph_error(error: BaseException) -> bool:
    """True for torch's error about backwarding a tensor that has no graph."""
    return isinstance(error, RuntimeError) and _NO_GRAPH in str(error)


def inplace_finding(trace: Trace, cause: InplaceCause, step: int) -> Finding:
    """The finding of a saved tensor changed in place; its message follows torch's text."""
    saved, changed = trace.site(cause.saved_at), trace.site(cause.changed_at)
    lines = [f"graphwatch: the tensor was saved at {describe(saved)} ({step_name(cause.saved_step)})"]
    remedies: list[Remedy] = []
    if changed is None:
        lines[0] += (". Something changed it in place after autograd saved it; use the out-of-place form "
                     "(e.g. x = x.add(1) instead of x.add_(1)) or .clone() it first (graphwatch could not tell "
                     "which line changed it).")
        fix = "use the out-of-place form where the tensor is changed after it is saved"
    else:
        found = {"node": "its node in the graph", "save": "a later save of the changed tensor",
                 "source": "the one in-place statement between the lines that ran around it"}.get(cause.found_by, "")
        lines[0] += f", then changed in place at {describe(changed)}" + (f" (found from {found})" if found else "")
        lines[0] += "."
        remedy = _out_of_place(trace, cause, changed.where)
        if cause.module:
            built = trace.site(cause.built_at)
            lines.append(f"The change is made by `{cause.module}`, an nn.{cause.module_type} built with "
                         + (f"inplace=True at {describe(built)}." if built else f"inplace=True ({cause.note})."))
        if remedy is not None:
            remedies.append(remedy)
            lines.append(f"Fix: {remedy.text}")
        fix = remedy.text if remedy else f"make the in-place operation at {changed.where} out of place"
    where = [s.where for s in (changed, saved, trace.site(cause.built_at)) if s is not None]
    evidence = {
        "key": f"{where[0] if where else '?'} -> {saved.where if saved else '?'}",
        "sites": list(dict.fromkeys(where)),
        "steps": [step],
        "saved_at": saved.where if saved else None,
        "changed_at": changed.where if changed else None,
        "found_by": cause.found_by,
        "op": cause.op,
        "module": cause.module,
        "built_at": trace.where(cause.built_at) if cause.built_at is not None else None,
    }
    return Finding(INPLACE_KIND, "error", step, "\n".join(lines), fix, evidence, remedies=remedies)


def _out_of_place(trace: Trace, cause: InplaceCause, changed_where: str) -> Remedy | None:
    site = trace.site(cause.built_at) if cause.module else trace.site(cause.changed_at)
    if site is None or (cause.module is None and cause.target is None):
        return None
    edit = Edit("out-of-place", site.file, site.line, cause.target or "")
    line = edited_line(site, edit)
    if line is None:
        return None
    if not cause.safe:
        return Remedy(f"the in-place operation at {changed_where} changed a view whose base may need the change: "
                      f"make it out of place only if nothing reads the base afterwards (e.g. `{line}`)", [],
                      "the changed tensor is a view of another", False)
    why = (f"`{cause.module}` changes its input in place (its result is the same out of place)" if cause.module
           else f"the statement at {changed_where} changes `{cause.target}` in place after autograd saved it")
    text = f"`{line}` at {site.where}" + (f" (where `{cause.module}` is built)" if cause.module else "")
    return Remedy(text, [edit], why, True)


def no_graph_finding(trace: Trace, cause: NoGraphCause, step: int) -> Finding:
    """The finding of a loss backwarded without a graph; its message follows torch's text."""
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
