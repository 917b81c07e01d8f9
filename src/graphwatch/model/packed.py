"""An append-mostly array of numbers that packs each full chunk: a long run's per-step numbers in a few bits.

A million-step session keeps a few numbers per step and per backward (totals,
timings, step bounds).  As plain ``array`` columns that is about 300 bytes a
step.  :class:`PackedArray` keeps the last, unfinished chunk of
:data:`CHUNK` values as a plain ``array`` and packs every full chunk the moment
it fills: a chunk of equal values or of an arithmetic sequence becomes two
numbers (and joins the chunk before when it continues it, so a steady
column stays two numbers however long the run); any other chunk becomes its
differences (whole numbers) or its values (floats), with their bytes shuffled
(all first bytes, then all second bytes, ...) and zlib-compressed.  Packing is
lossless: every read gives back the value appended.

A measurement (a step's time, a byte total) need not stay exact forever: with
``averaged_after=n``, values more than ``n`` behind the end are replaced by
their chunk's mean, and neighbouring averaged chunks merge (their weighted
mean) as they age, in spans that double up to :data:`MAX_SPAN` values.  The
first chunk stays exact (where a trend starts), and so do the last ``n``
values: a billion values take a few thousand spans.
:meth:`PackedArray.averaged` says which values were averaged.

Reads of a packed chunk unpack it once and keep the last chunk unpacked, so a
scan in order costs one unpack per chunk.  Writes to a packed chunk (a step
settled long after it ended, or a loaded trace's steps put into columns)
change the unpacked copy, which is packed again when another chunk is
unpacked: writes in order cost one unpack and one pack per chunk.  Reads
change that cache, so one thread at a time reads and writes an array (the
session's recording thread; finalizers never touch these arrays).

Example::

    >>> from graphwatch.model.packed import PackedArray, CHUNK
    >>> steps = PackedArray("q")
    >>> steps.extend(range(3 * CHUNK + 5))
    >>> len(steps), steps[CHUNK + 5], steps.packed_chunks()  # three arithmetic chunks joined into one
    (12293, 4101, 1)
    >>> steps.bisect_right(4101.5)                          # sorted contents: found without unpacking
    4102
    >>> timings = PackedArray("d", [0.25, 0.75] * (4 * CHUNK), averaged_after=CHUNK)
    >>> timings.averaged(), timings[CHUNK], timings[0], timings[-1]  # all but the first and last chunks
    ((4096, 28672), 0.5, 0.25, 0.75)
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, repeat
from operator import sub
from struct import pack
from typing import Any

CHUNK = 4096  # values per packed chunk
MAX_SPAN = 16 * CHUNK  # values an averaged span stands for at most (a trend over the run stays a trend)
NONE_CODE = -(2**63)  # a whole-number column's code for None: never averaged with real values

Number = int | float


def _machine_bytes(typecode: str, values: Sequence[Number]) -> bytes:
    """``values`` as the items of an ``array(typecode)`` hold them: :func:`struct.pack` converts each number in C,
    where ``array.extend`` parses each one against a format string (several times the instructions; a frozen
    batch writes some 40 columns)."""
    return pack(f"{len(values)}{typecode}", *values)


class _Chunk:
    """``count`` values, packed: ``first`` and ``step`` (equal values, or whole numbers in an arithmetic
    sequence, or an averaged span; ``data`` empty), else the shuffled, compressed bytes of the values or of
    their differences."""

    __slots__ = ("averaged", "count", "data", "deltas", "first", "last", "step", "sum")

    def __init__(self, values: array) -> None:
        self.count = len(values)
        self.first: Number = values[0]
        self.last: Number = values[-1]
        self.step: Number = 0
        self.deltas = False
        self.averaged = False
        self.sum: Number = 0  # an averaged span's exact total
        self.data = b""
        raw = values.tobytes()
        if raw == values[:1].tobytes() * len(values):  # equal values (bytes: -0.0 is not 0.0)
            return
        if values.typecode != "d":  # (the differences taken in C: a frozen batch seals some 40 columns at once)
            deltas = list(map(sub, values[1:], values[:-1]))
            if deltas and deltas.count(deltas[0]) == len(deltas):
                self.step = deltas[0]
                return
            if values.typecode == "q":  # whole numbers: differences are small where values move slowly
                try:
                    raw = array("q", [values[0], *deltas]).tobytes()
                    self.deltas = True
                except OverflowError:  # None's code beside real values: keep the values
                    pass
        width = values.itemsize
        self.data = zlib.compress(b"".join(raw[i::width] for i in range(width)), 1)

    def values(self, typecode: str) -> Iterable[Number]:
        """The values, without building an array for two numbers."""
        if self.data:
            return self.unpack(typecode)
        if self.step:
            return range(self.first, self.first + self.step * self.count, self.step)  # type: ignore[arg-type]
        return repeat(self.first, self.count)

    def unpack(self, typecode: str) -> array:
        if not self.data:
            return array(typecode, self.values(typecode))
        shuffled = zlib.decompress(self.data)
        width = len(shuffled) // self.count
        raw = bytearray(len(shuffled))
        for i in range(width):
            raw[i::width] = shuffled[i * self.count : (i + 1) * self.count]
        values = array(typecode)
        values.frombytes(bytes(raw))
        return array(typecode, accumulate(values)) if self.deltas else values

    def get(self, offset: int) -> Number | None:
        """The value at ``offset`` without unpacking, when the chunk is two numbers; else None."""
        return None if self.data else self.first + self.step * offset

    def joins(self, after: _Chunk, typecode: str) -> bool:
        """Whether ``after`` continues this chunk exactly: both two numbers, one sequence."""
        if self.data or after.data or self.step != after.step:
            return False
        expected = self.first + self.step * self.count
        if typecode != "d":
            return expected == after.first
        return array("d", [expected]).tobytes() == array("d", [after.first]).tobytes()  # -0.0 is not 0.0

    def total(self, typecode: str) -> Number:
        if self.averaged:
            return self.sum  # the exact total the span stands for, not its rounded mean times its count
        return sum(self.values(typecode)) if self.data or self.step else self.first * self.count

    def nbytes(self) -> int:
        return 88 + len(self.data)


def _span(count: int, total: Number, typecode: str) -> _Chunk:
    """``count`` values averaged: each reads as their mean (rounded in a whole-number array)."""
    chunk = _Chunk(array(typecode, [total / count if typecode == "d" else round(total / count)]))
    chunk.count, chunk.averaged, chunk.sum = count, True, total
    return chunk


class PackedArray:
    """A sequence of numbers of one ``array`` typecode ("q", "b" or "d") whose full chunks are packed.

    ``averaged_after``: keep only that many of the last values exact and average older ones (None: keep all).
    """

    __slots__ = ("_averaged", "_cached", "_cached_at", "_chunks", "_dirty", "_starts", "_tail", "keep", "typecode")

    def __init__(self, typecode: str, values: Iterable[Number] = (), *, averaged_after: int | None = None) -> None:
        self.typecode = typecode
        self.keep = averaged_after
        self._chunks: list[_Chunk] = []
        self._starts: list[int] = []  # each chunk's first index
        self._averaged = 1  # chunks before this one are the first (never averaged) and averaged spans
        self._tail: array[Any] = array(typecode)
        self._cached: array[Any] | None = None
        self._cached_at = -1  # the chunk unpacked in ``_cached``
        self._dirty = False  # whether ``_cached`` was written to since it was unpacked
        self.extend(values)

    # ------------------------------------------------------------ growing
    def append(self, value: Number) -> None:
        tail = self._tail
        tail.append(value)
        if len(tail) == CHUNK:
            self._seal()

    def extend(self, values: Iterable[Number]) -> None:
        values = values if isinstance(values, (list, tuple)) else list(values)
        start, typecode = 0, self.typecode
        while start < len(values):
            tail = self._tail
            room = CHUNK - len(tail)
            tail.frombytes(_machine_bytes(typecode, values[start : start + room]))
            start += room
            if len(tail) == CHUNK:
                self._seal()

    def _sealed(self) -> int:
        return self._starts[-1] + self._chunks[-1].count if self._chunks else 0

    def _seal(self) -> None:
        self._flush()
        self._cached_at = -1  # chunk numbers may shift below
        chunk, start = _Chunk(self._tail), self._sealed()
        self._tail = array(self.typecode)
        chunks = self._chunks
        if chunks and not chunks[-1].averaged and chunks[-1].joins(chunk, self.typecode):
            chunks[-1].count += chunk.count
            chunks[-1].last = chunk.last
        else:
            chunks.append(chunk)
            self._starts.append(start)
        if self.keep is not None:
            self._average_before(len(self) - self.keep)

    def _average_before(self, cutoff: int) -> None:
        """Average every chunk after the first that ends at or before ``cutoff``; merge spans of equal or
        growing size up to :data:`MAX_SPAN`."""
        chunks, starts = self._chunks, self._starts
        while self._averaged < len(chunks) and starts[self._averaged] + chunks[self._averaged].count <= cutoff:
            i = self._averaged
            chunk = chunks[i]
            if chunk.data:  # (a chunk of two numbers is small already: kept exact)
                if self.typecode == "q" and NONE_CODE in chunk.unpack("q"):
                    return  # None beside numbers: kept exact (and every later chunk with it)
                chunks[i] = _span(chunk.count, chunk.total(self.typecode), self.typecode)
            self._averaged += 1
            while i > 1 and chunks[i].averaged and chunks[i - 1].averaged and chunks[i - 1].count <= chunks[i].count:
                if chunks[i - 1].count + chunks[i].count > MAX_SPAN:
                    break
                a, b = chunks[i - 1], chunks[i]
                chunks[i - 1] = _span(a.count + b.count, a.sum + b.sum, self.typecode)
                del chunks[i], starts[i]
                self._averaged -= 1
                i -= 1

    # ------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self._sealed() + len(self._tail)

    def _position(self, index: int) -> tuple[int, int]:
        """(chunk, offset) of ``index``; chunk ``len(self._chunks)`` is the tail."""
        sealed = self._sealed()
        if index < 0:
            index += sealed + len(self._tail)
        if not 0 <= index < sealed + len(self._tail):
            raise IndexError("PackedArray index out of range")
        if index >= sealed:
            return len(self._chunks), index - sealed
        chunk = bisect_right(self._starts, index) - 1
        return chunk, index - self._starts[chunk]

    def _unpacked(self, chunk: int) -> array:
        if self._cached_at != chunk:
            self._flush()
            self._cached = self._chunks[chunk].unpack(self.typecode)
            self._cached_at = chunk
        return self._cached  # type: ignore[return-value]

    def _flush(self) -> None:
        """Pack the unpacked chunk again if it was written to."""
        if self._dirty:
            chunk = self._chunks[self._cached_at] = _Chunk(self._cached)  # type: ignore[arg-type]
            if self._cached_at < self._averaged and self._cached_at > 0:  # a span written to: still a span
                chunk.averaged, chunk.sum = True, sum(self._cached)  # type: ignore[arg-type]
            self._dirty = False

    def __getitem__(self, index: int) -> Any:  # an int, or a float in a "d" array
        chunk, offset = self._position(index)
        if chunk == len(self._chunks):
            return self._tail[offset]
        if chunk == self._cached_at:
            return self._cached[offset]  # type: ignore[index]
        value = self._chunks[chunk].get(offset)
        return self._unpacked(chunk)[offset] if value is None else value

    def __setitem__(self, index: int, value: Number) -> None:
        tail = self._tail
        offset = index - self._sealed() if index >= 0 else index + len(tail)
        if 0 <= offset < len(tail):  # (the recent values: most writes)
            tail[offset] = value
            return
        chunk, offset = self._position(index)
        if chunk == len(self._chunks):
            self._tail[offset] = value
            return
        self._unpacked(chunk)[offset] = value
        self._dirty = True

    def assign(self, indices: Sequence[int], values: Sequence[Number]) -> None:
        """``self[i] = v`` for each of ``indices`` and ``values`` in turn (as many of each); a run of consecutive
        indices in the unpacked tail (a batch of recent records frozen) is written in one slice."""
        tail, count = self._tail, len(indices)
        if len(values) != count:
            raise ValueError(f"{count} indices and {len(values)} values")
        first = indices[0] - self._sealed() if indices else -1
        if 0 <= first and first + count <= len(tail) and indices == list(range(indices[0], indices[0] + count)):
            tail[first : first + count] = array(self.typecode, _machine_bytes(self.typecode, values))
            return
        for index, value in zip(indices, values):
            self[index] = value

    def __iter__(self) -> Iterator[Any]:
        for i, chunk in enumerate(self._chunks):
            yield from self._unpacked(i) if chunk.data or i == self._cached_at else chunk.values(self.typecode)
        yield from self._tail

    def tolist(self) -> list[Any]:
        return list(self)

    def bisect_right(self, value: Number) -> int:
        """Where ``value`` would go in sorted contents (as :func:`bisect.bisect_right`), unpacking one chunk at most."""
        self._flush()
        chunks = self._chunks
        lo, hi = 0, len(chunks)
        while lo < hi:  # the first chunk whose last value is above ``value``
            mid = (lo + hi) // 2
            if chunks[mid].last <= value:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(chunks):
            return self._sealed() + bisect_right(self._tail, value)
        chunk = chunks[lo]
        if not chunk.data and chunk.step > 0 and self.typecode != "d":  # arithmetic: computed
            return self._starts[lo] + min(chunk.count, max(0, int((value - chunk.first) // chunk.step) + 1))
        return self._starts[lo] + bisect_right(self._unpacked(lo), value)

    def averaged(self) -> tuple[int, int]:
        """(first, stop): the values ``first`` to ``stop - 1`` read as the mean of their span rather than as
        appended; (0, 0) when none do."""
        if self._averaged <= 1:
            return 0, 0
        last = self._averaged - 1
        return self._starts[1], self._starts[last] + self._chunks[last].count

    def packed_chunks(self) -> int:
        """How many packed chunks (or spans) hold the values before the last, unfinished chunk."""
        return len(self._chunks)

    def nbytes(self) -> int:
        """About how many bytes the contents take."""
        self._flush()
        return sum(chunk.nbytes() for chunk in self._chunks) + self._tail.itemsize * len(self._tail)
