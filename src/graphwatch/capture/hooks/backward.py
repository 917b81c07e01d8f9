"""Intercept every call into the autograd engine.

``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad``
all reach the engine through ``torch.autograd.graph._engine_run_backward``
(torch itself patches it the same way for tracing).  Wrapping that one entry
point costs nothing per op, sees backwards from any thread, and gives the
roots of the graph about to be run.

Example::

    >>> import torch
    >>> from graphwatch.capture.hooks.backward import EnginePatch
    >>> seen = []
    >>> def observe(run, outputs, args, kwargs):
    ...     seen.append(len(outputs))
    ...     return run(outputs, *args, **kwargs)
    >>> with EnginePatch(observe):
    ...     torch.ones(1, requires_grad=True).exp().sum().backward()
    >>> seen
    [1]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.autograd
import torch.autograd.graph

from ...errors import ExplainedError, GraphwatchError

Run = Callable[..., Any]
Observer = Callable[[Run, Any, tuple, dict], Any]

_MODULES = (torch.autograd.graph, torch.autograd)
_NAME = "_engine_run_backward"


class EnginePatch:
    """Routes engine calls through ``observer(run, outputs, args, kwargs)`` while installed.

    ``remove()`` (or leaving the ``with`` block) puts torch's function back.
    Patches nest: removing an inner one restores exactly what it replaced.
    """

    def __init__(self, observer: Observer) -> None:
        self._observer = observer
        self._replaced: list[tuple[Any, Any]] = []

    def install(self) -> EnginePatch:
        original = torch.autograd.graph._engine_run_backward

        @functools.wraps(original)
        def engine_run_backward(t_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # pytest: the user's frames end at their backward call
            try:
                return self._observer(original, t_outputs, args, kwargs)
            except (GraphwatchError, ExplainedError) as error:  # graphwatch's: its traceback starts here
                raise error.with_traceback(None) from None

        for module in _MODULES:
            self._replaced.append((module, getattr(module, _NAME)))
            setattr(module, _NAME, engine_run_backward)
        return self

    def remove(self) -> None:
        while self._replaced:
            module, previous = self._replaced.pop()
            setattr(module, _NAME, previous)

    def __enter__(self) -> EnginePatch:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def parse_engine_args(t_outputs: Any, args: tuple, kwargs: dict) -> tuple[list[Any], bool, bool, bool]:
    """(root nodes, retain_graph, create_graph, accumulate_grad) of one engine call."""
    retain_graph = bool(args[1]) if len(args) > 1 else bool(kwargs.get("keep_graph", False))
    create_graph = bool(args[2]) if len(args) > 2 else bool(kwargs.get("create_graph", False))
    accumulate = bool(kwargs.get("accumulate_grad", True))
    roots = []
    for output in t_outputs:
        node = output.grad_fn if isinstance(output, torch.Tensor) else getattr(output, "node", None)
        if node is not None:
            roots.append(node)
    return roots, retain_graph, create_graph, accumulate
