"""Jupyter: ``%load_ext graphwatch``, then ``%%graphwatch`` above a cell, or a session across cells.

* ``%%graphwatch [--strict] [--level LEVEL] [--out DIR]``: the cell runs inside a session; its summary
  shows under the cell (in the report's look).  A cell that raises still fails, as it would without
  graphwatch (so "Run All" stops there); a ``BackwardTwiceError`` explains itself in its traceback, and the
  summary shows under the traceback.
* ``%graphwatch start [options]`` and ``%graphwatch stop``: one session across the cells between them
  (a hidden state carried from one cell's loop into the next is diagnosed); ``stop`` shows the summary.
  A ``%%graphwatch`` cell or a framework callback inside it uses that session.

Steps follow the loops of the cells' source, as in a script.  Sessions and findings display as HTML
by themselves (``gw`` or ``gw.findings[0]`` as a cell's last line).

Example::

    >>> from graphwatch.integrations.notebook import magic_options
    >>> magic_options("--strict --level light").level
    'light'
"""

from __future__ import annotations

import argparse
import ast
import shlex
from typing import Any

from ..errors import UsageError
from ..options import LEVELS
from ..rendering.notebook import register_displays
from ..session import Session
from . import Watched

__all__ = ["graphwatch_magic", "load_ipython_extension", "magic_options"]

_started: Watched | None = None  # %graphwatch start ... %graphwatch stop


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


def graphwatch_magic(line: str, cell: str | None = None) -> Session | None:
    """``%%graphwatch`` (a cell) and ``%graphwatch start|stop`` (a session across cells)."""
    __tracebackhide__ = True  # IPython: the cell's traceback starts at the cell's own lines
    options = magic_options(line)
    if cell is None:
        return _line_magic(options)
    if options.action is not None:
        raise UsageError(f"%%graphwatch {line}: `{options.action}` is for the line magic (%graphwatch start)")
    from IPython import get_ipython
    from IPython.display import display

    shell = get_ipython()
    watched = Watched(options.strict, options.level, options.out, summary=False, explicit_steps=False).start()
    try:
        value = _run_cell(shell, cell)
        watched.stop()
    except BaseException as error:
        watched.stop(error)
        if watched.owned:
            _display_after_cell(shell, watched.session)
        raise
    if value is not None:
        display(value)
    return watched.session if watched.owned else None


def _line_magic(options: argparse.Namespace) -> Session | None:
    global _started
    from IPython import get_ipython

    if options.action == "start":
        if _started is not None:  # started again without a stop: the earlier session ends, and shows
            _started.stop()
            _display_after_cell(get_ipython(), _started.session)
        _started = Watched(options.strict, options.level, options.out, summary=False, explicit_steps=False).start()
        return None
    if options.action == "stop":
        started, _started = _started, None
        if started is None:
            raise UsageError("%graphwatch stop: no session was started in this kernel (`%graphwatch start`)")
        started.stop()
        return started.session
    raise UsageError("%graphwatch takes `start [options]` or `stop`; %%graphwatch watches one cell")


def _run_cell(shell: Any, cell: str) -> Any:
    """Run ``cell`` in the notebook's namespace as IPython runs a cell (its magics transformed, its source
    kept for tracebacks and for graphwatch's reading of loops), letting its exception through; returns
    the value of its last line when that is an expression."""
    __tracebackhide__ = True
    source = shell.transform_cell(cell)
    number = max(shell.execution_count - 1, 0)  # IPython counts the running cell already
    filename = shell.compile.cache(source, number, raw_code=cell)
    tree = shell.transform_ast(shell.compile.ast_parse(source, filename=filename))
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(shell.compile(tree, filename, "exec"), shell.user_ns)
    if last is None:
        return None
    return eval(shell.compile(ast.Expression(last.value), filename, "eval"), shell.user_ns)


def _display_after_cell(shell: Any, value: Any) -> None:
    """Display ``value`` once the running cell has ended (under its traceback, when it raised)."""
    from IPython.display import display

    def show(*_: Any) -> None:
        shell.events.unregister("post_run_cell", show)
        display(value)

    shell.events.register("post_run_cell", show)


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%graphwatch`` and ``%graphwatch`` (``%load_ext graphwatch`` calls this)."""
    if not callable(getattr(ipython, "register_magic_function", None)):
        raise TypeError(
            f"load_ipython_extension takes the IPython shell, got {type(ipython).__name__}: "
            "in a notebook, run `%load_ext graphwatch`"
        )
    ipython.register_magic_function(graphwatch_magic, magic_kind="line_cell", magic_name="graphwatch")
    register_displays(ipython)
