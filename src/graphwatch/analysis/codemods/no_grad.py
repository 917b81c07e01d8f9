"""The ``no-grad`` codemod: an evaluation forward (or the whole loop that only evaluates) runs under
``with torch.no_grad():``, its block re-indented by the syntax tree (comments and strings as they were).

A loop only evaluates when nothing in it may train: no ``backward``, optimizer ``step``, ``zero_grad``,
``autograd.grad`` or ``.train(`` call, none of the lines where the run trained (``Edit.training``), no call
of a function the file defines (it could train) and no definition.  Otherwise only the statement goes
under ``no_grad``.  The file must bind ``torch`` (``import torch``).

Example::

    >>> from graphwatch.analysis.codemods import apply_edits
    >>> from graphwatch.model import Edit
    >>> source = "import torch\\nfor x in val:\\n    out = model(x)  # eval\\n    keep.append(out)\\n"
    >>> print(apply_edits(source, [Edit("no-grad", "t.py", 3)]), end="")
    import torch
    with torch.no_grad():
        for x in val:
            out = model(x)  # eval
            keep.append(out)
"""

from __future__ import annotations

import re

import libcst as cst

from ...model import Edit
from . import SourceTree, codemod
from .expressions import binds_torch, statement_starting

_TRAINING_CALL = re.compile(r"\.backward\(|\.step\(|zero_grad|autograd\.grad|\.train\(")
_LOOPS = (cst.For, cst.While)


def _only_evaluates(tree: SourceTree, loop: cst.BaseCompoundStatement, training: list[int], defined: set[str]) -> bool:
    where = tree.span(loop)
    if _TRAINING_CALL.search(tree.code(loop)) or any(where.start.line <= t <= where.end.line for t in training):
        return False
    calls_own = definitions = False

    class Look(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal calls_own
            calls_own = calls_own or (isinstance(node.func, cst.Name) and node.func.value in defined)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            nonlocal definitions
            definitions = True

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            nonlocal definitions
            definitions = True

    loop.visit(Look())
    return not calls_own and not definitions


@codemod("no-grad")
def no_grad(tree: SourceTree, edit: Edit) -> str | None:
    """The outermost loop holding ``edit.line`` that only evaluates, else the statement starting on it, under
    ``with torch.no_grad():`` (the block keeps the comments above it)."""
    statement = statement_starting(tree, edit.line)
    if statement is None or not binds_torch(tree.module):
        return None
    defined = {node.name.value for node in tree.nodes(cst.FunctionDef)}
    holding = tree.holding(edit.line, cst.BaseCompoundStatement)  # type: ignore[type-abstract]
    loops = [n for n in holding if isinstance(n, _LOOPS)]
    wrapped = next((loop for loop in loops if _only_evaluates(tree, loop, edit.training, defined)), statement)
    block = cst.With(
        items=[cst.WithItem(cst.parse_expression("torch.no_grad()"))],
        body=cst.IndentedBlock(body=[wrapped.with_changes(leading_lines=[])]),
        leading_lines=wrapped.leading_lines,
    )
    return tree.replaced(wrapped, block)
