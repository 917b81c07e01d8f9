"""Where graphwatch steps aside, so that torch behaves as without it.

While torch.compile traces with fake tensors, or a torch.func transform
(``grad``, ``vjp``, ``jacrev``, ``hessian``) runs, no real backward runs through
the engine, and torch.func switches saved-tensor hooks off with
``torch.autograd.graph.disable_saved_tensors_hooks``, which fails while a
session's hooks are active unless graphwatch pops them for its block.

Saved-tensor hooks change two more things a user can see, which
:func:`step_aside_for_disable` also puts right while a session is active:

* ``grad_fn._raw_saved_x.register_hooks(pack, unpack)`` raises in torch when
  default hooks already packed that tensor; graphwatch's packed tensors
  take the user's pair instead (:func:`graphwatch.capture.saved.register_user_hooks`);
* torch re-wraps every tensor an unpack hook returns, so ``ctx.saved_tensors``
  of a custom ``autograd.Function`` would give a new object for a saved input,
  without the attributes the user set on it; graphwatch gives back the input
  itself, as torch does without hooks.  (The ``_saved_x`` attributes of
  built-in nodes are C types that cannot be patched: there a saved input
  comes back as an equal tensor, not the same object.)

Example::

    >>> from graphwatch.capture.transforms import transforming
    >>> transforming()
    False
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from .saved import SavedHandle, register_user_hooks, user_view

_SavedTensor = torch._C._autograd.SavedTensor
_raw_data = _SavedTensor.data.fget  # what the pack hook returned (graphwatch's handle), or torch's tensor
_ctx_saved_tensors = torch._C._FunctionBase.saved_tensors.__get__


def transforming() -> bool:
    """True while torch.compile traces (fake tensors) or a torch.func transform runs: no real backward."""
    return torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is not None


def _register_hooks(original: Callable[..., None]) -> Callable[..., None]:
    def register_hooks(self: Any, pack_hook: Any, unpack_hook: Any) -> None:
        data = _raw_data(self)
        chainable = type(data) is SavedHandle and callable(pack_hook) and callable(unpack_hook)
        if chainable and register_user_hooks(data, pack_hook, unpack_hook):
            return
        original(self, pack_hook, unpack_hook)  # torch's own checks and errors

    return register_hooks


def _saved_tensors(ctx: Any) -> tuple:
    """``ctx.saved_tensors`` with each saved input given back as the very object that was saved."""
    tensors = _ctx_saved_tensors(ctx)  # runs the unpack hooks: graphwatch's checks, torch's errors
    if not tensors:
        return tensors
    return tuple(
        user_view(data, tensor) if tensor is not None and type(data := _raw_data(raw)) is SavedHandle else tensor
        for raw, tensor in zip(ctx._raw_saved_tensors, tensors)
    )


def _patch_user_hooks() -> Callable[[], None]:
    """Install the per-tensor ``register_hooks`` chaining and the ``ctx.saved_tensors`` identity."""
    original = _SavedTensor.register_hooks
    _SavedTensor.register_hooks = _register_hooks(original)
    BackwardCFunction.saved_tensors = property(_saved_tensors)  # type: ignore[assignment]

    def undo() -> None:
        _SavedTensor.register_hooks = original
        del BackwardCFunction.saved_tensors

    return undo


def step_aside_for_disable(hooks: tuple) -> Callable[[], None]:
    """Make ``torch.autograd.graph.disable_saved_tensors_hooks`` (used by torch.func.grad, vjp, jacrev,
    hessian) pop graphwatch's hooks for its block instead of failing, and let users' per-tensor hooks and
    custom Functions' saved inputs behave as without graphwatch (see the module's text); returns the undo."""
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
    undo_user_hooks = _patch_user_hooks()

    def undo() -> None:
        graph.disable_saved_tensors_hooks = original
        undo_user_hooks()

    return undo
