"""Find the user's line that is running now, cheaply, and intern it as a CallSite id.

"User code" is any frame whose file is not part of torch, of graphwatch or of
Python's standard library.  The walk uses ``sys._getframe`` and caches, per code
object, whether it is user code, so a lookup costs a few attribute reads per
frame (never ``traceback.extract_stack``).

Example::

    >>> from graphwatch.capture.lines.callsite import SiteTable
    >>> table = SiteTable()
    >>> site_id = table.here()
    >>> table.sites[site_id].function
    '<module>'
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
from types import CodeType, FrameType

import torch

from ...cells import cell_name
from ...model import CallSite

_GRAPHWATCH_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INTERNAL_PREFIXES = (_TORCH_DIR, _GRAPHWATCH_DIR)

# A site records the innermost user frame and its nearest user caller.
_PACKAGE, _OWN = 1, 2  # an installed package's code, the user's own (0: torch's, graphwatch's, Python's)


def is_user_file(filename: str) -> bool:
    """True for a file that is neither torch's, graphwatch's nor Python's standard library."""
    if filename.startswith("<"):  # <stdin>, <string> and notebooks are user code; <frozen ...> is not
        return not filename.startswith("<frozen")
    if not os.path.isabs(filename):  # relative to the working directory, as os.path.abspath makes it
        filename = os.path.join(os.getcwd(), filename)
    return _is_user_path(filename)


@functools.lru_cache(maxsize=4096)
def _is_user_path(filename: str) -> bool:
    """:func:`is_user_file` of an absolute path (once per path: a step end's holder search asks per value)."""
    path = os.path.abspath(filename)
    if path.startswith(_INTERNAL_PREFIXES):
        return False
    return not path.startswith(_STDLIB_DIR) or in_installed_package(path)


def in_installed_package(filename: str) -> bool:
    """Whether ``filename`` lies in an installed package (a ``site-packages`` or ``dist-packages`` folder).

    >>> in_installed_package("/venv/lib/python3.11/site-packages/accelerate/optimizer.py"), in_installed_package("train.py")
    (True, False)
    """
    return "-packages" + os.sep in filename


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when it lies below it; an installed package's file
    from its package folder on (``lightning/pytorch/core/module.py``: a framework's line, named as its
    tracebacks' readers know it; :mod:`linecache` still finds it through ``sys.path``); a Jupyter cell as
    IPython names it (``In[3]``, see :mod:`graphwatch.cells`).

    >>> display_path("/venv/lib/python3.11/site-packages/lightning/pytorch/core/module.py")
    'lightning/pytorch/core/module.py'
    """
    cell = cell_name(filename)  # a notebook cell: In[3], as IPython's tracebacks say
    if cell is not None:
        return cell
    for packages in ("site-packages", "dist-packages"):
        head, sep, tail = filename.rpartition(os.sep + packages + os.sep)
        if sep and head and tail:
            return tail
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def outer_frame(depth: int) -> FrameType | None:
    """``sys._getframe(depth)`` as seen from the caller, or None where the stack is not that deep (a hook
    that torch calls on a thread of its own: a TorchScript fork, the engine's device threads)."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:  # "call stack is not deep enough"
        return None


class SiteTable:
    """Interns user call sites; ``sites[i]`` is the CallSite with id ``i``.

    A lookup keys on ``(id(code), f_lasti)`` of each user frame: both are plain
    attribute reads, where hashing a code object or reading ``f_lineno`` costs
    about a microsecond each.  Lines are read only the first time a position is seen.
    """

    def __init__(self, sites: list[CallSite] | None = None) -> None:
        self.sites: list[CallSite] = sites if sites is not None else []
        self._ids: dict[tuple, int] = {}  # ((code, line), ...) -> site id
        self._positions: dict[tuple, int] = {}  # (id(code), f_lasti, ...) -> site id
        self._user_code: dict[int, int] = {}  # id(code) -> 0, _PACKAGE or _OWN
        self._codes: list[CodeType] = []  # keeps the codes alive, so that their ids stay theirs
        self._in_packages: set[int] = set()  # ids of the sites whose line is in an installed package's file

    def here(self, skip: int = 1) -> int | None:
        """Id of the innermost user frame's site (with its user callers), or None if there is none.

        ``skip``: how many frames above this call the walk starts (1: the caller's frame).  A hook that
        torch calls on a thread of its own (a TorchScript fork, the autograd engine's device threads)
        may have fewer than ``skip`` frames above it: that is no user frame either.  (The pack hook's
        lookup, once per op: one walk up the stack and one dict lookup when the position is known.)"""
        try:
            frame = sys._getframe(skip)
        except ValueError:  # "call stack is not deep enough"
            return None
        return self._walk(frame, None, None)

    def at(self, positions: tuple[int, ...], frame: FrameType | None) -> int | None:
        """:meth:`here` for the user frames above ``frame`` whose ``positions`` were read already
        (:meth:`~graphwatch.capture.steps.loop_steps.LoopSteps.positions`): a dict lookup once the position is known."""
        site_id = self._positions.get(positions[:4])
        return site_id if site_id is not None or not positions else self._walk(frame, None, None)

    def from_frame(self, frame: FrameType | None, line: int | None = None) -> int | None:
        """Like :meth:`here`, starting the walk at ``frame`` (at ``line`` instead of its current line)."""
        if frame is None:
            return None
        if line is None:
            return self._walk(frame, None, None)
        return self._walk(frame.f_back, frame, line)

    def from_code(self, code: CodeType, line: int) -> int:
        """The site id of ``line`` in ``code``'s function, with no caller (a line not running now)."""
        return self._intern(((code, line),))

    def from_file(self, filename: str, line: int) -> int:
        """The site id of ``line`` of a module's own code (a script that has finished running)."""
        return self.from_code(compile("", filename, "exec"), line)

    def _walk(self, frame: FrameType | None, inner: FrameType | None, line: int | None) -> int | None:
        """The site id of ``inner`` (else of the first user frame from ``frame`` outwards) and of its
        nearest user caller, found from ``frame`` outwards; ``line``: ``inner``'s line, instead of the one
        it runs now.  The user's own frames first: a frame of an installed package (transformers' model
        code, Lightning's loop) is skipped for the user's line that led into it, and counts only when no
        frame is the user's own (its key then marked, so that a stack with the user's frames never finds it).
        The hot loop: per frame, an ``id``, a dict lookup and ``f_back``."""
        found, caller = self._frames(frame, inner, _OWN)
        marker: tuple[int, ...] = ()
        if found is None:
            (found, caller), marker = self._frames(frame, inner, _PACKAGE), (-1,)
        if found is None:
            return None
        at = found.f_lasti if line is None else -line
        if caller is None:
            position: tuple[int, ...] = (id(found.f_code), at, *marker)
        else:
            position = (id(found.f_code), at, id(caller.f_code), caller.f_lasti, *marker)
        site_id = self._positions.get(position)
        if site_id is None:
            site_id = self._site([found] if caller is None else [found, caller], position, line)
        return site_id

    def _frames(
        self, frame: FrameType | None, inner: FrameType | None, least: int
    ) -> tuple[FrameType | None, FrameType | None]:
        """(``inner``, else the first frame from ``frame`` outwards whose code is at least ``least``
        (:data:`_OWN`: the user's own, :data:`_PACKAGE`: an installed package's too), and its nearest such caller)."""
        user_code = self._user_code
        while frame is not None:
            code = frame.f_code
            kind = user_code.get(id(code))
            if kind is None:
                kind = self._classify(code)
            if kind >= least:
                if inner is not None:
                    return inner, frame  # ``frame`` is inner's caller
                inner = frame
            frame = frame.f_back
        return inner, None

    def _site(self, frames: list[FrameType], position: tuple[int, ...], line: int | None) -> int:
        """The site id of a chain of user frames (innermost first) at a position not seen before: from
        their lines, read once per position."""
        lines = [frame.f_lineno for frame in frames]
        if line is not None:
            lines[0] = line
        chain = tuple((frame.f_code, n) for frame, n in zip(frames, lines))
        site_id = self._positions[position] = self._intern(chain)
        return site_id

    def _classify(self, code: CodeType) -> int:
        self._codes.append(code)
        filename = code.co_filename
        kind = self._user_code[id(code)] = (
            (_PACKAGE if in_installed_package(filename) else _OWN) if is_user_file(filename) else 0
        )
        return kind

    def _intern(self, chain: tuple[tuple[CodeType, int], ...]) -> int:
        caller = self._intern(chain[1:]) if len(chain) > 1 else None
        site_id = self._ids.get(chain)
        if site_id is not None:
            return site_id
        code, line = chain[0]
        source = linecache.getline(code.co_filename, line).strip()
        self.sites.append(CallSite(display_path(code.co_filename), line, code.co_name, source, caller))
        site_id = self._ids[chain] = len(self.sites) - 1
        if in_installed_package(code.co_filename):
            self._in_packages.add(site_id)
        return site_id

    def in_package(self, site_id: int | None) -> bool:
        """Whether site ``site_id``'s line is in an installed package (a framework's loop: Lightning's, a
        Trainer's), not the user's own code."""
        return site_id in self._in_packages

    def users_own(self, site_id: int | None, frame: FrameType | None) -> int | None:
        """``site_id`` (a site found from ``frame``), unless its line is in an installed package and a frame
        from ``frame`` outwards is the user's own code: then the site of the innermost such frame and its
        nearest such caller (a backward Lightning's loop calls is named by the user's ``trainer.fit(...)``; one
        a ``training_step`` calls through ``self.manual_backward(...)``, by that line).

        >>> table = SiteTable()
        >>> table.users_own(None, sys._getframe()) is None, table.sites[table.users_own(table.here(), sys._getframe())].function
        (True, '<module>')
        """
        if not self.in_package(site_id):
            return site_id
        frames: list[FrameType] = []
        while frame is not None and len(frames) < 2:
            filename = frame.f_code.co_filename
            if is_user_file(filename) and not in_installed_package(filename):
                frames.append(frame)
            frame = frame.f_back
        return self._intern(tuple((f.f_code, f.f_lineno) for f in frames)) if frames else site_id
