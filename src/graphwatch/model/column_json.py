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
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from .columns import Columns, RecordList, field_values
from .packed import NONE_CODE

MAX_RECORDS = 10**8  # more steps or backwards than any trace holds: a damaged count
BASE_RECORDS = 2**16  # records any trace file may claim, however small (see Budget.of)
BYTES_PER_RECORD = 16  # the least a step or backward of a real run costs its trace file
BASE_OBJECTS = 2**12  # records kept whole (with detail: ~1 KB each in memory) any trace file may hold ...
BYTES_PER_OBJECT = 32  # ... and beyond that, one per this many bytes of the file


@dataclass(frozen=True)
class Budget:
    """How many step or backward records a trace file can hold, and how many of them kept whole (as objects).

    Each record a session writes costs the file at least :data:`BYTES_PER_RECORD` bytes (its times and sizes
    differ from step to step, so they are written out), and one kept whole (a step with detail: holders,
    tables) far more; a file claiming more, beyond :data:`BASE_RECORDS` (:data:`BASE_OBJECTS`), is damaged or
    forged, and would make a reader allocate for what is not there.

    >>> Budget.of(3_000) == Budget(BASE_RECORDS, BASE_OBJECTS), Budget.of(200 * 2**20)
    (True, Budget(records=13107200, objects=6553600))
    """

    records: int = MAX_RECORDS
    objects: int = MAX_RECORDS

    @classmethod
    def of(cls, file_bytes: int) -> Budget:
        return cls(max(BASE_RECORDS, file_bytes // BYTES_PER_RECORD), max(BASE_OBJECTS, file_bytes // BYTES_PER_OBJECT))
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
    budget: Budget = Budget(),
) -> RecordList[Any]:
    """The RecordList of :func:`to_json_columns` output; ValueError or TypeError naming what is damaged.

    ``build(row)`` makes (and checks) one record from a dict of its fields: it
    is called for the records with extra fields only, unless the columns are
    not those ``columns`` describes (an older or damaged trace), when every
    record is built (and stored in columns as soon as it is).  ``range_limit``:
    a ``ranges`` field (a step's backwards) names ids below it, each id once;
    ``sites``: how many call sites the trace has; ``objects_where``: a bool
    field whose records stay objects where it is true (a step's ``detail``, as
    a session keeps them); ``budget``: how many records (and records kept whole)
    the file can hold, checked before anything is allocated for them.  A column
    written as ``{"all": v}`` or ``{"from": a}`` is never spelled out as a
    list: memory stays proportional to the file, not to what it claims.
    """
    count, values, extra = _decoded(data, columns, range_limit, budget.records)
    fields = {f.name: f for f in dataclasses.fields(columns.cls)}
    layout = {*columns.numbers, *columns.choices, *(f"{n}.{part}" for n in columns.ranges for part in ("first", "count"))}
    missing = [n for n in layout if n not in values and _default(fields[n.split(".")[0]]) is dataclasses.MISSING]
    if missing or any(name in fields and name not in layout for name in values):  # not our layout: record by record
        return _record_by_record(count, values, extra, columns, build, objects_where, budget.objects)
    for name in layout - values.keys():  # a column an older trace did not write: its default
        values[name] = Repeated(_default(fields[name.split(".")[0]]), count)
    objects = dict.fromkeys(extra)
    if objects_where is not None:
        objects.update((i, None) for i in _positions(values[objects_where], lambda value: value is True))
    for name, allowed in columns.choices.items():
        for value in _distinct(values[name]):
            if not isinstance(value, str):
                raise TypeError(f"{columns.cls.__name__} field {name!r} is {_shown(value)}, expected str")
        objects.update((i, None) for i in _positions(values[name], functools.partial(_outside, allowed)))
    _check_objects(len(objects), count, budget.objects)
    for i in objects:
        row = {name: values[name][i] for name in values if name in fields}
        for name in columns.ranges:
            first, n = values[f"{name}.first"][i], values[f"{name}.count"][i]
            row[name] = list(range(first, first + n))
        objects[i] = build({**row, **extra.get(i, {})})
    objects = dict(sorted(objects.items()))
    stored: dict[str, Iterable[Any]] = {}
    for name in layout:
        column = _without(values[name], objects)
        code = columns.numbers.get(name)
        if code is not None:
            _check_column(columns.cls.__name__, name, code, column, sites)
            column = _mapped(column, lambda v: NONE_CODE if v is None else v) if code == "n" else column
        elif name in columns.choices:
            column = _mapped(column, columns.choices[name].index)
        stored[name] = column
    key = next(iter(columns.numbers))  # the record's own number: index, id
    _check_own_numbers(columns.cls.__name__, key, values[key], objects)
    return RecordList.from_columns(columns, count, stored, objects)


def _check_objects(objects: int, count: int, most: int) -> None:
    """A ValueError when more records would be built as objects (about 1 KB each) than the file can hold."""
    if objects > most:
        raise ValueError(f"{objects:,} of the {count:,} records carry detail, more than a file of this size holds")


def _record_by_record(
    count: int, values: dict[str, Sequence[Any]], extra: dict[int, dict], columns: Columns,
    build: Callable[[dict], Any], objects_where: str | None, most: int,
) -> RecordList[Any]:
    """Every record built (and checked) from its row, then stored in columns unless ``objects_where`` is true."""
    fields = {f.name for f in dataclasses.fields(columns.cls)}
    records: RecordList[Any] = RecordList(columns)
    kept = 0
    for i in range(count):
        row = {name: values[name][i] for name in values if name in fields}
        for name in columns.ranges:
            first = values[f"{name}.first"][i] if f"{name}.first" in values else 0
            n = values[f"{name}.count"][i] if f"{name}.count" in values else 0
            row[name] = list(range(first, first + n))
        row.update(extra.get(i, {}))
        records.append(build(row))
        if (objects_where is not None and row.get(objects_where) is True) or not records.freeze(i):
            kept += 1
            _check_objects(kept, count, most)
    return records


class Repeated(Sequence[Any]):
    """``count`` times ``value``, as a column ``{"all": value}`` reads, without a list of them.

    >>> column = Repeated(0.5, 3)
    >>> len(column), column[2], list(column)
    (3, 0.5, [0.5, 0.5, 0.5])
    """

    __slots__ = ("length", "value")

    def __init__(self, value: Any, count: int) -> None:
        self.value, self.length = value, count

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, int) or not -self.length <= index < self.length:
            raise IndexError("column index out of range")
        return self.value

    def __iter__(self) -> Iterator[Any]:
        return repeat(self.value, self.length)


def _outside(allowed: tuple[str, ...], value: Any) -> bool:
    return value not in allowed


def _distinct(column: Sequence[Any]) -> Iterable[Any]:
    """The values to check of a column: the one value of a repeated one or the two ends of a count."""
    if isinstance(column, Repeated):
        return [column.value] if column.length else []
    if isinstance(column, range):
        return [column[0], column[-1]] if column else []
    return column


def _positions(column: Sequence[Any], test: Callable[[Any], bool]) -> Iterable[int]:
    """The indices of the values that pass ``test``."""
    if isinstance(column, Repeated):
        return range(column.length) if column.length and test(column.value) else ()
    return (i for i, value in enumerate(column) if test(value))


def _without(column: Sequence[Any], objects: dict[int, Any]) -> Sequence[Any] | Iterable[Any]:
    """The column's values of the records stored in columns (all but ``objects``), lazily where it is compact."""
    if not objects:
        return column
    if isinstance(column, Repeated):
        return Repeated(column.value, column.length - len(objects))
    if isinstance(column, range):
        return _Lazy(lambda: (v for i, v in enumerate(column) if i not in objects))
    return [v for i, v in enumerate(column) if i not in objects]


def _mapped(column: Sequence[Any] | Iterable[Any], how: Callable[[Any], Any]) -> Sequence[Any] | Iterable[Any]:
    if isinstance(column, Repeated):
        return Repeated(how(column.value), column.length)
    if isinstance(column, (list, range)):
        return [how(v) for v in column]
    return _Lazy(lambda: (how(v) for v in column))


class _Lazy(Iterable[Any]):
    """Values made again on each pass (a compact column less some records), never held as a list."""

    def __init__(self, values: Callable[[], Iterator[Any]]) -> None:
        self._values = values

    def __iter__(self) -> Iterator[Any]:
        return self._values()


def _check_own_numbers(record: str, key: str, column: Sequence[Any], objects: dict[int, Any]) -> None:
    """Each record's own number (a step's ``index``, a backward's ``id``) is its position."""
    if isinstance(column, range) and column.start == 0:
        return
    if isinstance(column, Repeated) and column.length <= 1 and column.value == 0:
        return
    for position, value in enumerate(column):
        if value != position and position not in objects:
            raise ValueError(f"{record} {position} field {key!r} is {value!r}, expected {position}")


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


_EXPECTED = {"q": "int", "n": "int | None", "d": "float", "b": "bool"}


def _check_column(record: str, name: str, code: str, column: Iterable[Any], sites: int) -> None:
    """A TypeError or ValueError naming the field when a value is not of its type or out of range."""
    low = 0 if name in ID_FIELDS else -LARGEST
    for value in _distinct(column):  # type: ignore[arg-type]  # (a lazy column is read value by value)
        if code == "b":
            ok = type(value) is bool
        elif code == "d":
            ok = type(value) in (int, float)
        else:
            ok = type(value) is int or (code == "n" and value is None)
        if not ok:
            raise TypeError(f"{record} field {name!r} is {_shown(value)}, expected {_EXPECTED[code]}")
        if code == "b" or value is None:
            continue
        if not (math.isfinite(value) and low <= value <= LARGEST):
            raise ValueError(f"{record} field {name!r} is {value!r}, out of range")
        if name in SITE_FIELDS and value >= sites:
            raise ValueError(f"{record} field {name!r} names site {value} of {sites}")


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _decoded(
    data: Any, columns: Columns, range_limit: int, most: int
) -> tuple[int, dict[str, Sequence[Any]], dict[int, dict]]:
    """(count, each column's values, each extra entry by record); ValueError naming what is damaged."""
    if not isinstance(data, dict) or not isinstance(data.get("count"), int) or not isinstance(data.get("columns"), dict):
        raise ValueError("expected an object with 'count' and 'columns'")
    count, encoded = data["count"], data["columns"]
    if isinstance(count, bool) or not 0 <= count <= MAX_RECORDS:
        raise ValueError(f"'count' is {count!r}, not a number of records")
    if count > most:
        raise ValueError(f"'count' claims {count:,} records, more than a file of this size can hold ({most:,})")
    for name, column in encoded.items():  # every length checked before any column is read
        if isinstance(column, list) and len(column) != count:
            raise ValueError(f"column {name!r} has {len(column)} values for {count} records")
    values = {name: _decode(column, count, name) for name, column in encoded.items()}
    for name in columns.ranges:
        firsts = values.setdefault(f"{name}.first", Repeated(0, count))
        counts = values.setdefault(f"{name}.count", Repeated(0, count))
        named = 0
        for first, n in zip(firsts, counts):
            if type(first) is not int or type(n) is not int:
                raise ValueError(f"column {name!r} should hold whole numbers")
            if first < 0 or n < 0 or first + n > range_limit:
                raise ValueError(f"column {name!r} names ids {first} to {first + n - 1}, outside 0 to {range_limit - 1}")
            named += n
            if named > range_limit:  # each id belongs to one record: no two ranges share one
                raise ValueError(f"column {name!r} names {named:,} ids or more, of {range_limit:,}")
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


def _decode(column: Any, count: int, name: str) -> Sequence[Any]:
    if isinstance(column, list):
        return column
    if isinstance(column, dict) and "all" in column:
        return Repeated(column["all"], count)
    if isinstance(column, dict) and type(column.get("from")) is int and abs(column["from"]) <= LARGEST:
        return range(column["from"], column["from"] + count)
    raise ValueError(f"column {name!r} should be a list, {{'all': value}} or {{'from': number}}")
