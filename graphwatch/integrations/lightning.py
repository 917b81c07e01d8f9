"""PyTorch Lightning: a callback that watches ``trainer.fit()``.

One graphwatch step is one Lightning training step: with automatic
optimization, each optimizer step (``trainer.global_step``; batches accumulated
with ``accumulate_grad_batches`` are one step); with manual optimization, each
batch (its ``training_step`` may step several optimizers).  The report goes to
``out``, or to ``<trainer.log_dir>/graphwatch``.  A fit that raises (the
backward-twice error explained, a strict leak) leaves its session with that
error, report written.

Example::

    >>> from graphwatch.integrations.lightning import GraphwatchCallback
    >>> callback = GraphwatchCallback(strict=False)   # Trainer(callbacks=[callback]).fit(model)
    >>> callback.session is None
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    except ImportError as missing:
        raise ImportError(
            "graphwatch.integrations.lightning needs PyTorch Lightning: pip install 'graphwatch[lightning]'"
        ) from missing

from ..session import Session
from . import Watched

__all__ = ["GraphwatchCallback"]


class GraphwatchCallback(Callback):  # type: ignore[misc]
    """Watch ``fit()`` with graphwatch: ``Trainer(callbacks=[GraphwatchCallback()])``.

    ``strict`` fails the fit at the end of the first leaking step (``graphwatch.GraphLeakError``);
    ``out`` is the report folder (default ``<trainer.log_dir>/graphwatch``); ``level`` as in
    :func:`graphwatch.watch`.  ``session`` is the session of the last fit (its ``findings``, ``trace``).
    Inside a session that is already watching (``graphwatch run``), the callback marks its steps and
    leaves the report to it.
    """

    def __init__(self, strict: bool = False, out: str | Path | None = None, level: str = "default") -> None:
        self.strict, self.out, self.level = strict, out, level
        self._watched: Watched | None = None
        self._global_step = 0

    @property
    def session(self) -> Session | None:
        """The session of the current (or last) fit."""
        return self._watched.session if self._watched is not None else None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        folder = self.out if self.out is not None else Path(trainer.log_dir or trainer.default_root_dir) / "graphwatch"
        self._watched = Watched(self.strict, self.level, folder, summary=trainer.is_global_zero).start()
        self._global_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._watched is None:
            return
        if pl_module.automatic_optimization and trainer.global_step == self._global_step:
            return  # still accumulating: the optimizer step ends the step
        self._global_step = trainer.global_step
        self._watched.end_step()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self._watched is not None:
            self._watched.stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._watched is not None:
            self._watched.stop(exception)
