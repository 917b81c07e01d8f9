"""The in-place statements of one function's source, for :mod:`graphwatch.capture.causes.inplace` (read only when torch's
"modified by an inplace operation" error is raised: nothing here runs on a healthy step).

- :func:`alias_roots`: the names a function binds to another name's tensor or to a view of it (``out = h``,
  ``y = h.view(...)``, ``col = h[:, 0]``, ``ht = h.t()``), each mapped to the name it came from: torch's version
  counter is shared by a tensor and its views, so a write through any of them changes the saved tensor;
- :func:`writes`: the in-place statements between two lines of a function, also those of a helper function
  it calls there (``normalize_(h)`` with ``def normalize_(t): t.sub_(...)``), each with the name of the
  caller's tensor it changes and the call that reached it;
- :func:`unsafe_reason`: why the out-of-place form of an in-place statement could change what the program
  computes: a view's base read afterwards, a tensor the function was given (:func:`holds_argument`), another name
  reading it, a tensor that required no grad that the function did not make (:func:`made_here`).

Example::

    >>> import ast
    >>> tree = ast.parse("h = f(x)\\ny = h.view(4, 2)\\nout = y\\ncol = out[:, 0]\\nz = h + 1\\nfor c, m in zip(h, ms): pass")
    >>> sorted(alias_roots(tree, 7).items())
    [('c', 'h'), ('col', 'h'), ('m', 'ms'), ('out', 'h'), ('y', 'h')]
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

from ..lines.callsite import is_user_file
from ..lines.source import (
    dotted_name,
    function_node,
    innermost_function,
    inplace_statement,
    module_node,
    own_statements,
)

# Tensor methods whose result shares the tensor's storage (and version counter)
_VIEW_METHODS = frozenset({
    "view", "view_as", "t", "transpose", "permute", "narrow", "select", "unsqueeze", "squeeze", "expand",
    "expand_as", "diagonal", "as_strided", "unfold", "unflatten", "movedim", "swapaxes", "swapdims", "detach",
    "T", "mT", "H", "mH", "real", "imag", "data",
})  # fmt: skip

Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Write:
    """One in-place statement: its file and line, the caller's name for the tensor it changes, and the file
    and line of the call that ran it (None: a statement of the function itself)."""

    file: str
    line: int
    name: str
    call: tuple[str, int] | None = None


def _viewed(value: ast.expr) -> str | None:
    """The name whose tensor ``value`` is, or a view of: ``h``, ``h[:, 0]``, ``h.view(...)``, ``h.T``."""
    while True:
        if isinstance(value, ast.Subscript):
            value = value.value
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _VIEW_METHODS:
            value = value.func.value
        elif isinstance(value, ast.Attribute) and value.attr in _VIEW_METHODS:
            value = value.value
        else:
            return dotted_name(value)


def alias_roots(scope: ast.AST, until: int) -> dict[str, str]:
    """name -> the name it is a view of or another name for (followed to the first), from the assignments of
    ``scope``'s own statements before line ``until`` and its ``for`` loops over a tensor (``for t in x``,
    ``for t, m in zip(x, mean)``: each ``t`` is a view of ``x``), in source order."""
    bindings: list[tuple[int, str, str | None]] = []  # (line, name, the name it views; None: a new tensor)
    for statement in (s for s in own_statements(scope) if isinstance(s, ast.Assign) and s.lineno < until):
        base = _viewed(statement.value)
        bindings += [(statement.lineno, name, base) for name in map(dotted_name, statement.targets) if name]
    for loop in (n for n in ast.walk(scope) if isinstance(n, ast.For) and n.lineno < until):
        zipped = isinstance(loop.iter, ast.Call) and dotted_name(loop.iter.func) == "zip"
        iterated = loop.iter.args if zipped else [loop.iter]  # type: ignore[attr-defined]
        targets = loop.target.elts if zipped and isinstance(loop.target, ast.Tuple) else [loop.target]
        bindings += [(loop.lineno, t.id, _viewed(i)) for t, i in zip(targets, iterated) if isinstance(t, ast.Name)]
    roots: dict[str, str] = {}
    for _, name, base in sorted(bindings, key=lambda b: b[0]):
        if base is not None and base != name:
            roots[name] = roots.get(base, base)
        else:
            roots.pop(name, None)  # rebound to a new tensor
    return roots


_NEW_TENSOR_FUNCTIONS = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace", "cat", "stack",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
})  # torch's functions whose result is always a new tensor  # fmt: skip
_KEEPING_METHODS = frozenset({"append", "extend", "insert", "add", "setdefault", "put"})  # a container keeps it


def makes_new_tensor(value: ast.expr) -> bool:
    """Whether an expression always makes a new tensor (never returns one it was given, as ``.to()`` and
    ``.float()`` may): arithmetic, ``.clone()``, torch's functions that make one.

    >>> [makes_new_tensor(ast.parse(e).body[0].value) for e in ("x + 0", "-x", "x.clone()", "torch.cat(xs)",
    ...                                                          "x.float()", "x", "x[0]")]
    [True, True, True, True, False, False, False]
    """
    if isinstance(value, ast.BinOp) or (isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.Invert))):
        return True
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return False
    return value.func.attr == "clone" or (
        value.func.attr in _NEW_TENSOR_FUNCTIONS and dotted_name(value.func.value) == "torch"
    )  # fmt: skip


def made_here(function: ast.FunctionDef | ast.AsyncFunctionDef, line: int, name: str) -> int | None:
    """The line of the statement that bound the local ``name`` to a new tensor (``x = x + 0``,
    ``x = h.clone()``) before the statement at ``line``, in its block or one around it (not across a loop), with
    no other binding of ``name`` between them and no other holder given it there (``self.cache = x``,
    ``xs.append(x)``): the tensor ``name`` holds at ``line`` is the function's own, which nothing outside it can
    read.  None when graphwatch cannot tell (a parameter, a global, a binding in a branch).

    >>> tree = ast.parse("def f(self, x):\\n    x = x + 0\\n    x += self.fc(x)\\n    y = x\\n    y += 1")
    >>> made_here(tree.body[0], 3, "x"), made_here(tree.body[0], 5, "y")
    (2, None)
    """
    if "." in name or any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(function)):
        return None
    found = _last_binding(function, line, name)
    fresh = isinstance(found, ast.Assign) and len(found.targets) == 1 and isinstance(found.targets[0], ast.Name) \
        and makes_new_tensor(found.value)  # fmt: skip
    if found is None or not fresh:
        return None
    between = [s for body, index in _blocks_to(function, line) for s in body[:index] if s.lineno > found.lineno]
    return None if any(_hands_on(s, name) for s in between) else found.lineno


def holds_argument(function: ast.FunctionDef | ast.AsyncFunctionDef, line: int, name: str) -> bool:
    """Whether ``name`` may still hold, at ``line``, the tensor the function was given for one of its parameters
    (or another name for it): no plain assignment rebinds it before the line in its block or one around it.

    >>> tree = ast.parse("def f(self, x, y):\\n    x += 1\\n    z = y\\n    z += 1\\n    y = y * 2\\n    y += 1")
    >>> [holds_argument(tree.body[0], line, name) for line, name in ((2, "x"), (4, "z"), (6, "y"))]
    [True, True, False]
    """
    arguments = function.args
    found = _last_binding(function, line, name)
    if not isinstance(found, ast.Assign):  # not rebound, or where graphwatch cannot tell (a branch, a loop)
        return name in {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    if len(found.targets) != 1 or not isinstance(found.targets[0], ast.Name):
        return isinstance(found.value, (ast.Tuple, ast.List))  # (``x, y = y, x``: maybe another's argument)
    base = _viewed(found.value)  # (``x = y``, ``x = y[0]``: another name's tensor)
    return base is not None and holds_argument(function, found.lineno, base)


def _last_binding(function: ast.AST, line: int, name: str) -> ast.stmt | None:
    """The statement that last binds ``name`` before ``line`` in its block or one around it (a compound one: the
    binding is somewhere in it), not across a loop (else None); ``x += 1`` binds nothing (the same tensor)."""
    for body, index in reversed(_blocks_to(function, line)):
        for statement in reversed(body[:index]):
            if not isinstance(statement, ast.AugAssign) and any(
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
                for n in ast.walk(statement)
            ):  # fmt: skip
                return statement
        if _in_loop(function, body):
            return None
    return None


def _blocks_to(function: ast.AST, line: int) -> list[tuple[list[ast.stmt], int]]:
    """(block, index) of the statement holding ``line`` in each block from the function's body inwards."""
    path: list[tuple[list[ast.stmt], int]] = []
    body: list[ast.stmt] = getattr(function, "body", [])
    while True:
        index = next((i for i, s in enumerate(body) if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if index is None:
            return path
        path.append((body, index))
        holder = body[index]
        blocks: list[list[ast.stmt]] = [getattr(holder, b, None) or [] for b in ("body", "orelse", "finalbody")]
        inner = next((b for b in blocks if b and b[0].lineno <= line <= (b[-1].end_lineno or b[-1].lineno)), None)
        if inner is None:
            return path
        body = inner


def _in_loop(function: ast.AST, body: list[ast.stmt]) -> bool:
    """Whether ``body`` is the body (or else-block) of a loop of ``function``."""
    return any(isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and (n.body is body or n.orelse is body)
               for n in ast.walk(function))  # fmt: skip


def _hands_on(statement: ast.stmt, name: str) -> bool:
    """Whether ``statement`` gives another holder the tensor of ``name`` itself or a view of it:
    ``out = x``, ``self.cache = x[0]``, ``xs.append(x)``."""
    for node in ast.walk(statement):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _viewed(node.value) == name:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _KEEPING_METHODS \
                and any(_viewed(a) == name for a in node.args):  # fmt: skip
            return True
    return False


def is_view_binding(scope: ast.AST, line: int, name: str) -> bool:
    """Whether the last assignment of ``scope``'s own statements to ``name`` before ``line`` binds it to a view
    of another name's tensor (``ht = h.t()``, ``col = h[:, 0]``), not to that tensor itself (``out = h``).

    >>> tree = ast.parse("ht = h.t()\\nout = h\\nht.mul_(2)\\nout.mul_(2)")
    >>> is_view_binding(tree, 3, "ht"), is_view_binding(tree, 4, "out")
    (True, False)
    """
    bound = [s for s in own_statements(scope) if isinstance(s, ast.Assign) and s.lineno < line
             and name in map(dotted_name, s.targets)]  # fmt: skip
    last = max(bound, key=lambda s: s.lineno, default=None)
    return last is not None and _viewed(last.value) not in (None, name) and dotted_name(last.value) is None


def made_in_function(file: str, line: int, name: str | None) -> bool:
    """Whether the tensor ``name`` holds at ``line`` of ``file`` was made by that line's function, and given to no
    other holder there (:func:`made_here`)."""
    tree = module_node(file) if name else None
    function = innermost_function(tree, line) if tree is not None else None
    return function is not None and name is not None and made_here(function, line, name) is not None


def unsafe_reason(file: str, line: int, name: str | None, is_view: bool, leaf: bool, in_helper: bool) -> str:
    """Why making the in-place change of ``name`` at ``line`` of ``file`` out of place could change what the
    program computes (:attr:`~graphwatch.model.causes.InplaceCause.unsafe`), or "": "view" (the changed tensor,
    ``is_view`` or bound to a view, is read afterwards through its base), "helper" (the change is a helper's,
    ``in_helper``, or the name holds a tensor the function was given: the caller's changes too), "alias" (a later
    line reads the tensor through another name), "outside" (a tensor that required no grad when saved, ``leaf``:
    an input, data, a buffer, which others may hold, unless the function made it)."""
    another = read_through_another_name(file, line, name)
    found = (("view", is_view or (another and bound_to_a_view(file, line, name))),
             ("helper", in_helper or holds_argument_at(file, line, name)), ("alias", another),
             ("outside", leaf and not made_in_function(file, line, name)))  # fmt: skip
    return next((why for why, unsafe in found if unsafe), "")


def read_through_another_name(file: str, line: int, name: str | None) -> bool:
    """Whether a line after ``line`` of ``file`` in its function reads the tensor that ``name`` changes there
    through another name (the tensor ``name`` views, or another view of it: ``y = h.view(...)``): made out of
    place, the change would not reach that name."""
    tree = module_node(file) if name else None
    scope = (innermost_function(tree, line) or tree) if tree is not None else None
    if scope is None or not name:
        return False
    roots = alias_roots(scope, line)
    root = roots.get(name, name)
    others = ({n for n, r in roots.items() if r == root} | {root}) - {name}
    return any(s.lineno > line and isinstance(n, (ast.Name, ast.Attribute)) and dotted_name(n) in others
               for s in own_statements(scope) for n in ast.walk(s))  # fmt: skip


def holds_argument_at(file: str, line: int, name: str | None) -> bool:
    """Whether ``name`` at ``line`` of ``file`` may hold a tensor its function was given (:func:`holds_argument`):
    changed in place, the caller's tensor changes too."""
    tree = module_node(file) if name else None
    function = innermost_function(tree, line) if tree is not None else None
    return function is not None and name is not None and holds_argument(function, line, name)


def bound_to_a_view(file: str, line: int, name: str | None) -> bool:
    """Whether ``name`` at ``line`` of ``file`` was bound, in its function, to a view of another name's tensor
    (:func:`is_view_binding`)."""
    tree = module_node(file) if name else None
    scope = (innermost_function(tree, line) or tree) if tree is not None else None
    return scope is not None and name is not None and is_view_binding(scope, line, name)


def statement_start(scope: ast.AST, line: int) -> int:
    """The first line of the simple statement of ``scope`` that holds ``line`` (a call spread over lines)."""
    return next((s.lineno for s in own_statements(scope) if s.lineno <= line <= (s.end_lineno or s.lineno)), line)


def writes(scope: Scope, file: str, first: int, last: int, callee: Callable[[ast.Call], CodeType | None]) -> list[Write]:
    """The in-place statements of ``scope`` after line ``first`` up to ``last``, and those of the user functions
    it calls there (``callee``: the code a call runs, or None) that change a tensor it passes them."""
    found: list[Write] = []
    for statement in own_statements(scope):
        if not first < statement.lineno <= last:
            continue
        helpers = [(call, code) for call in ast.walk(statement) if isinstance(call, ast.Call)
                   and (code := callee(call)) is not None]  # fmt: skip
        for call, code in helpers:  # (a user function named like an in-place method, ``ops.scale_(h)``, is one)
            function = function_node(code)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.extend(_helper_writes(function, code.co_filename, call, (file, statement.lineno)))
        name = inplace_statement(statement) if not helpers else None
        if name is not None:
            found.append(Write(file, statement.lineno, name))
    return sorted(found, key=lambda w: (w.call[1] if w.call else w.line, w.line))


def _helper_writes(function: ast.FunctionDef | ast.AsyncFunctionDef, file: str, call: ast.Call,
                   at: tuple[str, int]) -> Iterator[Write]:
    """The in-place statements of a called function that change one of its parameters (or a view of one),
    named as the call passes it."""
    passed = _passed(function, call)
    roots = alias_roots(function, function.end_lineno or function.lineno)
    for statement in own_statements(function):
        name = inplace_statement(statement)
        caller_name = passed.get(roots.get(name, name)) if name is not None else None
        if caller_name is not None:
            yield Write(file, statement.lineno, caller_name, at)


def _passed(function: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call) -> dict[str, str]:
    """parameter -> the caller's name passed for it (a method called through its instance skips ``self``)."""
    params = [a.arg for a in function.args.posonlyargs + function.args.args]
    if params[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute):
        params = params[1:]
    passed = {p: dotted_name(a) for p, a in zip(params, call.args) if not isinstance(a, ast.Starred)}
    passed.update({k.arg: dotted_name(k.value) for k in call.keywords if k.arg is not None})
    return {p: n for p, n in passed.items() if n is not None}


def code_of(value: Any) -> CodeType | None:
    """The code a called value runs, if it is the user's: a function's, or a bound method's (not a module's or a
    class's)."""
    code = getattr(getattr(value, "__func__", value), "__code__", None)
    return code if isinstance(code, CodeType) and is_user_file(code.co_filename) else None
