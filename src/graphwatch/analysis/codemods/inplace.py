"""The codemod that makes an in-place operation out of place (``out-of-place``), on the line that changed a
tensor autograd had saved.

Five forms, tried in this order on the statement at the edit's line:

- a call with ``inplace=True`` (``nn.ReLU(inplace=True)``, ``F.dropout(x, inplace=True)`` whose result is
  used) -> ``inplace=False``;
- ``t.op_(...)`` alone on its line -> ``t = t.op(...)`` (when ``torch.Tensor`` has ``op``);
- ``t += v`` (and the other augmented assignments) -> ``t = t + v``;
- ``t[...] = v`` -> ``t = t.clone()`` first, so the saved tensor keeps its values;
- ``f(t.op_(...))`` -> ``t = t.op(...)`` on a line of its own first, then ``f(t)``.

``target`` is the tensor's name as the line spells it (``att``); for the ``inplace=True`` form it may be
empty.  Whether the change is safe there (a view whose base must change, other names for the same tensor)
is the analysis's to decide: it asks for this edit only where it is.

Example::

    >>> from graphwatch.analysis.codemods import apply_edits
    >>> from graphwatch.model import Edit
    >>> print(apply_edits("x.relu_()  # here\\n", [Edit("out-of-place", "t.py", 1, "x")]), end="")
    x = x.relu()  # here
"""

from __future__ import annotations

from typing import cast

import libcst as cst
import torch

from ...model import Edit
from . import SourceTree, codemod
from .cuts import _dotted

_OPERATORS: dict[type, type] = {
    cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
    cst.DivideAssign: cst.Divide, cst.PowerAssign: cst.Power, cst.MatrixMultiplyAssign: cst.MatrixMultiply,
}  # fmt: skip


def _inplace_keyword(arg: cst.Arg) -> bool:
    return (arg.keyword is not None and arg.keyword.value == "inplace"
            and isinstance(arg.value, cst.Name) and arg.value.value == "True")


def _is_module_class(call: cst.Call) -> bool:
    """``nn.ReLU(...)``, ``torch.nn.Dropout(...)``, ``ReLU(...)``: a capitalised name (a class)."""
    name = _dotted(call.func) or ""
    return name.rsplit(".", 1)[-1][:1].isupper()


def _inplace_off(tree: SourceTree, statement: cst.SimpleStatementLine, line: int) -> str | None:
    """``inplace=True`` -> ``inplace=False`` in the one call starting on ``line`` that passes it."""
    calls = [c for c in tree.nodes(cst.Call) if any(map(_inplace_keyword, c.args)) and tree.span(c).start.line == line]
    if len(calls) != 1:
        return None
    call = calls[0]
    small = statement.body[0] if len(statement.body) == 1 else None
    if not _is_module_class(call) and isinstance(small, cst.Expr) and small.value is call:
        return None  # ``F.relu_(x, inplace=True)`` alone: the change itself is what the line is for
    args = [a.with_changes(value=cst.Name("False")) if _inplace_keyword(a) else a for a in call.args]
    return tree.replaced(call, call.with_changes(args=args))


def _method_out_of_place(tree: SourceTree, small: cst.BaseSmallStatement, statement: cst.SimpleStatementLine,
                         target: str) -> str | None:
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    func = small.value.func
    if not isinstance(func, cst.Attribute):
        return None
    method, name = func.attr.value, _dotted(func.value)
    if name is None or (target and name != target) or not method.endswith("_") or method.startswith("_"):
        return None
    if not callable(getattr(torch.Tensor, method[:-1], None)):
        return None
    call = small.value.with_changes(func=func.with_changes(attr=cst.Name(method[:-1])))
    assign = cst.Assign(targets=[cst.AssignTarget(cast(cst.Name | cst.Attribute, func.value))], value=call)
    return tree.replaced(statement, statement.with_changes(body=[assign]))


def _nested_out_of_place(tree: SourceTree, small: cst.BaseSmallStatement, statement: cst.SimpleStatementLine,
                         target: str) -> str | None:
    """``f(t.op_(...))`` -> ``t = t.op(...)`` on the line before, then ``f(t)``: the name sees the change, as it did
    (the analysis asks for it only where ``t`` is read nowhere else in the statement)."""
    calls = [c for c in tree.nodes(cst.Call) if tree.span(c).start.line >= tree.span(statement).start.line
             and tree.span(c).end.line <= tree.span(statement).end.line and isinstance(c.func, cst.Attribute)
             and _dotted(c.func.value) == target and c.func.attr.value.endswith("_")]
    if not target or len(calls) != 1 or (isinstance(small, cst.Expr) and small.value is calls[0]):
        return None
    call = calls[0]
    func = cast(cst.Attribute, call.func)
    method = func.attr.value
    if method.startswith("_") or not callable(getattr(torch.Tensor, method[:-1], None)):
        return None
    out_of_place = call.with_changes(func=func.with_changes(attr=cst.Name(method[:-1])))
    rebind = cst.SimpleStatementLine(
        [cst.Assign(targets=[cst.AssignTarget(cast(cst.Name | cst.Attribute, func.value))], value=out_of_place)],
        leading_lines=statement.leading_lines,
    )
    changed = statement.deep_replace(call, func.value).with_changes(leading_lines=())
    return tree.replaced(statement, cst.FlattenSentinel([rebind, changed]))


def _augmented_out_of_place(tree: SourceTree, small: cst.BaseSmallStatement, statement: cst.SimpleStatementLine,
                            target: str) -> str | None:
    if not isinstance(small, cst.AugAssign) or type(small.operator) not in _OPERATORS:
        return None
    name = _dotted(small.target)
    if name is None or (target and name != target):
        return None
    value = small.value
    if isinstance(value, (cst.BinaryOperation, cst.BooleanOperation, cst.Comparison, cst.IfExp, cst.Lambda)):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    operation = cst.BinaryOperation(left=small.target, operator=_OPERATORS[type(small.operator)](), right=value)
    assign = cst.Assign(targets=[cst.AssignTarget(small.target)], value=operation)
    return tree.replaced(statement, statement.with_changes(body=[assign]))


def _setitem_on_a_copy(tree: SourceTree, small: cst.BaseSmallStatement, statement: cst.SimpleStatementLine,
                       target: str) -> str | None:
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    subscript = small.targets[0].target
    if not isinstance(subscript, cst.Subscript):
        return None
    name = _dotted(subscript.value)
    if name is None or (target and name != target):
        return None
    copy = cst.parse_statement(f"{name} = {name}.clone()\n")
    return tree.replaced(statement, cst.FlattenSentinel([copy.with_changes(leading_lines=statement.leading_lines),
                                                         statement.with_changes(leading_lines=())]))


@codemod("out-of-place")
def out_of_place(tree: SourceTree, edit: Edit) -> str | None:
    """The in-place operation of the statement on ``edit.line`` made out of place (see the module's doc)."""
    statement = tree.statement_at(edit.line)
    if statement is None:
        found = tree.holding(edit.line, cst.SimpleStatementLine)  # a constructor call over several lines
        return _inplace_off(tree, found[-1], edit.line) if found else None
    edited = _inplace_off(tree, statement, edit.line)
    if edited is not None or len(statement.body) != 1:
        return edited
    small = statement.body[0]
    for form in (_method_out_of_place, _augmented_out_of_place, _setitem_on_a_copy, _nested_out_of_place):
        edited = form(tree, small, statement, edit.target)
        if edited is not None:
            return edited
    return None
