"""PackedArray gives back every value appended, whatever its chunks packed into, and packs a steady loop small."""

from __future__ import annotations

import io
import math
import random
import struct
from bisect import bisect_right

import pytest

import graphwatch
from graphwatch.model import packed
from graphwatch.model.packed import CHUNK, MAX_SPAN, NONE_CODE, PackedArray


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
        "None codes beside values": ("q", [NONE_CODE if i % 3 else rng.randrange(2**40) for i in range(n)]),
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
    assert 1 <= array_.packed_chunks() <= 3  # chunks that continue each other are joined
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


def test_assign_writes_each_index_its_value_in_the_tail_and_in_packed_chunks() -> None:
    """A batch of records frozen at once writes its row numbers in one call: a consecutive run in the
    unfinished tail, or any indices (unordered, in packed chunks) one by one, as ``array_[i] = v`` would."""
    values = [-1] * (CHUNK + 40)
    array_ = PackedArray("q", values)
    for indices in ([CHUNK + 3, CHUNK + 4, CHUNK + 5], [CHUNK + 10, CHUNK + 12, CHUNK + 11], [7, CHUNK + 20, 2], []):
        written = [100 + i for i in range(len(indices))]
        array_.assign(indices, written)
        for index, value in zip(indices, written):
            values[index] = value
        assert array_.tolist() == values
    assert array_[CHUNK + 11] == 102 and array_[CHUNK + 12] == 101  # (unordered: not taken for a run)
    with pytest.raises(ValueError):
        array_.assign([CHUNK + 1, CHUNK + 2], [5])  # (a short slice would shift every value after it)
    assert array_.tolist() == values


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


def test_a_steady_column_stays_one_chunk_however_long() -> None:
    array_ = PackedArray("q", range(0, 3 * 100 * CHUNK, 3))
    assert array_.packed_chunks() == 1 and array_[77 * CHUNK + 5] == 3 * (77 * CHUNK + 5)


def test_averaged_values_are_their_span_means_and_the_first_and_last_ones_stay_exact() -> None:
    rng = random.Random(3)
    keep = 2 * CHUNK
    values = [rng.randrange(1000) for _ in range(40 * CHUNK + 123)]
    array_ = PackedArray("q", values, averaged_after=keep)
    first, stop = array_.averaged()
    assert first == CHUNK and len(values) - keep - CHUNK < stop <= len(values) - keep
    read = array_.tolist()
    assert read[:first] == values[:first] and read[stop:] == values[stop:]  # exact where not averaged
    spans = []  # runs of one repeated value: a span (or neighbouring spans of one rounded mean)
    start = first
    for i in range(first + 1, stop + 1):
        if i == stop or read[i] != read[start]:
            spans.append((start, i))
            start = i
    for a, b in spans:
        assert abs(read[a] - sum(values[a:b]) / (b - a)) <= 0.5  # the rounded mean of what it stands for


def test_averaged_spans_keep_a_long_run_to_a_few_chunks() -> None:
    rng = random.Random(4)
    array_ = PackedArray("d", averaged_after=CHUNK)
    chunks = 512
    for _ in range(chunks):
        array_.extend(rng.random() for _value in range(CHUNK))
    spans = chunks * CHUNK // MAX_SPAN
    assert spans < array_.packed_chunks() <= spans + 10  # full spans, then a few smaller ones and two chunks
    assert array_.nbytes() < 3 * CHUNK * 8  # the exact first and last chunks, and the spans


def test_none_codes_are_never_averaged_with_numbers() -> None:
    values = [NONE_CODE if i % 2 else 5 for i in range(10 * CHUNK)]
    array_ = PackedArray("q", values, averaged_after=CHUNK)
    assert array_.tolist() == values and array_.averaged() == (0, 0)


_EXACT_FIELDS = {
    "steps": ("index", "source", "backwards", "optimizer_steps", "optimizer_site", "stale_grads", "detail"),
    "backwards": ("id", "step", "site", "api", "retain_graph", "create_graph", "earlier_nodes_reached",
                  "graph_reused", "held_bytes"),
}  # fmt: skip


def test_a_long_run_averages_old_measurements_only_and_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The same seeded run with the exact window shrunk to 64 rows (chunks of 16): ids, flags and what the
    analysis tests for zero stay exact, the findings are the same, and the terminal, the HTML report and
    the saved trace all say which steps were averaged."""
    from test_columns import _session_trace

    from graphwatch.model import columns
    from graphwatch.rendering.html import write_report
    from graphwatch.rendering.terminal import make_console, print_summary
    from graphwatch.rendering.wording import averaged_text

    whole = _session_trace(300)
    monkeypatch.setattr(packed, "CHUNK", 16)
    monkeypatch.setattr(columns, "AVERAGE_AFTER", 64)
    averaged = _session_trace(300)
    first, stop = averaged.averaged_from, averaged.averaged_before
    assert (whole.averaged_from, whole.averaged_before) == (0, 0) and 0 < first < stop <= 300 - 64 + 16
    for name, fields in _EXACT_FIELDS.items():
        for field in fields:
            values = columns.field_values(getattr(averaged, name), field)
            assert values == columns.field_values(getattr(whole, name), field), (name, field)
    for field in ("nodes_created", "saved_packed", "live_nodes"):  # deterministic measurements
        got, expected = (columns.field_values(t.steps, field) for t in (averaged, whole))
        assert got[:first] == expected[:first] and got[stop:] == expected[stop:], field
        assert got[first:stop] != expected[first:stop] or len(set(expected[first:stop])) == 1, field
        assert abs(sum(got) - sum(expected)) <= (stop - first) / 2, field  # each span reads its rounded mean
    assert [(f.kind, f.evidence.get("steps")) for f in averaged.findings] == [
        (f.kind, f.evidence.get("steps")) for f in whole.findings
    ]
    notice = averaged_text(averaged)
    assert f"steps {first:,} to {stop - 1:,}" in notice
    out = io.StringIO()
    print_summary(averaged, make_console(out))
    assert notice in " ".join(out.getvalue().split())
    report = write_report(averaged, tmp_path / "report")
    assert notice in report.read_text()
    loaded = graphwatch.load(tmp_path / "report" / "trace.json")
    assert (loaded.averaged_from, loaded.averaged_before) == (first, stop)
