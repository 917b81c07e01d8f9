"""``model.eval()``: a module switched from training to evaluation.

A training loop switches its model to evaluation before a validation pass: the
new code path the default level most wants to see in full detail, and one its
other signals see only after the fact (a validation pass makes no backward and
calls no optimizer; its graph is counted at the step's end, when the lines it
ran are gone).  While installed, ``torch.nn.Module.eval`` runs as before and
then calls ``observer(module)`` when the module was in training mode; calls
that change nothing and calls inside code torch.compile traces are not
reported.  ``Module.train``, which ``eval()`` calls and which recurses into
every child (and which some loops call every step), is left alone.

Example::

    >>> import torch
    >>> from graphwatch.capture.hooks.eval_mode import EvalModePatch
    >>> seen = []
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    >>> with EvalModePatch(seen.append):
    ...     for switch in (model.eval, model.eval, model.train, model.eval):
    ...         _ = switch()
    >>> seen == [model, model], model.training
    (True, False)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.nn

Observer = Callable[[torch.nn.Module], None]


class EvalModePatch:
    """Reports modules switched from training to evaluation mode to ``observer`` while installed.

    ``remove()`` (or leaving the ``with`` block) puts torch's method back; patches nest, and removing one
    restores exactly what it replaced.
    """

    def __init__(self, observer: Observer) -> None:
        self._observer = observer
        self._replaced: Any = None

    def install(self) -> EvalModePatch:
        original = self._replaced = torch.nn.Module.eval

        @functools.wraps(original)
        def eval_(module: torch.nn.Module) -> torch.nn.Module:
            if torch.compiler.is_compiling():  # torch.compile traces torch's own method: no new graph break
                return original(module)
            training = getattr(module, "training", False)
            result = original(module)
            if training:
                self._observer(module)
            return result

        torch.nn.Module.eval = eval_  # type: ignore[method-assign,assignment]
        return self

    def remove(self) -> None:
        if self._replaced is not None:
            torch.nn.Module.eval = self._replaced  # type: ignore[method-assign]
            self._replaced = None

    def __enter__(self) -> EvalModePatch:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()
