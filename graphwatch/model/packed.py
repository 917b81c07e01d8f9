"""An append-mostly array of numbers that packs each full chunk: a long run's per-step numbers in a few bits.

A million-step session keeps a few numbers per step and per backward (totals,
timings, step bounds).  As plain ``array`` columns that is about 300 bytes a
step.  :class:`PackedArray` keeps the last, unfinished chunk of
:data:`CHUNK` values as a plain ``array`` and packs every full chunk the moment
it fills: a chunk of equal values or of an arithmetic sequence becomes two
numbers; any other chunk becomes its differences (whole numbers) or its
values (floats), with their bytes shuffled (all first bytes, then all second
bytes, ...) and zlib-compressed, which takes a clean loop's step timings to a
few bytes each and its totals to almost nothing.  Packing is lossless: every
read gives back the value appended.

Reads of a packed chunk unpack it once and keep the last chunk unpacked, so a
scan in order costs one unpack per chunk.  Writes to a packed chunk (a step
settled long after it ended, or a loaded trace's steps put into columns)
change the unpacked copy, which is packed again when another chunk is
unpacked: writes in order cost one unpack and one pack per chunk.

Example::

    >>> from graphwatch.model.packed import PackedArray, CHUNK
    >>> steps = PackedArray("q")
    >>> steps.extend(range(3 * CHUNK))
    >>> len(steps), steps[CHUNK + 5], steps.packed_chunks()
    (12288, 4101, 3)
    >>> steps.nbytes()                       # three arithmetic chunks: two numbers each
    216
    >>> steps.bisect_right(4101.5)           # sorted contents: found without unpacking
    4102
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate, pairwise
from typing import Any

CHUNK = 4096  # values per packed chunk

Number = int | float


class _Chunk:
    """One full chunk, packed: ``first`` and ``step`` (equal values, or whole numbers in an arithmetic
    sequence; ``data`` empty), else the shuffled, compressed bytes of its values or of their differences."""

    __slots__ = ("data", "deltas", "first", "last", "step")

    def __init__(self, values: array) -> None:
        self.first: Number = values[0]
        self.last: Number = values[-1]
        self.step: Number = 0
        self.deltas = False
        self.data = b""
        raw = values.tobytes()
        if raw == values[:1].tobytes() * len(values):  # equal values (bytes: -0.0 is not 0.0)
            return
        if values.typecode != "d":
            step = values[1] - values[0]
            if all(b - a == step for a, b in pairwise(values)):
                self.step = step
                return
        if values.typecode == "q":  # whole numbers: differences are small where values move slowly
            try:
                raw = array("q", [values[0], *(b - a for a, b in pairwise(values))]).tobytes()
                self.deltas = True
            except OverflowError:  # None's code beside real values: keep the values
                pass
        width = values.itemsize
        self.data = zlib.compress(b"".join(raw[i::width] for i in range(width)), 1)

    def unpack(self, typecode: str) -> array:
        if not self.data:
            first, step = self.first, self.step
            return array(typecode, [first + step * i for i in range(CHUNK)] if step else [first] * CHUNK)
        shuffled = zlib.decompress(self.data)
        width = len(shuffled) // CHUNK
        raw = bytearray(len(shuffled))
        for i in range(width):
            raw[i::width] = shuffled[i * CHUNK : (i + 1) * CHUNK]
        values = array(typecode)
        values.frombytes(bytes(raw))
        if self.deltas:
            values = array(typecode, accumulate(values))
        return values

    def get(self, offset: int) -> Number | None:
        """The value at ``offset`` without unpacking, when the chunk is two numbers; else None."""
        return None if self.data else self.first + self.step * offset

    def nbytes(self) -> int:
        return 72 + len(self.data)


class PackedArray:
    """A sequence of numbers of one ``array`` typecode ("q", "b" or "d") whose full chunks are packed."""

    __slots__ = ("_cached", "_cached_at", "_chunks", "_dirty", "_tail", "typecode")

    def __init__(self, typecode: str, values: Iterable[Number] = ()) -> None:
        self.typecode = typecode
        self._chunks: list[_Chunk] = []
        self._tail: array[Any] = array(typecode)
        self._cached: array[Any] | None = None
        self._cached_at = -1  # the chunk unpacked in ``_cached``
        self._dirty = False  # whether ``_cached`` was written to since it was unpacked
        self.extend(values)

    def append(self, value: Number) -> None:
        tail = self._tail
        tail.append(value)
        if len(tail) == CHUNK:
            self._chunks.append(_Chunk(tail))
            self._tail = array(self.typecode)

    def extend(self, values: Iterable[Number]) -> None:
        for value in values:
            self.append(value)

    def __len__(self) -> int:
        return len(self._chunks) * CHUNK + len(self._tail)

    def _position(self, index: int) -> tuple[int, int]:
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("PackedArray index out of range")
        return divmod(index, CHUNK)

    def _unpacked(self, chunk: int) -> array:
        if self._cached_at != chunk:
            self._flush()
            self._cached = self._chunks[chunk].unpack(self.typecode)
            self._cached_at = chunk
        return self._cached  # type: ignore[return-value]

    def _flush(self) -> None:
        """Pack the unpacked chunk again if it was written to."""
        if self._dirty:
            self._chunks[self._cached_at] = _Chunk(self._cached)  # type: ignore[arg-type]
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
        chunk, offset = self._position(index)
        if chunk == len(self._chunks):
            self._tail[offset] = value
            return
        self._unpacked(chunk)[offset] = value
        self._dirty = True

    def __iter__(self) -> Iterator[Any]:
        for chunk in range(len(self._chunks)):
            yield from self._unpacked(chunk)
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
            return lo * CHUNK + bisect_right(self._tail, value)
        return lo * CHUNK + bisect_right(self._unpacked(lo), value)

    def packed_chunks(self) -> int:
        """How many full chunks are packed."""
        return len(self._chunks)

    def nbytes(self) -> int:
        """About how many bytes the contents take."""
        self._flush()
        return sum(chunk.nbytes() for chunk in self._chunks) + self._tail.itemsize * len(self._tail)
