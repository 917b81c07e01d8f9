"""Versioned JSON form of a :class:`~graphwatch.model.Trace`, written atomically.

Example::

    >>> import os, tempfile
    >>> from graphwatch.model import Trace, save_trace, load_trace
    >>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
    >>> save_trace(Trace(torch_version="2.13.0"), path)
    >>> load_trace(path).torch_version
    '2.13.0'
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError, UsageError
from .records import (
    BackwardRecord,
    CallSite,
    Finding,
    Holder,
    NodeRecord,
    SavedRecord,
    Snapshot,
    StepRecord,
    Trace,
)

FORMAT = "graphwatch-trace"
VERSION = 1

_LIST_FIELDS: dict[str, type] = {
    "sites": CallSite,
    "backwards": BackwardRecord,
    "steps": StepRecord,
    "findings": Finding,
    "snapshots": Snapshot,
}
_DICT_FIELDS: dict[str, type] = {"nodes": NodeRecord, "saved": SavedRecord}


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _defaults(cls: type) -> dict[str, Any]:
    """Each field's default value (fields without one are always written)."""
    found = _DEFAULTS.get(cls)
    if found is None:
        found = _DEFAULTS[cls] = {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
    return found


def _plain(record: Any) -> dict:
    """A record as a dict, leaving out fields at their default value (a long run writes many steps)."""
    defaults = _defaults(type(record))
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name in defaults and value == defaults[f.name]:
            continue
        if f.name == "holders":
            value = [_plain(h) for h in value]
        out[f.name] = value
    return out


def trace_to_dict(trace: Trace) -> dict:
    """The JSON-ready form of a trace (a dict of lists of dicts)."""
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    for f in dataclasses.fields(trace):
        value = getattr(trace, f.name)
        if f.name in _LIST_FIELDS:
            value = [_plain(r) for r in value]
        elif f.name in _DICT_FIELDS:
            value = [_plain(r) for r in value.values()]
        out[f.name] = value
    return out


def _build(cls: type, row: dict, where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        if not isinstance(row, dict):
            raise TypeError(f"expected an object, got {type(row).__name__}")
        record = cls(**{k: v for k, v in row.items() if k in names})
        # JSON turns tuples into lists and int keys into strings: undo both.
        for name in ("nodes_alive_by_step", "saved_alive_by_step"):
            if hasattr(record, name):
                setattr(record, name, {int(k): v for k, v in getattr(record, name).items()})
        if isinstance(record, SavedRecord):
            record.shape = tuple(record.shape)
        if isinstance(record, BackwardRecord):
            record.crossings = [tuple(c) for c in record.crossings]
        if isinstance(record, StepRecord):
            record.holders = [_build(Holder, h, where) for h in record.holders]
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"{where}: {exc}; the trace file is damaged - record the run again") from None
    return record


def trace_from_dict(data: Any, source: str = "trace") -> Trace:
    """Rebuild a :class:`Trace` from :func:`trace_to_dict` output, checking format and version."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceFormatError(
            f"{source} is not a graphwatch trace (no \"format\": \"{FORMAT}\" field); "
            "pass a trace.json written by graphwatch (gw.save(path) or gw.report(dir))"
        )
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceFormatError(
            f"{source} has no valid trace version ({version!r}); the trace file is damaged - record the run again"
        )
    if version > VERSION:
        raise TraceFormatError(
            f"{source} has trace version {version!r}, newer than this graphwatch reads ({VERSION}); "
            "upgrade graphwatch (pip install -U graphwatch) to read it"
        )
    trace = Trace()
    for f in dataclasses.fields(trace):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in _LIST_FIELDS:
            value = [_build(_LIST_FIELDS[f.name], row, f"{source}: {f.name}") for row in _rows(value, f.name, source)]
        elif f.name in _DICT_FIELDS:
            rows = [_build(_DICT_FIELDS[f.name], row, f"{source}: {f.name}") for row in _rows(value, f.name, source)]
            value = {r.id: r for r in rows}
        setattr(trace, f.name, value)
    return trace


def _rows(value: Any, name: str, source: str) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
        raise TraceFormatError(f"{source}: field {name!r} should be a list of objects; the trace file is damaged - record the run again")
    return value


def save_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write ``trace`` to ``path`` as JSON, atomically: a reader sees the old file or the whole new one."""
    write_atomically(Path(path), json.dumps(trace_to_dict(trace), separators=(",", ":")))


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename it."""
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"cannot write {path}: folder {folder} does not exist; create it or choose another path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(
            f"cannot write {path}: {exc.strerror}; choose a writable folder (e.g. --out /tmp/graphwatch)"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise UsageError(f"cannot write {path}: {exc.strerror}; free some space or choose another folder") from None
        raise


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once, at import: os.umask can only be read by setting it


def load_trace(path: str | os.PathLike) -> Trace:
    """Read a trace written by :func:`save_trace`; a clear :class:`TraceFormatError` otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceFormatError(f"{path} does not exist; pass the trace.json a session wrote") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read {path}: {exc}; pass the trace.json a session wrote") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): "
            "the file is truncated or corrupted; record the run again"
        ) from None
    return trace_from_dict(data, str(path))
