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
            "graphwatch.integrations.lightning needs PyTorch Lightning: pip install 'torch-graphwatch[lightning]'"
        ) from missing

from . import WatchingCallback

__all__ = ["GraphwatchCallback"]


class GraphwatchCallback(WatchingCallback, Callback):  # type: ignore[misc]
    """Watch ``fit()`` with graphwatch: ``Trainer(callbacks=[GraphwatchCallback()])``.

    ``strict`` fails the fit at the end of the first leaking step (``graphwatch.GraphLeakError``);
    ``out`` is the report folder (default ``<trainer.log_dir>/graphwatch``); ``level`` as in
    :func:`graphwatch.watch`.  ``session`` is the session of the last fit (its ``findings``, ``trace``).
    Inside a session that is already watching (``graphwatch run``), the callback marks its steps and
    leaves the report to it.
    """

    _global_step = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._start(Path(trainer.log_dir or trainer.default_root_dir) / "graphwatch", trainer.is_global_zero)
        self._global_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if pl_module.automatic_optimization and trainer.global_step == self._global_step:
            return  # still accumulating: the optimizer step ends the step
        self._global_step = trainer.global_step
        self._end_step()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop(exception)
