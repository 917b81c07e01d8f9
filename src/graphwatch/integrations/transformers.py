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
        "graphwatch.integrations.transformers needs transformers: pip install 'torch-graphwatch[transformers]'"
    ) from missing

from . import WatchingCallback

__all__ = ["GraphwatchCallback"]


class GraphwatchCallback(WatchingCallback, TrainerCallback):  # type: ignore[misc]
    """Watch ``train()`` with graphwatch: ``Trainer(..., callbacks=[GraphwatchCallback()])``.

    ``strict`` fails the run at the end of the first leaking step (``graphwatch.GraphLeakError``);
    ``out`` is the report folder (default ``<args.output_dir>/graphwatch``); ``level`` as in
    :func:`graphwatch.watch`.  ``session`` is the session of the last run (its ``findings``, ``trace``).
    Inside a session that is already watching (``graphwatch run``), the callback marks its steps and
    leaves the report to it.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start(Path(args.output_dir) / "graphwatch", state.is_world_process_zero)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop()
