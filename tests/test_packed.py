"""PackedArray gives back every value appended, whatever its chunks packed into, and packs a steady loop small."""

from __future__ import annotations

import math
import random
import struct
from bisect import bisect_right

import pytest

from graphwatch.model import packed
from graphwatch.model.columns import _NONE
from graphwatch.model.packed import CHUNK, PackedArray


def _same(a: list, b: list) -> bool:
    """Equal value by value, floats compared by their bits (-0.0 is not 0.0, nan is nan)."""
    if len(a) != len(b):
        return False
    return all(
        struct.pack("d", x) == struct.pack("d", y) if isinstance(x, float) else x == y for x, y in zip(a, b)
    )


def _cases() -> dict[str, tuple[str, list]]:
    rng = random.Random(0)
    n = 3 * CHUNK + 17
    return {
        "steady ints": ("q", list(range(5, 5 + 7 * n, 7))),
        "equal ints": ("q", [42] * n),
        "slowly moving ints": ("q", [1_000_000 + 4096 * (i // 100) for i in range(n)]),
        "random ints": ("q", [rng.randrange(-(2**62), 2**62) for _ in range(n)]),
        "None codes beside values": ("q", [_NONE if i % 3 else rng.randrange(2**40) for i in range(n)]),
        "row numbers with holes": ("q", [-1 if i % 5 == 0 else i for i in range(n)]),
        "flags": ("b", [rng.random() < 0.1 for _ in range(n)]),
        "timings": ("d", [0.001 + rng.random() * 1e-4 for _ in range(n)]),
        "odd floats": ("d", [[-0.0, 0.0, math.inf, -math.inf, math.nan, 1e-308][i % 6] for i in range(n)]),
        "equal floats": ("d", [0.5] * n),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_every_value_reads_back_as_appended(name: str) -> None:
    typecode, values = _cases()[name]
    expected = [int(v) for v in values] if typecode != "d" else values
    array_ = PackedArray(typecode, values)
    assert array_.packed_chunks() == 3
    assert _same(array_.tolist(), expected)
    assert _same([array_[i] for i in range(len(values))], expected)
    assert _same([array_[i] for i in reversed(range(len(values)))], expected[::-1])  # out of order
    assert _same([array_[-1]], [expected[-1]])
    with pytest.raises(IndexError):
        array_[len(values)]


def test_a_write_into_a_packed_chunk_changes_that_value_only() -> None:
    values = list(range(2 * CHUNK + 3))
    array_ = PackedArray("q", values)
    array_[5] = -1  # a step settled long after it ended
    array_[CHUNK + 1] = 99
    array_[-1] = 7
    values[5], values[CHUNK + 1], values[-1] = -1, 99, 7
    assert array_.tolist() == values and array_[5] == -1 and array_[CHUNK + 1] == 99


def test_writes_in_order_into_packed_chunks_read_back_everywhere() -> None:
    """A loaded trace's steps are put into columns after all were appended: every row number is written
    into chunks already packed with placeholders."""
    array_ = PackedArray("q", [-1] * (3 * CHUNK))
    for i in range(3 * CHUNK):
        array_[i] = 2 * i
    assert array_[CHUNK - 1] == 2 * (CHUNK - 1) and array_[0] == 0  # read across the chunk written last
    assert array_.tolist() == list(range(0, 6 * CHUNK, 2))
    assert array_.bisect_right(2 * CHUNK) == CHUNK + 1
    assert array_.nbytes() < 300  # packed again as arithmetic chunks


def test_bisect_right_finds_what_bisect_finds_on_the_list() -> None:
    rng = random.Random(1)
    values = sorted(rng.randrange(0, 10 * CHUNK) for _ in range(3 * CHUNK + 100))
    array_ = PackedArray("q", values)
    for probe in [-1, 0, values[CHUNK - 1], values[CHUNK], values[-1], values[-1] + 1, *rng.sample(values, 200)]:
        assert array_.bisect_right(probe) == bisect_right(values, probe), probe


def test_a_steady_loop_packs_to_a_few_bytes_a_value() -> None:
    rng = random.Random(2)
    n = 50 * CHUNK
    bounds = PackedArray("q", range(0, 9 * n, 9))  # step bounds of a loop making 9 nodes a step
    flags = PackedArray("b", [False] * n)
    rss = PackedArray("q", [300_000_000 + 4096 * (i // 1000) for i in range(n)])
    timings = PackedArray("d", [0.0003 + rng.random() * 2e-5 for _ in range(n)])
    assert (bounds.nbytes() + flags.nbytes()) / n < 0.1
    assert rss.nbytes() / n < 0.5
    assert timings.nbytes() / n < 8  # below a plain array's 8 bytes a value


def test_session_records_read_the_same_from_packed_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_columns import test_every_field_reads_the_same_from_columns_as_from_records as same_fields

    monkeypatch.setattr(packed, "CHUNK", 16)  # a 300-step session then fills many chunks of every column
    same_fields()
