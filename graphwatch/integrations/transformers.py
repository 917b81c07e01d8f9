"""Hugging Face ``Trainer``: a ``TrainerCallback`` that watches ``trainer.train()``.

One graphwatch step is one of the Trainer's optimizer steps (``state.global_step``:
the ``gradient_accumulation_steps`` micro-batches of one update are one step).
The report goes to ``out``, or to ``<args.output_dir>/graphwatch``.  A run that
raises still writes its report when the process exits.

Example::

    >>> from graphwatch.integrations.transformers import GraphwatchCallback
    >>> callback = GraphwatchCallback()   # Trainer(..., callbacks=[callback]).train()
    >>> callback.session is None
    True
"""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as missing:
    raise ImportError(
        "graphwatch.integrations.transformers needs transformers: pip install 'graphwatch[transformers]'"
    ) from missing

from . import WatchingCallback, stop_session


class GraphwatchCallback(WatchingCallback, TrainerCallback):  # type: ignore[misc]
    """Watch ``train()`` with graphwatch: ``Trainer(..., callbacks=[GraphwatchCallback()])``.

    ``strict`` fails the run at the end of the first leaking step (``graphwatch.GraphLeakError``);
    ``out`` is the report folder (default ``<args.output_dir>/graphwatch``); ``level`` as in
    :func:`graphwatch.watch`.  ``session`` is the session of the last run (its ``findings``, ``trace``).
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start(Path(args.output_dir) / "graphwatch", state.is_world_process_zero)
        atexit.register(self._at_exit)  # train() that raises never calls on_train_end

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is not None and self.session.active:
            self.session.end_step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        atexit.unregister(self._at_exit)
        stop_session(self.session)

    def _at_exit(self) -> None:
        stop_session(self.session, RuntimeError("the Trainer's run ended without on_train_end"))
