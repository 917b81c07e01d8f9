"""Which ``torch.no_grad()`` made a loss without a graph, found from the frames of the failing backward.

When torch raises "element 0 of tensors does not require grad and does not have a grad_fn" with grad mode
off, the user's frames on the stack say why: one of them runs inside a ``with torch.no_grad():`` (or
``torch.inference_mode()``) block, or its function is decorated with ``@torch.no_grad()``.  The syntax tree
of the frame's function, at the line it runs, names the block; for a ``with`` block, the statements of the
backward's block from the first one its loss is made from to the backward itself are what must run with
grad enabled.

Example::

    >>> import ast
    >>> from graphwatch.capture.no_grad import is_no_grad
    >>> is_no_grad(ast.parse("torch.no_grad()").body[0].value), is_no_grad(ast.parse("open(f)").body[0].value)
    (True, False)
"""

from __future__ import annotations

import ast
from types import FrameType
from typing import TYPE_CHECKING

import torch

from ..model.causes import NoGraphCause
from .holders import user_frames
from .source import dotted_name, function_node

if TYPE_CHECKING:
    from .recorder import Recorder

_NO_GRAD = {"no_grad", "inference_mode"}


def is_no_grad(expression: ast.expr) -> bool:
    """``torch.no_grad()``, ``no_grad()``, ``torch.inference_mode()`` (also without the call)."""
    target = expression.func if isinstance(expression, ast.Call) else expression
    name = dotted_name(target) or ""
    return name.rsplit(".", 1)[-1] in _NO_GRAD


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stored(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _holding(body: list[ast.stmt], line: int) -> ast.stmt | None:
    return next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)


def statements_to_enable(block: ast.With, line: int) -> tuple[int, int] | None:
    """(first, last line) of the statements of the innermost block inside ``block`` that holds the backward on
    ``line``: from the first one its loss is made from (by names, back from the backward) to the backward."""
    body = block.body
    while True:
        statement = _holding(body, line)
        if statement is None:
            return None
        inner = [b for b in (getattr(statement, "body", None), getattr(statement, "orelse", None)) if b]
        nested = next((b for b in inner if _holding(b, line) is not None), None)
        if nested is None or isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        body = nested
    index = body.index(statement)
    needed, first = _loaded(statement), statement
    for earlier in reversed(body[:index]):
        if _stored(earlier) & needed:
            needed |= _loaded(earlier)
            first = earlier
    return first.lineno, statement.end_lineno or statement.lineno


def find_no_grad(recorder: Recorder, start: FrameType | None, backward_site: int | None) -> NoGraphCause:
    """The no-grad block or decorator around the failing backward (innermost user frame first)."""
    cause = NoGraphCause(backward_site, grad_enabled_outside=torch.is_grad_enabled())
    if torch.is_grad_enabled():
        return cause
    for depth, frame in enumerate(list(user_frames(start))[:8]):
        tree = function_node(frame.f_code)
        if tree is None:
            continue
        line = frame.f_lineno
        blocks = [n for n in ast.walk(tree) if isinstance(n, ast.With) and any(is_no_grad(i.context_expr) for i in n.items)
                  and n.lineno < line <= (n.end_lineno or n.lineno)]  # fmt: skip
        if blocks:
            block = max(blocks, key=lambda n: n.lineno)
            cause.kind, cause.function = "with", frame.f_code.co_name
            cause.block_at = recorder.sites.from_frame(frame, block.lineno)
            span = statements_to_enable(block, line) if depth == 0 else None
            if span is not None:
                cause.first = recorder.sites.from_frame(frame, span[0])
                cause.last = recorder.sites.from_frame(frame, span[1])
            return cause
        decorators = getattr(tree, "decorator_list", [])
        found = next((d for d in decorators if is_no_grad(d)), None)
        if found is not None:
            cause.kind, cause.function = "decorator", frame.f_code.co_name
            cause.block_at = recorder.sites.from_frame(frame, found.lineno)
            return cause
    return cause
