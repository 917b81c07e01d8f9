"""Records kept in columns read back field by field exactly as record by record."""

from __future__ import annotations

import dataclasses

import torch

import graphwatch
from graphwatch.model import save_trace
from graphwatch.model.column_json import to_json_columns
from graphwatch.model.columns import BACKWARD_COLUMNS, STEP_COLUMNS, RecordList, field_values


def _session_trace(steps: int) -> graphwatch.Trace:
    """A real run long enough that most steps and backwards are frozen into columns, with a retained graph,
    a kept loss and no optimizer on some steps (fields at and off their defaults, None and not)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with graphwatch.watch(summary=False, snapshots="off", keep_steps=5) as gw:
        for step in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward(retain_graph=step % 7 == 0)
            if step % 3:
                opt.step()
            if step % 50 == 0:
                kept.append(loss)
            gw.end_step()
    return gw.trace


def test_every_field_reads_the_same_from_columns_as_from_records() -> None:
    trace = _session_trace(300)
    for records, columns in ((trace.steps, STEP_COLUMNS), (trace.backwards, BACKWARD_COLUMNS)):
        assert isinstance(records, RecordList) and 0 < records.frozen() < len(records)
        built = list(records)
        for field in dataclasses.fields(columns.cls):
            assert field_values(records, field.name) == [getattr(r, field.name) for r in built], field.name


def test_a_plain_list_reads_record_by_record() -> None:
    steps = list(_session_trace(20).steps)
    assert field_values(steps, "index") == list(range(len(steps)))


def test_json_columns_of_the_columns_equal_those_of_the_records() -> None:
    from graphwatch.model.trace_io import _plain

    trace = _session_trace(300)
    for records, columns in ((trace.steps, STEP_COLUMNS), (trace.backwards, BACKWARD_COLUMNS)):
        assert isinstance(records, RecordList) and records.loose()
        assert to_json_columns(records, columns, _plain) == to_json_columns(list(records), columns, _plain)


def test_a_loaded_trace_reads_the_same_and_keeps_its_settled_steps_in_columns(tmp_path) -> None:
    trace = _session_trace(300)
    path = tmp_path / "trace.json"
    save_trace(trace, path)
    loaded = graphwatch.load(path)
    for name in ("steps", "backwards"):
        original, back = getattr(trace, name), getattr(loaded, name)
        assert list(back) == list(original), name
        assert isinstance(back, RecordList) and back.frozen() >= original.frozen() > 0, name


def test_indexing_reads_as_a_list_does_across_frozen_records_and_those_appended_since() -> None:
    """Records appended after a freeze (no row written for them yet) read, slice, thaw and count as in a list; an
    index past either end raises IndexError, as a list's does."""
    from graphwatch.model import StepRecord

    made = [StepRecord(index=i, source="optimizer", seconds=i / 8, backwards=[i], detail=False) for i in range(7)]
    steps = RecordList(STEP_COLUMNS, made[:4])
    assert steps.freeze_many([0, 2]) == [0, 2]
    steps.extend(made[4:])  # appended after the freeze
    assert list(steps) == made and steps[-1] == made[6] and steps[2:6] == made[2:6] and steps.frozen() == 2
    for index in (7, -8):
        try:
            steps[index]
        except IndexError:
            continue
        raise AssertionError(f"index {index} of 7 records read a record")
    assert steps.freeze_many([5, 6]) == [5, 6] and steps.frozen() == 4 and list(steps) == made
    steps.thaw(5)
    assert steps.object_at(5) == made[5] and steps.frozen() == 3
    assert field_values(steps, "seconds") == [r.seconds for r in made]


def test_a_batch_freezes_nullable_columns_all_none_or_mixed_and_reads_them_back() -> None:
    """A frozen batch whose nullable columns are None throughout (a CPU run's CUDA figures, a loop with no
    optimizer) or None in some records only reads back record for record, None where it was None."""
    from graphwatch.model import StepRecord

    made = [
        StepRecord(index=i, source="backward", seconds=i / 4, backwards=[i], detail=False,
                   optimizer_site=None if i % 3 else i, cuda_allocated=None)
        for i in range(9)
    ]  # fmt: skip
    steps = RecordList(STEP_COLUMNS, made)
    assert steps.freeze_many(range(9)) == list(range(9)) and steps.frozen() == 9
    assert list(steps) == made
    assert field_values(steps, "cuda_allocated") == [None] * 9
    assert field_values(steps, "optimizer_site") == [None if i % 3 else i for i in range(9)]
