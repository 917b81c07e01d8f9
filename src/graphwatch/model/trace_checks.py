"""Checks of a loaded trace: every field of its declared type, every number in range, every reference real.

JSON loads anything; a damaged trace must give one line naming the field,
never a traceback later.  :func:`check_fields` compares each field with its
type hint, :func:`check_ranges` the sizes and references of a whole trace.
Steps and backwards stored in columns were checked column by column as they
loaded (:mod:`graphwatch.model.column_json`): only those kept as objects are
checked here.

Example::

    >>> from graphwatch.model import StepRecord
    >>> check_fields(StepRecord(index=0, source="optimizer", seconds="soon"), "StepRecord")
    Traceback (most recent call last):
    ...
    TypeError: StepRecord field 'seconds' is 'soon', expected float
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import types
import typing
from typing import Any

from .column_json import ID_FIELDS, LARGEST, SITE_FIELDS
from .columns import RecordList
from .trace import Trace

_HINTS: dict[type, dict[str, Any]] = {}


def check_fields(record: Any, what: str) -> None:
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
    if hint is int:  # (the plain types first: a trace's fields are mostly these, checked millions of times)
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is bool:
        return isinstance(value, bool)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = _origin_and_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_is_a(value, h) for h in args)
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


@functools.cache
def _origin_and_args(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``typing.get_origin(hint), typing.get_args(hint)``, read once per hint."""
    return typing.get_origin(hint), typing.get_args(hint)


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("graphwatch.model.records.", "")


def check_ranges(trace: Trace) -> None:
    """A ValueError naming the first field whose value is out of range (types are checked already).

    Numbers are finite and of a size a run can have; ids are not negative;
    records sit at their own index; sites, backwards and steps a record
    names exist; a finding's evidence ``steps`` and ``sites`` are lists of
    step numbers and of ``file:line`` strings.  Steps and backwards stored in
    columns were checked column by column as they loaded: only those kept as
    objects are checked here.
    """
    steps, backwards = loose_records(trace.steps), loose_records(trace.backwards)
    for name, key, records in (("steps", "index", steps), ("backwards", "id", backwards)):
        for position, record in records:
            if getattr(record, key) != position:
                raise ValueError(f"{name}[{position}] field {key!r} is {getattr(record, key)!r}, expected {position}")
    tables = [*trace.sites, *trace.nodes.values(), *trace.saved.values(), *(r for _, r in steps + backwards)]
    every: list[Any] = [*tables, *trace.findings, *trace.snapshots, *trace.sources]
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
    for block in trace.sources:
        if block.first < 1:
            raise ValueError(f"SourceLines field 'first' is {block.first!r}, expected a line number (1 or more)")
    _check_number("untracked_saved", trace.untracked_saved, "the trace's")
    first, stop = trace.averaged_from, trace.averaged_before
    if not 0 <= first <= stop <= max(len(trace.steps), first):
        raise ValueError(f"the trace's averaged steps {first} to {stop - 1} are not steps of the run")


def loose_records(records: list[Any]) -> list[tuple[int, Any]]:
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
