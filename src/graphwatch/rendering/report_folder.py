"""The report folder: what a report may write and delete there.

A report writes only inside its own folder, never through a link (:func:`check_pictures_folder`), and deletes only
the snapshots an earlier report wrote and listed in the folder's manifest (:data:`MANIFEST`): not the user's own
files, not a trace JSON the report may be made from.  :func:`write_pictures` lists the new pictures before it writes
them (a crash leaves none unlisted) and :func:`remove_earlier_pictures` removes the earlier ones once the new report
is complete.

Example::

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "report"
    >>> prepare_folder(folder)
    >>> earlier = write_pictures(folder, {"snapshots/a.svg": "<svg/>"})
    >>> earlier, listed(folder)
    ([], ['snapshots/a.svg'])
    >>> remove_earlier_pictures(folder, write_pictures(folder, {"snapshots/b.svg": "<svg/>"}), ["snapshots/b.svg"])
    >>> sorted(p.name for p in (folder / "snapshots").iterdir()), listed(folder)
    (['b.svg'], ['snapshots/b.svg'])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import UsageError
from ..model import write_atomically

MANIFEST = "report-files.json"  # the snapshots a report wrote: the only files a later report deletes


def check_pictures_folder(out_dir: Path) -> None:
    """A :class:`~graphwatch.UsageError` when ``out_dir/snapshots`` is a link or not a folder: a report writes
    (and deletes) only inside its own folder, never through a link to somewhere else.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> (folder / "snapshots").symlink_to(tempfile.mkdtemp())
    >>> check_pictures_folder(folder)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    graphwatch.errors.UsageError: cannot write the report to ...: its snapshots folder is a link ...
    """
    from .finding_blocks import printable_path

    pictures = out_dir / "snapshots"
    if pictures.is_symlink():
        raise _unwritable(
            out_dir, f"its snapshots folder is a link (to {printable_path(os.readlink(pictures))}), and graphwatch "
            "writes only inside the report folder; remove the link or pass another folder"
        )
    if pictures.exists() and not pictures.is_dir():
        raise _unwritable(out_dir, f"{printable_path(pictures)} is a file; move it or pass another folder")


def _unwritable(out_dir: Path, why: str) -> UsageError:
    """The error for a report folder that cannot be written: ``cannot write the report to DIR: WHY`` (DIR as
    one line: :func:`~graphwatch.rendering.finding_blocks.printable_path`)."""
    from .finding_blocks import printable_path

    return UsageError(f"cannot write the report to {printable_path(out_dir)}: {why}")


def prepare_folder(out_dir: Path) -> None:
    check_pictures_folder(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "snapshots").mkdir(exist_ok=True)
    except OSError as exc:
        raise _unwritable(out_dir, f"{exc.strerror or exc}; pass a folder you can write") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise _unwritable(out_dir, "permission denied; pass a folder you can write")


_SNAPSHOT_NAME = re.compile(r"snapshots/[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.svg")


def listed(out_dir: Path) -> list[str]:
    """The snapshot files an earlier report wrote to ``out_dir``, as its manifest lists them ([] without one)."""
    try:
        data = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    files = data.get("files") if isinstance(data, dict) else None
    return [f for f in files if isinstance(f, str) and _SNAPSHOT_NAME.fullmatch(f)] if isinstance(files, list) else []


def write_pictures(out_dir: Path, pictures: Mapping[str, str]) -> list[str]:
    """Write ``pictures`` (``snapshots/NAME.svg`` to SVG text) into ``out_dir``, listed in the manifest before they
    are written, with the pictures an earlier report wrote; return those earlier ones (:func:`listed`)."""
    earlier = listed(out_dir)
    _write_manifest(out_dir, sorted(set(earlier) | set(pictures)))  # listed before written: a crash leaves none unlisted
    for name, svg in pictures.items():
        write_atomically(out_dir / name, svg)
    return earlier


def remove_earlier_pictures(out_dir: Path, earlier: list[str], pictures: list[str]) -> None:
    """The report is complete: remove the ``earlier`` pictures it did not write again, and list only ``pictures``."""
    for name in set(earlier) - set(pictures):
        _remove_snapshot(out_dir, name)
    _write_manifest(out_dir, pictures)


def _write_manifest(out_dir: Path, files: list[str]) -> None:
    write_atomically(out_dir / MANIFEST, json.dumps({"format": "graphwatch-report-files", "files": files}, indent=1))


def _remove_snapshot(out_dir: Path, name: str) -> None:
    """Remove ``out_dir/name`` (a snapshot an earlier report wrote) if it is still a plain file there."""
    path = out_dir / name
    with contextlib.suppress(OSError):
        if path.parent.is_symlink() or path.is_symlink() or not path.is_file():
            return
        path.unlink()
