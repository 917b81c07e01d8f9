"""What ``graphwatch.watch()`` takes, checked once: a wrong option is a :class:`~graphwatch.UsageError` that
names the option and what to pass instead, before anything is installed.

Example::

    >>> from graphwatch.options import SessionOptions
    >>> SessionOptions.checked(level="light").level
    'light'
    >>> from graphwatch.errors import UsageError
    >>> try:
    ...     SessionOptions.checked(levle="light")
    ... except UsageError as error:
    ...     print(str(error).split(";")[1])
     did you mean 'level'? options are: strict, level, summary, out, keep_steps, snapshots, max_snapshots
"""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError

LEVELS = ("default", "light", "full", "precise")
OUT_VARIABLE = "GRAPHWATCH_OUT"  # the report folder of the session @graphwatch.step starts, unless configured
OPTIONS = ("strict", "level", "summary", "out", "keep_steps", "snapshots", "max_snapshots")


@dataclass(frozen=True)
class SessionOptions:
    """A session's options, checked (see :class:`~graphwatch.session.Session` for what each does)."""

    strict: bool = False
    level: str = "default"
    summary: bool = True
    out: Path | None = None
    keep_steps: int = 20
    snapshots: str | frozenset[int] = "auto"
    max_snapshots: int = 12

    @classmethod
    def checked(
        cls,
        *,
        strict: bool = False,
        level: str = "default",
        summary: bool = True,
        out: str | os.PathLike[str] | None = None,
        keep_steps: int = 20,
        snapshots: str | Iterable[int] = "auto",
        max_snapshots: int = 12,
        **unknown: Any,
    ) -> SessionOptions:
        """The options as given, or a UsageError naming the first wrong one."""
        if unknown:
            name = next(iter(unknown))
            close = difflib.get_close_matches(name, OPTIONS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"graphwatch.watch() got an unknown option {name!r}; {hint}options are: {', '.join(OPTIONS)}"
            )
        if level not in LEVELS:
            raise UsageError(f"level={level!r} is not a graphwatch level; use one of {', '.join(map(repr, LEVELS))}")
        if not isinstance(keep_steps, int) or keep_steps < 1:
            raise UsageError(f"keep_steps={keep_steps!r}: give a whole number of steps, at least 1")
        if not isinstance(max_snapshots, int) or max_snapshots < 0:
            raise UsageError(f"max_snapshots={max_snapshots!r}: give a whole number, 0 or more")
        if isinstance(snapshots, str) and snapshots not in ("auto", "off"):
            raise UsageError(f"snapshots={snapshots!r}: use 'auto', 'off' or a list of step numbers")
        folder = report_folder(out)
        try:
            steps = snapshots if isinstance(snapshots, str) else frozenset(int(s) for s in snapshots)
        except (TypeError, ValueError):
            raise UsageError(f"snapshots={snapshots!r}: use 'auto', 'off' or a list of step numbers") from None
        return cls(bool(strict), level, bool(summary), folder, keep_steps, steps, max_snapshots)


# Each way the report folder is given: how its errors name it, and what they ask for instead.
_SETTINGS = {
    "out": ("out={!r}", "pass out= a folder you can write (None or \"\": no report)"),
    "configure": ("graphwatch.configure(out={!r})", "pass graphwatch.configure(out=) a folder you can write"),
    OUT_VARIABLE: (OUT_VARIABLE + "={!r}", f"set {OUT_VARIABLE} to a folder you can write (empty: no report)"),
}


def check_out_type(out: object, setting: str = "out") -> None:
    """A UsageError unless ``out`` is a path (a str or os.PathLike) or None; ``setting`` (``"out"``,
    ``"configure"`` or ``"GRAPHWATCH_OUT"``) is how the message names it."""
    if out is not None and not isinstance(out, (str, os.PathLike)):
        named = _SETTINGS[setting][0].format(out)
        raise UsageError(f"{named}: give the report folder as a path (a str or pathlib.Path), or None")


def report_folder(out: str | os.PathLike[str] | None, setting: str = "out") -> Path | None:
    """The report folder ``out`` names, resolved once, now (a script that calls ``os.chdir()`` later still
    gets its report where it was asked for): an absolute path, or None for no report (None or ``""``).
    A UsageError naming ``setting`` (see :func:`check_out_type`) when it is not a path or cannot be written.

    >>> report_folder(""), report_folder(None), report_folder("rep").is_absolute()
    (None, None, True)
    """
    check_out_type(out, setting)
    if out is None or os.fspath(out) == "":
        return None
    folder = Path(out).absolute()
    check_writable_folder(folder, setting, out)
    return folder


def check_writable_folder(folder: Path, setting: str = "out", given: object = None) -> None:
    """A UsageError unless ``folder`` (or the nearest folder above it that exists) can be written; the message
    names ``setting`` (and, for an environment variable or configure(), the value ``given``)."""
    from .rendering.finding_blocks import printable_path

    probe = folder
    while not probe.exists():
        probe = probe.parent
    try:
        if not probe.is_dir():
            raise NotADirectoryError
        with tempfile.TemporaryFile(dir=probe):  # os.access says yes to root, even for /proc
            pass
    except OSError:
        named, fix = _SETTINGS[setting]
        where = "" if setting == "out" else f" ({named.format(given)})"
        raise UsageError(
            f"cannot write the report to {printable_path(folder)}{where}: {printable_path(probe)} is not a writable "
            f"folder; {fix}"
        ) from None
