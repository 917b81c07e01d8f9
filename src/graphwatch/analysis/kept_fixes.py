"""Remedies for graphs kept alive by a Python value: what the holder should keep instead, from what ran.

- an evaluation forward no backward ever used: run it under ``torch.no_grad()`` (``no-grad``; the whole
  loop when it only evaluates);
- a holder that adds or appends a tensor (``total += loss``, ``losses.append(loss)``, ``total = total +
  loss``): a number, ``.item()``, when the kept tensor has one element (``item``); a detached tensor,
  ``.detach()``, when it has more (``detach-use``: ``.item()`` would raise);
- a holder assigned a new value each step that no backward runs through (a moving average kept on an
  object, a module buffer updated outside ``no_grad``): the value detached where it is made (``detach-made``);
- a module's parameters updated in place outside ``no_grad`` (an EMA teacher): the update under
  ``no_grad`` (``no-grad``), where the line that updated them is known;
- else advice.

The element count and whether a backward ran through the held value were recorded when the holder was
found (:class:`~graphwatch.model.Holder`), never guessed from names.

Example::

    >>> from graphwatch.model import CallSite, Holder, Trace
    >>> site = CallSite("train.py", 12, "main", "total_loss += loss")
    >>> remedy = holder_remedy(site, "total_loss", [Holder("total_loss", 0, "train.py:9 in main", numel=1)])
    >>> remedy.text, remedy.edits[0].kind, remedy.patchable
    ('keep a number, not the graph: `total_loss += loss.item()` at train.py:12', 'item', True)
"""

from __future__ import annotations

from ..model import CallSite, Edit, Holder, Remedy, Trace
from ..model.columns import field_values
from .evidence import site_chain

# .codemods (LibCST) is imported inside the functions that use it: not at `import graphwatch` (test_import_cost.py)

GENERIC = (
    "keep numbers (`loss.item()`) or detached tensors (`.detach()`) across steps; run evaluation under "
    "`torch.no_grad()`"
)


def training_lines(trace: Trace) -> dict[str, list[int]]:
    """File -> the lines where the run called a backward or an optimizer's step, or a function leading to one
    (what holds them trains, and must keep its graph).

    >>> training_lines(Trace())
    {}
    """
    sites = dict.fromkeys([*field_values(trace.backwards, "site"), *field_values(trace.steps, "optimizer_site")])
    lines: dict[str, set[int]] = {}
    for site_id in sites:
        for site in site_chain(trace, site_id):
            lines.setdefault(site.file, set()).add(site.line)
    return {file: sorted(found) for file, found in lines.items()}


def evaluation_remedy(trace: Trace, forward: CallSite) -> Remedy:
    """``with torch.no_grad():`` around an evaluation forward that no backward used."""
    edit = Edit("no-grad", forward.file, forward.line, training=training_lines(trace).get(forward.file, []))
    return Remedy(
        f"run the forward at {forward.where} under `with torch.no_grad():` (evaluation builds no graph then)",
        [edit],
        why="no backward ever ran through a graph made on that line, and the block wrapped holds no line where "
        "the run called a backward or an optimizer step",
        mechanical=True,
    )


def parameters_remedy(trace: Trace, module: str, update: CallSite | None, why: str = "") -> Remedy:
    """The in-place update of a module's parameters under ``no_grad`` (patched at its line, when graphwatch found
    it; ``why`` it is safe there, by default that no backward ran through the graph the update records)."""
    text = (
        f"update `{module}`'s parameters under `with torch.no_grad():` (an in-place update of a parameter outside "
        "no_grad, as in an EMA teacher or a hand-written SGD step, records a graph that grows every step)"
    )
    if update is None:
        return Remedy(text)
    edit = Edit("no-grad", update.file, update.line, training=training_lines(trace).get(update.file, []))
    why = why or f"no backward ran through the graph the update at {update.where} records"
    return Remedy(text, [edit], why=why, mechanical=True)


def holder_remedy(site: CallSite, spelled: str, holders: list[Holder]) -> Remedy | None:
    """What the holder assigned or added to on ``site`` (``spelled`` as the line spells it) should keep instead,
    or None when the line does neither."""
    from .codemods.expressions import edited_statement
    from .codemods.numbers import kept_expression

    kept = kept_expression(site.source)
    if kept is not None:
        return _keep_value(site, kept, holders)
    if holders[0].backwarded or "[" in holders[0].name:
        return None  # a backward ran through the very value: detaching it would change what trains
    edit = Edit("detach-made", site.file, site.line, spelled, value_type="Tensor")
    edited = edited_statement(edit, site.source)
    if edited is None:
        return None
    return Remedy(
        f"keep the value without its graph: `{edited}` at {site.where}",
        [edit],
        why=f"no backward ran through `{holders[0].name}`: its graph only grows, one step on top of the last",
        mechanical=True,
    )


def _keep_value(site: CallSite, kept: str, holders: list[Holder]) -> Remedy | None:
    """``.item()`` for a tensor of one element, ``.detach()`` for one of more (``.item()`` would raise)."""
    from .codemods.numbers import kept_statement

    counts = {h.numel for h in holders}
    if None in counts:
        return None
    if counts == {1}:
        edited = kept_statement(site.source, "item")
        why = f"`{kept}` held one element each time (a number keeps its value without the graph)"
        edit = Edit("item", site.file, site.line, kept)
        return Remedy(f"keep a number, not the graph: `{edited}` at {site.where}", [edit], why, True) if edited else None
    most = max(c for c in counts if c is not None)
    edited = kept_statement(site.source, "detach")
    if edited is None:
        return None
    why = f"`{kept}` held {most:,} elements: `.item()` takes a tensor of one, so a detached tensor is kept instead"
    return Remedy(
        f"keep a detached tensor, not the graph: `{edited}` at {site.where} (`.item()` would raise: it has {most:,} "
        "elements)",
        [Edit("detach-use", site.file, site.line, kept)],
        why,
        mechanical=True,
    )
