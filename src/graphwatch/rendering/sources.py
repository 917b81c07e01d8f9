"""The source lines a finding cites, with a few lines of context around each, from the trace alone.

Findings cite lines as ``"file:line"`` strings (``evidence["sites"]``).  The
lines themselves were stored in the trace when it was recorded
(:class:`~graphwatch.model.SourceLines`, read by
:func:`graphwatch.capture.lines.source.cited_lines`): rendering a trace reads
nothing from the disk of whoever renders it, so a trace that cites
``/etc/passwd:1`` shows no line of it.  A citation whose lines the trace does
not hold (an older trace, a file the run could not read) has no excerpt.

Example::

    >>> from graphwatch.model import SourceLines
    >>> stored = [SourceLines("train.py", 1, ["a = 1\\n", "b = 2\\n", "c = 3\\n", "d = 4\\n"])]
    >>> excerpt = read_excerpt("train.py:3", stored, context=1)
    >>> excerpt.where, list(excerpt.numbered())
    ('train.py:3', [(2, 'b = 2'), (3, 'c = 3'), (4, 'd = 4')])
    >>> excerpt.merged(read_excerpt("train.py:1", stored, context=0)).where
    'train.py:1, 3'
    >>> read_excerpt("/etc/passwd:1", stored) is None
    True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..model import Finding, SourceLines
from ..model.source_lines import CONTEXT_LINES, parse_where


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


def read_excerpt(where: str, stored: Sequence[SourceLines], context: int = CONTEXT_LINES) -> SourceExcerpt | None:
    """The cited line of ``where`` (``"file:line"``) with up to ``context`` lines either side, from the
    ``stored`` lines of a trace; None when they do not hold it."""
    parsed = parse_where(where)
    if parsed is None:
        return None
    file, line = parsed
    block = next((b for b in stored if b.file == file and b.text(line) is not None), None)
    if block is None:
        return None
    first, last = max(block.first, line - context), min(block.last, line + context)
    return SourceExcerpt(file, (line,), first, tuple(block.lines[first - block.first : last - block.first + 1]))


def cited_excerpts(
    finding: Finding, stored: Sequence[SourceLines], context: int = CONTEXT_LINES
) -> list[SourceExcerpt]:
    """The lines a finding cites (``evidence["sites"]``) that the trace holds, in the order cited.

    Citations close together in one file share an excerpt.

    >>> finding = Finding("retained-graph", "warning", 0, "m", "f", {"sites": ["<unknown>", "gone.py:3"]})
    >>> cited_excerpts(finding, [])
    []
    """
    excerpts: list[SourceExcerpt] = []
    for where in dict.fromkeys(finding.evidence.get("sites") or []):
        excerpt = read_excerpt(str(where), stored, context)
        if excerpt is None:
            continue
        near = next((i for i, shown in enumerate(excerpts) if shown.joins(excerpt)), None)
        if near is None:
            excerpts.append(excerpt)
        else:
            excerpts[near] = excerpts[near].merged(excerpt)
    return excerpts
