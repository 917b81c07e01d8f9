"""Read the user's frames: which frames are the user's, and the values their names hold, without keeping any.

Before Python 3.13 a function frame's ``f_locals`` is a snapshot dict kept on the frame: read carelessly, it
keeps the values it saw alive after the function rebinds them (a graph graphwatch would then hold itself).
Every read here drops that snapshot again, unless someone else holds it.

Example::

    >>> import sys
    >>> from graphwatch.capture.lines.frames import resolve
    >>> class Box:
    ...     size = 3
    ...     broken = property(lambda self: 1 / 0)
    >>> def look():
    ...     box, frame = Box(), sys._getframe()
    ...     return [resolve(frame, f"box.{attr}") for attr in ("size", "missing", "broken")]
    >>> look()
    [3, None, None]
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .callsite import is_user_file

_SNAPSHOT_LOCALS = sys.version_info < (3, 13)


def drop_locals_snapshot(frame: FrameType, local_names: dict) -> None:
    """Before 3.13 a function frame's f_locals is a snapshot dict kept on the frame: it would keep the
    values it saw alive after the function rebinds them.  Empty it, unless someone else holds it: it is
    also what ``locals()`` returned to the user's code (or what a debugger shows), and theirs to keep."""
    if not (_SNAPSHOT_LOCALS and frame.f_code.co_flags & inspect.CO_OPTIMIZED and type(local_names) is dict):
        return
    # the references: the frame's, the caller's variable, this parameter, getrefcount's argument
    if sys.getrefcount(local_names) <= 4:
        local_names.clear()  # the next f_locals or locals() fills it again from the frame


def local_value(frame: FrameType, name: str, default: Any = None) -> Any:
    """One local variable of ``frame``, read without leaving a snapshot of its locals behind."""
    local_names = frame.f_locals
    value = local_names.get(name, default)
    drop_locals_snapshot(frame, local_names)
    return value


def named_values(frame: FrameType) -> Iterator[tuple[str, Any]]:
    """(name, value) of the frame's bound local variables (read one by one: no snapshot of its locals is left
    behind), then of its globals that no local name shadows."""
    code = frame.f_code
    local_names = dict.fromkeys((*code.co_varnames, *code.co_cellvars, *code.co_freevars))
    for name in local_names:
        value = local_value(frame, name)
        if value is not None:
            yield name, value
    for name, value in list(frame.f_globals.items()):
        if not name.startswith("__") and name not in local_names:
            yield name, value

def resolve(frame: FrameType | None, name: str, names: dict | None = None) -> Any:
    """The value of the dotted ``name`` in ``frame`` (locals, then globals), or None; without a frame, in
    ``names`` (a finished script's globals)."""
    head, *attrs = name.split(".")
    if frame is None:
        value = (names or {}).get(head)
    elif head in frame.f_code.co_varnames or head in frame.f_code.co_cellvars or head in frame.f_code.co_freevars:
        value = local_value(frame, head)
    else:
        value = frame.f_globals.get(head)
    for attr in attrs:
        try:
            value = getattr(value, attr, None)
        except Exception:  # a property of the user's that raises: no value (and no error in their run)
            return None
    return value


def user_frames(start: FrameType | None) -> Iterator[FrameType]:
    """The user frames on the stack, innermost first."""
    frame = start
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            yield frame
        frame = frame.f_back
