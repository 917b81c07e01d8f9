"""All of a run's patches as one file that ``patch -p0`` applies (``graphwatch run --patch-out FILE``).

Each finding's patch is a unified diff of the file as the run found it.  Two
findings may patch one file (a retained graph and a missing ``zero_grad()`` of
one loop), and two diffs made from the same original do not apply one after
the other where one's context holds a line the other changes.  So each
patch's hunks are read as changes of the original file's lines (found in the
file as it is on disk), the changes of all patches are made together, and one
diff per file is written from the file to the result.  A patch whose lines are
not in the file (edited since the run), or that changes lines an earlier patch
changes, is left out whole, and a comment line at the top says so (``patch``
skips text before a diff).  So is a patch whose check failed (``graphwatch run --check-fixes``), never
offered as the fix to apply; patches no check ran for are said to be unchecked.

Example::

    >>> import os, tempfile
    >>> from graphwatch.model import Finding
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "train.py"), "w") as source:
    ...     _ = source.write("a = 1\\nb = 2\\nc = 3\\n")
    >>> first = "--- train.py\\n+++ train.py\\n@@ -1,2 +1,2 @@\\n-a = 1\\n+a = 10\\n b = 2\\n"
    >>> second = "--- train.py\\n+++ train.py\\n@@ -2,2 +2,2 @@\\n b = 2\\n-c = 3\\n+c = 30\\n"
    >>> findings = [Finding("k", "warning", 0, "m", "f", patch=p) for p in (first, second)]
    >>> print(combined_patch(findings, folder), end="")
    # graphwatch: 2 patches of 1 file; apply from the run's folder with: patch -p0 < THIS_FILE
    # unchecked: `graphwatch run --check-fixes` re-runs it
    --- train.py
    +++ train.py
    @@ -1,3 +1,3 @@
    -a = 1
    +a = 10
     b = 2
    -c = 3
    +c = 30
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.evidence import counted
from ..model import Finding, PatchCheck
from .patch_checks import UNCHECKED, failed_warning
from .visible import one_line, patch_warning

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")
_FOLDER = re.compile(r"^# in (?P<folder>.+): patch -p0$")
_NAME_LINES = ("--- ", "+++ ", "*** ", "Index: ")  # the lines that name the file a diff changes (unified, context)


@dataclass
class _FileDiff:
    """One file's part of a patch: the lines before its diff (``# in FOLDER: patch -p0``), its two header
    lines, and its hunks (each the old start line and the hunk's body lines)."""

    preamble: list[str]
    header: list[str]
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.header[0][4:].split("\t")[0].strip()

    @property
    def folder(self) -> str | None:
        found = next((m for line in self.preamble if (m := _FOLDER.match(line))), None)
        return found.group("folder") if found else None


def _file_diffs(patch: str) -> list[_FileDiff]:
    """The per-file parts of a unified diff (text outside them is kept as the next part's preamble)."""
    parts: list[_FileDiff] = []
    preamble: list[str] = []
    lines = patch.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            parts.append(_FileDiff([p.rstrip("\n") for p in preamble], [line, lines[i + 1]]))
            preamble = []
            i += 2
        elif (match := _HUNK.match(line)) and parts:
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i][:1] in (" ", "-", "+", "\\"):
                body.append(lines[i])
                i += 1
            parts[-1].hunks.append((int(match.group(1)), body))
        else:
            preamble.append(line)
            i += 1
    return parts


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` names ``folder`` or a path under it, by the names alone (nothing is read from disk)."""
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def outside_warning(patch: str, cwd: str | None) -> str | None:
    """Why ``patch`` must not be offered for applying because of where it writes: it names a file by an absolute
    path or through ``..``, or its ``# in DIR: patch -p0`` line names a folder outside ``cwd`` (the run's
    folder; None when it is not known: then any such line), or None.

    >>> outside_warning("# in /etc: patch -p0\\n--- passwd\\n+++ passwd\\n", "/home/me/run")
    'this patch changes files outside the folder the run ran in (/etc); read it before applying it by hand'
    >>> outside_warning("--- train.py\\n+++ train.py\\n", "/home/me/run") is None
    True
    """
    outside = []
    for line in patch.splitlines():  # every line that could name a file to ``patch`` (a removed "-- x" line too)
        folder = _FOLDER.match(line)
        if folder is not None:
            inside = cwd is not None and os.path.isabs(folder["folder"]) and _inside(folder["folder"], cwd)
            outside += [] if inside else [folder["folder"]]
        elif line.startswith(_NAME_LINES):
            name = line.split(" ", 1)[1].split("\t")[0].strip()
            outside += [name] if os.path.isabs(name) or ".." in name.split("/") else []
    if not outside:
        return None
    named = ", ".join(dict.fromkeys(outside))
    return f"this patch changes files outside the folder the run ran in ({named}); read it before applying it by hand"


def not_for_copying(patch: str, cwd: str | None, check: PatchCheck | None = None) -> str | None:
    """Why ``patch`` must not be offered for copying (:func:`~graphwatch.rendering.visible.patch_warning`:
    characters that hide what it does; :func:`outside_warning`: where it writes;
    :func:`~graphwatch.rendering.patch_checks.failed_warning`: its ``check`` failed), or None when it may be."""
    return patch_warning(patch) or outside_warning(patch, cwd) or failed_warning(check)


Change = tuple[int, int, list[str]]  # lines [start, end) of the original file, and the lines that replace them


def _changes(original: list[str], hunks: list[tuple[int, list[str]]]) -> list[Change] | None:
    """What ``hunks`` change in ``original``, each found at its line (else at the one other place its old lines
    are), as changes of the original's lines without their context; None when a hunk is not in the file."""
    changes: list[Change] = []
    for start, body in hunks:
        rows: list[tuple[str, str]] = []  # (" ", "-" or "+", the line)
        for line in body:
            if line.startswith("\\"):  # "\ No newline at end of file": the line before ends without one
                rows[-1] = (rows[-1][0], rows[-1][1].rstrip("\n"))
            else:
                rows.append((line[:1], line[1:]))
        old = [text for op, text in rows if op != "+"]
        at = start - 1 if old else start  # a hunk with no old lines names the line it inserts after
        if original[at : at + len(old)] != old:
            places = [i for i in range(len(original) - len(old) + 1) if original[i : i + len(old)] == old]
            if len(places) != 1 or not old:
                return None
            at = places[0]
        pending: Change | None = None
        for op, text in rows:
            if op == " ":
                if pending is not None:
                    changes.append(pending)
                    pending = None
                at += 1
                continue
            pending = pending or (at, at, [])
            if op == "-":
                pending = (pending[0], pending[1] + 1, pending[2])
                at += 1
            else:
                pending[2].append(text)
        if pending is not None:
            changes.append(pending)
    return changes


def _overlap(a: Change, b: Change) -> bool:
    """Whether two different changes touch the same lines: two replacements that share a line, an insertion
    inside a replaced range, or two insertions at one place (which first is not known).

    >>> _overlap((3, 5, ["x"]), (4, 6, ["y"])), _overlap((3, 5, ["x"]), (5, 5, ["y"])), _overlap((4, 4, ["x"]), (3, 5, []))
    (True, False, True)
    """
    if a == b:
        return False
    (a_start, a_end, _), (b_start, b_end, _) = a, b
    if a_start == a_end and b_start == b_end:
        return a_start == b_start
    if a_start == a_end:
        return b_start < a_start < b_end
    if b_start == b_end:
        return a_start < b_start < a_end
    return a_start < b_end and b_start < a_end


def _applied(original: list[str], changes: list[Change]) -> list[str]:
    """``original`` with ``changes`` (which do not overlap) made, from the last line up."""
    result = list(original)
    for start, end, new in sorted(set((s, e, tuple(n)) for s, e, n in changes), reverse=True):
        result[start:end] = new
    return result


def _parts_by_file(patches: Sequence[str]) -> dict[tuple[str | None, str], list[_FileDiff]]:
    """The per-file parts of ``patches``, by (the folder a ``# in FOLDER`` line names, the file's path)."""
    by_file: dict[tuple[str | None, str], list[_FileDiff]] = {}
    for patch in patches:
        for part in _file_diffs(patch):
            by_file.setdefault((part.folder, part.path), []).append(part)
    return by_file


def _first_per_patch(findings: Sequence[Finding]) -> list[Finding]:
    """The first finding of each distinct patch (findings that share one are checked once)."""
    first: dict[str, Finding] = {}
    for finding in findings:
        if finding.patch:
            first.setdefault(finding.patch, finding)
    return list(first.values())


def _named(finding: Finding) -> str:
    """A finding as a comment line names it: its kind and the line it cites first."""
    sites = finding.evidence.get("sites") or []
    return f"{finding.kind}{f' at {sites[0]}' if sites else ''}"


def patched_files(findings: Sequence[Finding], cwd: str | Path) -> list[Path]:
    """The files the patches of ``findings`` change, found from ``cwd`` (the run's folder) as
    :func:`combined_patch` reads them.

    >>> patched_files([Finding("k", "warning", 0, "m", "f", patch="--- a.py\\n+++ a.py\\n")], "/run")
    [PosixPath('/run/a.py')]
    """
    patches = list(dict.fromkeys(f.patch for f in findings if f.patch))
    return [Path(folder or cwd) / path for folder, path in _parts_by_file(patches)]


def combined_patch(findings: Sequence[Finding], cwd: str | Path) -> str:
    """One text with every distinct patch of ``findings``, per file one diff from the file on disk (found from
    ``cwd``, the run's folder, where the patches' paths start) to all its patches applied; first a comment
    line saying how many, how to apply it, and which patches were left out and why (or, with no finding at
    all, that there is nothing to patch).

    >>> combined_patch([], ".")
    '# graphwatch: nothing to patch: the run had no finding\\n'
    """
    if not findings:
        return "# graphwatch: nothing to patch: the run had no finding\n"
    notes = [f"# left out: the patch of {one_line(_named(f))}, whose check failed: {one_line('; '.join(f.check.failed))}"
             for f in _first_per_patch(findings) if f.check is not None and not f.check.checked]
    patches = list(dict.fromkeys(f.patch for f in findings if f.patch and failed_warning(f.check) is None))
    if any(f.check is None for f in findings if f.patch in patches):
        notes.append(f"# {UNCHECKED}")
    diffs: list[str] = []
    for (folder, path), parts in _parts_by_file(patches).items():
        file = Path(folder or cwd) / path
        try:
            original = file.read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError) as exc:
            notes.append(f"# left out: the patch of {file}, which cannot be read ({exc.__class__.__name__})")
            continue
        accepted: list[Change] = []
        for part in parts:  # each patch whole or not at all
            changes = _changes(original, part.hunks)
            if changes is None:
                notes.append(f"# left out: a patch of {path} whose lines are not in the file as it is now")
            elif any(_overlap(a, b) for a in changes for b in accepted):
                notes.append(f"# left out: a patch of {path} that changes lines an earlier one changes")
            else:
                accepted += changes
        current = _applied(original, accepted)
        if current == original:
            continue
        header = [f"# in {folder}: patch -p0\n"] if folder else []
        body = [line if line.endswith("\n") else f"{line}\n\\ No newline at end of file\n"
                for line in list(difflib.unified_diff(original, current, n=3))[2:]]
        diffs.append("".join(header + parts[0].header + body))  # the patches' own header lines
    files = counted(len(diffs), "file")
    elsewhere = " (a file outside that folder says where its own part applies)" if any(d.startswith("# in ") for d in diffs) else ""
    head = (
        f"# graphwatch: {len(patches)} patch{'es' * (len(patches) != 1)} of {files}; apply from the run's folder with: "
        f"patch -p0 < THIS_FILE{elsewhere}\n"
        if diffs else "# graphwatch: no patches to apply\n" if notes
        else "# graphwatch: no patches (no finding's fix is one edit graphwatch can make safely)\n"
    )
    return head + "".join(f"{note}\n" for note in notes) + "".join(diffs)
