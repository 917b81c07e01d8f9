"""Where parameters an optimizer steps were cut off from the loss: the line of a ``.detach()``, a ``.data`` or a
``with torch.no_grad():`` block between them and the loss whose backward runs before the step, for the
``untrained-parameters`` finding (:mod:`graphwatch.analysis.untrained`).

Looked for once per optimizer, at the first of its steps at which parameters that require a gradient and never
held one hold none (:class:`~graphwatch.capture.causes.parameters.ParameterLedger`), while the frame that calls
``.step()`` still holds the values.  In that frame's function, the walk starts at the last statement before the
step that calls ``.backward()`` on a name (``loss.backward()``, ``scaler.scale(loss).backward()``), when the tensor
that name holds has a graph that reaches none of those parameters (else that backward reached them, and no cut
is the cause) and goes back through the statement that
last bound each name it reads (the loop that binds a loop variable: ``for f1, f2 in zip(feats, targets)``), up
to :data:`_LOOKED_AT` statements.  It stops at the first binding that cuts what reaches the parameters:

- ``.detach()`` (``.detach_()``) or ``.data`` of an expression that reaches all of them: it calls modules that
  own them (``G(z).detach()``), or reads them (``vgg(target.detach())``), or reads names whose tensors' graphs
  reach them, or a name bound (earlier) from such an expression (``fake = G(z)`` ... ``fake.detach()``);
- a statement inside a ``with torch.no_grad():`` block whose value is such an expression.

Nothing is said when no such line is found: the parameters' module may be one the forward never calls, or the
cut lies in a function the walk does not enter.

Example::

    >>> import ast
    >>> tree = ast.parse("fake = G(z).detach()\\nout = D(fake)\\nloss = crit(out, y)\\nloss.backward()\\nopt.step()")
    >>> cut = cut_between(tree, 5, lambda expression: "G(" in ast.unparse(expression), lambda backward: True)
    >>> cut.line, cut.op, cut.what
    (1, '`.detach()`', 'G(z)')
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from ..lines.frames import resolve
from ..lines.source import dotted_name, function_node
from .graph_cuts import code_statements, loaded_names, no_grad_block, stored_names

_LOOKED_AT = 200  # bindings the walk back from the backward looks at
_GRAPH_NODES = 100_000  # nodes of a tensor's graph walked to tell whether it reaches a parameter
_CUTTING = frozenset({"detach", "detach_"})

Reaches = Callable[[ast.expr], bool]  # whether an expression's value reaches the parameters (its own words)


@dataclass(frozen=True, slots=True)
class ParameterCut:
    """The line that cut the parameters off: the op (```.detach()```, ```.data```, ```torch.no_grad()```), the
    expression cut (``G(z)``), and for ``torch.no_grad()`` the line of the ``with``."""

    line: int
    op: str
    what: str
    block: int | None = None


def find_parameter_cut(frame: FrameType, parameters: list[torch.Tensor]) -> ParameterCut | None:
    """The cut between ``parameters`` and the loss backwarded before the ``.step()`` that ``frame`` runs now."""
    tree = function_node(frame.f_code)
    if tree is None or not parameters:
        return None
    reach = _Reach(frame, parameters)
    return cut_between(tree, frame.f_lineno, reach.expression, reach.misses)


def cut_between(tree: ast.AST, step_line: int, reaches: Reaches, misses: Callable[[ast.stmt], bool]) -> ParameterCut | None:
    """The cut (see the module's text) on the way back from the last statement of ``tree`` before ``step_line``
    that calls ``.backward()``; ``reaches``: whether an expression's value reaches the parameters; ``misses``:
    whether the loss a backward's statement reads is known to reach none of them."""
    statements = [s for s in code_statements(tree) if not hasattr(s, "body") or isinstance(s, (ast.For, ast.AsyncFor))]
    backward = max((s for s in statements if (s.end_lineno or s.lineno) < step_line and _calls_backward(s)),
                   key=lambda s: s.lineno, default=None)  # fmt: skip
    if backward is None or not misses(backward):
        return None
    walk = _Walk(tree, statements, reaches)
    return walk.back_from([_loss_name(backward) or ""], backward.lineno)


class _Walk:
    def __init__(self, tree: ast.AST, statements: list[ast.stmt], reaches: Reaches) -> None:
        self.tree, self.statements, self.reaches = tree, statements, reaches
        self.seen: set[int] = set()

    def back_from(self, names: list[str], line: int) -> ParameterCut | None:
        queue = [(name, line) for name in names]
        while queue and len(self.seen) < _LOOKED_AT:
            name, before = queue.pop(0)
            binding = self._binding(name, before)
            if binding is None or id(binding) in self.seen:
                continue
            self.seen.add(id(binding))
            value = _bound_value(binding)
            if value is None:
                continue
            cut = self._cut(binding, value)
            if cut is not None:
                return cut
            read = loaded_names(value) + ([name] if isinstance(binding, ast.AugAssign) else [])
            queue += [(n, binding.lineno) for n in read]
        return None

    def _binding(self, name: str, before: int) -> ast.stmt | None:
        """The statement that last bound ``name`` before line ``before``, in source order."""
        bound = [s for s in self.statements if s.lineno < before and name in stored_names(s)]
        return max(bound, key=lambda s: s.lineno, default=None)

    def _cut(self, binding: ast.stmt, value: ast.expr) -> ParameterCut | None:
        block = no_grad_block(self.tree, binding.lineno)
        if block is not None and self._reaches(value, binding.lineno):
            return ParameterCut(binding.lineno, "`torch.no_grad()`", ast.unparse(value), block.lineno)
        for node in ast.walk(value):
            operand = _cut_operand(node)
            if operand is not None and self._reaches(operand[1], binding.lineno):
                return ParameterCut(binding.lineno, operand[0], ast.unparse(operand[1]))
        return None

    def _reaches(self, expression: ast.expr, line: int, depth: int = 3) -> bool:
        """Whether ``expression`` (on ``line``) reaches the parameters: as it reads now, or through a name it
        reads that was bound earlier from such an expression."""
        if self.reaches(expression):
            return True
        for name in loaded_names(expression) if depth else ():
            binding = self._binding(name, line)
            value = _bound_value(binding) if binding is not None else None
            if binding is not None and value is not None and self._reaches(value, binding.lineno, depth - 1):
                return True
        return False


def _loss_name(statement: ast.stmt) -> str | None:
    """The name a statement backwards: ``loss`` of ``loss.backward()``, ``scaler.scale(loss).backward()``,
    ``torch.autograd.backward(loss)``; else None."""
    call = next((n for n in ast.walk(statement) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "backward"), None)  # fmt: skip
    if call is None or not isinstance(call.func, ast.Attribute):
        return None
    loss = call.args[0] if dotted_name(call.func.value) in ("torch.autograd", "autograd") and call.args else call.func.value
    if isinstance(loss, ast.Call) and isinstance(loss.func, ast.Attribute) and loss.func.attr == "scale" and loss.args:
        loss = loss.args[0]
    return dotted_name(loss)


def _calls_backward(statement: ast.stmt) -> bool:
    return not hasattr(statement, "body") and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
        for n in ast.walk(statement)
    )  # fmt: skip


def _bound_value(statement: ast.stmt) -> ast.expr | None:
    """What a binding binds: the value of an assignment, the iterable of a loop."""
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        return statement.iter
    return getattr(statement, "value", None)


def _cut_operand(node: ast.AST) -> tuple[str, ast.expr] | None:
    """(op, the expression it cuts) for ``x.detach()`` and ``x.data``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CUTTING:
        return f"`.{node.func.attr}()`", node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.ctx, ast.Load):
        return "`.data`", node.value
    return None


class _Reach:
    """Whether an expression, read in ``frame``, reaches all of ``parameters`` (a cut said to cut them off must
    cut off every one): together, the modules it calls own them, or they are tensors it reads, or the graphs of
    the tensors it reads reach them."""

    def __init__(self, frame: FrameType, parameters: list[torch.Tensor]) -> None:
        self.frame = frame
        self.ids = {id(p) for p in parameters}

    def expression(self, expression: ast.expr) -> bool:
        covered: set[int] = set()
        for node in ast.walk(expression):
            if isinstance(node, ast.Call):  # a module called (its own name: never the model it is an attribute of)
                callee = dotted_name(node.func)
                module = resolve(self.frame, callee) if callee else None
                if isinstance(module, torch.nn.Module):
                    covered |= {id(p) for p in module.parameters()} & self.ids
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                name = dotted_name(node)
                value = resolve(self.frame, name) if name else None
                if isinstance(value, torch.Tensor):
                    covered |= self._reached(value) or set()
        return covered == self.ids

    def misses(self, statement: ast.stmt) -> bool:
        """Whether the loss ``statement`` backwards is a name holding a tensor with a graph that, walked to its
        end, reaches none of the parameters."""
        name = _loss_name(statement)
        loss = resolve(self.frame, name) if name is not None else None
        return isinstance(loss, torch.Tensor) and loss.grad_fn is not None and self._reached(loss) == set()

    def _reached(self, tensor: torch.Tensor) -> set[int] | None:
        """``id()`` of the parameters ``tensor`` is or its graph reaches; None: too large a graph to tell."""
        if id(tensor) in self.ids:
            return {id(tensor)}
        found: set[int] = set()
        stack: list[Any] = [tensor.grad_fn]
        seen: set[Any] = set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            if len(seen) >= _GRAPH_NODES:
                return None
            seen.add(node)
            if id(getattr(node, "variable", None)) in self.ids:
                found.add(id(node.variable))
            stack.extend(child for child, _ in node.next_functions)
        return found
