"""The source lines a trace's findings cite, stored in the trace when it is recorded.

A report made from a trace shows the lines its findings cite (with a few lines
of context) from the trace alone: whoever renders a trace someone else
recorded must never have their own files read into it (a trace citing
``/etc/passwd:1`` would otherwise put that file's first line into a report
they then share).  So the session reads the cited lines once, from the disk
of the run it watched, and keeps them as :class:`SourceLines`.

Example::

    >>> block = SourceLines("train.py", 17, ["x = 1\\n", "loss = f(x)\\n", "y = 2\\n"])
    >>> block.last, block.text(18)
    (19, 'loss = f(x)\\n')
    >>> parse_where("C:/x/train.py:7"), parse_where("<unknown>")
    (('C:/x/train.py', 7), None)
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONTEXT_LINES = 3  # lines shown (and stored) either side of a cited line
MAX_LINE_CHARS = 500  # a longer line (minified code, data) is stored cut, with "…"


@dataclass(slots=True)
class SourceLines:
    """Lines ``first`` to ``last`` of ``file`` (named as findings cite it), as the run's file held them."""

    file: str
    first: int
    lines: list[str] = field(default_factory=list)

    @property
    def last(self) -> int:
        return self.first + len(self.lines) - 1

    def text(self, line: int) -> str | None:
        """Line ``line`` of the file, if this block holds it."""
        return self.lines[line - self.first] if self.first <= line <= self.last else None


def parse_where(where: str) -> tuple[str, int] | None:
    """``"dir/train.py:18"`` -> ``("dir/train.py", 18)``; None when it names no line."""
    file, sep, line = where.rpartition(":")
    if not sep or not file or not (line.isascii() and line.isdigit()) or int(line) < 1:
        return None
    return file, int(line)
