"""``graphwatch run --patch-out FILE``: where a run's patches may be written, and writing them there.

FILE gets every patch of the run in one file (:func:`~graphwatch.rendering.patch_file.combined_patch`),
written to a temporary file that is then renamed over FILE.  So FILE must be a regular file, or not exist
yet: a symbolic link (``/dev/stdout`` is one), a device (``/dev/null``), a FIFO, a socket or a folder is
refused, never replaced (graphwatch does not write through a link either), and so are the script being run
and every file the run read as source (a file its findings cite, a file a patch changes), which the diff
would overwrite.  What can be known before the script runs is checked then (:func:`check_patch_out`: exit 2,
the script does not run); everything is checked again when the patches are written (:func:`write_patches`).

Example::

    >>> from graphwatch.errors import UsageError
    >>> try:
    ...     check_patch_out("/dev/null", script="train.py")
    ... except UsageError as exc:
    ...     print(str(exc).split(";")[0])
    cannot write the patches to /dev/null: it is a character device, not a regular file
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .errors import UsageError
from .model import Trace

# What a path that is not a regular file is, by its stat.S_IS* test
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)
_FIX = "pass --patch-out a new file, or a regular file that is not part of the run's code"


def refusal(path: Path, sources: Iterable[tuple[Path, str]] = ()) -> str | None:
    """Why the patches must not be written to ``path``, or None: it is a link or not a regular file, or it is
    one of ``sources`` (each a path and what it is, e.g. ``"the script graphwatch runs"``), hard links included.
    A path that does not exist (or cannot be looked at: the folder check says why) is not refused here."""
    from .rendering.finding_blocks import printable_path

    try:
        info = path.lstat()
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"it is a symbolic link (to {printable_path(os.readlink(path))}); graphwatch does not write through links"
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a file")
        return f"it is {kind}, not a regular file"
    for source, what in sources:
        try:
            if os.path.samefile(path, source):
                return f"it is {what}"
        except OSError:  # a source that is gone, or a name that is no file ("<string>")
            continue
    return None


def check_patch_out(name: str, script: str | os.PathLike[str]) -> Path:
    """``--patch-out FILE`` as an absolute path, before the script runs (and can change folder): a UsageError
    when FILE is refused (:func:`refusal`; ``script`` is the script being run) or its folder cannot be written.

    >>> try:
    ...     check_patch_out("/dev/null/fixes.patch", script="train.py")
    ... except UsageError as exc:
    ...     print(str(exc).split(";")[0])
    cannot write the patches to /dev/null/fixes.patch: /dev/null is not a writable folder
    """
    from .rendering.finding_blocks import printable_path

    path = Path(name).absolute()
    why = refusal(path, [(Path(script), "the script graphwatch runs")])
    if why is not None:
        raise UsageError(f"cannot write the patches to {printable_path(name)}: {why}; {_FIX}")
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError:
        raise UsageError(
            f"cannot write the patches to {printable_path(name)}: {printable_path(path.parent)} is not a writable "
            "folder; pass --patch-out a file in a folder you can write"
        ) from None
    return path


def run_sources(trace: Trace, script: Path) -> list[tuple[Path, str]]:
    """The files the run read as source, each with what it is: the script, the files whose lines the trace
    cites, the files its patches change (names relative to the folder the run started in)."""
    from .rendering.patch_file import patched_files

    cwd = Path(str(trace.options.get("cwd") or "."))
    cited = [(cwd / lines.file, "a file the run read as source (its findings cite it)") for lines in trace.sources]
    patched = [(file, "a file the patches change") for file in patched_files(trace.findings, cwd)]
    return [(script, "the script graphwatch ran"), *patched, *cited]


def write_patches(trace: Trace, path: Path, script: Path, quiet: bool) -> None:
    """Write every patch of ``trace`` to ``path`` as one file for ``patch -p0`` (see
    :mod:`graphwatch.rendering.patch_file`); say where on stderr, unless ``quiet``.  A UsageError, and nothing
    written, when ``path`` is refused (:func:`refusal`, against :func:`run_sources`) or cannot be written."""
    from .model.trace_io import write_atomically
    from .rendering.finding_blocks import printable_path
    from .rendering.patch_file import combined_patch

    cwd = str(trace.options.get("cwd") or ".")
    kept = "the patches are still in the report and its trace.json"
    why = refusal(path, run_sources(trace, script))
    if why is not None:
        raise UsageError(f"cannot write the patches to {printable_path(path)}: {why}; nothing was written there; {kept}")
    try:
        write_atomically(path, combined_patch(trace.findings, cwd))
    except UsageError as exc:
        raise UsageError(f"{exc}; {kept}") from None
    if not quiet:
        shown = printable_path(path)
        print(f"patches: {shown} (apply from {printable_path(cwd)}: patch -p0 < {shown})", file=sys.stderr)
