"""Codemods for the fixes of a backward through a freed graph and of a loss made without a graph: a tensor
detached where one loss uses it, each loss's own copy of an expression two losses shared (with what that loss
must not train detached in it), ``create_graph=True`` on an ``autograd.grad``, ``retain_graph=True`` on the
earlier of two backwards one optimizer needs, a second backward removed,
statements put under ``torch.enable_grad()``.

Each refuses (None) where the line is not what the edit expects: the tensor is not used there exactly once,
there is no ``autograd.grad`` call, the statement is not a backward, the lines are not whole statements of
one block.

Example::

    >>> from graphwatch.analysis.codemods import apply_edits
    >>> from graphwatch.model import Edit
    >>> print(apply_edits("output = netD(fake)  # D on fakes\\n", [Edit("detach-use", "t.py", 1, "fake")]), end="")
    output = netD(fake.detach())  # D on fakes
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import libcst as cst

from ...model import Edit
from . import NodeT, SourceTree, codemod
from .expressions import binds_torch, called
from .expressions import dotted as _dotted
from .numbers import nodes


def _statement_holding(tree: SourceTree, line: int) -> cst.SimpleStatementLine | None:
    """The simple statement line (on one line or several) that holds ``line``."""
    found = tree.holding(line, cst.SimpleStatementLine)
    return found[-1] if found else None


class _Uses(cst.CSTVisitor):
    """The loads of the dotted name ``target`` in a statement: not an assignment's target, not a keyword's
    name, not an attribute's own name (``fake`` in ``self.fake``), not one already ``.detach()``-ed."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.found: list[cst.BaseExpression] = []
        self._not_uses: set[int] = set()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False  # ``fake = ...``: a store

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_uses.add(id(node.keyword))

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self._not_uses.add(id(node.attr))
        if node.attr.value == "detach":
            self._not_uses.add(id(node.value))
        if id(node) not in self._not_uses and _dotted(node) == self.target:
            self.found.append(node)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._not_uses and node.value == self.target:
            self.found.append(node)


def _detached(expression: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=expression, attr=cst.Name("detach")))


@codemod("detach-use")
def detach_use(tree: SourceTree, edit: Edit) -> str | None:
    """``target`` -> ``target.detach()`` where the statement on ``edit.line`` uses it; only where it uses it
    once (two uses: which one must not reach what made it is not for a patch to guess).  A ``target`` that is
    no name (``loss * 16``, the value a holder keeps) is the one expression of the statement spelled so,
    detached in parentheses."""
    statement = _statement_holding(tree, edit.line)
    if statement is None or not edit.target:
        return None
    uses = _Uses(edit.target)
    statement.visit(uses)
    if not uses.found and _dotted(cst.parse_expression(edit.target)) is None:
        spelled = [e for e in nodes(statement, (cst.BaseExpression,)) if tree.code(e).strip() == edit.target]
        expression = cast(cst.BaseExpression, spelled[0]) if len(spelled) == 1 else None
        return tree.replaced(expression, called(expression, "detach")) if expression is not None else None
    if len(uses.found) != 1:
        return None
    return tree.replaced(uses.found[0], _detached(uses.found[0]))


# Calls a statement between the shared expression and the loss may make: a backward, a zero_grad, a step
_TRAINING_CALLS = frozenset({"backward", "zero_grad", "step"})
# Tensor methods whose result is a new tensor (never a view of their input, which an optimizer step could change)
_NEW_TENSOR = frozenset({"exp", "log", "mean", "sum", "pow", "sigmoid", "tanh", "abs", "sqrt", "logsumexp", "softplus"})


@codemod("own-copy")
def own_copy(tree: SourceTree, edit: Edit) -> str | None:
    """The loss that the backward on ``edit.line`` backwards gets its own copy of the expression that the
    statement on ``edit.until`` assigns to a name both losses use, with ``edit.target`` detached in the copy:
    ``critic_loss = td_loss + min_q_loss`` -> ``critic_loss = td_loss + (alpha.detach() * (gap - 1.0))``.

    Only where the copy computes what the name held: the expression calls nothing (a call could draw random
    numbers or change state), the loss is assigned by one statement of the same block between the two lines
    and uses the name once, and the statements in between assign nothing the expression reads and call only
    backwards, ``zero_grad`` and steps; across a step, each name the expression reads must hold a tensor
    made in the block (``alpha = log_alpha.exp()``), not a parameter the step changes."""
    shared, backward = tree.statement_at(edit.until or 0), tree.statement_at(edit.line)
    assigned, loss = _assignment(shared), _backwarded_name(backward)
    if shared is None or backward is None or assigned is None or loss is None or not edit.target:
        return None
    name, expression = assigned
    block = next((b for b in tree.nodes(cst.IndentedBlock) if shared in b.body and backward in b.body), None)
    body: list[cst.BaseStatement] = list(block.body) if block is not None else list(tree.module.body)
    read = {n.value for n in _under(tree, cst.Name, expression)}
    if shared not in body or backward not in body or name in read or _under(tree, cst.Call, expression):
        return None
    between = body[body.index(shared) + 1 : body.index(backward)]
    assignments = [i for i, s in enumerate(between) if (a := _assignment(s)) is not None and a[0] == loss]
    if not assignments or not _keeps(tree, between[: assignments[-1]], body[: body.index(shared)], read, name):
        return None
    uses, copied = _Uses(name), _Uses(edit.target)
    between[assignments[-1]].visit(uses)
    expression.visit(copied)
    if len(uses.found) != 1 or len(copied.found) != 1:
        return None
    own = cast(cst.BaseExpression, expression.deep_replace(copied.found[0], _detached(copied.found[0])))
    if not isinstance(own, cst.Name | cst.Attribute | cst.Call | cst.Subscript):
        own = own.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return tree.replaced(uses.found[0], own)


def _assignment(statement: cst.CSTNode | None) -> tuple[str, cst.BaseExpression] | None:
    """(the name, the value) of a statement line that is one ``name = value``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or not isinstance(small.targets[0].target, cst.Name):
        return None
    return small.targets[0].target.value, small.value


def _backwarded_name(statement: cst.CSTNode | None) -> str | None:
    """``loss`` of a statement line that is one ``loss.backward(...)``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and _is_backward_call(call) and isinstance(call.func, cst.Attribute)):
        return None
    return call.func.value.value if isinstance(call.func.value, cst.Name) else None


def _under(tree: SourceTree, kind: type[NodeT], outer: cst.CSTNode) -> list[NodeT]:
    """The nodes of ``kind`` inside ``outer`` (a node of ``tree``)."""
    return [node for node in tree.nodes(kind) if _inside(tree, node, outer)]


def _keeps(
    tree: SourceTree, between: list[cst.BaseStatement], before: list[cst.BaseStatement], names: set[str], shared: str
) -> bool:  # fmt: skip
    """Whether the statements ``between`` leave what ``names`` and ``shared`` hold as it was: simple statements
    that assign none of them and call only backwards, ``zero_grad`` and steps; across a step, each of
    ``names`` holds a tensor a statement ``before`` made (an operator, or a method in :data:`_NEW_TENSOR`)."""
    stepped = False
    for statement in between:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        stored = [t for small in statement.body for t in _stored(small)]
        if any(n.value in names | {shared} for t in stored for n in _under(tree, cst.Name, t)):
            return False
        called = [c.func.attr.value if isinstance(c.func, cst.Attribute) else "" for c in _under(tree, cst.Call, statement)]
        if any(c not in _TRAINING_CALLS for c in called):
            return False
        stepped = stepped or "step" in called
    made = {a[0]: a[1] for s in before if (a := _assignment(s)) is not None}  # (the last assignment of each)
    return not stepped or all(n in made and _new_tensor(made[n]) for n in names)


def _stored(small: cst.BaseSmallStatement) -> list[cst.BaseExpression]:
    """What a small statement assigns or deletes."""
    if isinstance(small, cst.Assign):
        return [t.target for t in small.targets]
    if isinstance(small, cst.AugAssign | cst.AnnAssign | cst.Del):
        return [small.target]
    return []


def _new_tensor(value: cst.BaseExpression) -> bool:
    """Whether ``value`` makes a new tensor: an operator, or a call of a method in :data:`_NEW_TENSOR`."""
    if isinstance(value, cst.BinaryOperation | cst.UnaryOperation):
        return True
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _NEW_TENSOR


def _is_autograd_grad(call: cst.Call) -> bool:
    name = _dotted(call.func)
    return name in ("torch.autograd.grad", "autograd.grad", "grad")


@codemod("create-graph")
def create_graph(tree: SourceTree, edit: Edit) -> str | None:
    """``create_graph=True`` on the one ``torch.autograd.grad(...)`` call of the statement on ``edit.line``
    (a ``create_graph=False`` there becomes True)."""
    return _keyword_true(tree, edit.line, "create_graph", _is_autograd_grad)


@codemod("retain-graph")
def retain_graph(tree: SourceTree, edit: Edit) -> str | None:
    """``retain_graph=True`` on the one backward or ``torch.autograd.grad(...)`` call of the statement on
    ``edit.line`` (a ``retain_graph=False`` there becomes True)."""
    return _keyword_true(tree, edit.line, "retain_graph", lambda c: _is_autograd_grad(c) or _is_backward_call(c))


def _keyword_true(tree: SourceTree, line: int, keyword: str, wanted: Callable[[cst.Call], bool]) -> str | None:
    """``keyword=True`` on the one call of the statement on ``line`` that ``wanted`` accepts."""
    statement = _statement_holding(tree, line)
    if statement is None:
        return None
    calls = [c for c in tree.nodes(cst.Call) if wanted(c) and _inside(tree, c, statement)]
    if len(calls) != 1:
        return None
    call = calls[0]
    if any(a.star == "**" for a in call.args):  # the keyword may be in the mapping: no guess
        return None
    present = next((a for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
    args = list(call.args)
    if present is not None:
        args = [a.with_changes(value=cst.Name("True")) if a is present else a for a in args]
    else:
        tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        added = cst.Arg(value=cst.Name("True"), keyword=cst.Name(keyword), equal=tight)
        if args and isinstance(args[-1].comma, cst.Comma):  # a trailing comma stays last
            added = added.with_changes(comma=args[-1].comma)
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        args.append(added)
    return tree.replaced(call, call.with_changes(args=args))


def _inside(tree: SourceTree, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    inner, around = tree.span(node), tree.span(outer)
    return (around.start.line, around.start.column) <= (inner.start.line, inner.start.column) and (
        (inner.end.line, inner.end.column) <= (around.end.line, around.end.column)
    )


def _is_backward_call(expression: cst.BaseExpression) -> bool:
    if not isinstance(expression, cst.Call):
        return False
    name = _dotted(expression.func) or ""
    return name.endswith(".backward") or (isinstance(expression.func, cst.Attribute) and expression.func.attr.value == "backward")


@codemod("remove-statement")
def remove_statement(tree: SourceTree, edit: Edit) -> str | None:
    """The backward call on ``edit.line`` removed: a statement that is one backward call, on a line of its own
    (``pass`` takes its place when it is the only statement of its block) or beside other statements on the
    line (``total = ...; loss.backward()``: the others stay).  A line with more than one backward call, or none,
    is refused."""
    statement = tree.statement_at(edit.line)
    if statement is None:
        return None
    backwards = [small for small in statement.body if isinstance(small, cst.Expr) and _is_backward_call(small.value)]
    if len(backwards) != 1:
        return None
    if len(statement.body) > 1:
        kept = [small for small in statement.body if small is not backwards[0]]
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)  # (no `;` left at the line's end)
        return tree.replaced(statement, statement.with_changes(body=kept))
    blocks = [b for b in tree.nodes(cst.IndentedBlock) if any(s is statement for s in b.body)]
    if blocks and len(blocks[0].body) == 1:
        return tree.replaced(statement, statement.with_changes(body=[cst.Pass()]))
    return tree.replaced(statement, cst.RemoveFromParent())


@codemod("enable-grad")
def enable_grad(tree: SourceTree, edit: Edit) -> str | None:
    """The statements from ``edit.line`` to ``edit.until`` (whole statements of one block) put under
    ``with torch.enable_grad():``; the file must ``import torch``."""
    last = edit.until if edit.until is not None else edit.line
    if not binds_torch(tree.module) or last < edit.line:
        return None
    blocks: list[cst.IndentedBlock | cst.Module] = [*tree.nodes(cst.IndentedBlock), tree.module]
    for block in blocks:
        body = list(block.body)
        first = next((i for i, s in enumerate(body) if tree.span(s).start.line == edit.line), None)
        end = next((i for i, s in enumerate(body) if tree.span(s).end.line == last), None)
        if first is None or end is None or end < first:
            continue
        head = cast(cst.SimpleStatementLine, body[first])  # (every statement has leading lines)
        moved = [head.with_changes(leading_lines=()), *body[first + 1 : end + 1]]
        wrapped = cst.With(
            items=[cst.WithItem(cst.Call(cst.Attribute(cst.Name("torch"), cst.Name("enable_grad"))))],
            body=cst.IndentedBlock(body=moved),
            leading_lines=head.leading_lines,
        )
        new_body = [*body[:first], wrapped, *body[end + 1 :]]
        if isinstance(block, cst.Module):
            return block.with_changes(body=new_body).code
        return tree.replaced(block, block.with_changes(body=new_body))
    return None
