"""Codemods that cut a graph by detaching a value, as it ran: a state the loop carries (``detach-state``),
or a value where it is made (``detach-made``).

A value is detached by its type when it ran (:data:`~graphwatch.model.VALUE_TYPES`): a tensor with
``.detach()``, a tuple or list element by element (nested ones too), a state the code also sets to None only
when it is not None.  A type graphwatch cannot detach right gets no edit.  A state the script can make a
tensor or a tuple (an ``init_hidden()`` that returns ``(h, c)`` for an LSTM and ``h`` otherwise) is detached by
a helper that handles both (:func:`state_statement`): the script's own ``repackage_hidden``-like one when it
has it, else :data:`HELPER`, added above the function that keeps the state.

Example::

    >>> detach_statement("hidden", "tuple[Tensor]"), detach_statement("h, c", "Tensor")
    ('hidden = tuple(h.detach() for h in hidden)', 'h, c = h.detach(), c.detach()')
    >>> detach_statement("self.hidden", "Optional[tuple[Tensor]]")
    'if self.hidden is not None: self.hidden = tuple(h.detach() for h in self.hidden)'
    >>> detach_statement("states", "list[tuple[Tensor]]"), detach_statement("x", "other")
    ('states = [tuple(h.detach() for h in layer) for layer in states]', None)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TypeVar

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider

from ...model import Edit
from . import SourceTree, codemod, module_tree
from .expressions import binds_torch, called, dotted

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_NodeT = TypeVar("_NodeT", bound=cst.CSTNode)
_LOOPS = (cst.For, cst.While)
_CONTAINERS = (("tuple[", "tuple({item} for {var} in {value})"), ("list[", "[{item} for {var} in {value}]"))
_ELEMENT_NAMES = {"Tensor": ("h", "t", "tensor"), "": ("layer", "part", "group")}
_HELPER_NAME = re.compile(r"repackage|detach", re.IGNORECASE)
HELPER_NAME = "repackage_hidden"
HELPER = f'''def {HELPER_NAME}(state):
    """`state` with its graph cut: a tensor detached, a tuple or list of tensors (nested too) item by item."""
    if isinstance(state, torch.Tensor):
        return state.detach()
    if isinstance(state, list):
        return [{HELPER_NAME}(item) for item in state]
    return tuple({HELPER_NAME}(item) for item in state)
'''


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


def detach_statement(target: str, value_type: str, helper: str | None = None) -> str | None:
    """The statement that keeps ``target``'s value and cuts its graph (see the module's examples); ``target``
    is a name, a dotted name, or names a line assigns together (``"h, c"``, each of type ``value_type``);
    ``helper``: a function of the script that detaches a tensor or a tuple, used for one name.

    >>> detach_statement("hidden", "Tensor", helper="repackage_hidden")
    'hidden = repackage_hidden(hidden)'
    """
    names = [name.strip() for name in target.split(",")]
    if not all(_DOTTED.match(name) for name in names):
        return None
    optional = value_type.startswith("Optional[") and value_type.endswith("]")
    kind = value_type[len("Optional[") : -1] if optional else value_type
    taken = frozenset(part for name in names for part in name.split("."))
    values = [detached(name, kind, taken) for name in names]
    if helper is not None and len(names) == 1 and values[0] is not None:
        values = [f"{helper}({names[0]})"]
    if any(v is None for v in values) or (optional and len(names) > 1):
        return None
    statement = f"{', '.join(names)} = {', '.join(v for v in values if v)}"
    return f"if {target} is not None: {statement}" if optional else statement


def state_statement(module: cst.Module | None, target: str, value_type: str) -> tuple[str | None, bool]:
    """The statement that detaches the state ``target`` in the file ``module`` (None: not read), and whether
    :data:`HELPER` must be added for it.  A helper detaches a state the script can make more than one type
    (:func:`several_types`): the script's own (:func:`own_helper`), else :data:`HELPER_NAME`, added (no statement
    when that name is taken or the file does not bind ``torch``).  The script's own helper also detaches a
    tuple or list, and a tensor the script detaches with it elsewhere (``hidden = repackage_hidden(hidden)``
    in its evaluation loop)."""
    if module is None or "," in target:
        return detach_statement(target, value_type), False
    if starts_as_number(module, target):  # `total = 0.0` before the loop: no .detach() on the first step's number
        statement = detach_statement(target, value_type)
        if statement is None or not binds_torch(module):
            return None, False
        inner = statement.split(": ", 1)[1] if statement.startswith("if ") else statement
        return f"if isinstance({target}, torch.Tensor): {inner}", False
    helper, several = own_helper(module), several_types(module, target)
    container = value_type not in ("Tensor", "Optional[Tensor]")
    if helper is not None and (several or container or f"{helper}({target})" in module.code):
        return detach_statement(target, value_type, helper), False
    if not several:
        return detach_statement(target, value_type), False
    if not binds_torch(module) or HELPER_NAME in _functions(module):
        return None, False
    return detach_statement(target, value_type, HELPER_NAME), True


def own_helper(module: cst.Module) -> str | None:
    """The name of the script's own function that detaches a tensor or a tuple of them (upstream's
    ``repackage_hidden``): one of the file's top level, named so, taking one argument, that checks the type
    with ``isinstance`` and calls ``.detach()``."""
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and _HELPER_NAME.search(statement.name.value):
            code = module.code_for_node(statement)
            if len(statement.params.params) == 1 and "isinstance(" in code and ".detach()" in code:
                return statement.name.value
    return None


def starts_as_number(module: cst.Module, target: str) -> bool:
    """Whether the file assigns a number to ``target`` (``total = 0.0``, ``loss_sum = -1``): a sum that a loop
    makes a tensor holds a plain number until the first one is added.

    >>> starts_as_number(cst.parse_module("total = 0.0\\nfor x in xs:\\n    total = total + f(x)\\n"), "total")
    True
    """
    for node in _nodes(module, cst.Assign):
        if len(node.targets) == 1 and dotted(node.targets[0].target) == target:
            value = node.value.expression if isinstance(node.value, cst.UnaryOperation) else node.value
            if isinstance(value, (cst.Integer, cst.Float)):
                return True
    return False


def several_types(module: cst.Module, target: str) -> bool:
    """Whether the file makes ``target`` (a name or dotted name) a tuple or list in one place and some other
    value in another: read off what each ``target = ...`` assigns, through the ``return``s of a function of
    the file it calls (``hidden = model.init_hidden(bsz)``, returning ``(h, c)`` for an LSTM, ``h`` else)."""
    functions = _functions(module)
    found: set[str] = set()
    for node in _nodes(module, cst.Assign):
        if len(node.targets) == 1 and dotted(node.targets[0].target) == target:
            found |= _shapes(node.value, functions, 0)
    return found == {"container", "value"}


def _functions(module: cst.Module) -> dict[str, list[cst.FunctionDef]]:
    """The file's functions and methods by name."""
    functions: dict[str, list[cst.FunctionDef]] = {}
    for node in _nodes(module, cst.FunctionDef):
        functions.setdefault(node.name.value, []).append(node)
    return functions


def _nodes(root: cst.CSTNode, kind: type[_NodeT]) -> list[_NodeT]:
    """Every node of ``kind`` under ``root`` (a whole file's: walked once, :func:`_file_nodes`)."""
    if isinstance(root, cst.Module):
        return _file_nodes(root, kind)  # type: ignore[return-value]
    return _walk(root, kind)


@functools.lru_cache(maxsize=4)  # (a node hashes by identity: the file's tree as file_tree keeps it, two kinds)
def _file_nodes(module: cst.Module, kind: type[cst.CSTNode]) -> list[cst.CSTNode]:
    """:func:`_walk` of a whole file, kept: a carried graph's fix is derived again at each step end that refreshes
    the finding, and a LibCST walk of a file of a few hundred lines costs a few hundred milliseconds."""
    return _walk(module, kind)


def _walk(root: cst.CSTNode, kind: type[_NodeT]) -> list[_NodeT]:
    """Every node of ``kind`` under ``root``, walked."""
    found: list[_NodeT] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, kind):
                found.append(node)
            return True

    root.visit(Collect())
    return found


def _shapes(value: cst.BaseExpression, functions: dict[str, list[cst.FunctionDef]], depth: int) -> set[str]:
    """The shapes of ``value``: "container" (a tuple or list), "value" (what a call returns), both (a
    conditional, a function of the file returning either) or none known (a name, None, an unpacked call)."""
    if isinstance(value, (cst.Tuple, cst.List, cst.ListComp)):
        return {"container"}
    if isinstance(value, cst.IfExp):
        return _shapes(value.body, functions, depth) | _shapes(value.orelse, functions, depth)
    if not isinstance(value, cst.Call):
        return set()
    callee = value.func.attr.value if isinstance(value.func, cst.Attribute) else dotted(value.func)
    defined = functions.get(callee or "", [])
    if not defined:
        return {"value"}
    if depth >= 2:
        return set()
    returned = [r.value for f in defined for r in _nodes(f, cst.Return) if r.value is not None]
    return set().union(*(_shapes(v, functions, depth + 1) for v in returned))


def attribute_assignment(module: cst.Module, line: int, attr: str) -> tuple[int, str] | None:
    """The first line of the function holding ``line`` that assigns an attribute ``attr`` of an attribute of
    ``self`` (``self.attn.cache_k = ...``), and that target as it is spelled; None when none does."""
    tree = module_tree(module)
    functions = tree.holding(line, cst.FunctionDef)
    if not functions:
        return None
    for node in _nodes(functions[-1], cst.Assign):
        for target in node.targets:
            spelled = dotted(target.target)
            if spelled is not None and spelled.startswith("self.") and spelled.endswith(f".{attr}"):
                return tree.span(node).start.line, spelled
    return None


def loop_holds_both(module: cst.Module, line: int, until: int) -> bool:
    """Whether a loop holding ``line`` also holds ``until`` (the line leading to the backward): where a
    ``detach-state`` edit with ``until`` goes.  A ``training_step`` calling ``self.manual_backward(loss)``, or a
    ``train_step()`` helper, holds both lines in no loop: it runs once per backward.

    >>> loop_holds_both(cst.parse_module("for x in y:\\n    h = f(h)\\n    h.sum().backward()\\n"), 2, 3)
    True
    """
    tree = module_tree(module)
    loops = [*tree.holding(line, cst.For), *tree.holding(line, cst.While)]
    return any(tree.span(loop).start.line <= until <= tree.span(loop).end.line for loop in loops)


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
    text, added = state_statement(tree.module, edit.target, edit.value_type)
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
    edited = tree.replaced(before, cst.FlattenSentinel([_statement_node(text), before]))  # type: ignore[arg-type]
    return _with_helper(edited, chain[1], tree.module) if added else edited


def _with_helper(source: str, top: cst.CSTNode, module: cst.Module) -> str:
    """``source`` (``module`` edited below the top-level statement ``top``) with :data:`HELPER` added just
    above ``top``, set apart by two blank lines."""
    edited = cst.parse_module(source)
    index = list(module.body).index(top)  # type: ignore[arg-type]
    body = list(edited.body)
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    helper = cst.parse_statement(HELPER).with_changes(leading_lines=body[index].leading_lines or blank)
    body[index:index] = [helper]
    body[index + 1] = body[index + 1].with_changes(leading_lines=blank)
    return edited.with_changes(body=body).code


@codemod("detach-made")
def detach_made(tree: SourceTree, edit: Edit) -> str | None:
    """``target = value`` on ``edit.line`` becomes ``target = value.detach()`` (a tensor's only: an edit that
    names no type is one for a tensor).  On a line of several statements (``global avg; avg = 0.9 * avg + 0.1 *
    loss``) the one that assigns ``target`` is edited, the others left as they are; none where two do."""
    if edit.value_type not in ("", "Tensor"):
        return None
    statements = tree.holding(edit.line, cst.SimpleStatementLine)
    if not statements:
        return None
    assigns = [
        small for small in statements[-1].body
        if isinstance(small, (cst.Assign, cst.AnnAssign)) and _assigned(small) == [edit.target]
    ]  # fmt: skip
    if len(assigns) != 1:
        return None
    assign = assigns[0]
    value = assign.value
    if value is None:
        return None
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "detach":
        return None  # detached already
    return tree.replaced(assign, assign.with_changes(value=called(value, "detach")))


def _assigned(statement: cst.Assign | cst.AnnAssign) -> list[str | None]:
    """The dotted names ``statement`` assigns a value to (``target = ...``, ``target: T = ...``; none for a bare
    annotation)."""
    if isinstance(statement, cst.Assign):
        return [dotted(t.target) for t in statement.targets]
    return [dotted(statement.target)] if statement.value is not None else []
