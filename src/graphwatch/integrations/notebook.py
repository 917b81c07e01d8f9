"""Jupyter: ``%load_ext graphwatch``, then ``%%graphwatch`` above a cell, or a session across cells.

* ``%%graphwatch [--strict] [--level LEVEL] [--out DIR]``: the cell runs inside a session; its summary
  shows under the cell (in the report's look).  A cell that raises still fails, as it would without
  graphwatch (so "Run All" stops there); a ``BackwardTwiceError`` explains itself in its traceback, and the
  summary shows under the traceback.
* ``%graphwatch start [options]`` and ``%graphwatch stop``: one session across the cells between them
  (a hidden state carried from one cell's loop into the next is diagnosed); ``stop`` shows the summary.
  A ``%%graphwatch`` cell or a framework callback inside it uses that session.

Either way the ended session is then ``gw`` in the notebook (``gw.findings``, ``gw.report(DIR)``), also
after a cell that raised; a ``gw`` of the notebook's own that is not a session is left alone, and the
session is ``gw2`` (``gw3``, ...) instead: the line under the summary names it.

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
import functools
import itertools
import shlex
from typing import Any, NoReturn

from ..capture.lines.source import cited_lines
from ..errors import UsageError
from ..options import LEVELS
from ..rendering.notebook import register_displays, summary_html
from ..rendering.wording import session_text
from ..session import Session
from . import Watched

__all__ = ["SESSION_NAME", "graphwatch_magic", "load_ipython_extension", "magic_options"]

SESSION_NAME = "gw"  # the name an ended session is bound to in the notebook (gw2, gw3, ... when taken)
_started: Watched | None = None  # %graphwatch start ... %graphwatch stop


@functools.cache
def _ipython_usage_error() -> type[UsageError]:
    """graphwatch's ``UsageError`` that is also IPython's (IPython shows its message alone, no traceback);
    graphwatch's own where IPython is not installed."""
    try:
        from IPython.core.error import UsageError as IPythonUsageError
    except ImportError:
        return UsageError

    class MagicUsageError(UsageError, IPythonUsageError):
        """A misuse of ``%%graphwatch`` / ``%graphwatch``, as IPython reports its magics' misuse."""

    return MagicUsageError


def _misuse(message: str) -> UsageError:
    """The error for a misused magic: IPython's ``UsageError`` and graphwatch's."""
    return _ipython_usage_error()(message)


class _OptionParser(argparse.ArgumentParser):
    """argparse that raises its reason instead of printing it on stderr and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def magic_options(line: str) -> argparse.Namespace:
    """The options of ``%%graphwatch`` / ``%graphwatch start``, as ``graphwatch run`` spells them; a bad
    option is IPython's ``UsageError`` (graphwatch's) with the reason, and nothing printed.

    >>> magic_options("--bogus")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    graphwatch.integrations.notebook...UsageError: %%graphwatch --bogus: unrecognized arguments: --bogus; options: ...
    """
    parser = _OptionParser(prog="%%graphwatch", add_help=False)
    parser.add_argument("action", nargs="?", choices=("start", "stop"))
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--level", choices=LEVELS, default="default")
    parser.add_argument("--out", default=None)
    try:
        return parser.parse_args(shlex.split(line))
    except ValueError as error:  # ours, with argparse's reason, or shlex's ("No closing quotation")
        raise _misuse(f"%%graphwatch {line}: {error}; options: [--strict] [--level LEVEL] [--out DIR]") from None


def graphwatch_magic(line: str, cell: str | None = None) -> Session | None:
    """``%%graphwatch`` (a cell) and ``%graphwatch start|stop`` (a session across cells)."""
    __tracebackhide__ = True  # IPython: the cell's traceback starts at the cell's own lines
    options = magic_options(line)
    if cell is None:
        return _line_magic(options)
    if options.action is not None:
        raise _misuse(f"%%graphwatch {line}: `{options.action}` is for the line magic (%graphwatch start)")
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
            _display_after_cell(shell, _bound(shell, watched.session))
        raise
    if value is not None:
        display(value)
    if watched.owned:
        display(_bound(shell, watched.session))
    return None


def _line_magic(options: argparse.Namespace) -> Session | None:
    global _started
    from IPython import get_ipython

    if options.action == "start":
        if _started is not None:  # started again without a stop: the earlier session ends, and shows
            _started.stop()
            _display_after_cell(get_ipython(), _bound(get_ipython(), _started.session))
        _started = Watched(options.strict, options.level, options.out, summary=False, explicit_steps=False).start()
        return None
    if options.action == "stop":
        started, _started = _started, None
        if started is None:
            raise _misuse("%graphwatch stop: no session was started in this kernel (`%graphwatch start`)")
        started.stop()
        _bound(get_ipython(), started.session)
        return started.session
    raise _misuse("%graphwatch takes `start [options]` or `stop`; %%graphwatch watches one cell")


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


class BoundSession:
    """An ended session as a notebook shows it under a cell: its summary, then the name it is bound to in the
    notebook and what to call on it."""

    def __init__(self, session: Session, name: str) -> None:
        self.session, self.name = session, name

    def _repr_html_(self) -> str:
        trace = self.session.trace
        trace.sources = cited_lines(trace)
        return summary_html(trace, self.name)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(session_text(self.session.trace, "ended", self.name))


def _bound(shell: Any, session: Session | None) -> BoundSession | None:
    """Bind ``session`` to ``gw`` in the notebook's namespace, or to the first of ``gw2``, ``gw3``, ... that is
    free or a session already (a notebook's own ``gw`` is never overwritten); returns it with that name."""
    if session is None:
        return None
    namespace = shell.user_ns
    names = itertools.chain([SESSION_NAME], (f"{SESSION_NAME}{n}" for n in itertools.count(2)))
    name = next(n for n in names if isinstance(namespace.get(n, session), Session))
    namespace[name] = session
    return BoundSession(session, name)


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
