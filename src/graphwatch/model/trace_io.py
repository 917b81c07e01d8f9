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

import contextlib
import dataclasses
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError, UsageError
from .column_json import (
    MAX_RECORDS,
    Budget,
    records_from_json_columns,
    to_json_columns,
)
from .columns import TRACE_COLUMNS, RecordList, freeze_step
from .patch_check import PatchCheck
from .records import (
    BackwardRecord,
    CallSite,
    DetailSpan,
    Finding,
    Holder,
    NodeRecord,
    SavedRecord,
    Snapshot,
    StepRecord,
    StepSpans,
    StepTable,
)
from .remedies import Edit, Remedy
from .source_lines import SourceLines
from .trace import Trace, averaged_steps
from .trace_checks import check_fields, check_ranges, loose_records
from .training import OptimizerRecord, ParameterRecord

FORMAT = "graphwatch-trace"
# 2: steps and backwards as columns (version 1 traces, a list of objects each, still load)
# 3: a finding's patch and a snapshot's focused picture (version 1 and 2 traces still load, without them)
# 4: a finding's remedies, as data (earlier traces load with none)
# 5: the source lines findings cite (earlier traces load with none: their reports show no excerpts)
# 6: what trained (optimizers, parameters) and a patch's check (earlier traces load without them)
# 7: the call sites a backward freed a saved tensor of (``CallSite.backwarded``; earlier traces: none)
VERSION = 7
# Fields every version wrote: a trace without one of them is damaged, not empty.
_REQUIRED = ("sites", "nodes", "saved", "backwards", "steps", "findings", "snapshots")

_LIST_FIELDS: dict[str, type] = {
    "sites": CallSite,
    "backwards": BackwardRecord,
    "steps": StepRecord,
    "findings": Finding,
    "snapshots": Snapshot,
    "sources": SourceLines,
    "optimizers": OptimizerRecord,
    "parameters": ParameterRecord,
    "full_detail": DetailSpan,
}
_DICT_FIELDS: dict[str, type] = {"nodes": NodeRecord, "saved": SavedRecord}
# Records held inside records: (field, record type) per type (a list of them, or one record or None).
_NESTED: dict[type, tuple[tuple[str, type], ...]] = {
    StepRecord: (("holders", Holder),),
    Finding: (("remedies", Remedy), ("check", PatchCheck)),
    Remedy: (("edits", Edit),),
}


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _defaults(cls: type) -> dict[str, Any]:
    """Each field's default value (fields without one are always written)."""
    found = _DEFAULTS.get(cls)
    if found is None:
        found = _DEFAULTS[cls] = {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
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
        if f.name in ("holders", "remedies", "edits"):
            value = [_plain(h) for h in value]
        elif f.name == "check":
            value = _plain(value)
        elif isinstance(value, StepSpans):
            value = list(value)
        elif isinstance(value, StepTable):
            value = dict(value)
        out[f.name] = value
    return out


def trace_to_dict(trace: Trace) -> dict:
    """The JSON-ready form of a trace (a dict of lists of dicts)."""
    out: dict[str, Any] = {"format": FORMAT, "version": VERSION}
    if not trace.averaged_before:  # a session still open: its columns know which steps they averaged
        trace = dataclasses.replace(trace)
        trace.averaged_from, trace.averaged_before = averaged_steps(trace)
    for f in dataclasses.fields(trace):
        value = getattr(trace, f.name)
        if f.name in TRACE_COLUMNS:
            value = to_json_columns(value, TRACE_COLUMNS[f.name], _plain)
        elif f.name in _LIST_FIELDS:
            value = [_plain(r) for r in value]
        elif f.name in _DICT_FIELDS:
            value = [_plain(r) for r in value.values()]
        out[f.name] = value
    return out


def _build(cls: type, row: dict, where: str) -> Any:
    try:
        return _record(cls, row)
    except (TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"{where}: {exc}; the trace file is damaged - record the run again") from None


def _record(cls: type, row: Any) -> Any:
    """One record from its JSON object; a TypeError naming the field when a value has the wrong type."""
    if not isinstance(row, dict):
        raise TypeError(f"expected an object, got {type(row).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    record = cls(**{k: v for k, v in row.items() if k in names})
    # JSON turns tuples into lists and int keys into strings: undo both (wrong types are caught below).
    for name in ("nodes_alive_by_step", "saved_alive_by_step"):
        value = getattr(record, name, None)
        if isinstance(value, dict):
            try:
                setattr(record, name, {int(k): v for k, v in value.items()})
            except ValueError:
                raise TypeError(f"{cls.__name__} field {name!r} has a key that is not a step number") from None
    if isinstance(record, (SavedRecord, ParameterRecord)) and isinstance(record.shape, list):
        record.shape = tuple(record.shape)
    if isinstance(record, BackwardRecord) and isinstance(record.crossings, list):
        record.crossings = [tuple(c) if isinstance(c, list) else c for c in record.crossings]
    for name, part in _NESTED.get(cls, ()):
        value = getattr(record, name)
        if isinstance(value, list) and not all(isinstance(row, dict) for row in value):
            raise TypeError(f"{cls.__name__} field {name!r} should be a list of objects")
        try:
            if isinstance(value, list):
                setattr(record, name, [_record(part, row) for row in value])
            elif isinstance(value, dict):
                setattr(record, name, _record(part, value))
        except TypeError as exc:  # (a record of the wrong shape inside: named by the field that holds it)
            raise TypeError(f"{cls.__name__} field {name!r}: {exc}") from None
    check_fields(record, cls.__name__)
    if isinstance(record, PatchCheck):
        record.from_trace = True  # a verdict the trace claims, not one computed here
    if isinstance(record, Holder):
        record.steps = StepSpans.of(record.steps)
    return record


def trace_from_dict(data: Any, source: str = "trace", file_bytes: int | None = None) -> Trace:
    """Rebuild a :class:`Trace` from :func:`trace_to_dict` output, checking format, version and every field.

    ``file_bytes``: the size of the file ``data`` was read from; the numbers of steps and backwards it
    claims are checked against it (:class:`~graphwatch.model.column_json.Budget`) before anything is
    allocated for them.
    """
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
            "upgrade graphwatch (pip install -U torch-graphwatch) to read it"
        )
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise TraceFormatError(
            f"{source} has no {' or '.join(map(repr, missing))} field; the trace file is damaged - record the run again"
        )
    budget = Budget() if file_bytes is None else Budget.of(file_bytes)
    trace = Trace()
    for f in dataclasses.fields(trace):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in TRACE_COLUMNS and version >= 2:
            build = functools.partial(_build, _LIST_FIELDS[f.name], where=f"{source}: {f.name}")
            limit = len(trace.backwards) if f.name == "steps" else MAX_RECORDS
            try:
                value = records_from_json_columns(
                    value, TRACE_COLUMNS[f.name], build, range_limit=limit, sites=len(trace.sites),
                    objects_where="detail" if f.name == "steps" else None, budget=budget,
                )
            except TraceFormatError:
                raise
            except (TypeError, ValueError) as exc:
                raise TraceFormatError(
                    f"{source}: field {f.name!r}: {exc}; the trace file is damaged - record the run again"
                ) from None
        elif f.name in _LIST_FIELDS:
            value = [_build(_LIST_FIELDS[f.name], row, f"{source}: {f.name}") for row in _rows(value, f.name, source)]
            if f.name in TRACE_COLUMNS:  # version 1: a list of objects
                value = RecordList(TRACE_COLUMNS[f.name], value)
        elif f.name in _DICT_FIELDS:
            rows = [_build(_DICT_FIELDS[f.name], row, f"{source}: {f.name}") for row in _rows(value, f.name, source)]
            value = {r.id: r for r in rows}  # type: ignore[attr-defined]  # node and saved records
        setattr(trace, f.name, value)
    try:
        check_fields(trace, "the trace's")
        check_ranges(trace)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{source}: {exc}; the trace file is damaged - record the run again") from None
    for index, step in loose_records(trace.steps):  # as compact as the session kept it (columns came frozen)
        if step.detail and version >= 2:  # the session keeps a step with detail, and its backwards, as objects
            for backward in step.backwards:
                trace.backwards.thaw(backward)  # type: ignore[attr-defined]  # a RecordList
        elif not step.detail:
            try:
                freeze_step(trace.steps, trace.backwards, index)  # type: ignore[arg-type]  # RecordLists
            except (IndexError, TypeError, OverflowError):  # a step naming a backward that is not there
                raise TraceFormatError(
                    f"{source}: step {index} names backwards {step.backwards} of {len(trace.backwards)}; "
                    "the trace file is damaged - record the run again"
                ) from None
    return trace




def _rows(value: Any, name: str, source: str) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
        raise TraceFormatError(
            f"{source}: field {name!r} should be a list of objects; the trace file is damaged - record the run again"
        )
    return value


def save_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write ``trace`` to ``path`` as JSON, atomically: a reader sees the old file or the whole new one."""
    write_atomically(Path(path), json.dumps(trace_to_dict(trace), separators=(",", ":")))


def save_trace_elsewhere(trace: Trace) -> Path | None:
    """Save ``trace`` to a new file in the system's temporary folder: where the trace of a run goes when its
    report folder cannot be written (full, gone, read-only).  None when that fails too.

    >>> from graphwatch.model import Trace
    >>> path = save_trace_elsewhere(Trace(torch_version="2.13.0"))
    >>> path.name.startswith("graphwatch-trace-"), load_trace(path).torch_version
    (True, '2.13.0')
    """
    try:
        fd, name = tempfile.mkstemp(prefix="graphwatch-trace-", suffix=".json")
    except OSError:
        return None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(trace_to_dict(trace), separators=(",", ":")))
    except (OSError, ValueError, TypeError):
        with contextlib.suppress(OSError):
            os.unlink(name)
        return None
    return Path(name)


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
    except RecursionError:  # json recurses once per nesting level: "[[[[..." raises this, not JSONDecodeError
        raise TraceFormatError(
            f"{path} nests JSON too deeply to be a graphwatch trace: the file is corrupted; record the run again"
        ) from None
    return trace_from_dict(data, str(path), file_bytes=len(text))
