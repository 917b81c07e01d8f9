"""Where a loss's graph was cut when the cut has left the stack, found once torch has raised "element 0 of
tensors does not require grad and does not have a grad_fn" with grad mode on.

Nothing here runs on a step where nothing goes wrong.  At the error, the user's frames still hold the values
the loss was made from; the walk goes back from the backward's statement through the statements that assigned
the names it needs (last assignment before the line that needs it), following only names whose value now
requires no grad, and stops at the first statement that explains the cut:

- it runs inside a ``with torch.no_grad():`` block of the same function (the block has been left) and reads a
  tensor that requires grad or a module that trains;
- it holds an op that makes no graph from an input that required grad: ``.argmax()``, a comparison, an
  integer cast, ``.detach()``, ``.data``, ``.item()``, ``.numpy()``, ``torch.tensor(...)``, ``torch.from_numpy``;
- it calls a user function decorated with ``@torch.no_grad()`` (the function has returned);
- it calls a module none of whose parameters requires grad: the optimizer owning those parameters, and the
  ``requires_grad_(False)`` call (or ``requires_grad = False`` loop) of the module's file, are named.

A name the function received as an argument is followed into the caller's statement.

Example::

    >>> import ast
    >>> from graphwatch.capture.causes.graph_cuts import cut_ops
    >>> cut_ops(ast.parse("pred = (logits.argmax(1) > 0).long()").body[0], lambda name: None)
    ['`.argmax()`', '`>`', '`.long()`']
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from ...errors import notify
from ...model.causes import NoGraphCause
from ..lines.callsite import is_user_file
from ..lines.frames import named_values, resolve
from ..lines.source import dotted_name, function_node, is_no_grad, module_node
from .holders import parameter_names

if TYPE_CHECKING:
    from ..recorder import Recorder

_FRAMES = 4  # user frames followed outwards, innermost first
_METHODS = {"argmax", "argmin", "detach", "item", "numpy", "tolist", "long", "int", "short", "bool", "byte", "char",
            "eq", "ne", "gt", "lt", "ge", "le"}  # fmt: skip
_FUNCTIONS = {"tensor", "from_numpy", "as_tensor", "argmax", "argmin", "array", "asarray", "eq", "ne", "gt", "lt",
              "ge", "le", "Tensor", "FloatTensor", "LongTensor"}  # fmt: skip
_INTEGER_DTYPES = {"long", "int", "int64", "int32", "int16", "int8", "uint8", "short", "bool"}
_COMPARE = {ast.Gt: ">", ast.Lt: "<", ast.GtE: ">=", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!="}

Value = Callable[[str], Any]  # a dotted name -> its value in the frame now (None: unknown)


def _without_graph(value: Any) -> bool:
    """A value a loss cannot get a graph from: a tensor that requires no grad, a number, a NumPy array."""
    if isinstance(value, torch.Tensor):
        return not value.requires_grad
    return isinstance(value, (int, float)) or type(value).__module__ == "numpy"


def _had_graph(node: ast.expr, value: Value) -> bool:
    """Whether an op's input may have had a graph: not a literal, nor a name whose value now has none (a tensor
    that requires no grad, a number, a list of labels)."""
    if isinstance(node, ast.Constant):
        return False
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_had_graph(e, value) for e in node.elts)
    name = dotted_name(node)
    held = value(name) if name is not None else None
    return held is None or (isinstance(held, torch.Tensor) and held.requires_grad)


def _integer_cast(call: ast.Call) -> bool:
    """``x.to(torch.long)``, ``x.type(torch.int64)``, ``x.to(dtype=torch.bool)``."""
    spelled = [dotted_name(a) or "" for a in (*call.args, *(k.value for k in call.keywords))]
    return any(s.rsplit(".", 1)[-1] in _INTEGER_DTYPES for s in spelled)


def cut_ops(statement: ast.AST, value: Value) -> list[str]:
    """The ops of ``statement`` that make a result without a graph from an input that may have had one, in the
    order they run (an input named by a name whose value has no graph now is no cut: ``y.long()`` of a label)."""
    found: list[tuple[tuple[int, int], str]] = []
    for node in ast.walk(statement):
        end = (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)  # (inner ones first)
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _COMPARE:
            if _had_graph(node.left, value) or any(_had_graph(c, value) for c in node.comparators):
                found.append((end, f"`{_COMPARE[type(node.ops[0])]}`"))
        elif isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.ctx, ast.Load):
            if _had_graph(node.value, value):
                found.append((end, "`.data`"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, receiver = node.func.attr, node.func.value
            spelled = dotted_name(receiver) or ""
            if spelled.split(".")[0] in ("torch", "np", "numpy") and name in _FUNCTIONS:
                if any(_had_graph(a, value) for a in node.args[:1]):
                    found.append((end, f"`{spelled}.{name}()`"))
            elif (name in _METHODS or (name in ("to", "type") and _integer_cast(node))) and _had_graph(receiver, value):
                found.append((end, f"`.{name}()`"))
    return list(dict.fromkeys(op for _, op in sorted(found)))


def code_statements(tree: ast.AST) -> Iterator[ast.stmt]:
    """The statements of one code object (not those of functions or classes defined in it)."""
    stack = list(getattr(tree, "body", []))
    while stack:
        statement = stack.pop()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield statement
        for block in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(statement, block, None) or [])


def stored_names(statement: ast.stmt) -> set[str]:
    """The dotted names a statement assigns (``a``, ``self.h``; each part of a tuple)."""
    targets = getattr(statement, "targets", None) or [getattr(statement, "target", None)]
    parts = [n for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.expr)]
    return {name for name in map(dotted_name, parts) if name}


def loaded_names(node: ast.AST) -> list[str]:
    """The dotted names ``node`` reads, longest first at each place (``self.model`` before ``self``)."""
    names = [dotted_name(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))
             and isinstance(n.ctx, ast.Load)]  # fmt: skip
    return list(dict.fromkeys(n for n in names if n))


def _simple(statement: ast.stmt) -> bool:
    return not hasattr(statement, "body")


class CutFinder:
    """The walk back from a failing backward to where its loss's graph was cut (see the module's text)."""

    def __init__(self, recorder: Recorder, frames: list[FrameType], cause: NoGraphCause) -> None:
        self.recorder, self.frames, self.cause = recorder, frames[:_FRAMES], cause

    def find(self) -> None:
        """Fill the cause's ``cut_at`` (and what made the cut) when one is found."""
        for frame in self.frames:  # (an outer frame is looked at when the loss came in as an argument)
            tree = function_node(frame.f_code)
            if tree is None:
                return
            statements = [s for s in code_statements(tree) if _simple(s)]
            here = next((s for s in statements if s.lineno <= frame.f_lineno <= (s.end_lineno or s.lineno)), None)
            needed = set(loaded_names(here)) if here is not None else set()  # the backward's statement, or the call
            if not self._walk(frame, tree, statements, frame.f_lineno, needed) or self.cause.kind:
                return

    def _walk(self, frame: FrameType, tree: ast.AST, statements: list[ast.stmt], line: int, needed: set[str]) -> set[str]:
        """Back from ``line``: the names still needed that the function received (for its caller)."""
        value: Value = partial(resolve, frame)
        needed = {n for n in needed if _without_graph(value(n)) or value(n) is None}
        earlier = sorted((s for s in statements if s.lineno < line), key=lambda s: s.lineno, reverse=True)
        for statement in earlier:
            stored = stored_names(statement) & needed
            if not stored:
                continue
            if self._explains(frame, tree, statement, value):
                return set()
            needed = (needed - stored) | {n for n in loaded_names(statement) if _without_graph(value(n))}
        return needed & set(frame.f_code.co_varnames[: frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount])

    def _explains(self, frame: FrameType, tree: ast.AST, statement: ast.stmt, value: Value) -> bool:
        """Whether ``statement`` cut the graph (and the cause says how)."""
        cause, sites = self.cause, self.recorder.sites
        block = no_grad_block(tree, statement.lineno)
        if block is not None and any(_trains(value(name)) for name in loaded_names(statement)):
            cause.kind, cause.function = "with", frame.f_code.co_name
            cause.block_at, cause.cut_at = sites.from_frame(frame, block.lineno), sites.from_frame(frame, statement.lineno)
            return True
        stored = {name.split(".")[0] for name in stored_names(statement)}  # (their values now are the statement's)
        ops = cut_ops(statement, lambda name: None if name.split(".")[0] in stored else value(name))
        if ops:
            cause.kind, cause.op, cause.cut_at = "op", ", ".join(ops), sites.from_frame(frame, statement.lineno)
            return True
        for name in loaded_names(statement):
            called = value(name)
            if self._decorated(called, name):
                cause.call_at = sites.from_frame(frame, statement.lineno)
                return True
            if isinstance(called, torch.nn.Module) and _frozen(called) and f"{name}(" in ast.unparse(statement):
                cause.call_at = sites.from_frame(frame, statement.lineno)
                self._frozen_cause(frame, name)
                return True
        return False

    def _decorated(self, called: Any, name: str) -> bool:
        """Whether ``called`` is a user function decorated with ``@torch.no_grad()`` (the cause then names it)."""
        function = getattr(called, "__func__", called)
        code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
        if code is None or not is_user_file(code.co_filename):
            return False
        tree = function_node(code)
        if not isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        decorator = next((d for d in tree.decorator_list if is_no_grad(d)), None)
        if decorator is None:
            return False
        cause, sites = self.cause, self.recorder.sites
        cause.kind, cause.function = "decorator", name
        cause.block_at, cause.cut_at = sites.from_code(code, decorator.lineno), sites.from_code(code, tree.lineno)
        return True

    def _frozen_cause(self, frame: FrameType, module_name: str) -> None:
        """The optimizer that owns the frozen parameters, and the line that froze them."""
        cause = self.cause
        cause.kind, cause.function = "frozen", module_name
        names = {id(p): n for n, p in parameter_names(frame).items()}
        for name, held in (pair for f in self.frames for pair in named_values(f)):
            if isinstance(held, torch.optim.Optimizer) and not name.startswith("_"):
                owned = [p for group in held.param_groups for p in group["params"]]
                frozen = [names.get(id(p), f"parameter {i}") for i, p in enumerate(owned) if not p.requires_grad]
                if frozen:
                    cause.optimizer, cause.frozen, cause.owned = name, frozen, len(owned)
                    break
        root = module_name.split(".")[0]
        for filename in dict.fromkeys(f.f_code.co_filename for f in self.frames):
            found = freezing_lines(module_node(filename), root)
            if found:
                line, loop = found[0]
                cause.cut_at = self.recorder.sites.from_file(filename, line)
                cause.loop_at = self.recorder.sites.from_file(filename, loop) if loop is not None else None
                return


def no_grad_block(tree: ast.AST, line: int) -> ast.With | None:
    """The innermost ``with torch.no_grad():`` block of ``tree`` (not of a function in it) whose body holds
    ``line`` (also a body on the ``with``'s own line: ``with torch.no_grad(): loss = f(x)``)."""
    blocks = [s for s in code_statements(tree) if isinstance(s, ast.With) and any(is_no_grad(i.context_expr) for i in s.items)
              and s.body[0].lineno <= line <= (s.end_lineno or s.lineno)]  # fmt: skip
    return max(blocks, key=lambda s: s.lineno, default=None)


def _trains(value: Any) -> bool:
    """A tensor that requires grad, or a module with a parameter that does."""
    if isinstance(value, torch.nn.Module):
        return any(p.requires_grad for p in value.parameters())
    return isinstance(value, torch.Tensor) and value.requires_grad


def _frozen(module: torch.nn.Module) -> bool:
    params = list(module.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


def freezing_lines(tree: ast.AST | None, root: str) -> list[tuple[int, int | None]]:
    """(line, the loop's line or None) of each statement of ``tree`` that stops parameters requiring grad:
    ``x.requires_grad_(False)`` or ``p.requires_grad = False``; those that name ``root`` first.

    >>> code = "for p in net.parameters():\\n    p.requires_grad = False\\nhead.requires_grad_(False)\\n"
    >>> freezing_lines(ast.parse(code), "head"), freezing_lines(ast.parse(code), "net")
    ([(3, None), (2, 1)], [(2, 1), (3, None)])
    """
    nodes = list(ast.walk(tree)) if tree is not None else []
    loops = [n for n in nodes if isinstance(n, ast.For)]
    found: list[tuple[bool, int, int | None]] = []
    for statement in nodes:
        if not isinstance(statement, (ast.Expr, ast.Assign)) or not _freezes(statement):
            continue
        around = [n for n in loops if n.lineno < statement.lineno <= (n.end_lineno or n.lineno)]
        loop = max(around, key=lambda n: n.lineno, default=None)
        names = loaded_names(loop.iter if loop is not None else statement)
        found.append((not any(n.split(".")[0] == root for n in names), statement.lineno, loop.lineno if loop else None))
    return [(line, loop_line) for _, line, loop_line in sorted(found)]


def _freezes(statement: ast.Expr | ast.Assign) -> bool:
    if isinstance(statement, ast.Assign):
        return (isinstance(statement.value, ast.Constant) and statement.value.value is False
                and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in statement.targets))
    call = statement.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "requires_grad_"):
        return False
    flag = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "requires_grad"), None)
    return isinstance(flag, ast.Constant) and flag.value is False


def find_cut(recorder: Recorder, frames: list[FrameType], cause: NoGraphCause) -> None:
    """Fill ``cause`` with where the loss's graph was cut, off the stack (nothing when it cannot be told)."""
    try:
        CutFinder(recorder, frames, cause).find()
    except Exception as error:  # looking closer must never hide the user's error
        cause.kind, cause.cut_at, cause.block_at = "", None, None  # (the plain sentence, not half a cause)
        notify(f"graphwatch: could not look into the cause ({error!r})", stacklevel=2)
