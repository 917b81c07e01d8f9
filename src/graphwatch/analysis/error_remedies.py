"""The remedies of a backward through a freed graph, made from what graphwatch saw (a
:class:`~graphwatch.model.causes.BackwardCause`), best first.

- a loss that reaches parameters its optimizer does not own: ``.detach()`` of the tensor at that boundary
  where *that* loss uses it (``detach-use``; two when each loss reaches the other's parameters); where that
  line is one both losses use (one expression both are made from), a detach there would cut both: each loss
  gets its own copy of the expression (``own-copy``, when every cut is named there), else words only;
- a loss made from an ``autograd.grad`` result: ``create_graph=True`` on that call (``create-graph``);
- one tensor backwarded twice: the second backward removed (``remove-statement``);
- a shared tensor made from nothing an optimizer trains (a fixed target): detached where it is made
  (``detach-made``);
- summing the losses or ``retain_graph=True``: only when one optimizer owns everything both backwards reach
  and did not step between them, with that as the reason.  Otherwise they are not offered.

Each sentence quotes the line as the edit leaves it, made by the edit's codemod: never parsed back.

Example::

    >>> from graphwatch.analysis.error_remedies import backward_expression
    >>> backward_expression("energy.sum().backward()"), backward_expression("torch.autograd.grad(f(x), [x])")
    ('energy.sum()', 'f(x)')
"""

from __future__ import annotations

import ast

from ..model import BackwardRecord, CallSite, Edit, Remedy, Trace
from ..model.causes import BackwardCause, Cut

# .codemods (LibCST) is imported inside the functions that use it: not at `import graphwatch` (test_import_cost.py)


def backward_expression(source: str) -> str | None:
    """The expression a line backwards, as valid Python: ``x`` of ``x.backward()``, the first argument of
    ``torch.autograd.backward(...)`` / ``autograd.grad(...)``."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:
        return None
    for node in ast.walk(tree):  # outermost first
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("backward", "grad"):
            if ast.unparse(func.value) in ("torch.autograd", "autograd"):  # torch.autograd.backward(x), .grad(x, ..)
                return ast.unparse(node.args[0]) if node.args else None
            if func.attr == "backward":
                return ast.unparse(func.value)
        if isinstance(func, ast.Name) and func.id == "grad" and node.args:
            return ast.unparse(node.args[0])
    return None


def _calls_backward(source: str) -> bool:
    """Whether a line calls a backward itself (``loss.backward()``, ``self.manual_backward(loss)``, the first line
    of a call spread over several): not a call into a framework that runs one (``trainer.fit(model)``).

    >>> _calls_backward("self.manual_backward(loss)"), _calls_backward("trainer.fit(model, data)")
    (True, False)
    """
    return backward_expression(source) is not None or "backward(" in source or "grad(" in source


def edited_line(site: CallSite, edit: Edit) -> str | None:
    """``site``'s line as ``edit`` leaves it (None: the edit cannot be made there, or has no codemod yet)."""
    from .codemods.expressions import edited_statement

    return edited_statement(edit, site.source) if site.source else None


class RemedyMaker:
    """Makes the remedies of one failed backward (``failing``) that ran into a graph ``freeing`` freed."""

    def __init__(self, trace: Trace, cause: BackwardCause, freeing: BackwardRecord, failing: BackwardRecord) -> None:
        self.trace, self.cause, self.freeing, self.failing = trace, cause, freeing, failing
        self.freeing_site = trace.site(freeing.site)
        self.failing_site = trace.site(failing.site)

    def _where(self, backward: BackwardRecord) -> str:
        return self.trace.where(backward.site)

    def _edit(self, kind: str, site: CallSite | None, target: str = "") -> tuple[Edit | None, str | None]:
        if site is None:
            return None, None
        edit = Edit(kind, site.file, site.line, target)
        return edit, edited_line(site, edit)

    # ------------------------------------------------------------------ each kind
    def cuts(self) -> Remedy | None:
        """``.detach()`` where each loss uses a tensor made from another optimizer's parameters; words only when
        a cut is on a line both losses share (:meth:`_shared_cuts`)."""
        if not self.cause.cuts:
            return None
        if self._shared_lines():
            return self._shared_cuts()
        parts, whys, edits = [], [], []
        mechanical = True
        for cut in self.cause.cuts:
            if cut.name is None:  # seen, not named: the remedy is not the whole fix
                mechanical = False
                whys.append(self._unnamed(cut))
                continue
            part, why, edit = self._cut(cut)
            parts.append(part)
            whys.append(why)
            if edit is None:
                mechanical = False
            else:
                edits.append(edit)
        if not parts:
            return None
        head = "detach where each loss uses what it must not train: " if len(parts) > 1 else ""
        return Remedy(head + "; and ".join(parts), edits, "; ".join(whys), mechanical and bool(edits))

    def _shared_lines(self) -> set[str]:
        """The lines where a cut would go that both losses run through: the line that makes the tensor both
        backwards reach, or a line where the cuts of both backwards go."""
        used: dict[str, set[int]] = {}
        for cut in self.cause.cuts:
            if cut.used_at is not None:
                used.setdefault(self.trace.where(cut.used_at), set()).add(cut.backward)
        shared = self.trace.where(self.cause.shared_at) if self.cause.shared_at is not None else None
        return {line for line, backwards in used.items() if line == shared or len(backwards) > 1}

    def _shared_cuts(self) -> Remedy:
        """A cut on a line both losses share would cut both (the second loss would have no graph left): each
        loss needs its own copy of the expression, with what it must not train detached in it.  A patch
        (``own-copy`` edits) only when every cut is named on the line that assigns the shared tensor; else
        words, with the lines."""
        lines = self._shared_lines()
        shared = self.trace.site(self.cause.shared_at)
        parts, edits = [], []
        for cut in self.cause.cuts:
            backward = self.trace.backwards[cut.backward]
            what = f"`{cut.name}`" if cut.name else f"what {self.trace.where(cut.used_at)} makes from {cut.owner}'s parameters"
            parts.append(f"in the loss of the backward at {self._where(backward)}, a copy with {what} detached")
            site = self.trace.site(backward.site)
            if cut.name and site is not None and shared is not None and self.trace.where(cut.used_at) == shared.where:
                edits.append(Edit("own-copy", site.file, site.line, cut.name, until=shared.line))
        named = f"`{self.cause.shared}`" if self.cause.shared else "the expression"
        text = (f"give each loss its own expression: {named} at {', '.join(sorted(lines))} is used by the losses of "
                f"both backwards ({self._where(self.freeing)} and {self._where(self.failing)}), so a `.detach()` "
                f"there would cut both; write it out in each loss: {'; and '.join(parts)}")  # fmt: skip
        mechanical = len(edits) == len(self.cause.cuts) == len({c.backward for c in self.cause.cuts})
        why = "each loss reaches parameters the other's optimizer trains, through one expression both losses use" + (
            "" if mechanical else ": graphwatch gives no patch for it")
        return Remedy(text, edits if mechanical else [], why, mechanical)

    def _unnamed(self, cut: Cut) -> str:
        used = self.trace.site(cut.used_at)
        return (f"the loss of the backward at {self._where(self.trace.backwards[cut.backward])} also reaches "
                f"{cut.owner}'s parameters through a value {used.where if used else 'a line'} makes without a "
                "name: graphwatch gives no patch for it")

    def _cut(self, cut: Cut) -> tuple[str, str, Edit | None]:
        backward = self.trace.backwards[cut.backward]
        used, made = self.trace.site(cut.used_at), self.trace.site(cut.made_at)
        what = f"`{cut.name}`"
        made_text = f" (made at {made.where})" if made is not None else ""
        why = (f"{cut.optimizer}, which steps after the backward at {self._where(backward)}, owns none of the "
               f"parameters {what}{made_text} is made from: they are {cut.owner}'s")
        edit, line = self._edit("detach-use", used, cut.name or "")
        if used is None:
            return f"detach {what}{made_text} where the loss of the backward at {self._where(backward)} uses it", why, None
        if line is None:
            return f"detach {what}{made_text} where the loss of the backward at {self._where(backward)} uses it, at " \
                   f"{used.where} (`{used.source}`)", why, None  # fmt: skip
        return f"`{line}` at {used.where}: the loss of the backward at {self._where(backward)} must not reach " \
               f"what made {what}{made_text}", why, edit  # fmt: skip

    def create_graph(self) -> Remedy | None:
        name = self.cause.grad_result
        if name is None or self.freeing_site is None:
            return None
        edit, line = self._edit("create-graph", self.freeing_site)
        shown = f"`{line}`" if line else "`create_graph=True` on the `torch.autograd.grad` call"
        text = (f"{shown} at {self.freeing_site.where}: the loss backwarded at {self._where(self.failing)} is made "
                f"from `{name}`, that call's result, and trains through it only if the gradient keeps its graph")
        why = (f"`{name}` comes from the `torch.autograd.grad` at {self.freeing_site.where} without create_graph, and "
               f"the loss of the backward at {self._where(self.failing)} uses it: that term trains nothing as it is")
        return Remedy(text, [edit] if edit and line else [], why, bool(edit and line))

    def framework_backward(self) -> Remedy | None:
        """The second backward ran inside a framework (its line, the user's call into it, calls no backward:
        ``trainer.fit(model)``), through the graph of the user's own ``loss.backward()`` in the function it
        calls (a Lightning ``training_step`` under automatic optimization, a ``Trainer``'s ``compute_loss``): the
        user's backward removed, the framework's does it."""
        from .codemods import CODEMODS

        failing, freeing = self.failing_site, self.freeing_site
        if failing is None or freeing is None or failing.where == freeing.where or self.cause.stepped_between:
            return None
        name = backward_expression(freeing.source)
        if name is None or _calls_backward(failing.source) or self.freeing.api != "backward":
            return None
        edit, _ = self._edit("remove-statement", freeing)
        text = (f"drop the `{name}.backward()` at {freeing.where}: the framework called at {failing.where} "
                f"(`{failing.source}`) backwards the loss itself (Lightning's automatic optimization backwards what "
                "`training_step` returns, a Hugging Face `Trainer` what `compute_loss` returns); to call backward "
                "yourself, switch that off (Lightning: `self.automatic_optimization = False` and "
                "`self.manual_backward(loss)`)")
        why = (f"the backward at {failing.where} ran inside an installed package (the line calls no backward), "
               f"from a loss made from the one the backward at {freeing.where} had already backwarded")
        return Remedy(text, [edit] if edit else [], why, edit is not None and "remove-statement" in CODEMODS)

    def remove_second(self) -> Remedy | None:
        """Drop the second backward of one tensor (never the only backward of a loop: same line)."""
        from .codemods import CODEMODS

        if self.failing_site is None or self.freeing_site is None or self.failing_site.where == self.freeing_site.where:
            return None
        if self.cause.stepped_between or not _calls_backward(self.failing_site.source):  # (a framework ran it)
            return None
        edit, _ = self._edit("remove-statement", self.failing_site)
        name = backward_expression(self.failing_site.source) or "the tensor"
        text = (f"drop the second `{name}.backward()` at {self.failing_site.where}: the backward at "
                f"{self.freeing_site.where} already ran through its graph, and a second one would add the same "
                "gradients to `.grad` again")
        why = f"both backwards start from the same tensor (`{name}`), and no optimizer stepped between them"
        return Remedy(text, [edit] if edit else [], why, edit is not None and "remove-statement" in CODEMODS)

    def detach_made(self) -> Remedy | None:
        cause = self.cause
        site = self.trace.site(cause.shared_at)
        if cause.shared_owner != "nobody" or cause.shared is None or site is None:
            return None
        edit, line = self._edit("detach-made", site, cause.shared)
        shown = f"`{line}`" if line else f"detach `{cause.shared}` where it is made (`{site.source}`)"
        text = (f"{shown} at {site.where}: no optimizer trains what `{cause.shared}` is made from, so no gradient "
                "needs to flow there")
        why = f"the parameters `{cause.shared}` is made from belong to no optimizer ({self._seen()})"
        return Remedy(text, [edit] if edit else [], why, edit is not None)

    def _seen(self) -> str:
        seen = self.cause.optimizers_seen
        return "optimizers seen: " + ", ".join(seen) if seen else "no optimizer was seen"

    def together(self, sum_ok: bool) -> list[Remedy]:
        """Summing the losses and ``retain_graph=True``: only when one optimizer owns everything both reach."""
        cause = self.cause
        if cause.one_owner is None or self.freeing_site is None or self.failing_site is None:
            return []
        if self.freeing_site.where == self.failing_site.where:  # one line run twice: retaining grows each time
            return []
        why = (f"{cause.one_owner} owns all {cause.owned_reached} parameters both backwards reach and steps after "
               "both, with no optimizer step between them: both are meant to train what they share")
        remedies = []
        first, second = backward_expression(self.freeing_site.source), backward_expression(self.failing_site.source)
        if sum_ok and first and second and self.freeing.api == self.failing.api == "backward":
            remedies.append(Remedy(
                f"backward once through the sum: `({first} + {second}).backward()` in place of the backwards at "
                f"{self.freeing_site.where} and {self.failing_site.where}", [], why,
            ))
        call = "the `torch.autograd.grad`" if self.freeing.api == "grad" else "the earlier backward"
        edit, line = self._edit("retain-graph", self.freeing_site)
        shown = f"`{line}`" if edit and line else f"`retain_graph=True` on {call}"
        remedies.append(Remedy(
            f"{shown} at {self.freeing_site.where}; the last backward, at {self.failing_site.where}, must not "
            "retain", [edit] if edit and line else [], why, bool(edit and line),
        ))
        return remedies

    def no_fix(self) -> str:
        """Why no fix is offered."""
        cause = self.cause
        if not cause.optimizers_seen:
            return ("graphwatch offers no fix: no optimizer was seen, so it cannot check that both backwards are "
                    "meant to reach the graph they share (summing the losses or retain_graph=True would make both "
                    "train it)")
        serving = sorted({n for n in cause.optimizers.values() if n})
        if len(serving) > 1 or cause.stepped_between:
            return (f"graphwatch offers no fix: the two backwards serve different optimizers ({', '.join(serving)}) "
                    "and it could not see where one loss enters the other's graph; summing the losses or "
                    "retain_graph=True would train each optimizer's parameters with the other's loss")
        return ("graphwatch offers no fix: it could not check that one optimizer owns everything both backwards "
                "reach")
