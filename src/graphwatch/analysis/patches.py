"""A patch for each finding whose fix is mechanical: the edits of its first patchable remedy, as a unified diff
the user can apply.

The diff is made from the remedy's edits (:class:`~graphwatch.model.Edit`), each a syntax-tree change of
the file as it is now (:mod:`.codemods`), never from the fix's sentence.  When one edit cannot be made
safely (the line no longer holds what ran there, the expression is not used there, the file does not
parse), the finding gets no patch: no patch is better than a wrong one.  A fix that needs judgement is a
remedy that is not mechanical, and gets none either.

Diff paths are the finding's cited paths (relative to the session's working folder when the file is inside
it), so ``patch -p0`` applies it from there; a file outside that folder is named as in its own folder, and a
first line says where to apply it (``# in /abs/folder: patch -p0``).

Example::

    >>> from graphwatch.model import Edit, Finding, Remedy
    >>> remedy = Remedy("drop retain_graph=True at nowhere.py:3", [Edit("drop-retain", "nowhere.py", 3)], mechanical=True)
    >>> patch_for(Finding("retained-graph", "warning", 3, "m", remedy.text, remedies=[remedy]), cwd=".") is None
    True
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Iterable
from pathlib import Path

from ..model import Edit, Finding, Trace

# .codemods (LibCST) is imported inside the functions that use it: not at `import graphwatch` (test_import_cost.py)


def add_patches(trace: Trace) -> None:
    """Set ``finding.patch`` for every finding of ``trace`` whose first patchable remedy's edits can be made."""
    cwd = str(trace.options.get("cwd") or ".")
    for finding in trace.findings:
        if finding.patch is None:
            finding.patch = patch_for(finding, cwd)


def patch_for(finding: Finding, cwd: str) -> str | None:
    """The unified diff of ``finding``'s first patchable remedy, or None (no such remedy, or an edit that cannot
    be made safely in the files as they are now)."""
    remedy = next((r for r in finding.remedies if r.patchable), None)
    return None if remedy is None else patch_of(remedy.edits, cwd)


def patch_of(edits: Iterable[Edit], cwd: str) -> str | None:
    """The unified diff that makes ``edits`` (files as the trace cites them, relative to ``cwd``), or None."""
    from .codemods import apply_edits

    by_file: dict[str, list[Edit]] = {}
    for edit in edits:
        by_file.setdefault(edit.file, []).append(edit)
    absolute = {Path(file).parent for file in by_file if Path(file).is_absolute()}
    if absolute and (len(absolute) > 1 or len(absolute) < len({Path(f).parent for f in by_file})):
        return None  # one patch applies in one folder
    diffs = []
    for file, file_edits in by_file.items():
        path = Path(file) if Path(file).is_absolute() else Path(cwd, file)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        edited = apply_edits(source, file_edits)
        if edited is None or edited == source or not _parses(edited):
            return None
        name = path.name if absolute else file  # patch and git apply refuse absolute names
        lines, new = source.splitlines(keepends=True), edited.splitlines(keepends=True)
        diffs.append("".join(difflib.unified_diff(lines, new, fromfile=name, tofile=name, n=2)))
    if not diffs:
        return None
    return "".join(diffs) if not absolute else f"# in {absolute.pop()}: patch -p0\n" + "".join(diffs)


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True
