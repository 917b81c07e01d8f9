"""Codemods that cut a graph by detaching a value, as it ran: a state the loop carries (``detach-state``),
or a value where it is made (``detach-made``).

A value is detached by its type when it ran (:data:`~graphwatch.model.VALUE_TYPES`): a tensor with
``.detach()``, a tuple or list element by element (nested ones too), a state the code also sets to None only
when it is not None.  A type graphwatch cannot detach right gets no edit.

Example::

    >>> detach_statement("hidden", "tuple[Tensor]"), detach_statement("h, c", "Tensor")
    ('hidden = tuple(h.detach() for h in hidden)', 'h, c = h.detach(), c.detach()')
    >>> detach_statement("self.hidden", "Optional[tuple[Tensor]]")
    'if self.hidden is not None: self.hidden = tuple(h.detach() for h in self.hidden)'
    >>> detach_statement("states", "list[tuple[Tensor]]"), detach_statement("x", "other")
    ('states = [tuple(h.detach() for h in layer) for layer in states]', None)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider

from ...model import Edit
from . import SourceTree, codemod
from .expressions import called, dotted

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_LOOPS = (cst.For, cst.While)
_CONTAINERS = (("tuple[", "tuple({item} for {var} in {value})"), ("list[", "[{item} for {var} in {value}]"))
_ELEMENT_NAMES = {"Tensor": ("h", "t", "tensor"), "": ("layer", "part", "group")}


def detached(value: str, value_type: str, taken: frozenset[str] = frozenset()) -> str | None:
    """``value`` (a name) with its graph cut, element by element for a tuple or list; None for a type that
    cannot be detached so (``other``, ``Optional``)."""
    if value_type == "Tensor":
        return f"{value}.detach()"
    for prefix, form in _CONTAINERS:
        if value_type.startswith(prefix) and value_type.endswith("]"):
            inner = value_type[len(prefix) : -1]
            var = next(n for n in (*_ELEMENT_NAMES.get(inner, _ELEMENT_NAMES[""]), "element") if n not in taken)
            item = detached(var, inner, taken | {var})
            return None if item is None else form.format(item=item, var=var, value=value)
    return None


def detach_statement(target: str, value_type: str) -> str | None:
    """The statement that keeps ``target``'s value and cuts its graph (see the module's examples); ``target``
    is a name, a dotted name, or names a line assigns together (``"h, c"``, each of type ``value_type``)."""
    names = [name.strip() for name in target.split(",")]
    if not all(_DOTTED.match(name) for name in names):
        return None
    optional = value_type.startswith("Optional[") and value_type.endswith("]")
    kind = value_type[len("Optional[") : -1] if optional else value_type
    taken = frozenset(part for name in names for part in name.split("."))
    values = [detached(name, kind, taken) for name in names]
    if any(v is None for v in values) or (optional and len(names) > 1):
        return None
    statement = f"{', '.join(names)} = {', '.join(v for v in values if v)}"
    return f"if {target} is not None: {statement}" if optional else statement


def _statement_node(text: str) -> cst.BaseStatement:
    """The statement as code: an ``if ... is not None:`` statement as a block, not on one line."""
    node = cst.parse_statement(text + "\n")
    if isinstance(node, cst.If) and isinstance(node.body, cst.SimpleStatementSuite):
        inner = cst.SimpleStatementLine(body=list(node.body.body))
        node = node.with_changes(body=cst.IndentedBlock(body=[inner]), whitespace_after_test=cst.SimpleWhitespace(""))
    return node


def _blocks(node: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    """The statement sequences directly inside a module or compound statement (body, else, handlers, finally)."""
    if isinstance(node, cst.Module):
        return [node.body]
    found: list[Sequence[cst.BaseStatement]] = []
    parts = [getattr(node, "body", None), getattr(node, "orelse", None), getattr(node, "finalbody", None)]
    parts += list(getattr(node, "handlers", ()))
    while parts:
        part = parts.pop(0)
        if isinstance(part, cst.If):  # an elif
            parts += [part.body, part.orelse]
        elif isinstance(part, (cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler)):
            parts.append(part.body)
        elif isinstance(part, cst.IndentedBlock):
            found.append(part.body)
    return found


def _earlier(parent: cst.CSTNode, child: cst.BaseStatement) -> Sequence[cst.BaseStatement]:
    """The statements before ``child`` in the block of ``parent`` that holds it."""
    for block in _blocks(parent):
        for index, statement in enumerate(block):
            if statement is child:
                return block[:index]
    return ()


def _uses(tree: SourceTree, node: cst.CSTNode, names: set[str]) -> set[ExpressionContext]:
    """How ``node`` uses the (dotted) ``names``: reads (LOAD), assigns (STORE), both or neither."""
    contexts = tree.wrapper.resolve(ExpressionContextProvider)
    found: set[ExpressionContext] = set()

    class Uses(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            if name.value in names and (context := contexts.get(name)) is not None:
                found.add(context)

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            if dotted(attribute) in names and (context := contexts.get(attribute)) is not None:
                found.add(context)
            attribute.value.visit(self)
            return False  # (the attribute's own name is not a variable)

    node.visit(Uses())  # the node as it sits in the tree: the contexts are keyed by the tree's own nodes
    return found


def _reads(tree: SourceTree, node: cst.CSTNode, names: set[str]) -> bool:
    return ExpressionContext.LOAD in _uses(tree, node, names)


def _carries(tree: SourceTree, loop: cst.CSTNode, names: set[str]) -> bool:
    """Whether the value of ``names`` entering an iteration of ``loop`` (or a call of a function) can be used
    in it: the first statement of its body that uses them does not just assign them anew."""
    for statement in _blocks(loop)[0]:
        used = _uses(tree, statement, names)
        if used:
            return not (isinstance(statement, cst.SimpleStatementLine) and used == {ExpressionContext.STORE})
    return False


@codemod("detach-state")
def detach_state(tree: SourceTree, edit: Edit) -> str | None:
    """The detach of a carried state inserted where each step starts using it: in the training loop holding
    the state's line and ``edit.until`` (the line that leads to the backward) or, without ``until``, in the
    function holding the state's line (a ``training_step`` that runs once per step); above any inner loop
    (over time steps: the whole sequence still backpropagates) and above any earlier statement of the step
    that reads the state."""
    text = detach_statement(edit.target, edit.value_type)
    if text is None:
        return None
    names = {name.strip() for name in edit.target.split(",")}
    chain: list[cst.CSTNode] = [tree.module, *tree.holding(edit.line, cst.BaseStatement)]  # type: ignore[type-abstract]
    if edit.until is None:
        outer = [i for i, node in enumerate(chain) if isinstance(node, cst.FunctionDef)]
    else:
        outer = [i for i, node in enumerate(chain) if isinstance(node, _LOOPS)
                 and tree.span(node).start.line <= edit.until <= tree.span(node).end.line]  # fmt: skip
    if not outer or outer[-1] == len(chain) - 1:
        return None
    top = outer[-1]
    if not _carries(tree, chain[top], names):
        return None  # each step assigns it anew: whatever carries the graph, it is not this name
    loops = [i for i in range(top + 1, len(chain)) if isinstance(chain[i], _LOOPS)]
    point = loops[0] if loops else len(chain) - 1
    before = chain[point]
    for level in range(point, top, -1):  # an earlier statement of the step that reads the state comes first
        readers = [s for s in _earlier(chain[level - 1], chain[level]) if _reads(tree, s, names)]  # type: ignore[arg-type]
        if readers:
            before = readers[0]
    return tree.replaced(before, cst.FlattenSentinel([_statement_node(text), before]))  # type: ignore[arg-type]


@codemod("detach-made")
def detach_made(tree: SourceTree, edit: Edit) -> str | None:
    """``target = value`` on ``edit.line`` becomes ``target = value.detach()`` (a tensor's only: an edit that
    names no type is one for a tensor)."""
    if edit.value_type not in ("", "Tensor"):
        return None
    statements = tree.holding(edit.line, cst.SimpleStatementLine)
    if not statements or len(statements[-1].body) != 1:
        return None
    assign = statements[-1].body[0]
    if isinstance(assign, cst.Assign):
        targets = [t.target for t in assign.targets]
    elif isinstance(assign, cst.AnnAssign) and assign.value is not None:
        targets = [assign.target]
    else:
        return None
    value = assign.value
    if [dotted(t) for t in targets] != [edit.target] or value is None:
        return None
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "detach":
        return None  # detached already
    return tree.replaced(assign, assign.with_changes(value=called(value, "detach")))
