"""torch.compile and torch.func: where graphwatch steps aside.

While torch.compile traces with fake tensors, or a torch.func transform
(``grad``, ``vjp``, ``jacrev``, ``hessian``) runs, no real backward runs through
the engine, and torch.func switches saved-tensor hooks off with
``torch.autograd.graph.disable_saved_tensors_hooks``, which fails while a
session's hooks are active unless graphwatch pops them for its block.

Example::

    >>> from graphwatch.capture.transforms import transforming
    >>> transforming()
    False
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def transforming() -> bool:
    """True while torch.compile traces (fake tensors) or a torch.func transform runs: no real backward."""
    return torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is not None


def step_aside_for_disable(hooks: tuple) -> Callable[[], None]:
    """Make ``torch.autograd.graph.disable_saved_tensors_hooks`` (used by torch.func.grad, vjp, jacrev,
    hessian) pop graphwatch's hooks for its block instead of failing; returns the undo."""
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

    def undo() -> None:
        graph.disable_saved_tensors_hooks = original

    return undo
