"""A list of records whose settled entries live in packed columns: a long run's steps in a few bytes each.

A 100,000-step session makes 100,000 StepRecords and as many BackwardRecords;
as objects they take about 1.3 KB a step.  :class:`RecordList` behaves like the
list it replaces (indexing, slices, iteration, ``len``, equality), but
:meth:`RecordList.freeze` moves a record whose fields are all plain numbers
(or at their defaults) into one row of number columns, each a
:class:`~graphwatch.model.packed.PackedArray` that packs every full chunk of
rows (a clean loop's steps take a few bytes each, mostly their timings).
Reading a frozen entry builds an equal record again; records that carry
detail (holders, crossings, per-step tables) stay objects.  The JSON trace
writes these lists as columns too (:mod:`graphwatch.model.column_json`).

Example::

    >>> from graphwatch.model.columns import RecordList, STEP_COLUMNS
    >>> from graphwatch.model import StepRecord
    >>> steps = RecordList(STEP_COLUMNS)
    >>> steps.append(StepRecord(index=0, source="optimizer", seconds=0.5, backwards=[0, 1], detail=False))
    >>> steps.freeze(0)
    True
    >>> steps[0] == StepRecord(index=0, source="optimizer", seconds=0.5, backwards=[0, 1], detail=False)
    True
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar, overload

from .packed import NONE_CODE, PackedArray
from .records import STEP_SOURCES, BackwardRecord, StepRecord

R = TypeVar("R")
AVERAGE_AFTER = 2**18  # rows of a long run whose measurements stay exact; older ones are averaged over spans


@dataclass(frozen=True)
class Columns:
    """How a record class is stored in columns.

    ``numbers``: int, float or bool fields, by array typecode (``"q"`` ints,
    ``"n"`` ints that may be None, ``"d"`` floats, ``"b"`` bools).
    ``choices``: str fields with a closed set of values, stored as an index.
    ``ranges``: list-of-int fields stored as (first, count) when consecutive.
    ``averaged``: number fields that measure (times, sizes, counts), read as
    the mean of their span once more than :data:`AVERAGE_AFTER` rows are
    newer (:class:`~graphwatch.model.packed.PackedArray`); the others (ids,
    flags, what the analysis tests for zero) stay exact.
    Any other field must hold its default for the record to be frozen.
    """

    cls: type
    numbers: dict[str, str]
    choices: dict[str, tuple[str, ...]]
    ranges: tuple[str, ...] = ()
    averaged: tuple[str, ...] = ()

    def defaults(self) -> dict[str, Any]:
        return {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            for f in dataclasses.fields(self.cls)
            if f.name not in self.numbers and f.name not in self.choices and f.name not in self.ranges
            and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
        }  # fmt: skip


STEP_COLUMNS = Columns(
    StepRecord,
    numbers={
        "index": "q", "nodes_created": "q", "saved_packed": "q", "saved_bytes_packed": "q", "saved_counted_only": "q",
        "live_activation_bytes": "q", "live_leaf_bytes": "q", "live_nodes": "q", "backward_seconds": "d",
        "backward_cpu_seconds": "d", "seconds": "d", "cpu_seconds": "d", "rss_bytes": "q", "cuda_allocated": "n",
        "cuda_reserved": "n", "optimizer_steps": "q", "optimizer_site": "n", "stale_grads": "q", "stale_site": "n", "detail": "b",
    },
    choices={"source": STEP_SOURCES},
    ranges=("backwards",),
    averaged=(
        "nodes_created", "saved_packed", "saved_bytes_packed", "live_activation_bytes", "live_leaf_bytes",
        "live_nodes", "backward_seconds", "backward_cpu_seconds", "seconds", "cpu_seconds", "rss_bytes",
        "cuda_allocated", "cuda_reserved",
    ),
)  # fmt: skip

BACKWARD_COLUMNS = Columns(
    BackwardRecord,
    numbers={
        "id": "q", "step": "q", "site": "n", "retain_graph": "b", "create_graph": "b", "nodes_reached": "q", "nodes_counted_only": "q",
        "earlier_nodes_reached": "q", "saved_freed": "q", "bytes_freed": "q", "seconds": "d", "cpu_seconds": "d",
        "graph_reused": "b", "held_bytes": "q",
    },
    choices={"api": ("backward", "grad")},
    averaged=("nodes_reached", "saved_freed", "bytes_freed", "seconds", "cpu_seconds"),
)  # fmt: skip


# The Trace fields kept as RecordLists, and how.
TRACE_COLUMNS = {"steps": STEP_COLUMNS, "backwards": BACKWARD_COLUMNS}


class RecordList(Sequence, Generic[R]):
    """A list of records; :meth:`freeze` stores one in columns (reads give an equal, new record)."""

    def __init__(self, columns: Columns, records: Iterable[R] = ()) -> None:
        self.columns = columns
        self._defaults = columns.defaults()
        # a record's fields that must hold their defaults to be frozen, read in one call (a tuple, even of one)
        self._default_fields = attrgetter(*self._defaults, "__class__")
        self._default_values = (*self._defaults.values(), columns.cls)
        # each choice field: (its name, its getter, its values' codes: the index of each allowed value)
        self._choice_codes = [
            (name, attrgetter(name), {value: code for code, value in enumerate(allowed)})
            for name, allowed in columns.choices.items()
        ]
        self._range_getters = [(name, attrgetter(name)) for name in columns.ranges]
        typecodes = {name: "q" if code == "n" else code for name, code in columns.numbers.items()}
        typecodes.update({name: "b" for name in columns.choices})
        typecodes.update({f"{name}.{part}": "q" for name in columns.ranges for part in ("first", "count")})
        self._arrays = {
            name: PackedArray(code, averaged_after=AVERAGE_AFTER if name in columns.averaged else None)
            for name, code in typecodes.items()
        }
        self._numbers = attrgetter(*columns.numbers)
        self._number_arrays = [(self._arrays[name], code == "n") for name, code in columns.numbers.items()]
        # per index: its row in the arrays, or -1 while it is an object; the records appended since the last
        # freeze have no entry yet (objects all: :meth:`_rows` fills theirs in when it is needed)
        self._row = PackedArray("q")
        self._length = 0  # how many records (appends are the hot path of a session's step ends)
        self._objects: dict[int, R] = {}
        self.extend(records)

    # ------------------------------------------------------------ the list
    def append(self, record: R) -> None:
        self._objects[self._length] = record
        self._length += 1

    def extend(self, records: Iterable[R]) -> None:
        for record in records:
            self.append(record)

    def __len__(self) -> int:
        return self._length

    def object_at(self, index: int) -> R | None:
        """Record ``index`` while it is kept as an object (not in the columns), else None."""
        return self._objects.get(index)

    @overload
    def __getitem__(self, index: int) -> R: ...
    @overload
    def __getitem__(self, index: slice) -> list[R]: ...
    def __getitem__(self, index: int | slice) -> R | list[R]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("record index out of range")  # (as a list says it)
        row = self._row[index] if index < len(self._row) else -1
        return self._objects[index] if row < 0 else self._thaw(row)

    def _rows(self) -> PackedArray:
        """The row of every index (-1 for the records kept as objects), complete up to the last appended."""
        rows = self._row
        if len(rows) < self._length:
            rows.extend([-1] * (self._length - len(rows)))
        return rows

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RecordList, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"RecordList({list(self)!r})"

    # ------------------------------------------------------------ columns
    def freeze(self, index: int) -> bool:
        """Store record ``index`` in the columns; False (it stays an object) if it carries more than numbers."""
        if index not in self._objects:
            return self._row[index] >= 0
        return bool(self.freeze_many([index]))

    def freeze_many(self, indices: Iterable[int]) -> list[int]:
        """:meth:`freeze` the records at ``indices`` (kept as objects) a column at a time; returns those stored.
        Each column is read and written by C-level maps over the batch (a session's step ends freeze hundreds of
        records at once, on the light path)."""
        return self._freeze_batch(indices)[0]

    def _freeze_batch(self, indices: Iterable[int]) -> tuple[list[int], list[R]]:
        """(the indices stored, their records): :meth:`freeze_many`."""
        objects = self._objects
        found = list(filter(objects.__contains__, indices))
        candidates = list(map(objects.__getitem__, found))
        storable = self._numbers_only(candidates)
        if all(storable):
            frozen, records = found, candidates
        else:
            frozen = list(compress(found, storable))
            records = list(compress(candidates, storable))
        if not records:
            return [], []
        arrays = self._arrays
        for (column, nullable), values in zip(self._number_arrays, zip(*map(self._numbers, records))):  # a column a time
            if nullable and None in values:
                if values.count(None) == len(values):  # (a CPU run's CUDA figures, a loop with no optimizer)
                    values = (NONE_CODE,) * len(values)
                else:
                    values = tuple(NONE_CODE if value is None else value for value in values)
            column.extend(values)
        for name, getter, codes in self._choice_codes:
            arrays[name].extend(list(map(codes.__getitem__, map(getter, records))))
        for name, getter in self._range_getters:
            spans = list(map(getter, records))
            arrays[f"{name}.first"].extend([values[0] if values else 0 for values in spans])
            arrays[f"{name}.count"].extend(list(map(len, spans)))
        row = len(self._number_arrays[0][0]) - len(records)
        self._rows().assign(frozen, range(row, row + len(frozen)))
        deque(map(objects.__delitem__, frozen), maxlen=0)
        return frozen, records

    def _numbers_only(self, records: list[R]) -> list[bool]:
        """Whether each of ``records`` carries nothing but what the columns store (numbers, choices, consecutive
        ranges): a check at a time over all of them (a step's end freezes hundreds at once)."""
        checks = [list(map(self._default_values.__eq__, map(self._default_fields, records)))]
        for _, getter in self._range_getters:
            checks.append([len(v) < 2 or v == list(range(v[0], v[0] + len(v))) for v in map(getter, records)])
        checks.extend(list(map(codes.__contains__, map(getter, records))) for _, getter, codes in self._choice_codes)
        return list(map(all, zip(*checks)))

    def _thaw(self, row: int) -> R:
        arrays, columns = self._arrays, self.columns
        values: dict[str, Any] = {}
        for name, code in columns.numbers.items():
            value = arrays[name][row]
            values[name] = None if code == "n" and value == NONE_CODE else bool(value) if code == "b" else value
        for name, allowed in columns.choices.items():
            values[name] = allowed[arrays[name][row]]
        for name in columns.ranges:
            first = arrays[f"{name}.first"][row]
            values[name] = list(range(first, first + arrays[f"{name}.count"][row]))
        return columns.cls(**values)

    def frozen(self) -> int:
        """How many records are stored in columns."""
        return self._length - len(self._objects)

    def averaged(self) -> tuple[int, int]:
        """(first, stop): frozen records ``first`` to ``stop - 1`` read the mean of their span for the
        ``averaged`` fields; (0, 0) when none do."""
        spans = [span for name in self.columns.averaged if (span := self._arrays[name].averaged())[1]]
        if not spans:
            return 0, 0
        key = self._arrays[next(iter(self.columns.numbers))]  # each row's record number (index, id)
        first, stop = min(a for a, _ in spans), max(b for _, b in spans)
        return key[first], key[stop] if stop < len(key) else len(self)

    @classmethod
    def from_columns(
        cls, columns: Columns, count: int, values: Mapping[str, Iterable[Any]], objects: dict[int, Any]
    ) -> RecordList[Any]:
        """``count`` records: ``objects`` at their indices, every other one frozen from ``values``, a list per
        column (numbers, choices and ``name.first``/``name.count`` of ranges; any iterable) of what the columns
        store (None as its code, a choice as its index), one value per frozen record in order."""
        records: RecordList[Any] = cls(columns)
        for name, column in records._arrays.items():
            column.extend(values[name])
        rows = records._row
        row = 0
        for i in range(count):
            if i in objects:
                rows.append(-1)
            else:
                rows.append(row)
                row += 1
        records._length = count
        records._objects = dict(objects)
        return records

    def thaw(self, index: int) -> None:
        """Keep record ``index`` as an object again (its row stays in the columns, unused)."""
        rows = self._rows()
        row = rows[index]
        if row >= 0:
            self._objects[index] = self._thaw(row)
            rows[index] = -1

    def loose(self) -> list[tuple[int, R]]:
        """(index, record) of the records kept as objects, in order."""
        return sorted(self._objects.items(), key=itemgetter(0))

    def field(self, name: str) -> list[Any]:
        """Every record's value of field ``name``, in order, read from the columns without building the
        frozen records again (a million-step run's session end reads a few fields of every step)."""
        columns, objects = self.columns, self._objects
        if name in columns.numbers:
            column, code = self._arrays[name], columns.numbers[name]
            values: list[Any] = column.tolist()
            if code == "n":
                values = [None if v == NONE_CODE else v for v in values]
            elif code == "b":
                values = [bool(v) for v in values]
        elif name in columns.choices:
            allowed = columns.choices[name]
            values = [allowed[v] for v in self._arrays[name]]
        elif name in columns.ranges:
            firsts, counts = self._arrays[f"{name}.first"], self._arrays[f"{name}.count"]
            values = [list(range(f, f + c)) for f, c in zip(firsts, counts)]
        else:
            default = self._defaults[name]  # a frozen record holds its default there
            values = [default] * self.frozen()
        rows = self._rows()
        return [getattr(objects[i], name) if row < 0 else values[row] for i, row in enumerate(rows)]


def field_values(records: Sequence[Any], name: str) -> list[Any]:
    """Every record's value of field ``name``: :meth:`RecordList.field`, or read record by record.

    >>> from graphwatch.model import StepRecord
    >>> steps = RecordList(STEP_COLUMNS, [StepRecord(index=i, source="optimizer", detail=False) for i in range(3)])
    >>> steps.freeze(0), field_values(steps, "index"), field_values(steps, "source")
    (True, [0, 1, 2], ['optimizer', 'optimizer', 'optimizer'])
    """
    if isinstance(records, RecordList):
        return records.field(name)
    return [getattr(record, name) for record in records]


def freeze_step(steps: RecordList, backwards: RecordList, index: int) -> None:
    """Store step ``index`` and its backwards in columns, where they carry only numbers."""
    freeze_steps(steps, backwards, [index])


def freeze_steps(steps: RecordList, backwards: RecordList, indices: list[int]) -> None:
    """:func:`freeze_step` for many steps at once, a column at a time."""
    _, frozen = steps._freeze_batch(indices)
    backwards.freeze_many(list(chain.from_iterable(map(_BACKWARDS, frozen))))


_BACKWARDS = attrgetter("backwards")
