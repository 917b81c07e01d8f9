"""Hugging Face ``Trainer``: a ``TrainerCallback`` that watches ``trainer.train()``.

One graphwatch step is one of the Trainer's optimizer steps (``state.global_step``:
the ``gradient_accumulation_steps`` micro-batches of one update are one step).
The report goes to ``out``, or to ``<args.output_dir>/graphwatch``.  The Trainer
tells callbacks nothing of an error: a run that raises keeps its session until the
next ``train()`` (or ``%%graphwatch`` cell) or the process's exit, which close it
with that error and write its report.

Example::

    >>> from graphwatch.integrations.transformers import GraphwatchCallback
    >>> callback = GraphwatchCallback()   # Trainer(..., callbacks=[callback]).train()
    >>> callback.session is None
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as missing:
    raise ImportError(
        "graphwatch.integrations.transformers needs transformers: pip install 'graphwatch[transformers]'"
    ) from missing

from ..session import Session
from . import Watched

__all__ = ["GraphwatchCallback"]


class GraphwatchCallback(TrainerCallback):  # type: ignore[misc]
    """Watch ``train()`` with graphwatch: ``Trainer(..., callbacks=[GraphwatchCallback()])``.

    ``strict`` fails the run at the end of the first leaking step (``graphwatch.GraphLeakError``);
    ``out`` is the report folder (default ``<args.output_dir>/graphwatch``); ``level`` as in
    :func:`graphwatch.watch`.  ``session`` is the session of the last run (its ``findings``, ``trace``).
    Inside a session that is already watching (``graphwatch run``), the callback marks its steps and
    leaves the report to it.
    """

    def __init__(self, strict: bool = False, out: str | Path | None = None, level: str = "default") -> None:
        self.strict, self.out, self.level = strict, out, level
        self._watched: Watched | None = None

    @property
    def session(self) -> Session | None:
        """The session of the current (or last) run."""
        return self._watched.session if self._watched is not None else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = self.out if self.out is not None else Path(args.output_dir) / "graphwatch"
        self._watched = Watched(self.strict, self.level, folder, summary=state.is_world_process_zero).start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._watched is not None:
            self._watched.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._watched is not None:
            self._watched.stop()
