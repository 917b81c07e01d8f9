"""``model.eval()`` and ``model.train()``: a module switched between training and evaluation.

A training loop switches its model to evaluation before a validation pass and
back before the next epoch's first step: the two new code paths the default
level most wants to see in full detail, and the ones its other signals see
only after the fact (a validation pass makes no backward and calls no
optimizer; its graph is counted at the step's end, when the lines it ran are
gone).  While installed, ``torch.nn.Module.train`` (which ``eval()`` calls)
runs as before and then calls ``observer(module, mode)`` for each outermost
call that changed the module's mode; the calls it makes on the module's
children, calls that change nothing and calls inside code torch.compile
traces are not reported.

Example::

    >>> import torch
    >>> from graphwatch.capture.mode_switch import ModeSwitchPatch
    >>> seen = []
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    >>> with ModeSwitchPatch(lambda module, mode: seen.append(mode)):
    ...     for switch in (model.eval, model.eval, model.train):
    ...         _ = switch()
    >>> seen, model.training
    ([False, True], True)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch.nn

Observer = Callable[[torch.nn.Module, bool], None]


class ModeSwitchPatch:
    """Reports modules switched between training and evaluation mode to ``observer`` while installed.

    ``remove()`` (or leaving the ``with`` block) puts torch's method back; patches nest, and removing one
    restores exactly what it replaced.
    """

    def __init__(self, observer: Observer) -> None:
        self._observer = observer
        self._replaced: Any = None
        self._running = threading.local()  # .depth: Module.train calls running on this thread (the outermost is the user's)

    def install(self) -> ModeSwitchPatch:
        original = self._replaced = torch.nn.Module.train

        @functools.wraps(original)
        def train(module: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
            if torch.compiler.is_compiling():  # torch.compile traces torch's own method: no new graph break
                return original(module, mode)
            running = self._running
            depth = getattr(running, "depth", 0)
            changes = not depth and isinstance(mode, bool) and getattr(module, "training", mode) != mode
            running.depth = depth + 1
            try:
                result = original(module, mode)
            finally:
                running.depth = depth
            if changes:
                self._observer(module, mode)
            return result

        torch.nn.Module.train = train  # type: ignore[method-assign,assignment]
        return self

    def remove(self) -> None:
        if self._replaced is not None:
            torch.nn.Module.train = self._replaced  # type: ignore[method-assign]
            self._replaced = None

    def __enter__(self) -> ModeSwitchPatch:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()
