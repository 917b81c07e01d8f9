"""Where graphwatch steps aside, so that torch behaves as without it.

While torch.compile traces with fake tensors, or a torch.func transform
(``grad``, ``vjp``, ``jacrev``, ``hessian``) runs, no real backward runs through
the engine, and torch.func switches saved-tensor hooks off with
``torch.autograd.graph.disable_saved_tensors_hooks``, which fails while a
session's hooks are active unless graphwatch pops them for its block.

While a compiled function runs, Dynamo must not compile graphwatch's own
frames either (:func:`hide_from_compiler`).

Example::

    >>> from graphwatch.capture.hooks.transforms import transforming
    >>> transforming()
    False
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .saved_views import patch_saved_views


def hide_from_compiler() -> None:
    """Tell torch.compile never to compile a frame of graphwatch's own code.

    graphwatch's hooks run from inside torch (the engine entry point, pack and
    unpack hooks, a handle's ``__del__``, optimizer hooks), also while a
    compiled function runs its eager parts after a graph break; Dynamo would
    then try to compile those frames, warn about ``sys._getframe`` and break
    graphs that do not break without graphwatch.  Each of graphwatch's code
    objects is marked "skip this frame" (what ``torch.compiler.disable`` does,
    with no wrapper and no cost per call); the frames they call, the user's
    hooks among them, are treated by Dynamo as without graphwatch.  Cheap
    (one C call per code object, once per module) and a no-op where torch
    has no frame strategies.

    Each call hides the modules loaded since the last one: graphwatch imports
    some of its code on first use (the drawing code, the codemods), maybe from
    a hook inside a compiled function, and calls this right after.
    """
    if _set_strategy is None:
        return
    loaded = {
        name: module
        for name in _modules_since_last_call()
        if (name == "graphwatch" or name.startswith("graphwatch.")) and name not in _hidden
        and (module := sys.modules.get(name)) is not None
    }  # fmt: skip
    skip = _strategy(_action.SKIP, _action.DEFAULT)
    for code in _graphwatch_code(loaded.values()):
        _set_strategy(code, skip)
    _hidden.update(loaded)


def _modules_since_last_call() -> list[str]:
    """The names ``sys.modules`` gained since the last call (all of them the first time, or when a module listed
    before was removed): a dict keeps its order, so a new module comes after every name seen.  A session starts
    with this: reading all of them (thousands with torch) costs milliseconds, mostly in the garbage collections
    their copies set off."""
    global _seen_modules
    names = list(sys.modules)  # (a copy of the names only: another thread may import meanwhile)
    count, last = _seen_modules
    unchanged = 0 < count <= len(names) and names[count - 1] == last  # (a removal before it would shift it)
    _seen_modules = (len(names), names[-1] if names else "")
    return names[count:] if unchanged else names


def _graphwatch_code(modules: Iterable[types.ModuleType]) -> Iterator[types.CodeType]:
    """The live code objects of graphwatch's ``modules``: functions, methods, properties, and the
    functions nested in them (a closure's code is a constant of the function that makes it)."""
    pending: list[Any] = list(modules)
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, types.CodeType):
            yield item
            pending.extend(const for const in item.co_consts if isinstance(const, types.CodeType))
        elif isinstance(item, (types.FunctionType, types.MethodType)):
            pending.append(getattr(item, "__func__", item).__code__)
        elif isinstance(item, (staticmethod, classmethod)):
            pending.append(item.__func__)
        elif isinstance(item, property):
            pending.extend(f for f in (item.fget, item.fset, item.fdel) if f is not None)
        elif isinstance(item, (types.ModuleType, type)):
            owned = isinstance(item, type) or item.__name__.startswith("graphwatch")
            if owned and (isinstance(item, types.ModuleType) or item.__module__.startswith("graphwatch")):
                pending.extend(vars(item).values())
        elif callable(getattr(item, "__wrapped__", None)):  # functools.wraps: the wrapper's own code
            code = getattr(item, "__code__", None)
            if code is not None:
                pending.append(code)


try:
    from torch._C._dynamo.eval_frame import (
        _FrameAction as _action,
    )
    from torch._C._dynamo.eval_frame import (
        _FrameExecStrategy as _strategy,
    )
    from torch._C._dynamo.eval_frame import (
        set_code_exec_strategy as _set_strategy,
    )
except ImportError:  # torch without frame strategies: nothing to hide from
    _set_strategy = None  # type: ignore[assignment]
_hidden: set[str] = set()  # the graphwatch modules whose code Dynamo skips
_seen_modules = (0, "")  # how many names sys.modules had at the last scan, and the last of them


def transforming() -> bool:
    """True while torch.compile traces (fake tensors) or a torch.func transform runs: no real backward.

    The interpreter stack is read only while some transform is alive (torch's global table of transform
    levels is not empty): reading it creates torch.func's per-thread state, which the autograd engine then
    copies at every node it runs, in every backward of that thread from then on, after the session too
    (0.2 us a node, 5% of a chain of small ops' backward, measured on torch 2.13).
    """
    return torch.compiler.is_compiling() or (
        torch._C._are_functorch_transforms_active() and torch._C._functorch.peek_interpreter_stack() is not None
    )


def step_aside_for_disable(hooks: tuple) -> Callable[[], None]:
    """Make ``torch.autograd.graph.disable_saved_tensors_hooks`` (used by torch.func.grad, vjp, jacrev,
    hessian) pop graphwatch's hooks for its block instead of failing, and show saved tensors to the user
    as without graphwatch (:mod:`graphwatch.capture.hooks.saved_views`); returns the undo."""
    graph = torch.autograd.graph
    original = graph.disable_saved_tensors_hooks

    @contextmanager
    def disable_saved_tensors_hooks(error_message: str) -> Iterator[None]:
        ours = torch._C._autograd._top_saved_tensors_default_hooks(False) == hooks
        if ours:
            torch._C._autograd._pop_saved_tensors_default_hooks()
        try:
            with original(error_message):
                yield
        finally:
            if ours:
                torch._C._autograd._push_saved_tensors_default_hooks(*hooks)

    graph.disable_saved_tensors_hooks = disable_saved_tensors_hooks
    undo_views = patch_saved_views()

    def undo() -> None:
        graph.disable_saved_tensors_hooks = original
        undo_views()

    return undo
