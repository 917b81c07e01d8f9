"""Which statement updated a saved parameter in place, when torch's "modified by an inplace operation" error
names a parameter (or a view of one: ``linear`` saves ``weight.t()``) and no ``optimizer.step()`` the session saw
did it: a hand-written update (``p -= lr * p.grad`` under ``torch.no_grad()``) records no node, so the statement
is read from the source.

Where to look: a graph saved by an earlier step than the failing backward's (a graph carried across steps) was
saved before the loop's lines ran again, so the whole loop around the backward (or the whole function that runs
it, a ``train_step()`` called once a step); a graph of this step, the lines between the one that saved the
parameter and the backward.  Of the in-place statements there, the updates: those in a ``with torch.no_grad():``
block or on ``.data`` (a parameter cannot be changed in place otherwise); of those, the ones whose name is the
parameter in the frame that runs them (``w -= lr * w.grad``), else all of them when they change one name
(``for p in params: p -= lr * p.grad``), else none (graphwatch cannot tell).

Example::

    >>> import ast
    >>> loop = ast.parse("for step in range(3):\\n    loss.backward()\\n    with torch.no_grad():\\n        w -= 0.1 * w.grad")
    >>> loop_around(loop, 2).lineno, no_grad_spans(loop)
    (1, [(3, 4)])
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from types import CodeType, FrameType

import torch

from ...model import CallSite, Trace
from ..lines.callsite import display_path
from ..lines.source import innermost_function, is_no_grad, module_node
from .held_values import value_at
from .inplace_source import Write, writes


def update_writes(
    trace: Trace, at: CallSite, saved_at: int | None, earlier: bool, frames: list[FrameType],
    callee: Callable[[ast.Call], CodeType | None], parameter: torch.Tensor,
) -> list[Write]:  # fmt: skip
    """The statements that updated ``parameter`` (see the module's docstring), in the function holding ``at`` (the
    running backward's line): the loop around it when an ``earlier`` step's graph saved the parameter, else the
    lines from the one that led to the save (``saved_at``, or the line of that function that called it) to the
    backward.  ``frames``: the user's frames (names are read in the one running ``at``); ``callee``: the code
    a call there runs (:func:`~graphwatch.capture.causes.inplace_source.writes`)."""
    tree = module_node(at.file)
    if tree is None:
        return []
    function = innermost_function(tree, at.line)
    scope = function or tree
    if earlier:  # (a function with no loop around the backward, a train_step(): all of it ran since its last call)
        around = loop_around(scope, at.line) or function
        if around is None:
            return []
        first, last = around.lineno, around.end_lineno or around.lineno
    else:
        led = trace.site(saved_at)
        while led is not None and (led.file, led.function) != (at.file, at.function):
            led = trace.site(led.caller)
        first, last = (led.line if led is not None else getattr(scope, "lineno", 0)), at.line
    frame = next((f for f in frames if f.f_code.co_name == at.function
                  and display_path(f.f_code.co_filename) == at.file), None)  # fmt: skip
    return updates_of(writes(scope, at.file, first, last, callee), scope, frame, parameter)


def loop_around(scope: ast.AST, line: int) -> ast.For | ast.While | ast.AsyncFor | None:
    """The innermost loop of ``scope`` whose body holds ``line`` (a line of ``scope``'s own, as a backward's in its
    innermost function is: no loop of a function defined inside it can hold that line)."""
    loops = [
        s for s in ast.walk(scope) if isinstance(s, (ast.For, ast.While, ast.AsyncFor))
        and s.body[0].lineno <= line <= (s.end_lineno or s.lineno)
    ]  # fmt: skip
    return max(loops, key=lambda s: s.lineno, default=None)


def no_grad_spans(scope: ast.AST) -> list[tuple[int, int]]:
    """(first line, last line) of each ``with torch.no_grad():`` (or ``inference_mode``) block in ``scope``."""
    return [
        (s.lineno, s.end_lineno or s.lineno) for s in ast.walk(scope)
        if isinstance(s, (ast.With, ast.AsyncWith)) and any(is_no_grad(item.context_expr) for item in s.items)
    ]  # fmt: skip


def updates_of(found: list[Write], scope: ast.AST, frame: FrameType | None, parameter: torch.Tensor) -> list[Write]:
    """Of the in-place statements ``found`` in ``scope``, those that updated ``parameter`` (see the module's
    docstring); ``frame`` runs ``scope``, where a name is read (None: names are not read)."""
    spans = no_grad_spans(scope)
    updates = [
        w for w in found if w.call is None and (w.name.endswith(".data") or any(a <= w.line <= b for a, b in spans))
    ]
    named = [w for w in updates if frame is not None and value_at(frame, w.name.removesuffix(".data"), None) is parameter]
    if named:
        return named
    return updates if len({w.name for w in updates}) == 1 else []
