"""Codemods that change one call or put one statement before or after a line: ``retain_graph=True`` dropped,
a statement inserted (``optimizer.zero_grad()``).

Example::

    >>> from graphwatch.analysis.codemods import apply_edits
    >>> from graphwatch.model import Edit
    >>> print(apply_edits("if ok:\\n    loss.backward()\\n", [Edit("insert-before", "t.py", 2, "opt.zero_grad()")]), end="")
    if ok:
        opt.zero_grad()
        loss.backward()
"""

from __future__ import annotations

import libcst as cst

from ...model import Edit
from . import SourceTree, codemod


def _is_retain_true(arg: cst.Arg) -> bool:
    return (arg.keyword is not None and arg.keyword.value == "retain_graph"
            and isinstance(arg.value, cst.Name) and arg.value.value == "True")


@codemod("drop-retain")
def drop_retain(tree: SourceTree, edit: Edit) -> str | None:
    """``retain_graph=True`` taken out of the one call on the line that passes it."""
    statement = tree.statement_at(edit.line)
    if statement is None:
        return None
    calls = [c for c in tree.nodes(cst.Call) if tree.span(c).start.line == edit.line and any(map(_is_retain_true, c.args))]
    if len(calls) != 1:
        return None
    call = calls[0]
    args = [a for a in call.args if not _is_retain_true(a)]
    if args:  # the new last argument takes the dropped one's trailing comma (none, usually)
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return tree.replaced(call, call.with_changes(args=args))


@codemod("insert-before")
def insert_before(tree: SourceTree, edit: Edit) -> str | None:
    """The statement ``edit.target`` inserted before the statement on ``edit.line``, at its indentation."""
    return _inserted(tree, edit, after=False)


@codemod("insert-after")
def insert_after(tree: SourceTree, edit: Edit) -> str | None:
    """The statement ``edit.target`` inserted after the statement on ``edit.line``, at its indentation (in the
    same block: an ``optimizer.step()`` run once every few backwards keeps its new neighbour to itself).

    >>> from graphwatch.analysis.codemods import apply_edits
    >>> print(apply_edits("if last:\\n    opt.step()\\n", [Edit("insert-after", "t.py", 2, "opt.zero_grad()")]), end="")
    if last:
        opt.step()
        opt.zero_grad()
    """
    return _inserted(tree, edit, after=True)


def _inserted(tree: SourceTree, edit: Edit, after: bool) -> str | None:
    """The file with the statement ``edit.target`` put next to the one-line statement on ``edit.line`` (None:
    no such statement there, or a target that is not one simple statement)."""
    statement = tree.statement_at(edit.line)
    try:
        new = cst.parse_statement(edit.target + "\n")
    except cst.ParserSyntaxError:
        return None
    if statement is None or not isinstance(new, cst.SimpleStatementLine):
        return None
    return tree.replaced(statement, cst.FlattenSentinel([statement, new] if after else [new, statement]))
