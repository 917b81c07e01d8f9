"""A value kept by a caller that a function of the same file returned: fixed at the ``return``.

PyTorch's char-RNN tutorial keeps what its ``train()`` returns (``output, loss = train(...)``, then
``current_loss += loss``): the graph goes in at ``return output, loss``, and one edit there fixes every holder
its callers feed (``print_loss_total`` and ``plot_loss_total`` of the seq2seq tutorial alike).  The return
keeps a number (``return output, loss.item()``) when every caller's use of it takes one
(:func:`~.numbers.number_rewrites`: their ``.item()`` calls are taken out), else a detached tensor.

Example::

    >>> source = (
    ...     "def train(x):\\n    loss = f(x)\\n    loss.backward()\\n    return x, loss\\n\\n"
    ...     "total = 0\\nfor x in data:\\n    out, loss = train(x)\\n    total += loss\\nprint(f'{total:.3f}')\\n"
    ... )
    >>> found = returned_value(source, 9)
    >>> found.line, found.value, found.numbers, found.as_item, found.as_detached
    (4, 'loss', True, 'return x, loss.item()', 'return x, loss.detach()')
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ParentNodeProvider

from ...model import Edit
from . import SourceTree, codemod
from .expressions import called, dotted, replaced_all, statement_starting
from .numbers import HOLDER_LEVELS, keeping, keeping_at, local_to, nodes, number_rewrites


@dataclass(frozen=True, slots=True)
class Returned:
    """The ``return`` a kept value came from, and what it becomes there."""

    function: str  # the function that returned it: "train"
    line: int  # the return statement's line
    value: str  # the returned expression the callers keep: "loss", "loss / target_length"
    numbers: bool  # every caller's use of it works with a number (then ``as_item`` is the fix)
    as_item: str  # the return statement keeping ``value.item()`` (without its comment)
    as_detached: str | None  # ... keeping the one name of ``value`` detached; None: no single name to detach
    detached: str | None  # that name: "loss"
    # the function calls ``detached.backward()`` (without retain_graph): no later backward can run through it,
    # so detaching it changes no gradient
    backwarded: bool


@functools.lru_cache(maxsize=64)
def returned_value(source: str, line: int) -> Returned | None:
    """The ``return`` of a function of the file ``source`` whose value the statement on ``line`` keeps in a
    holder, directly or through the holders it feeds (``current_loss += loss`` after ``output, loss =
    train(...)``), when that is the one function whose value it keeps and the function has one ``return``;
    None otherwise.  Computed once for a file's text and line: a leak is judged again at every step end, and
    following the file's callers takes seconds in a tutorial-sized script."""
    kept = keeping_at(source, line)
    if kept is None:
        return None
    tree, statement, found = kept
    origins = _origins(tree, _scope_of(tree, statement), found[2], HOLDER_LEVELS, set())
    if origins is None or len(origins) != 1:
        return None
    name, index = origins.pop()
    function = _function(tree, name)
    returned = _returned(tree, function, index) if function is not None else None
    if function is None or returned is None:
        return None
    back, value = returned
    detached = _detached_name(value, function)
    code = cst.Module([]).code_for_node
    small = back.body[0]  # (the statement without its comment)
    return Returned(
        name,
        tree.span(back).start.line,
        code(value).strip(),
        _callers_numbers(tree, function, index) is not None,
        code(small.deep_replace(value, called(value, "item"))),
        None if detached is None else code(small.deep_replace(detached, called(detached, "detach"))),
        None if detached is None else code(detached),
        detached is not None and _backwards(function, code(detached)),
    )


@codemod("item")
def item(tree: SourceTree, edit: Edit) -> str | None:
    """``edit.target`` -> ``edit.target.item()`` where the statement on ``edit.line`` keeps it in a holder (or
    returns it to callers that keep it: :func:`returned_numbers`), and the ``.item()`` calls of what holds it
    taken out (see :mod:`.numbers`)."""
    statement = statement_starting(tree, edit.line, alone=False)
    if statement is None:
        return None
    if isinstance(statement.body[0], cst.Return):
        return returned_numbers(tree, statement, edit.target)
    found = keeping(statement)
    if found is None or tree.code(found[2]).strip() != edit.target:
        return None
    _, holder, value = found
    numbers = number_rewrites(tree, statement, holder)
    if numbers is None:
        return None
    numbers[value] = called(value, "item")
    return replaced_all(tree.module, numbers)


def returned_numbers(tree: SourceTree, statement: cst.SimpleStatementLine, target: str) -> str | None:
    """The file with the ``return`` on ``statement`` keeping ``target.item()`` (``target`` is what it returns,
    or one item of the tuple it returns) and its callers' ``.item()`` calls taken out; None when a caller uses
    it as a tensor, or keeps it in a way that cannot be told."""
    back = statement.body[0]
    functions = tree.holding(tree.span(statement).start.line, cst.FunctionDef)
    if not isinstance(back, cst.Return) or back.value is None or not functions:
        return None
    function = functions[-1]
    if _function(tree, function.name.value) is not function:
        return None
    values = back.value.elements if isinstance(back.value, cst.Tuple) else None
    if values is None:
        index, value = None, back.value
    else:
        spots = [i for i, v in enumerate(values) if tree.code(v.value).strip() == target]
        if len(spots) != 1:
            return None
        index, value = spots[0], values[spots[0]].value
    if values is None and tree.code(value).strip() != target:
        return None
    numbers = _callers_numbers(tree, function, index)
    if numbers is None:
        return None
    numbers[value] = called(value, "item")
    return replaced_all(tree.module, numbers)


def _scope_of(tree: SourceTree, statement: cst.CSTNode) -> cst.CSTNode:
    """The function holding ``statement`` (its innermost), else the module."""
    functions = tree.holding(tree.span(statement).start.line, cst.FunctionDef)
    return functions[-1] if functions else tree.module


Origin = tuple[str, "int | None"]  # (the function called, the item of what it returns that is kept, or None)


def _origins(
    tree: SourceTree, scope: cst.CSTNode, value: cst.BaseExpression, depth: int, seen: set[str]
) -> set[Origin] | None:
    """The functions of the file whose returned value ``value`` (an expression in ``scope``) reads, through the
    names it reads and what is assigned or added to them there (``depth`` holders back); None when one of those
    names is assigned something else than a call, a number, a value added to it, or arithmetic of other values
    (the seq2seq tutorial's ``plot_loss_avg = plot_loss_total / plot_every``, then kept in ``plot_losses``)."""
    origins: set[Origin] = set()
    for name in _read_names(value) - seen:
        seen.add(name)
        for target, assigned in _assignments(scope, name):
            if isinstance(assigned, (cst.Integer, cst.Float)):
                continue  # ``total = 0``
            origin = _call_origin(tree, target, assigned, name)
            if origin is not None:
                origins.add(origin)
                continue
            added = assigned.value if isinstance(assigned, cst.AugAssign) else _added_to(assigned, name)
            if added is None and isinstance(assigned, cst.BinaryOperation):
                added = assigned  # a value made of others: ``plot_loss_avg = plot_loss_total / plot_every``
            further = _origins(tree, scope, added, depth - 1, seen) if added is not None and depth > 0 else None
            if further is None:
                return None
            origins |= further
    return origins


def _assignments(scope: cst.CSTNode, name: str) -> list[tuple[cst.BaseExpression, cst.CSTNode]]:
    """(the target, the value assigned, or the ``+=`` statement) of each assignment of ``name`` in ``scope``
    (not in the functions inside it that have a ``name`` of their own)."""
    found: list[tuple[cst.BaseExpression, cst.CSTNode]] = []

    class Assignments(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is scope or not local_to(node, name)

        def visit_Assign(self, node: cst.Assign) -> None:
            found.extend((t.target, node.value) for t in node.targets if name in _target_names(t.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if dotted(node.target) == name:
                found.append((node.target, node))

    scope.visit(Assignments())
    return found


def _target_names(target: cst.BaseExpression) -> list[str | None]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [dotted(e.value) for e in target.elements]
    return [dotted(target)]


def _call_origin(tree: SourceTree, target: cst.BaseExpression, assigned: cst.CSTNode, name: str) -> Origin | None:
    """(the function, the item kept) when ``target = assigned`` binds ``name`` to what a call of a function of
    the file returns (``loss = train(...)``, ``output, loss = train(...)``)."""
    if not (isinstance(assigned, cst.Call) and isinstance(assigned.func, cst.Name)):
        return None
    if _function(tree, assigned.func.value) is None:
        return None
    names = _target_names(target)
    if not isinstance(target, (cst.Tuple, cst.List)):
        return assigned.func.value, None
    return (assigned.func.value, names.index(name)) if names.count(name) == 1 else None


def _added_to(assigned: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """``v`` of ``name = name + v``; None for any other value."""
    if isinstance(assigned, cst.BinaryOperation) and isinstance(assigned.operator, cst.Add):
        if dotted(assigned.left) == name:
            return assigned.right
        if dotted(assigned.right) == name:
            return assigned.left
    return None


def _read_names(value: cst.CSTNode) -> set[str]:
    """The plain names an expression reads (not an attribute's own name, not a keyword's)."""
    names: set[str] = set()

    class Reads(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

    value.visit(Reads())
    return names


def _function(tree: SourceTree, name: str) -> cst.FunctionDef | None:
    """The function the file's top level defines as ``name``, when that is the only thing it binds to it."""
    found = [s for s in tree.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    if len(found) != 1 or name in {n for t, _ in _assignments(tree.module, name) for n in _target_names(t)}:
        return None
    return found[0]


def _returned(
    tree: SourceTree, function: cst.FunctionDef, index: int | None
) -> tuple[cst.SimpleStatementLine, cst.BaseExpression] | None:
    """(the one ``return`` line of ``function``, the expression it returns that is kept: the item ``index`` of
    the tuple it returns), or None (several returns, a tuple of another shape)."""
    lines = [
        line for line in tree.nodes(cst.SimpleStatementLine)
        if isinstance(line.body[0], cst.Return) and tree.holding(tree.span(line).start.line, cst.FunctionDef)[-1:]
        == [function]
    ]  # fmt: skip
    if len(lines) != 1 or not isinstance(back := lines[0].body[0], cst.Return) or back.value is None:
        return None
    if index is None:
        return None if isinstance(back.value, cst.Tuple) else (lines[0], back.value)
    values = back.value.elements if isinstance(back.value, cst.Tuple) else []
    return (lines[0], values[index].value) if index < len(values) else None


def _detached_name(value: cst.BaseExpression, function: cst.FunctionDef) -> cst.BaseExpression | None:
    """What ``.detach()`` goes on in the returned ``value``: itself when it is a name, else the one name it
    reads that ``function`` assigns (``loss`` in ``loss / target_length``)."""
    if dotted(value) is not None:
        return value
    candidates = [n for n in _name_nodes(value) if local_to(function, n.value)]
    return candidates[0] if len(candidates) == 1 else None


def _backwards(function: cst.FunctionDef, name: str) -> bool:
    """Whether ``function`` calls ``name.backward()`` and never with ``retain_graph`` (its graph is freed then)."""
    calls = [
        node for node in nodes(function, (cst.Call,))
        if isinstance(func := node.func, cst.Attribute) and func.attr.value == "backward"  # type: ignore[attr-defined]
        and dotted(func.value) == name
    ]  # fmt: skip
    keywords = {a.keyword.value for c in calls for a in c.args if a.keyword is not None}  # type: ignore[attr-defined]
    return bool(calls) and "retain_graph" not in keywords and "create_graph" not in keywords


def _name_nodes(value: cst.CSTNode) -> list[cst.Name]:
    found: list[cst.Name] = []

    class Names(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

    value.visit(Names())
    return found


def _callers_numbers(
    tree: SourceTree, function: cst.FunctionDef, index: int | None
) -> dict[cst.CSTNode, cst.CSTNode] | None:
    """What changes in the callers of ``function`` when it returns a number as its item ``index`` (see
    :func:`~.numbers.number_rewrites`); None when a caller uses it as a tensor, or calls the function other
    than as the value of an assignment to names."""
    parents = tree.wrapper.resolve(ParentNodeProvider)
    numbers: dict[cst.CSTNode, cst.CSTNode] = {}
    name = function.name.value
    calls = [n for n in tree.nodes(cst.Name) if n.value == name and n is not function.name]
    for called_name in calls:
        call = parents.get(called_name)
        assign = parents.get(call) if isinstance(call, cst.Call) and call.func is called_name else None
        line = parents.get(assign) if isinstance(assign, cst.Assign) and len(assign.targets) == 1 else None
        kept = _bound(assign.targets[0].target, index) if isinstance(assign, cst.Assign) else None
        found = number_rewrites(tree, line, kept) if isinstance(line, cst.SimpleStatementLine) and kept else None
        if found is None:
            return None
        numbers.update(found)
    return numbers if calls else None


def _bound(target: cst.BaseExpression, index: int | None) -> str | None:
    """The name ``target`` binds to the item ``index`` of the value assigned (``index`` None: to the value)."""
    if index is None:
        return None if isinstance(target, (cst.Tuple, cst.List)) else dotted(target)
    names = _target_names(target) if isinstance(target, (cst.Tuple, cst.List)) else []
    return names[index] if index < len(names) else None
