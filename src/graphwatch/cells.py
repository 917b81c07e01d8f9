"""Jupyter cells named as IPython names them in its tracebacks (``In[3]``), and read back by that name.

A kernel compiles each cell under a file name of its own (``/tmp/ipykernel_812/2851938562.py``) that exists
on no disk; its text is in :mod:`linecache`.  Findings cite ``In[3]:5`` instead, and the report reads the
cited lines back from the cell.  Outside a kernel both functions find nothing.

Example::

    >>> cell_name("train.py") is None, cell_lines("In[3]")
    (True, [])
"""

from __future__ import annotations

import linecache
import re
import sys
from typing import Any

_CELL = re.compile(r"In\[\d+\]")


def cell_name(filename: str) -> str | None:
    """``"In[3]"`` for the file name of a cell the running IPython kernel compiled, else None."""
    ipython: Any = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    format_code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    named = format_code_name(filename) if callable(format_code_name) else None
    return named[1] if isinstance(named, tuple) and len(named) == 2 and isinstance(named[1], str) else None


def cell_lines(name: str) -> list[str]:
    """The lines of the cell IPython names ``name`` (``"In[3]"``), from :mod:`linecache`; [] when unknown."""
    if not _CELL.fullmatch(name):
        return []
    # the last one of that name: a cell magic (%%graphwatch) compiles its body under the cell's number too
    found = [filename for filename in list(linecache.cache) if cell_name(filename) == name]
    return linecache.getlines(found[-1]) if found else []
