"""graphwatch inside training frameworks and notebooks.

Each integration is imported only when used, and needs its framework installed
(``pip install graphwatch[lightning]``, ``[transformers]``, ``[notebook]``):

* :mod:`graphwatch.integrations.lightning`: ``GraphwatchCallback`` for a PyTorch Lightning ``Trainer``;
* :mod:`graphwatch.integrations.transformers`: ``GraphwatchCallback`` for a Hugging Face ``Trainer``;
* :mod:`graphwatch.integrations.notebook`: the ``%%graphwatch`` cell magic (``%load_ext graphwatch``).

A framework's step is graphwatch's step: the callbacks end one at each of the
framework's own step boundaries (``Session.end_step``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..session import Session, watch


def start_session(
    strict: bool, level: str, out: str | Path | None, summary: bool = True, explicit_steps: bool = True
) -> Session:
    """Enter a session; with ``explicit_steps`` the caller ends its steps (:meth:`Session.end_step`),
    else they follow the user's loop as in a script."""
    session = watch(strict=strict, level=level, out=out, summary=summary)
    session.__enter__()
    if explicit_steps:
        session.follow_explicit_steps()
    return session


class WatchingCallback:
    """What the framework callbacks share: their options (``strict``, ``out``, ``level``, as in
    :func:`graphwatch.watch`) and ``session``, the session of the last run (its ``findings``, ``trace``)."""

    def __init__(self, strict: bool = False, out: str | Path | None = None, level: str = "default") -> None:
        super().__init__()
        self.strict, self.out, self.level = strict, out, level
        self.session: Session | None = None

    def _start(self, default_folder: Path, summary: bool) -> None:
        """Enter the run's session; its report goes to ``out``, or to ``default_folder``."""
        folder = self.out if self.out is not None else default_folder
        self.session = start_session(self.strict, self.level, folder, summary=summary)


def stop_session(session: Session | None, error: BaseException | None = None) -> None:
    """Leave ``session`` if it is still watching (the error that stopped the run, if any, is recorded)."""
    if session is not None and session.active:
        kind: Any = type(error) if error is not None else None
        session.__exit__(kind, error, error.__traceback__ if error is not None else None)
