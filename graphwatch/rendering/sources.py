"""Read the source lines a finding cites, with a few lines of context around each.

Findings cite lines as ``"file:line"`` strings (``evidence["sites"]``).  The
file part is the path as the run saw it: relative to the run's working folder
when the file lies below it.  :func:`read_excerpt` looks for it under each of
the folders it is given (then as is, then in :mod:`linecache`, where a Jupyter
kernel keeps its cells), and returns ``None`` for files that are gone, for
lines past their end and for pseudo-files such as ``<stdin>`` whose text is no
longer in :mod:`linecache`.

Example::

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "train.py"), "w") as fh:
    ...     _ = fh.write("a = 1\\nb = 2\\nc = 3\\nd = 4\\n")
    >>> excerpt = read_excerpt("train.py:3", context=1, roots=[folder])
    >>> excerpt.where, list(excerpt.numbered())
    ('train.py:3', [(2, 'b = 2'), (3, 'c = 3'), (4, 'd = 4')])
    >>> excerpt.merged(read_excerpt("train.py:1", context=0, roots=[folder])).where
    'train.py:1, 3'
    >>> read_excerpt("missing.py:3", roots=[folder]) is None
    True
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cells import cell_lines
from ..model import Finding

CONTEXT_LINES = 3


@dataclass(frozen=True, slots=True)
class SourceExcerpt:
    """Lines ``first .. last`` of ``file`` (named as the finding cites it); ``cited`` are the cited lines."""

    file: str
    cited: tuple[int, ...]
    first: int
    lines: tuple[str, ...]

    @property
    def last(self) -> int:
        return self.first + len(self.lines) - 1

    @property
    def where(self) -> str:
        """``"train.py:18"``, or ``"train.py:18, 20"`` for an excerpt that shows two cited lines."""
        return f"{self.file}:{', '.join(map(str, self.cited))}"

    @property
    def sites(self) -> list[str]:
        """The ``"file:line"`` citations this excerpt shows."""
        return [f"{self.file}:{line}" for line in self.cited]

    def numbered(self) -> Iterator[tuple[int, str]]:
        """(line number, text without its newline) for each line of the excerpt."""
        for offset, text in enumerate(self.lines):
            yield self.first + offset, text.rstrip("\r\n")

    def joins(self, other: SourceExcerpt) -> bool:
        """True when ``other`` shows the same file and overlaps or touches this excerpt."""
        return self.file == other.file and other.first <= self.last + 1 and self.first <= other.last + 1

    def merged(self, other: SourceExcerpt) -> SourceExcerpt:
        """One excerpt showing the lines and citations of both (which :meth:`joins`)."""
        text = dict(zip(range(self.first, self.last + 1), self.lines))
        text.update(zip(range(other.first, other.last + 1), other.lines))
        first = min(text)
        cited = tuple(sorted(set(self.cited) | set(other.cited)))
        return SourceExcerpt(self.file, cited, first, tuple(text[n] for n in range(first, max(text) + 1)))


def parse_where(where: str) -> tuple[str, int] | None:
    """``"dir/train.py:18"`` -> ``("dir/train.py", 18)``; None when it names no line.

    >>> parse_where("C:/x/train.py:7"), parse_where("<unknown>")
    (('C:/x/train.py', 7), None)
    """
    file, sep, line = where.rpartition(":")
    if not sep or not file or not line.isdigit() or int(line) < 1:
        return None
    return file, int(line)


def _source_lines(file: str, roots: Sequence[str | os.PathLike]) -> list[str]:
    if file.startswith("<"):  # <stdin>, <string>, notebook cells: only linecache may still know them
        return linecache.getlines(file)
    path = Path(file)
    candidates = [path] if path.is_absolute() else [Path(root) / path for root in roots] + [path]
    for candidate in candidates:
        if candidate.is_file():
            return linecache.getlines(str(candidate.resolve()))
    return cell_lines(file) or linecache.getlines(file)  # a notebook cell (In[3]): no file, linecache has it


def read_excerpt(
    where: str, context: int = CONTEXT_LINES, roots: Sequence[str | os.PathLike] = ()
) -> SourceExcerpt | None:
    """The cited line of ``where`` (``"file:line"``) with ``context`` lines either side, or None."""
    parsed = parse_where(where)
    if parsed is None:
        return None
    file, line = parsed
    lines = _source_lines(file, roots)
    if line > len(lines):
        return None
    first = max(1, line - context)
    return SourceExcerpt(file, (line,), first, tuple(lines[first - 1 : line + context]))


def cited_excerpts(
    finding: Finding, context: int = CONTEXT_LINES, roots: Sequence[str | os.PathLike] = ()
) -> list[SourceExcerpt]:
    """The lines a finding cites (``evidence["sites"]``) that can still be read, in the order cited.

    Citations close together in one file share an excerpt.

    >>> finding = Finding("retained-graph", "warning", 0, "m", "f", {"sites": ["<unknown>", "gone.py:3"]})
    >>> cited_excerpts(finding)
    []
    """
    excerpts: list[SourceExcerpt] = []
    for where in dict.fromkeys(finding.evidence.get("sites") or []):
        excerpt = read_excerpt(str(where), context, roots)
        if excerpt is None:
            continue
        near = next((i for i, shown in enumerate(excerpts) if shown.joins(excerpt)), None)
        if near is None:
            excerpts.append(excerpt)
        else:
            excerpts[near] = excerpts[near].merged(excerpt)
    return excerpts
