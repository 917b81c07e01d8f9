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

import collections.abc
import dataclasses
import functools
import json
import math
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError, UsageError
from .column_json import (
    ID_FIELDS,
    LARGEST,
    MAX_RECORDS,
    SITE_FIELDS,
    records_from_json_columns,
    to_json_columns,
)
from .columns import TRACE_COLUMNS, RecordList, averaged_steps, freeze_step
from .records import (
    BackwardRecord,
    CallSite,
    Finding,
    Holder,
    NodeRecord,
    SavedRecord,
    Snapshot,
    StepRecord,
    StepSpans,
    StepTable,
    Trace,
)

FORMAT = "graphwatch-trace"
# 2: steps and backwards as columns (version 1 traces, a list of objects each, still load)
# 3: a finding's patch and a snapshot's focused picture (version 1 and 2 traces still load, without them)
VERSION = 3

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
        if f.name == "holders":
            value = [_plain(h) for h in value]
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
    if isinstance(record, SavedRecord) and isinstance(record.shape, list):
        record.shape = tuple(record.shape)
    if isinstance(record, BackwardRecord) and isinstance(record.crossings, list):
        record.crossings = [tuple(c) if isinstance(c, list) else c for c in record.crossings]
    if isinstance(record, StepRecord) and isinstance(record.holders, list):
        if not all(isinstance(h, dict) for h in record.holders):
            raise TypeError("StepRecord field 'holders' should be a list of objects")
        record.holders = [_record(Holder, h) for h in record.holders]
    _check_fields(record, cls.__name__)
    if isinstance(record, Holder):
        record.steps = StepSpans.of(record.steps)
    return record


_HINTS: dict[type, dict[str, Any]] = {}


def _check_fields(record: Any, what: str) -> None:
    """A TypeError naming the first field whose value is not of its declared type (JSON loads anything)."""
    cls = type(record)
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if not _is_a(value, hints[f.name]):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise TypeError(f"{what} field {f.name!r} is {shown}, expected {_type_name(hints[f.name])}")


def _is_a(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as JSON loads it) fits the field type ``hint``; ints pass for floats, bools not for ints."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is typing.Union or origin is types.UnionType:
        return any(_is_a(value, h) for h in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, (list, tuple, RecordList)):
            return False
        items = (v for _, v in value.loose()) if isinstance(value, RecordList) else value  # columns: checked
        return not args or all(_is_a(v, args[0]) for v in items)  # list[X], tuple[X, ...], tuple[X, X]
    if hint is dict or origin in (dict, collections.abc.Mapping):
        if not isinstance(value, collections.abc.Mapping):
            return False
        return not args or all(_is_a(k, args[0]) and _is_a(v, args[1]) for k, v in value.items())
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("graphwatch.model.records.", "")


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
        if f.name in TRACE_COLUMNS and version >= 2:
            build = functools.partial(_build, _LIST_FIELDS[f.name], where=f"{source}: {f.name}")
            limit = len(trace.backwards) if f.name == "steps" else MAX_RECORDS
            try:
                value = records_from_json_columns(
                    value, TRACE_COLUMNS[f.name], build, range_limit=limit, sites=len(trace.sites),
                    objects_where="detail" if f.name == "steps" else None,
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
        _check_fields(trace, "the trace's")
        _check_ranges(trace)
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{source}: {exc}; the trace file is damaged - record the run again") from None
    for index, step in _objects(trace.steps):  # as compact as the session kept it (columns came frozen)
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




def _check_ranges(trace: Trace) -> None:
    """A ValueError naming the first field whose value is out of range (types are checked already).

    Numbers are finite and of a size a run can have; ids are not negative;
    records sit at their own index; sites, backwards and steps a record
    names exist; a finding's evidence ``steps`` and ``sites`` are lists of
    step numbers and of ``file:line`` strings.  Steps and backwards stored in
    columns were checked column by column as they loaded: only those kept as
    objects are checked here.
    """
    steps, backwards = _objects(trace.steps), _objects(trace.backwards)
    for name, key, records in (("steps", "index", steps), ("backwards", "id", backwards)):
        for position, record in records:
            if getattr(record, key) != position:
                raise ValueError(f"{name}[{position}] field {key!r} is {getattr(record, key)!r}, expected {position}")
    tables = [*trace.sites, *trace.nodes.values(), *trace.saved.values(), *(r for _, r in steps + backwards)]
    every: list[Any] = [*tables, *trace.findings, *trace.snapshots]
    for record in every:
        for f in dataclasses.fields(record):
            _check_number(f.name, getattr(record, f.name), type(record).__name__)
            if f.name in SITE_FIELDS and getattr(record, f.name) is not None and getattr(record, f.name) >= len(trace.sites):
                site = getattr(record, f.name)
                raise ValueError(f"{type(record).__name__} field {f.name!r} names site {site} of {len(trace.sites)}")
    for _, step in steps:
        if any(b >= len(trace.backwards) for b in step.backwards):
            raise ValueError(f"StepRecord field 'backwards' names backwards {step.backwards} of {len(trace.backwards)}")
    for finding in trace.findings:
        _check_evidence(finding.evidence)
    _check_number("untracked_saved", trace.untracked_saved, "the trace's")
    first, stop = trace.averaged_from, trace.averaged_before
    if not 0 <= first <= stop <= max(len(trace.steps), first):
        raise ValueError(f"the trace's averaged steps {first} to {stop - 1} are not steps of the run")


def _objects(records: list[Any]) -> list[tuple[int, Any]]:
    """(index, record) of the records kept as objects (every one of a plain list)."""
    return records.loose() if isinstance(records, RecordList) else list(enumerate(records))


def _check_number(name: str, value: Any, what: str) -> None:
    """Every number in ``value`` (searched through lists and dicts) finite and of a plausible size."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        bad = not math.isfinite(value) or abs(value) > LARGEST or (name in ID_FIELDS and value < 0)
        if bad:
            raise ValueError(f"{what} field {name!r} is {value!r}, out of range")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_number(name, item, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_number(name, key, what)
            _check_number(name, item, what)


def _check_evidence(evidence: dict) -> None:
    steps, sites = evidence.get("steps"), evidence.get("sites")
    if steps is not None and not (isinstance(steps, list) and all(_is_a(s, int) and s >= 0 for s in steps)):
        raise ValueError(f"Finding field 'evidence' has 'steps' {steps!r:.40}, expected a list of step numbers")
    if sites is not None and not (isinstance(sites, list) and all(isinstance(s, str) for s in sites)):
        raise ValueError(f"Finding field 'evidence' has 'sites' {sites!r:.40}, expected a list of 'file:line' strings")


def _rows(value: Any, name: str, source: str) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
        raise TraceFormatError(
            f"{source}: field {name!r} should be a list of objects; the trace file is damaged - record the run again"
        )
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
    except RecursionError:  # json recurses once per nesting level: "[[[[..." raises this, not JSONDecodeError
        raise TraceFormatError(
            f"{path} nests JSON too deeply to be a graphwatch trace: the file is corrupted; record the run again"
        ) from None
    return trace_from_dict(data, str(path))
