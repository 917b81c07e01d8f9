"""The ``item`` codemod: a holder keeps a number instead of a one-element tensor and its graph.

``total += loss`` becomes ``total += loss.item()`` (likewise ``losses.append(loss)`` and ``total = total +
loss``).  The holder then holds numbers, so its other uses in the same scope (for ``self.x``, the class's
other methods) must work with numbers: ``total.item()`` becomes ``total``, ``losses[-1].item()`` becomes
``losses[-1]``; counting, summing, arithmetic, formatting (f-strings, ``%``, ``str.format``), printing,
``torch.tensor(losses)`` and a loop using each item so work as they are, and so does keeping it in another
holder whose uses do (``all_losses.append(current_loss / 4)``).  Any other use (``torch.stack(losses)``, a
tensor method, an item's ``.item()`` in a loop, handing it to a function) leaves no patch:
:func:`takes_numbers` says so beforehand, and the fix keeps a detached tensor instead.

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

from . import SourceTree, file_tree
from .expressions import called, dotted, statement_starting

_FILLS = ("append", "extend", "clear")  # methods of a list of numbers used as they are
# functions that take numbers as they take one-element tensors (a list of numbers for the dotted ones)
_NUMBER_CALLS = ("len", "sum", "min", "max", "print", "float", "int", "round", "str", "abs", "repr", "format",
                 "torch.tensor", "np.array", "np.mean", "numpy.array", "numpy.mean", "statistics.mean")  # fmt: skip
HOLDER_LEVELS = 2  # holders looked through: ``loss`` kept in ``current_loss``, kept in ``all_losses``


def kept_value(statement: cst.BaseSmallStatement) -> tuple[str, cst.BaseExpression] | None:
    """(the holder, the expression it keeps) when ``statement`` adds to or appends to a holder:
    ``total += v``, ``holder.append(v)``, ``total = total + v``, ``total.add_(v)`` (see :func:`adds_in_place`);
    None otherwise."""
    if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
        holder = dotted(statement.target)
        return None if holder is None else (holder, statement.value)
    if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
        call = statement.value
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("append", "add_") and len(call.args) == 1:
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


def adds_in_place(statement: cst.BaseSmallStatement) -> bool:
    """Whether ``statement`` is ``holder.add_(v)``: the holder stays a tensor whatever it adds (a number too),
    so none of its uses changes when ``v`` is kept as a number."""
    call = statement.value if isinstance(statement, cst.Expr) else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_"


def keeping(line: cst.SimpleStatementLine) -> tuple[cst.BaseSmallStatement, str, cst.BaseExpression] | None:
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
    found = keeping(body[0]) if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) else None
    return None if found is None else (found[0], found[2])


def kept_expression(source: str) -> str | None:
    """The code of the expression a line keeps in its holder (see :func:`kept_value`), or None.

    >>> kept_expression("hist.append(perte_ü * 2)  # keep"), kept_expression("x = f(y)")
    ('perte_ü * 2', None)
    """
    found = _kept_on_line(source)
    return None if found is None else cst.Module([]).code_for_node(found[1])


def line_adds_in_place(source: str) -> bool:
    """Whether one line of code keeps its value by adding it in place to a tensor (``total.add_(loss)``).

    >>> line_adds_in_place("stats.loss_sum.add_(loss * 16)"), line_adds_in_place("total += loss")
    (True, False)
    """
    found = _kept_on_line(source)
    return found is not None and adds_in_place(found[0])


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


def takes_numbers(source: str, line: int) -> bool:
    """Whether every use of the holder the statement on ``line`` of the file ``source`` keeps a value in works
    the same when it holds numbers (see :func:`number_rewrites`); False when it needs tensors, when that cannot
    be told, or when the line keeps nothing.

    >>> source = "hist = []\\nfor x in data:\\n    hist.append(f(x))\\nprint(torch.stack(hist).mean())\\n"
    >>> takes_numbers(source, 3), takes_numbers(source.replace("torch.stack(hist).mean()", "sum(hist)"), 3)
    (False, True)
    """
    kept = keeping_at(source, line)
    return kept is not None and number_rewrites(kept[0], kept[1], kept[2][1]) is not None


def keeping_at(
    source: str, line: int
) -> tuple[SourceTree, cst.SimpleStatementLine, tuple[cst.BaseSmallStatement, str, cst.BaseExpression]] | None:
    """(the file's tree, the statement starting on ``line``, what :func:`keeping` says of it) when that statement
    keeps a value; None when the file does not parse or the line keeps nothing."""
    try:
        tree = file_tree(source)
    except cst.ParserSyntaxError:
        return None
    statement = statement_starting(tree, line, alone=False)
    found = keeping(statement) if statement is not None else None
    return None if statement is None or found is None else (tree, statement, found)


def number_rewrites(
    tree: SourceTree, statement: cst.CSTNode, holder: str, depth: int = HOLDER_LEVELS
) -> dict[cst.CSTNode, cst.CSTNode] | None:
    """What changes when ``holder`` (stored by ``statement``) holds numbers instead of tensors: each of its
    ``.item()`` calls (``holder.item()``, ``holder[i].item()``) -> the number itself; None when one of its other
    uses needs a tensor or cannot be told.  A use that keeps it in another holder (``all_losses.append(
    current_loss)``) takes numbers when that holder's uses do (``depth`` holders down); nothing changes for a
    holder that adds it in place (``total.add_(loss)``: a tensor still)."""
    keeps = keeping(statement) if isinstance(statement, cst.SimpleStatementLine) else None
    if keeps is not None and adds_in_place(keeps[0]):
        return {}
    scope = _scope(tree, statement, holder)
    parents = tree.wrapper.resolve(ParentNodeProvider)
    numbers: dict[cst.CSTNode, cst.CSTNode] = {}
    for use in _uses(scope, holder):
        if _inside(use, statement, parents):
            continue
        call = _item_call(use, parents)
        if call is not None:
            numbers[call[0]] = call[1]
            continue
        if _stored(use, parents):
            continue
        kept = _kept_into(use, parents)
        if kept is None and (_number_use(use, parents) or _numbers_iterated(use, parents)):
            continue
        further = number_rewrites(tree, kept[0], kept[1], depth - 1) if kept is not None and depth > 0 else None
        if further is None:
            return None
        numbers.update(further)
    return numbers


def _kept_into(use: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> tuple[cst.CSTNode, str] | None:
    """(the statement line, the holder) when ``use`` is the value a statement keeps in another holder."""
    line: cst.CSTNode | None = use
    while line is not None and not isinstance(line, cst.SimpleStatementLine):
        line = parents.get(line)
    found = keeping(line) if isinstance(line, cst.SimpleStatementLine) else None
    return (line, found[1]) if line is not None and found is not None and _inside(use, found[2], parents) else None


def _scope(tree: SourceTree, statement: cst.CSTNode, holder: str) -> cst.CSTNode:
    """Where the holder's name means this holder: the class holding the line for ``self.x``, the function
    holding it for a name that function assigns, else the whole file."""
    line = tree.span(statement).start.line
    kind = cst.ClassDef if holder.startswith("self.") else cst.FunctionDef
    around = tree.holding(line, kind)
    if not around:
        return tree.module
    if isinstance(around[-1], cst.FunctionDef) and not local_to(around[-1], holder):
        return tree.module  # a global (or a name of an enclosing function) the function fills
    return around[-1]


def local_to(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` assigns a ``name`` of its own (not declared ``global`` or ``nonlocal`` there)."""
    declarations = nodes(function, (cst.Global, cst.Nonlocal))
    declared = {alias.name.value for node in declarations for alias in node.names}  # type: ignore[attr-defined]
    return name not in declared and any(dotted(t) == name for t in _assigned(function))


def nodes(root: cst.CSTNode, kinds: tuple[type[cst.CSTNode], ...]) -> list[cst.CSTNode]:
    """Every node of ``kinds`` under ``root``."""
    found: list[cst.CSTNode] = []

    class Nodes(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kinds):
                found.append(node)
            return True

    root.visit(Nodes())
    return found


def _assigned(function: cst.CSTNode) -> list[cst.CSTNode]:
    targets: list[cst.CSTNode] = []

    class Targets(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            targets.extend(_flat(node.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            targets.append(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            targets.append(node.target)

    function.visit(Targets())
    return targets


def _flat(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The names a target assigns: ``output`` and ``loss`` of ``output, loss``."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _flat(element.value)]
    return [target]


def _uses(scope: cst.CSTNode, holder: str) -> list[cst.CSTNode]:
    """Every Name or Attribute in ``scope`` spelled ``holder`` (an attribute's own name is not a use), but
    those of a function inside ``scope`` that assigns a name ``holder`` of its own."""
    found: list[cst.CSTNode] = []

    class Uses(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is scope or "." in holder or not local_to(node, holder)

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


def _stored(use: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether ``use`` is (one name of) what an assignment or a ``for`` assigns: ``output, loss = ...``."""
    node, parent = use, parents.get(use)
    while isinstance(parent, (cst.Element, cst.Tuple, cst.List)):
        node, parent = parent, parents.get(parent)
    return isinstance(parent, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor)) and getattr(
        parent, "target", None
    ) is node


def _numbers_iterated(use: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether ``use`` is what a ``for`` (or a comprehension) iterates over, each item named and used only as a
    number there (``f"{v:.4f}" for v in losses``; an item's ``.item()`` is a tensor's use)."""
    loop = parents.get(use)
    if not isinstance(loop, (cst.For, cst.CompFor)) or loop.iter is not use or not isinstance(loop.target, cst.Name):
        return False
    body = parents.get(loop) if isinstance(loop, cst.CompFor) else loop.body
    if body is None:
        return False
    items = [u for u in _uses(body, loop.target.value) if u is not loop.target]
    return all(_stored(u, parents) or _number_use(u, parents) for u in items)


def _number_use(use: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Whether this use works the same when the holder holds numbers: filling it, counting, summing, printing,
    formatting it (also with ``%`` and ``str.format``), arithmetic on it or on one of its items."""
    parent = parents.get(use)
    if isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value in _FILLS:
        return isinstance(parents.get(parent), cst.Call)
    node = use
    if isinstance(parent, cst.Subscript) and parent.value is use:  # an item, used as a number
        node, parent = parent, parents.get(parent)
    if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget,
                           cst.FormattedStringExpression, cst.AugAssign)):  # fmt: skip
        return True
    values = parents.get(parent) if isinstance(parent, cst.Element) else None
    if isinstance(values, cst.Tuple):  # "%d %.4f" % (i, loss)
        formatting = parents.get(values)
        return isinstance(formatting, cst.BinaryOperation) and isinstance(formatting.operator, cst.Modulo)
    if isinstance(parent, cst.Arg) and parent.value is node:
        call = parents.get(parent)
        if not isinstance(call, cst.Call):
            return False
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "format":  # "{:.4f}".format(loss)
            return isinstance(call.func.value, (cst.SimpleString, cst.ConcatenatedString))
        return dotted(call.func) in _NUMBER_CALLS
    return False
