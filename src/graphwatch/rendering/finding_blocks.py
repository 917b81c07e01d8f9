"""The findings as the terminal summary shows them: each finding's kind, steps, message, fix, patch (or a line
pointing at it, printed below, exactly as it is) and its check's line, every string from a trace made printable.

:mod:`graphwatch.rendering.terminal` (the summary) and :mod:`graphwatch.rendering.ranks` (the ranks of a job)
compose these lines; :class:`Verbatim` blocks are written past rich (``terminal.print_blocks``).

Example::

    >>> from graphwatch.model import Finding
    >>> [type(part).__name__ for part in finding_lines(Finding("retained-graph", "warning", 3, "m", "f"))]
    ['Text', 'Padding', 'Padding']
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.segment import Segment
from rich.text import Text

from ..model import Finding
from .patch_checks import check_text
from .patch_file import not_for_copying
from .visible import visible
from .wording import cited_sites, finding_steps, steps_text

_LINE_BREAKS = re.compile("[\t\n]")  # what :func:`visible` leaves as they are; a printed path shows them escaped
_SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}
_SEVERITY_MARK = {"error": "✖", "warning": "▲", "info": "●"}


def finding_lines(
    finding: Finding, note: str = "", in_error: bool = False, patch_above: str | None = None,
    patch_number: int | None = None, cwd: str | None = None,
) -> Iterator[RenderableType]:
    """One finding as the summary shows it: kind and steps (and ``note``, e.g. ``only on rank 1``), message, fix,
    patch, lines.

    ``in_error``: the error that ended the run holds the explanation; one line points at it.
    ``patch_above``: the kind of a finding printed above with the same patch (it is not printed again).
    ``patch_number``: the patch is printed below, outside any box, as that number (:func:`patch_blocks`); only
    a line points at it.  Otherwise the patch follows, exactly as it is (:class:`Verbatim`), unless it is not
    to be copied (:func:`~graphwatch.rendering.patch_file.not_for_copying`; ``cwd``: the run's folder).

    >>> [type(part).__name__ for part in finding_lines(Finding("retained-graph", "warning", 3, "m", "f"))]
    ['Text', 'Padding', 'Padding']
    """
    mark = _SEVERITY_MARK.get(finding.severity, "●")
    yield Text.assemble(
        (f"{mark} {printable(finding.kind)}", _SEVERITY_STYLE.get(finding.severity, "bold")),
        (f"  {printable(note)}", "bold magenta") if note else "",
        (f"  {steps_text(finding_steps(finding))}", "dim"),
    )
    if in_error:
        yield Padding(Text("explained, with its fixes, in the error that ended the run (its traceback)"), (0, 0, 0, 2), expand=False)
    else:
        yield Padding(Text(printable(finding.message)), (0, 0, 0, 2), expand=False)
    if not in_error and finding.fix not in finding.message:  # an explanation lists its fixes: not again
        yield Padding(Text.assemble(("fix: ", "bold green"), printable(finding.fix)), (0, 0, 0, 2), expand=False)
    warning = not_for_copying(finding.patch, cwd, finding.check) if finding.patch else None
    if finding.patch and warning is not None:  # never offered for copying: shown marked, in the box
        head = f"patch, not for copying: {warning}; it is shown as text, any hidden character marked:"
        yield Padding(Text(head, style="bold red"), (0, 0, 0, 2), expand=False)
        yield Padding(diff_text(finding.patch), (0, 0, 0, 4), expand=False)
    elif finding.patch and patch_number is not None:
        yield Padding(Text.assemble(("patch: ", "bold green"), f"{patch_number}, printed below"), (0, 0, 0, 2), expand=False)
    elif finding.patch and patch_above:
        above = f"the one under {printable(patch_above)} above"
        yield Padding(Text.assemble(("patch: ", "bold green"), above), (0, 0, 0, 2), expand=False)
    elif finding.patch:
        yield Padding(Text("patch (patch -p0):", style="bold green"), (0, 0, 0, 2), expand=False)
        yield Verbatim(finding.patch)
    if finding.patch and not patch_above:  # checked by graphwatch run --check-fixes, or unchecked
        yield Padding(check_text(finding.check), (0, 0, 0, 2), expand=False)
    sites = cited_sites(finding)
    if sites:
        yield Padding(Text.assemble(("at: ", "bold"), (printable(", ".join(sites)), "cyan")), (0, 0, 0, 2), expand=False)


def findings_lines(
    findings: Sequence[Finding], in_error: Callable[[Finding], bool] | None = None,
    patch_numbers: Mapping[str, int] | None = None, cwd: str | None = None,
) -> Iterator[RenderableType]:
    """Each of ``findings`` by :func:`finding_lines`, a blank line between them; a patch two findings share
    (a backward-twice error and the carried graph behind it) is printed under the first only.
    ``patch_numbers`` (patch -> its number, :func:`numbered_patches`): the patches are printed elsewhere.
    ``cwd``: the folder the run ran in (:func:`finding_lines`).

    >>> f = Finding("retained-graph", "warning", 3, "m", "f", patch="--- a.py\\n+++ a.py\\n")
    >>> [type(part).__name__ for part in findings_lines([f, f])].count("Padding")
    7
    """
    printed: dict[str, str] = {}  # patch -> the kind of the finding it was printed under
    for i, finding in enumerate(findings):
        if i:
            yield Text("")
        number = patch_numbers.get(finding.patch or "") if patch_numbers is not None else None
        yield from finding_lines(
            finding, in_error=bool(in_error and in_error(finding)), patch_above=printed.get(finding.patch or ""),
            patch_number=number, cwd=cwd,
        )
        if finding.patch:
            printed.setdefault(finding.patch, finding.kind)


def numbered_patches(findings: Sequence[Finding], cwd: str | None = None) -> dict[str, int]:
    """Each distinct patch of ``findings`` that may be offered for copying -> its number (1, 2, ...), in the
    findings' order (a patch holding hidden or reordering characters, or writing outside ``cwd``, the run's
    folder, is shown as text under its finding: :func:`~graphwatch.rendering.patch_file.not_for_copying`).

    >>> f = Finding("retained-graph", "warning", 3, "m", "f", patch="--- a.py\\n+++ a.py\\n")
    >>> numbered_patches([f, f, Finding("retained-graph", "warning", 4, "m", "f")])
    {'--- a.py\\n+++ a.py\\n': 1}
    """
    numbers: dict[str, int] = {}
    for finding in findings:
        if finding.patch and finding.patch not in numbers and not_for_copying(finding.patch, cwd, finding.check) is None:
            numbers[finding.patch] = len(numbers) + 1
    return numbers


def patch_blocks(findings: Sequence[Finding], numbers: Mapping[str, int]) -> Iterator[RenderableType]:
    """The patches ``numbers`` names, each under a line that says which finding it fixes, outside any box
    and exactly as they are (:class:`Verbatim`): copied from a terminal or piped into ``patch -p0``, they apply."""
    for patch, number in numbers.items():
        fixed = [f for f in findings if f.patch == patch]
        kinds = ", ".join(dict.fromkeys(f.kind for f in fixed))
        of = f" {number} of {len(numbers)}" if len(numbers) > 1 else ""
        yield Text.assemble(("patch (patch -p0):", "bold green"), f"{of} the fix of {printable(kinds)}")
        yield Verbatim(patch)
        yield Text("")


class Verbatim:
    """Text printed exactly as it is, a patch: not boxed, wrapped, padded, styled or trimmed.

    Rendered by rich (into a console of your own), it is one unstyled, unwrapped line per line;
    :func:`~graphwatch.rendering.terminal.print_blocks` writes it straight to the console's stream, byte for byte, trailing spaces
    included (a diff's context line may end in one).

    >>> import io
    >>> from rich.console import Console
    >>> from graphwatch.rendering.terminal import print_blocks
    >>> console = Console(file=io.StringIO(), width=10, force_terminal=True)
    >>> print_blocks(console, [Verbatim("--- a.py\\n+ a long line, longer than the console  \\n")])
    >>> console.file.getvalue()
    '--- a.py\\n+ a long line, longer than the console  \\n'
    """

    def __init__(self, text: str) -> None:
        self.text = text if text.endswith("\n") else text + "\n"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.text.splitlines():
            yield Segment(line)
            yield Segment.line()


def diff_text(patch: str) -> Text:
    """A unified diff, its added lines green and removed ones red (no wrapping: a diff line is code)."""
    text = Text(no_wrap=True, overflow="ignore")
    for line in patch.rstrip("\n").splitlines():
        style = "green" if line.startswith("+") and not line.startswith("+++") else ""
        style = "red" if line.startswith("-") and not line.startswith("---") else style
        text.append(printable(line) + "\n", style=style or "dim")
    text.rstrip()
    return text


def printable(text: str) -> str:
    """``text`` from a trace (a name, a message, a patch line) as a terminal may show it: every control,
    bidirectional or invisible character written as ``\\u{hex}``, so that no string a trace holds can move
    the cursor, set the terminal's title or reorder a line (:func:`~graphwatch.rendering.visible.visible`).

    >>> printable("loss\\x1b]0;pwned\\x07")
    'loss\\\\u{1b}]0;pwned\\\\u{7}'
    """
    return visible(text)


def printable_path(path: str | os.PathLike[str]) -> str:
    """A path as one line of output: :func:`printable`, and its tabs and newlines written as ``\\u{9}`` and
    ``\\u{a}`` too (a folder name holding a newline must not print a line of its own, one that reads as
    graphwatch's).

    >>> printable_path("rep\\ngraphwatch: no graph leaks")
    'rep\\\\u{a}graphwatch: no graph leaks'
    """
    return _LINE_BREAKS.sub(lambda match: f"\\u{{{ord(match[0]):x}}}", printable(os.fspath(path)))
