"""Find the user's line that is running now, cheaply, and intern it as a CallSite id.

"User code" is any frame whose file is not part of torch, of graphwatch or of
Python's standard library.  The walk uses ``sys._getframe`` and caches, per code
object, whether it is user code, so a lookup costs a few attribute reads per
frame (never ``traceback.extract_stack``).

Example::

    >>> from graphwatch.capture.callsite import SiteTable
    >>> table = SiteTable()
    >>> site_id = table.here()
    >>> table.sites[site_id].function
    '<module>'
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from types import CodeType, FrameType

import torch

from ..model import CallSite

_GRAPHWATCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INTERNAL_PREFIXES = (_TORCH_DIR, _GRAPHWATCH_DIR)

# How many user frames a site records (the innermost and its user callers).
CHAIN_DEPTH = 2


def is_user_file(filename: str) -> bool:
    """True for a file that is neither torch's, graphwatch's nor Python's standard library."""
    if filename.startswith("<"):  # <stdin>, <string> and notebooks are user code; <frozen ...> is not
        return not filename.startswith("<frozen")
    path = os.path.abspath(filename)
    if path.startswith(_INTERNAL_PREFIXES):
        return False
    return not path.startswith(_STDLIB_DIR) or "-packages" + os.sep in path


def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when it lies below it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


class SiteTable:
    """Interns user call sites; ``sites[i]`` is the CallSite with id ``i``."""

    def __init__(self, sites: list[CallSite] | None = None) -> None:
        self.sites: list[CallSite] = sites if sites is not None else []
        self._ids: dict[tuple, int] = {}
        self._user_code: dict[CodeType, bool] = {}

    def here(self, skip: int = 1) -> int | None:
        """Id of the innermost user frame's site (with its user callers), or None if there is none."""
        return self.from_frame(sys._getframe(skip))

    def from_frame(self, frame: FrameType | None, line: int | None = None) -> int | None:
        """Like :meth:`here`, starting the walk at ``frame`` (at ``line`` instead of its current line)."""
        user_code = self._user_code
        chain: list[tuple[CodeType, int]] = []
        if frame is not None and line is not None:
            chain.append((frame.f_code, line))
            frame = frame.f_back
        while frame is not None:
            code = frame.f_code
            is_user = user_code.get(code)
            if is_user is None:
                is_user = user_code[code] = is_user_file(code.co_filename)
            if is_user:
                chain.append((code, frame.f_lineno))
                if len(chain) == CHAIN_DEPTH:
                    break
            frame = frame.f_back
        if not chain:
            return None
        key = tuple(chain)
        site_id = self._ids.get(key)
        if site_id is None:
            site_id = self._intern(key)
        return site_id

    def _intern(self, chain: tuple[tuple[CodeType, int], ...]) -> int:
        caller = self._intern(chain[1:]) if len(chain) > 1 else None
        site_id = self._ids.get(chain)
        if site_id is not None:
            return site_id
        code, line = chain[0]
        source = linecache.getline(code.co_filename, line).strip()
        self.sites.append(CallSite(display_path(code.co_filename), line, code.co_name, source, caller))
        site_id = self._ids[chain] = len(self.sites) - 1
        return site_id
