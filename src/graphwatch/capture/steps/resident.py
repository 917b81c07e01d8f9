"""The process's resident set size, read at every step end.

Example::

    >>> from graphwatch.capture.steps.resident import ResidentMemory
    >>> rss = ResidentMemory()
    >>> rss.bytes() > 0
    True
    >>> rss.close()
"""

from __future__ import annotations

import os
import resource


class ResidentMemory:
    """Reads the process's resident set size; keeps /proc/self/statm open (a step end reads it)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def bytes(self) -> int:
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak, where /proc is missing

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
