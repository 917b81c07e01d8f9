"""Which ``torch.no_grad()`` made a loss without a graph, found from the frames of the failing backward.

When torch raises "element 0 of tensors does not require grad and does not have a grad_fn" with grad mode
off, the user's frames on the stack say why: one of them runs inside a ``with torch.no_grad():`` (or
``torch.inference_mode()``) block, or its function is decorated with ``@torch.no_grad()``.  The syntax tree
of the frame's function, at the line it runs, names the block.  What must run with grad enabled are the
statements of the backward's own block (inside the ``with`` block when the backward is in it, else in the
function a caller runs inside the block) from the first one its loss is made from to the backward itself.

Example::

    >>> import ast
    >>> from graphwatch.capture.causes.no_grad import statements_to_enable
    >>> statements_to_enable(ast.parse("x = f()\\ny = 2\\nloss = g(x)\\nloss.backward()").body, 4)
    (1, 4)
"""

from __future__ import annotations

import ast
from types import FrameType
from typing import TYPE_CHECKING

import torch

from ...model.causes import NoGraphCause
from ..lines.frames import user_frames
from ..lines.source import function_node, is_no_grad
from .graph_cuts import find_cut

if TYPE_CHECKING:
    from ..recorder import Recorder

def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stored(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _holding(body: list[ast.stmt], line: int) -> ast.stmt | None:
    return next((s for s in body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)


def statements_to_enable(body: list[ast.stmt], line: int) -> tuple[int, int] | None:
    """(first, last line) of the statements of the innermost block inside ``body`` that holds the backward on
    ``line``: from the first one its loss is made from (by names, back from the backward) to the backward."""
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
    """The no-grad block or decorator around the failing backward (innermost user frame first); with grad mode
    on, where the graph was cut before the backward (:func:`~graphwatch.capture.causes.graph_cuts.find_cut`)."""
    cause = NoGraphCause(backward_site, grad_enabled_outside=torch.is_grad_enabled())
    if torch.is_grad_enabled():
        find_cut(recorder, list(user_frames(start)), cause)
        return cause
    frames = list(user_frames(start))[:8]
    for depth, frame in enumerate(frames):
        tree = function_node(frame.f_code)
        if tree is None:
            continue
        line = frame.f_lineno
        blocks = [n for n in ast.walk(tree) if isinstance(n, ast.With) and any(is_no_grad(i.context_expr) for i in n.items)
                  and n.body[0].lineno <= line <= (n.end_lineno or n.lineno)]  # fmt: skip  # (a one-line block too)
        if blocks:
            block = max(blocks, key=lambda n: n.lineno)
            cause.kind, cause.function = "with", frame.f_code.co_name
            cause.block_at = recorder.sites.from_frame(frame, block.lineno)
            _mark_statements(recorder, cause, frames[0], block.body if depth == 0 else None)
            return cause
        decorators = getattr(tree, "decorator_list", [])
        found = next((d for d in decorators if is_no_grad(d)), None)
        if found is not None:
            cause.kind, cause.function = "decorator", frame.f_code.co_name
            cause.block_at = recorder.sites.from_frame(frame, found.lineno)  # (a decorated function's
            return cause  # lines are left to the user: the decorator says it runs without a graph)
    return cause


def _mark_statements(recorder: Recorder, cause: NoGraphCause, innermost: FrameType, body: list[ast.stmt] | None) -> None:
    """The statements to run with grad enabled, in the innermost user frame (the one calling the backward):
    inside the no-grad block's ``body`` when it is that frame's, else in that frame's whole function."""
    if body is None:
        tree = function_node(innermost.f_code)
        body = getattr(tree, "body", None) if not isinstance(tree, ast.Lambda) else None
    span = statements_to_enable(body, innermost.f_lineno) if isinstance(body, list) else None
    if span is not None:
        cause.first = recorder.sites.from_frame(innermost, span[0])
        cause.last = recorder.sites.from_frame(innermost, span[1])
