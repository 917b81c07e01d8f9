"""Expressions the codemods build and look for: ``expr.method()`` with the parentheses it needs, dotted
names, the statement a line starts, and the statement an edit leaves (a fix sentence shows it).

Example::

    >>> import libcst as cst
    >>> from graphwatch.analysis.codemods.expressions import called
    >>> [cst.Module([]).code_for_node(called(cst.parse_expression(e), "item")) for e in ("loss", "perte_ü * 2")]
    ['loss.item()', '(perte_ü * 2).item()']
"""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from ...model import Edit
from . import CODEMODS, SourceTree

# Expressions that take ``.method()`` as they are: anything else is put in parentheses first.
_ATOMS = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.List, cst.Tuple, cst.Dict, cst.Set)


def called(expression: cst.BaseExpression, method: str) -> cst.Call:
    """``expression.method()``, with ``expression`` in parentheses when it needs them (``(a * 2).item()``)."""
    value = expression
    if not isinstance(expression, _ATOMS) and not expression.lpar:  # type: ignore[attr-defined]
        value = expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=value, attr=cst.Name(method)))


def replaced_all(module: cst.Module, replacements: dict[cst.CSTNode, cst.CSTNode]) -> str:
    """The source of ``module`` with each node that is a key of ``replacements`` (a node of it) replaced."""

    class Replace(cst.CSTTransformer):
        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            return replacements.get(original, updated)

    return module.visit(Replace()).code


def dotted(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a name or a chain of attributes on a name (no calls, no subscripts), else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def binds_torch(module: cst.Module) -> bool:
    """Whether the file's top level binds the name ``torch`` (``import torch``, ``import torch.nn``)."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Import) and any(
                    alias.asname is None and cst.Module([]).code_for_node(alias.name).split(".")[0] == "torch"
                    for alias in small.names
                ):
                    return True
    return False


def statement_starting(tree: SourceTree, line: int, alone: bool = True) -> cst.SimpleStatementLine | None:
    """The simple statement line (possibly running over several lines) that starts on ``line``, holding one
    statement (or, not ``alone``, several: ``loss.backward(); losses.append(loss)``); None for anything else."""
    for node in tree.nodes(cst.SimpleStatementLine):
        if tree.span(node).start.line == line:
            return node if len(node.body) == 1 or not alone else None
    return None


def edited_statement(edit: Edit, source: str) -> str | None:
    """The line of code ``source`` (as a trace cites it) as ``edit`` leaves it, without its comment (its
    statements joined by ``; ``); None when the edit cannot be made there or has no codemod.  A fix sentence
    shows this, so that what the user reads is what the patch does.

    >>> edited_statement(Edit("item", "t.py", 1, "loss"), "losses.append(loss)  # keep (for plotting)")
    'losses.append(loss.item())'
    """
    make = CODEMODS.get(edit.kind)
    try:
        tree = SourceTree(source.strip() + "\n")
    except cst.ParserSyntaxError:
        return None
    edited = make(tree, replace(edit, line=1)) if make is not None else None
    if edited is None:
        return None
    code = cst.Module([]).code_for_node
    return "; ".join(
        "; ".join(code(small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)).strip() for small in statement.body)
        if isinstance(statement, cst.SimpleStatementLine)
        else code(statement).strip()
        for statement in cst.parse_module(edited).body
    )
