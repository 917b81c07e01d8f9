"""The JSON form of a trace's steps and backwards: one list (or one value) per column.

Writing reads a :class:`~graphwatch.model.columns.RecordList` column by column
(:func:`to_json_columns`).  Reading (:func:`records_from_json_columns`) checks
each column's values at once (types, finite and plausible sizes, ids not
negative, call sites that exist, each record at its own index) and puts them
straight into a RecordList's packed columns: a million-step trace loads
without building a million records.  Only records with fields outside the
columns (``extra``: holders, crossings, per-step tables) are built, and
checked, one by one.

Example::

    >>> from graphwatch.model import StepRecord
    >>> from graphwatch.model.columns import STEP_COLUMNS, RecordList
    >>> steps = RecordList(STEP_COLUMNS, [StepRecord(index=i, source="optimizer", seconds=0.5) for i in range(3)])
    >>> data = to_json_columns(steps, STEP_COLUMNS, lambda record: {})
    >>> data["columns"]["index"], data["columns"]["seconds"]
    ({'from': 0}, {'all': 0.5})
    >>> loaded = records_from_json_columns(data, STEP_COLUMNS, lambda row: StepRecord(**row))
    >>> list(loaded) == list(steps), loaded.frozen()
    (True, 3)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from .columns import Columns, RecordList, field_values
from .packed import NONE_CODE

MAX_RECORDS = 10**8  # more steps or backwards than any trace holds: a damaged count
LARGEST = 2**53  # beyond this a number cannot be a count, a size or an id of a real run
SITE_FIELDS = ("site", "optimizer_site")
ID_FIELDS = ("id", "step", "index", "seq", "backward", "node", "freed_by", "died_step", *SITE_FIELDS)


def to_json_columns(records: Sequence[Any], columns: Columns, plain: Any) -> dict:
    """Records as JSON columns: ``{"count", "columns", "extra"}``.

    A column is ``{"all": v}`` when every record has ``v``, ``{"from": a}`` for
    a, a+1, ..., else a list.  ``extra`` lists ``[i, {field: value}]`` for the
    fields outside the columns that differ from their defaults, as
    ``plain(record)`` (which leaves out defaults) gives them.  A
    :class:`RecordList` is read column by column: only the records it keeps as
    objects can have extra fields.
    """
    names = [*columns.numbers, *columns.choices]
    values = {name: field_values(records, name) for name in names}
    loose = records.loose() if isinstance(records, RecordList) else enumerate(records)
    extras = {}
    for i, record in loose:
        other = {k: v for k, v in plain(record).items() if k not in values and k not in columns.ranges}
        if other:
            extras[i] = other
    for name in columns.ranges:
        firsts, counts = values[f"{name}.first"], values[f"{name}.count"] = [], []
        for i, items in enumerate(field_values(records, name)):
            first = items[0] if items else 0
            if items != list(range(first, first + len(items))):  # not consecutive: written in full
                extras.setdefault(i, {})[name] = items
                first, items = 0, []
            firsts.append(first)
            counts.append(len(items))
    extra = [[i, extras[i]] for i in sorted(extras)]
    return {"count": len(records), "columns": {name: _encode(column) for name, column in values.items()}, "extra": extra}


def records_from_json_columns(
    data: Any,
    columns: Columns,
    build: Callable[[dict], Any],
    *,
    range_limit: int = MAX_RECORDS,
    sites: int = MAX_RECORDS,
    objects_where: str | None = None,
) -> RecordList[Any]:
    """The RecordList of :func:`to_json_columns` output; ValueError or TypeError naming what is damaged.

    ``build(row)`` makes (and checks) one record from a dict of its fields: it
    is called for the records with extra fields only, unless the columns are
    not those ``columns`` describes (an older or damaged trace), when every
    record is built.  ``range_limit``: a ``ranges`` field (a step's backwards)
    names ids below it; ``sites``: how many call sites the trace has;
    ``objects_where``: a bool field whose records stay objects where it is
    true (a step's ``detail``, as a session keeps them).
    """
    count, values, extra = _decoded(data, columns, range_limit)
    fields = {f.name: f for f in dataclasses.fields(columns.cls)}
    layout = {*columns.numbers, *columns.choices, *(f"{n}.{part}" for n in columns.ranges for part in ("first", "count"))}
    missing = [n for n in layout if n not in values and _default(fields[n.split(".")[0]]) is dataclasses.MISSING]
    if missing or any(name in fields and name not in layout for name in values):  # not our layout: record by record
        rows = [{name: values[name][i] for name in values if name in fields} for i in range(count)]
        for name in columns.ranges:
            for i, row in enumerate(rows):
                first, n = values.get(f"{name}.first", [0] * count)[i], values.get(f"{name}.count", [0] * count)[i]
                row[name] = list(range(first, first + n))
        for i, fields_of_i in extra.items():
            rows[i].update(fields_of_i)
        return RecordList(columns, [build(row) for row in rows])
    for name in layout - values.keys():  # a column an older trace did not write: its default
        values[name] = [_default(fields[name.split(".")[0]])] * count
    objects = dict.fromkeys(extra)
    if objects_where is not None:
        objects.update((i, None) for i, value in enumerate(values[objects_where]) if value is True)
    for name, allowed in columns.choices.items():
        for i, value in enumerate(values[name]):
            if not isinstance(value, str):
                raise TypeError(f"{columns.cls.__name__} field {name!r} is {_shown(value)}, expected str")
            if value not in allowed:
                objects[i] = None  # a value the columns cannot hold: the record stays an object
    for i in objects:
        row = {name: values[name][i] for name in values if name in fields}
        for name in columns.ranges:
            first, n = values[f"{name}.first"][i], values[f"{name}.count"][i]
            row[name] = list(range(first, first + n))
        objects[i] = build({**row, **extra.get(i, {})})
    objects = dict(sorted(objects.items()))
    frozen = [i for i in range(count) if i not in objects] if objects else None
    stored: dict[str, list[Any]] = {}
    for name in layout:
        column = values[name] if frozen is None else [values[name][i] for i in frozen]
        code = columns.numbers.get(name)
        if code is not None:
            _check_column(columns.cls.__name__, name, code, column, sites)
            column = [NONE_CODE if v is None else v for v in column] if code == "n" else column
        elif name in columns.choices:
            column = [columns.choices[name].index(v) for v in column]
        stored[name] = column
    key = next(iter(columns.numbers))  # the record's own number: index, id
    for position, value in zip(frozen if frozen is not None else range(count), stored[key]):
        if value != position:
            raise ValueError(f"{columns.cls.__name__} {position} field {key!r} is {value!r}, expected {position}")
    return RecordList.from_columns(columns, count, stored, objects)


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


_EXPECTED = {"q": "int", "n": "int | None", "d": "float", "b": "bool"}


def _check_column(record: str, name: str, code: str, column: list[Any], sites: int) -> None:
    """A TypeError or ValueError naming the field when a value is not of its type or out of range."""
    for value in column:
        if code == "b":
            ok = type(value) is bool
        elif code == "d":
            ok = type(value) in (int, float)
        else:
            ok = type(value) is int or (code == "n" and value is None)
        if not ok:
            raise TypeError(f"{record} field {name!r} is {_shown(value)}, expected {_EXPECTED[code]}")
    if code == "b":
        return
    numbers = [v for v in column if v is not None]
    low = 0 if name in ID_FIELDS else -LARGEST
    for value in numbers:
        if not (math.isfinite(value) and low <= value <= LARGEST):
            raise ValueError(f"{record} field {name!r} is {value!r}, out of range")
        if name in SITE_FIELDS and value >= sites:
            raise ValueError(f"{record} field {name!r} names site {value} of {sites}")


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _decoded(data: Any, columns: Columns, range_limit: int) -> tuple[int, dict[str, list[Any]], dict[int, dict]]:
    """(count, each column's values, each extra entry by record); ValueError naming what is damaged."""
    if not isinstance(data, dict) or not isinstance(data.get("count"), int) or not isinstance(data.get("columns"), dict):
        raise ValueError("expected an object with 'count' and 'columns'")
    count, encoded = data["count"], data["columns"]
    if isinstance(count, bool) or not 0 <= count <= MAX_RECORDS:
        raise ValueError(f"'count' is {count!r}, not a number of records")
    values = {name: _decode(column, count, name) for name, column in encoded.items()}
    for name in columns.ranges:
        firsts = values.setdefault(f"{name}.first", [0] * count)
        counts = values.setdefault(f"{name}.count", [0] * count)
        for first, n in zip(firsts, counts):
            if type(first) is not int or type(n) is not int:
                raise ValueError(f"column {name!r} should hold whole numbers")
            if first < 0 or n < 0 or first + n > range_limit:
                raise ValueError(f"column {name!r} names ids {first} to {first + n - 1}, outside 0 to {range_limit - 1}")
    extra = data.get("extra", [])
    if not isinstance(extra, list):
        raise ValueError("'extra' should be a list")
    by_record: dict[int, dict] = {}
    for item in extra:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and isinstance(item[1], dict)):
            raise ValueError("each 'extra' entry should be [index, object]")
        if not 0 <= item[0] < count:
            raise ValueError(f"'extra' names record {item[0]}, but there are {count}")
        by_record.setdefault(item[0], {}).update(item[1])
    return count, values, by_record


def _encode(column: list) -> Any:
    if column and all(v == column[0] and type(v) is type(column[0]) for v in column):
        return {"all": column[0]}
    first = column[0] if column else None
    if type(first) is int and column == list(range(first, first + len(column))):
        return {"from": first}
    return column


def _decode(column: Any, count: int, name: str) -> list:
    if isinstance(column, list):
        if len(column) != count:
            raise ValueError(f"column {name!r} has {len(column)} values for {count} records")
        return column
    if isinstance(column, dict) and "all" in column:
        return [column["all"]] * count
    if isinstance(column, dict) and isinstance(column.get("from"), int):
        return list(range(column["from"], column["from"] + count))
    raise ValueError(f"column {name!r} should be a list, {{'all': value}} or {{'from': number}}")
