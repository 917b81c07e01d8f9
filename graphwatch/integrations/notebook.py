"""Jupyter: ``%load_ext graphwatch``, then ``%%graphwatch`` above a cell, or a session across cells.

* ``%%graphwatch [--strict] [--level LEVEL] [--out DIR]``: the cell runs inside a session; its summary
  shows under the cell (in the report's look), and a ``BackwardTwiceError`` explains itself in the
  cell's traceback as anywhere else.
* ``%graphwatch start [options]`` and ``%graphwatch stop``: one session across the cells between them
  (a hidden state carried from one cell's loop into the next is diagnosed); ``stop`` shows the summary.

Sessions and findings display as HTML in a notebook by themselves (``gw`` as a cell's last line).

Example::

    >>> from graphwatch.integrations.notebook import magic_options
    >>> magic_options("--strict --level light").level
    'light'
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from ..errors import UsageError
from ..session import LEVELS, Session
from . import start_session, stop_session

_started: Session | None = None


def magic_options(line: str) -> argparse.Namespace:
    """The options of ``%%graphwatch`` / ``%graphwatch start``, as ``graphwatch run`` spells them."""
    parser = argparse.ArgumentParser(prog="%%graphwatch", add_help=False, exit_on_error=False)
    parser.add_argument("action", nargs="?", choices=("start", "stop"))
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--level", choices=LEVELS, default="default")
    parser.add_argument("--out", default=None)
    try:
        return parser.parse_args(shlex.split(line))
    except (argparse.ArgumentError, SystemExit) as error:
        raise UsageError(f"%%graphwatch {line}: {error}; options: [--strict] [--level LEVEL] [--out DIR]") from None


def graphwatch_magic(line: str, cell: str | None = None) -> Any:
    """``%%graphwatch`` (a cell) and ``%graphwatch start|stop`` (a session across cells)."""
    global _started
    options = magic_options(line)
    if cell is None:  # the line magic
        if options.action == "start":
            stop_session(_started)
            _started = start_session(options.strict, options.level, options.out, summary=False, explicit_steps=False)
            return None
        if options.action == "stop":
            session, _started = _started, None
            stop_session(session)
            return session
        raise UsageError("%graphwatch takes `start [options]` or `stop`; %%graphwatch watches one cell")
    from IPython import get_ipython

    shell = get_ipython()
    session = start_session(options.strict, options.level, options.out, summary=False, explicit_steps=False)
    result = shell.run_cell(cell)
    error = result.error_in_exec
    stop_session(session, error if isinstance(error, Exception) else None)
    return session


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%graphwatch`` and ``%graphwatch`` (``%load_ext graphwatch`` calls this)."""
    if not callable(getattr(ipython, "register_magic_function", None)):
        raise TypeError(
            f"load_ipython_extension takes the IPython shell, got {type(ipython).__name__}: "
            "in a notebook, run `%load_ext graphwatch`"
        )
    ipython.register_magic_function(graphwatch_magic, magic_kind="line_cell", magic_name="graphwatch")
