"""The ``item`` codemod: a holder keeps a number instead of a one-element tensor and its graph.

``total += loss`` becomes ``total += loss.item()`` (likewise ``losses.append(loss)`` and ``total = total +
loss``).  The holder then holds numbers, so its other uses in the same scope must work with numbers:
``total.item()`` becomes ``total``, ``losses[-1].item()`` becomes ``losses[-1]``; counting, summing,
arithmetic, formatting and printing work as they are.  Any other use (``torch.stack(losses)``, a tensor
method, iterating over the items) leaves no patch.

Example::

    >>> from graphwatch.analysis.codemods import apply_edits
    >>> from graphwatch.model import Edit
    >>> source = "total = 0\\nfor x in data:\\n    total = total + f(x)\\nprint(total.item() / 8)\\n"
    >>> print(apply_edits(source, [Edit("item", "t.py", 3, "f(x)")]), end="")
    total = 0
    for x in data:
        total = total + f(x).item()
    print(total / 8)
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import ParentNodeProvider

from ...model import Edit
from . import SourceTree, codemod
from .expressions import called, dotted, replaced_all, statement_starting

_FILLS = ("append", "extend", "clear")  # methods of a list of numbers used as they are
_NUMBER_CALLS = ("len", "sum", "min", "max", "print", "float", "int", "round", "str", "abs", "repr")


def kept_value(statement: cst.BaseSmallStatement) -> tuple[str, cst.BaseExpression] | None:
    """(the holder, the expression it keeps) when ``statement`` adds to or appends to a holder:
    ``total += v``, ``holder.append(v)``, ``total = total + v``; None otherwise."""
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
        holder = dotted(statement.target)
        return None if holder is None else (holder, statement.value)
    if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
        call = statement.value
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "append" and len(call.args) == 1:
            holder = dotted(call.func.value)
            return None if holder is None or call.args[0].keyword else (holder, call.args[0].value)
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
        holder, value = dotted(statement.targets[0].target), statement.value
        if holder is not None and isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
            if dotted(value.left) == holder:
                return holder, value.right
            if dotted(value.right) == holder:
                return holder, value.left
    return None


def _keeping(line: cst.SimpleStatementLine) -> tuple[cst.BaseSmallStatement, str, cst.BaseExpression] | None:
    """(the statement, its holder, the expression it keeps) of the one statement of a line that keeps a value
    (``g_loss.backward(); losses.append(g_loss)``: the second), or None (none, or more than one)."""
    found = [(small, *kept) for small in line.body if (kept := kept_value(small)) is not None]
    return found[0] if len(found) == 1 else None


def _kept_on_line(source: str) -> tuple[cst.BaseSmallStatement, cst.BaseExpression] | None:
    """(the statement, the expression it keeps) for one line of code, or None."""
    try:
        body = cst.parse_module(source.strip() + "\n").body
    except cst.ParserSyntaxError:
        return None
    found = _keeping(body[0]) if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) else None
    return None if found is None else (found[0], found[2])


def kept_expression(source: str) -> str | None:
    """The code of the expression a line keeps in its holder (see :func:`kept_value`), or None.

    >>> kept_expression("hist.append(perte_ü * 2)  # keep"), kept_expression("x = f(y)")
    ('perte_ü * 2', None)
    """
    found = _kept_on_line(source)
    return None if found is None else cst.Module([]).code_for_node(found[1])


def kept_statement(source: str, method: str) -> str | None:
    """The statement on one line of code keeping ``expression.method()`` instead of the expression it keeps,
    without its comment; None when the line keeps nothing.

    >>> kept_statement("self.epoch_logits.append(logits)  # all of them", "detach")
    'self.epoch_logits.append(logits.detach())'
    """
    found = _kept_on_line(source)
    if found is None:
        return None
    statement, value = found
    return cst.Module([]).code_for_node(statement.deep_replace(value, called(value, method)))


@codemod("item")
def item(tree: SourceTree, edit: Edit) -> str | None:
    """``edit.target`` -> ``edit.target.item()`` where the statement on ``edit.line`` keeps it in a holder,
    and the holder's ``.item()`` calls in its scope taken out (see the module's doc)."""
    statement = statement_starting(tree, edit.line, alone=False)
    found = _keeping(statement) if statement is not None else None
    if statement is None or found is None or tree.code(found[2]).strip() != edit.target:
        return None
    _, holder, value = found
    scope = _scope(tree, statement, holder)
    parents = tree.wrapper.resolve(ParentNodeProvider)
    numbers: dict[cst.CSTNode, cst.CSTNode] = {}
    for use in _uses(scope, holder):
        if _inside(use, statement, parents):
            continue
        call = _item_call(use, parents)
        if call is not None:
            numbers[call[0]] = call[1]
        elif not _number_use(use, parents):
            return None
    numbers[value] = called(value, "item")
    return replaced_all(tree.module, numbers)


def _scope(tree: SourceTree, statement: cst.CSTNode, holder: str) -> cst.CSTNode:
    """Where the holder's name means this holder: the class holding the line for ``self.x``, the function
    holding it for a name that function assigns, else the whole file."""
    line = tree.span(statement).start.line
    kind = cst.ClassDef if holder.startswith("self.") else cst.FunctionDef
    around = tree.holding(line, kind)
    if not around:
        return tree.module
    if kind is cst.FunctionDef and not any(dotted(t) == holder for t in _assigned(around[-1])):
        return tree.module  # a global (or a name of an enclosing function) the function fills
    return around[-1]


def _assigned(function: cst.CSTNode) -> list[cst.CSTNode]:
    targets: list[cst.CSTNode] = []

    class Targets(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            targets.append(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            targets.append(node.target)

    function.visit(Targets())
    return targets


def _uses(scope: cst.CSTNode, holder: str) -> list[cst.CSTNode]:
    """Every Name or Attribute in ``scope`` spelled ``holder`` (an attribute's own name is not a use)."""
    found: list[cst.CSTNode] = []

    class Uses(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            if node.value == holder:
                found.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            if dotted(node) == holder:
                found.append(node)
                return False
            node.value.visit(self)
            return False

    scope.visit(Uses())
    return found


def _inside(node: cst.CSTNode, ancestor: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    found: cst.CSTNode | None = node
    while found is not None:
        if found is ancestor:
            return True
        found = parents.get(found)
    return False


def _item_call(use: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """(``holder.item()`` or ``holder[i].item()``, what replaces it: ``holder`` or ``holder[i]``), or None."""
    value = use
    parent = parents.get(value)
    if isinstance(parent, cst.Subscript) and parent.value is value:
        value, parent = parent, parents.get(parent)
    if isinstance(parent, cst.Attribute) and parent.value is value and parent.attr.value == "item":
        call = parents.get(parent)
        if isinstance(call, cst.Call) and call.func is parent and not call.args:
            return call, value.with_changes(lpar=call.lpar, rpar=call.rpar)
    return None


def _number_use(use: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether this use works the same when the holder holds numbers: assigning it, filling it, counting,
    summing, printing, formatting it, arithmetic on it or on one of its items."""
    parent = parents.get(use)
    if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) and getattr(parent, "target", None) is use:
        return True
    if isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value in _FILLS:
        return isinstance(parents.get(parent), cst.Call)
    node = use
    if isinstance(parent, cst.Subscript) and parent.value is use:  # an item, used as a number
        node, parent = parent, parents.get(parent)
    if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget,
                           cst.FormattedStringExpression, cst.AugAssign)):  # fmt: skip
        return True
    if isinstance(parent, cst.Arg) and parent.value is node:
        call = parents.get(parent)
        return isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in _NUMBER_CALLS
    return False
