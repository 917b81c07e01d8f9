"""Remedies for graphs kept alive by a Python value: what the holder should keep instead, from what ran.

- an evaluation forward no backward ever used: run it under ``torch.no_grad()`` (``no-grad``; the whole
  loop when it only evaluates);
- a holder that adds or appends a tensor (``total += loss``, ``losses.append(loss)``, ``total = total +
  loss``, ``total.add_(loss)``: a tensor holder whatever it adds): a number, ``.item()``, when the kept
  tensor has one element and every later use of the holder takes a number (``item``: ``+=``, ``print``,
  formatting, ``sum``, ``len``); a detached tensor, ``.detach()``, when it has more elements (``.item()``
  would raise), or when a later use needs a tensor (``torch.stack(self.outputs)``, a tensor method) or cannot
  be told (``detach-use``);
- a value a function of the same file returned (``output, loss = train(...)``, then ``current_loss +=
  loss``): fixed at that function's ``return`` (:mod:`.codemods.returned`), a number when every caller's use
  takes one, else a detached tensor when the function ran the backward through it;
- a holder assigned a new value each step that no backward runs through (a moving average kept on an
  object, a module buffer updated outside ``no_grad``): the value detached where it is made (``detach-made``);
- a module's parameters updated in place outside ``no_grad`` (an EMA teacher): the update under
  ``no_grad`` (``no-grad``), where the line that updated them is known;
- a holder changed in place outside ``no_grad`` that no backward ran through (a buffer's EMA,
  ``self.ema_w.mul_(0.99).add_(w)``, in a Lightning hook or a ``Callback``'s): that line under ``no_grad``
  (``no-grad``);
- a container whose items hold tensors inside them (a replay buffer's tuples, a dict of ``loss`` and
  ``pred``): advice that names every part that carries a graph;
- else advice.

The element count and whether a backward ran through the held value were recorded when the holder was
found (:class:`~graphwatch.model.Holder`), never guessed from names; how the holder is used later is read
from the source of the file that ran (a file that cannot be read: a detached tensor, which works for any use).

Example::

    >>> from graphwatch.model import CallSite, Holder, Trace
    >>> site = CallSite("no_such_train.py", 12, "main", "total_loss += loss")
    >>> remedy = holder_remedy(site, "total_loss", [Holder("total_loss", 0, "train.py:9 in main", numel=1)])
    >>> remedy.text, remedy.edits[0].kind, remedy.patchable
    ('keep a detached tensor, not the graph: `total_loss += loss.detach()` at no_such_train.py:12 (its later uses \
could not be read: a number might break one)', 'detach-use', True)
"""

from __future__ import annotations

import linecache
from typing import TYPE_CHECKING

from ..capture.lines.source import inplace_line
from ..model import CallSite, Edit, Holder, Remedy, Trace
from ..model.columns import field_values
from ..model.records import within
from .evidence import site_chain, stored_part

if TYPE_CHECKING:
    from .codemods.returned import Returned

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


def inplace_update_remedy(trace: Trace, site: CallSite, name: str, holders: list[Holder]) -> Remedy | None:
    """``with torch.no_grad():`` around the line ``site`` that changes the holder ``name`` in place (a buffer's EMA,
    ``self.ema_w.mul_(0.99).add_(self.layer.weight, alpha=0.01)``), patched where no backward ran through the held
    tensor (its graph only grows, one step on top of the last: no_grad changes no gradient); None when the line
    changes something else in place, or nothing."""
    changed = inplace_line(site.source)
    attr = name.rpartition(".")[2]
    if changed is None or not (changed == name or ("." in name and changed.endswith(f".{attr}"))):
        return None
    text = (
        f"update `{changed}` under `with torch.no_grad():` at {site.where} (an in-place update outside no_grad "
        "records a graph that grows every step)"
    )
    if any(h.backwarded for h in holders):  # a backward ran through it: no_grad would change what trains
        return Remedy(text)
    edit = Edit("no-grad", site.file, site.line, training=training_lines(trace).get(site.file, []))
    why = f"no backward ran through `{name}`: its graph only grows, one step on top of the last"
    return Remedy(text, [edit], why=why, mechanical=True)


def part_remedy(site: CallSite, container: str, holders: list[Holder]) -> Remedy:
    """Advice for a container whose items hold tensors inside them (a replay buffer's ``(state, action, reward)``
    tuples, ``action`` still carrying the rollout's graph; a dict whose ``loss`` and ``pred`` both carry theirs):
    store each such part without its graph, every one named (one left out would keep the graphs alive)."""
    paths = list(dict.fromkeys(path for h in holders if (path := within(h.name, container))))
    named = [f"`{part}`" if (part := stored_part(site.source, path)) is not None else None for path in paths]
    if len(paths) == 1:
        parts = named[0] or f"the part `{paths[0]}` of each item"
    else:
        spelled = [found or f"`{path}`" for found, path in zip(named, paths)]
        parts = f"each of {', '.join(spelled[:-1])} and {spelled[-1]} (the {len(paths)} parts of each item that carry a graph)"
    examples = [next(h.name for h in holders if within(h.name, container) == path) for path in paths]
    carry = "still carries" if len(paths) == 1 else "still carry"
    return Remedy(
        f"store {parts} without its graph at {site.where} (`.detach()` it, or `.item()` for a number): "
        f"{' and '.join(f'`{e}`' for e in examples)} {carry} the graph of the step that made it"
    )


def holder_remedy(site: CallSite, spelled: str, holders: list[Holder]) -> Remedy | None:
    """What the holder assigned or added to on ``site`` (``spelled`` as the line spells it) should keep instead,
    or None when the line does neither."""
    from .codemods.expressions import edited_statement
    from .codemods.numbers import kept_expression

    kept = kept_expression(site.source)
    if kept is not None:
        returned = returned_origin(site)
        found = _returned_remedy(site, spelled, returned, holders) if returned is not None else None
        return found or _keep_value(site, spelled, kept, holders, _file_source(site))
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


def returned_origin(site: CallSite) -> Returned | None:
    """The ``return`` of a function of the same file whose value the holder on ``site`` keeps, directly or
    through the holders it feeds (:func:`~.codemods.returned.returned_value`); None when it keeps no one
    function's returned value, or the file is no longer what ran.  Holders fed by one ``return`` are one root
    cause: one edit there fixes them all."""
    from .codemods.returned import returned_value

    source = _file_source(site)
    return returned_value(source, site.line) if source is not None else None


def _file_source(site: CallSite) -> str | None:
    """The source of the file ``site`` ran in, when its line is still the one that ran; else None."""
    lines = linecache.getlines(site.file)
    ran = lines[site.line - 1].strip() if 0 < site.line <= len(lines) else None
    return "".join(lines) if ran is not None and ran == site.source.strip() else None


def _one_element(holders: list[Holder]) -> bool | None:
    """Whether the held tensors had one element each time (None: a count is unknown)."""
    counts = {h.numel for h in holders}
    return None if None in counts else counts == {1}


def _keep_value(site: CallSite, spelled: str, kept: str, holders: list[Holder], source: str | None) -> Remedy | None:
    """``.item()`` for a tensor of one element whose holder's later uses all take a number, else ``.detach()``
    (``.item()`` would raise on more elements, or break a use that needs a tensor)."""
    from .codemods.numbers import kept_statement, line_adds_in_place, takes_numbers

    one = _one_element(holders)
    if one is None:
        return None
    if one and source is not None and takes_numbers(source, site.line):
        edited = kept_statement(site.source, "item")
        uses = (
            f"`{spelled}` adds it in place, so it stays a tensor"
            if line_adds_in_place(site.source)
            else f"every later use of `{spelled}` takes a number"
        )
        why = f"`{kept}` held one element each time, and {uses}"
        edit = Edit("item", site.file, site.line, kept)
        return Remedy(f"keep a number, not the graph: `{edited}` at {site.where}", [edit], why, True) if edited else None
    edited = kept_statement(site.source, "detach")
    if edited is None:
        return None
    if not one:
        most = max(h.numel or 0 for h in holders)
        why = f"`{kept}` held {most:,} elements: `.item()` takes a tensor of one, so a detached tensor is kept instead"
        reason = f"`.item()` would raise: it has {most:,} elements"
    elif source is None:
        why = reason = "its later uses could not be read: a number might break one"
    else:
        why = reason = f"a later use of `{spelled}` needs a tensor, or may: a number could break it"
    return Remedy(
        f"keep a detached tensor, not the graph: `{edited}` at {site.where} ({reason})",
        [Edit("detach-use", site.file, site.line, kept)],
        why,
        mechanical=True,
    )


def _returned_remedy(site: CallSite, spelled: str, returned: Returned, holders: list[Holder]) -> Remedy | None:
    """The fix at the ``return`` of the function whose value the holder on ``site`` keeps: a number when it
    held one element and every caller's use takes one; else a detached tensor, when the function ran the
    backward through it (no gradient can change then); else None."""
    where, function = f"{site.file}:{returned.line}", f"`{returned.function}()`"
    one = _one_element(holders)
    fed = f"what {function} returns is kept by its caller: `{spelled}` at {site.where}"
    if one and returned.numbers:
        edit = Edit("item", site.file, returned.line, returned.value)
        why = f"{fed}; it held one element each time, and every use of it by {function}'s callers takes a number"
        return Remedy(f"return a number, not the graph: `{returned.as_item}` at {where} ({fed})", [edit], why, True)
    if one is None or returned.detached is None or not returned.backwarded:
        return None
    edit = Edit("detach-use", site.file, returned.line, returned.detached)
    why = f"{fed}; {function} ran the backward through `{returned.detached}` already, so no gradient changes"
    return Remedy(f"return a detached tensor, not the graph: `{returned.as_detached}` at {where} ({fed})", [edit], why, True)
