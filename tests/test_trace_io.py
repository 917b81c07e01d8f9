"""``gw.save(path)`` / ``graphwatch.load(path)``: a versioned JSON trace, written atomically.

A file graphwatch cannot read raises :class:`graphwatch.TraceFormatError`
whose message names the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat

import pytest
import torch
import torch.nn as nn

import graphwatch
from graphwatch.capture.recorder import FREEZE_BATCH
from graphwatch.model import FORMAT, VERSION

pytestmark = pytest.mark.usefixtures("no_session_left")


@pytest.fixture(scope="module")
def rich_session() -> graphwatch.Session:
    """A session whose trace has every kind of record: nodes, saved tensors, retained and failed
    backwards, holders, crossings, snapshots and findings with evidence."""
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    head = nn.Linear(4, 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.01)
    losses = []
    with graphwatch.watch(summary=False) as gw:
        h = torch.zeros(4)
        for _ in range(6):
            with gw.step():
                h = torch.tanh(w @ h + torch.randn(4))  # carried across steps without detach
                loss = head(h).sum()
                losses.append(loss)  # keeps every graph alive
                loss.backward(retain_graph=True)
                opt.step()  # no zero_grad
        with gw.step():
            y = w.exp().sum()
            y.backward()
            with pytest.raises(RuntimeError):
                y.backward()  # through the freed graph
    return gw


def _as_dicts(trace: graphwatch.Trace) -> dict:
    return dataclasses.asdict(trace)


def test_rich_session_has_every_kind_of_record(rich_session):
    """Guards the round-trip test below against comparing empty traces."""
    trace = rich_session.trace
    assert trace.nodes and trace.saved and trace.sites and trace.snapshots
    assert any(b.crossings for b in trace.backwards) and any(b.error for b in trace.backwards)
    assert any(s.holders for s in trace.steps) and any(s.nodes_alive_by_step for s in trace.steps)
    assert {f.kind for f in trace.findings} >= {"graph-carried-across-steps", "backward-through-freed-graph", "retained-graph"}


def test_save_then_load_round_trips_every_record(rich_session, tmp_path):
    path = tmp_path / "trace.json"
    assert rich_session.save(path) == path
    loaded = graphwatch.load(path)
    assert isinstance(loaded, graphwatch.Trace)
    assert loaded == rich_session.trace
    assert _as_dicts(loaded) == _as_dicts(rich_session.trace)
    # tuples and int keys come back as tuples and ints, not JSON's lists and strings
    step = next(s for s in loaded.steps if s.nodes_alive_by_step)
    assert all(type(k) is int for k in step.nodes_alive_by_step)
    assert all(type(s.shape) is tuple for s in loaded.saved.values())
    assert all(type(c) is tuple for b in loaded.backwards for c in b.crossings)
    assert all(type(k) is int for k in loaded.nodes)


def test_saved_file_is_versioned_json(rich_session, tmp_path):
    path = rich_session.save(tmp_path / "trace.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert (data["format"], data["version"]) == (FORMAT, VERSION) == ("graphwatch-trace", 7)
    assert set(data["steps"]) == set(data["backwards"]) == {"count", "columns", "extra"}  # version 2: columns
    assert data["steps"]["count"] == len(rich_session.trace.steps)


def test_a_version_1_trace_still_loads(rich_session, tmp_path):
    from graphwatch.model.trace_io import _plain, trace_to_dict

    data = trace_to_dict(rich_session.trace)
    data["version"] = 1  # version 1 wrote steps and backwards as lists of objects
    data["steps"] = [_plain(s) for s in rich_session.trace.steps]
    data["backwards"] = [_plain(b) for b in rich_session.trace.backwards]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    assert graphwatch.load(path) == rich_session.trace


def test_patches_and_focused_pictures_round_trip_and_a_version_2_trace_loads_without_them(rich_session, tmp_path):
    """Version 3 adds a finding's patch and a snapshot's focused picture; a version 2 trace has neither."""
    from graphwatch.model import save_trace
    from graphwatch.model.trace_io import trace_to_dict

    trace = graphwatch.load(rich_session.save(tmp_path / "copy.json"))  # (the shared session stays as it is)
    assert any(s.focus for s in trace.snapshots)
    trace.findings[0].patch = "--- train.py\n+++ train.py\n@@ -1 +1 @@\n-a\n+b\n"
    save_trace(trace, tmp_path / "v3.json")
    loaded = graphwatch.load(tmp_path / "v3.json")
    assert loaded.findings[0].patch == trace.findings[0].patch
    assert [s.focus for s in loaded.snapshots] == [s.focus for s in trace.snapshots]
    data = trace_to_dict(trace)
    data["version"] = 2
    for row in data["findings"]:
        row.pop("patch", None)
    for row in data["snapshots"]:
        row.pop("focus", None)
    (tmp_path / "v2.json").write_text(json.dumps(data))
    old = graphwatch.load(tmp_path / "v2.json")
    assert [f.patch for f in old.findings] == [None] * len(trace.findings)
    assert [s.focus for s in old.snapshots] == [None] * len(trace.snapshots)
    assert [s.dot for s in old.snapshots] == [s.dot for s in trace.snapshots]


def test_remedies_round_trip_and_a_version_3_trace_loads_without_them(rich_session, tmp_path):
    """Version 4 adds a finding's remedies (edits as data); a version 3 trace has none."""
    from graphwatch.model import Edit, Remedy, save_trace
    from graphwatch.model.trace_io import trace_to_dict

    trace = graphwatch.load(rich_session.save(tmp_path / "copy.json"))
    remedy = Remedy("detach `h`", [Edit("detach-state", "train.py", 7, target="h", until=9)], why="w", mechanical=True)
    trace.findings[0].remedies = [remedy, Remedy("advice only")]
    save_trace(trace, tmp_path / "v4.json")
    assert graphwatch.load(tmp_path / "v4.json").findings[0].remedies == [remedy, Remedy("advice only")]
    data = trace_to_dict(trace)
    data["version"] = 3
    for row in data["findings"]:
        row.pop("remedies", None)
    (tmp_path / "v3.json").write_text(json.dumps(data))
    assert [f.remedies for f in graphwatch.load(tmp_path / "v3.json").findings] == [[]] * len(trace.findings)
    data["findings"][0]["remedies"] = [{"text": "t", "edits": ["not an object"]}]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(graphwatch.TraceFormatError, match="edits"):
        graphwatch.load(tmp_path / "bad.json")


@pytest.mark.parametrize("field, value", [("patch", 5), ("patch", ["-a"]), ("focus", {"dot": 1})])
def test_load_of_a_damaged_patch_or_focus_names_the_field(rich_session, tmp_path, field, value):
    from graphwatch.model.trace_io import trace_to_dict

    data = trace_to_dict(rich_session.trace)
    data["findings" if field == "patch" else "snapshots"][0][field] = value
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data))
    message = _load_error(path)
    assert f"field '{field}' is {value!r}, expected str | None" in message and "record the run again" in message


def test_a_long_run_is_written_in_columns_and_kept_in_columns(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(summary=False, keep_steps=3) as gw:
        for _ in range(300):
            opt.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
            if gw.trace.steps.frozen():
                break  # the first batch of settled steps went into columns
    assert len(gw.trace.steps) == FREEZE_BATCH + 4 and gw.trace.steps.frozen() == FREEZE_BATCH  # not step 0, last 3
    trace = gw.trace
    assert trace.steps.frozen() == len(trace.steps) - 4 == trace.backwards.frozen()  # and the rest at the end
    assert [s.index for s in trace.steps] == list(range(len(trace.steps)))
    assert [b.id for b in trace.backwards] == list(range(len(trace.steps)))
    assert trace.steps[5].backwards == [5] and trace.backwards[5].step == 5 and not trace.steps[5].detail
    path = gw.save(tmp_path / "trace.json")
    columns = json.loads(path.read_text())["steps"]["columns"]
    assert columns["index"] == {"from": 0} and columns["source"] == {"all": "optimizer"}
    assert columns["backwards.first"] == {"from": 0} and columns["backwards.count"] == {"all": 1}
    loaded = graphwatch.load(path)
    assert loaded == trace and loaded.steps.frozen() == trace.steps.frozen() == loaded.backwards.frozen()


def test_save_of_a_loaded_trace_writes_the_same_file(rich_session, tmp_path):
    first = rich_session.save(tmp_path / "a.json")
    from graphwatch.model import save_trace

    save_trace(graphwatch.load(first), tmp_path / "b.json")
    assert (tmp_path / "b.json").read_bytes() == first.read_bytes()


def test_save_leaves_no_temporary_file_and_replaces_an_existing_file_whole(rich_session, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("x" * 5_000_000)  # an older, much larger file
    rich_session.save(path)
    assert os.listdir(tmp_path) == ["trace.json"]
    text = path.read_text(encoding="utf-8")
    assert "x" * 100 not in text
    assert graphwatch.load(path) == rich_session.trace


def test_failed_save_keeps_the_old_file_and_leaves_no_temporary_file(rich_session, tmp_path, monkeypatch):
    path = tmp_path / "trace.json"
    rich_session.save(path)
    before = path.read_bytes()

    def replace_fails(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace_fails)  # the failure happens after the whole text was written
    with pytest.raises(graphwatch.UsageError, match="No space left on device"):
        rich_session.save(path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["trace.json"]
    assert path.read_bytes() == before


def test_unserialisable_trace_does_not_touch_the_old_file(tmp_path):
    path = tmp_path / "trace.json"
    with graphwatch.watch(summary=False) as gw:
        pass
    gw.save(path)
    before = path.read_bytes()
    gw.trace.options["bad"] = object()  # json cannot write this
    with pytest.raises(TypeError):
        gw.save(path)
    assert os.listdir(tmp_path) == ["trace.json"]
    assert path.read_bytes() == before


def test_saved_trace_has_the_permissions_of_a_normally_written_file(rich_session, tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    normal = tmp_path / "normal.json"
    normal.write_text("{}")
    path = rich_session.save(tmp_path / "trace.json")
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(normal.stat().st_mode) == 0o666 & ~umask


# ------------------------------------------------------------ load errors
def _load_error(path) -> str:
    with pytest.raises(graphwatch.TraceFormatError) as raised:
        graphwatch.load(path)
    assert isinstance(raised.value, graphwatch.GraphwatchError)
    return str(raised.value)


def test_load_of_foreign_json_names_the_fix(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"a": 1}))
    message = _load_error(path)
    assert "is not a graphwatch trace" in message and str(path) in message
    assert "pass a trace.json written by graphwatch" in message


def test_load_of_a_json_list_names_the_fix(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    assert "is not a graphwatch trace" in _load_error(path)


def test_load_of_a_newer_version_names_the_fix(tmp_path):
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 999}))
    message = _load_error(path)
    assert "999" in message and "newer" in message
    assert "upgrade graphwatch" in message


def test_load_of_truncated_json_names_the_fix(rich_session, tmp_path):
    full = rich_session.save(tmp_path / "full.json").read_bytes()
    path = tmp_path / "truncated.json"
    path.write_bytes(full[: len(full) // 2])
    message = _load_error(path)
    assert "not valid JSON" in message and "truncated or corrupted" in message
    assert "record the run again" in message


def test_load_of_an_empty_file_names_the_fix(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("")
    assert "record the run again" in _load_error(path)


def test_load_of_a_missing_path_names_the_fix(tmp_path):
    path = tmp_path / "nowhere" / "trace.json"
    message = _load_error(path)
    assert "does not exist" in message and str(path) in message
    assert "pass the trace.json a session wrote" in message


def test_load_of_a_binary_file_names_the_fix(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"w": torch.randn(64)}, path)  # a real binary file users might pass by mistake
    message = _load_error(path)
    assert str(path) in message
    assert "pass the trace.json a session wrote" in message or "record the run again" in message


def test_load_of_a_directory_names_the_fix(tmp_path):
    assert "pass the trace.json a session wrote" in _load_error(tmp_path)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param({"steps": 5}, id="field-not-a-list"),
        pytest.param({"steps": [{"index": 0}]}, id="record-missing-a-field"),
        pytest.param({"steps": [{"index": 0, "source": "optimizer", "nodes_alive_by_step": 5}]}, id="mapping-not-an-object"),
        pytest.param(
            {"steps": [{"index": 0, "source": "optimizer", "saved_alive_by_step": {"x": 1}}]}, id="step-key-not-a-number"
        ),
        pytest.param(
            {"saved": [{"id": 0, "step": 0, "site": None, "nbytes": 1, "kind": "activation", "shape": 5}]},
            id="shape-not-a-list",
        ),
        pytest.param({"steps": [{"index": 0, "source": "optimizer", "holders": [5]}]}, id="holder-not-an-object"),
    ],
)
def test_load_of_a_damaged_trace_names_the_fix(tmp_path, damage):
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 1, **damage}))  # records as version 1 wrote them
    message = _load_error(path)
    assert "damaged" in message and "record the run again" in message


_STEP = {"index": [0], "source": ["optimizer"]}


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([{"index": 0, "source": "optimizer"}], id="a-list-where-columns-belong"),
        pytest.param({"count": 2, "columns": _STEP}, id="column-shorter-than-count"),
        pytest.param({"count": 1, "columns": {"index": [0]}}, id="record-missing-a-field"),
        pytest.param({"count": 1, "columns": {**_STEP, "seconds": {"every": 1}}}, id="column-of-unknown-form"),
        pytest.param({"count": 1, "columns": _STEP, "extra": [[3, {"stale_grads": 1}]]}, id="extra-for-no-record"),
        pytest.param({"count": 1, "columns": _STEP, "extra": [{"stale_grads": 1}]}, id="extra-not-a-pair"),
        pytest.param({"count": 1, "columns": {**_STEP, "backwards.first": ["a"]}}, id="range-not-a-number"),
        pytest.param(
            {"count": 1, "columns": {**_STEP, "backwards.first": [5], "backwards.count": [1], "detail": [False]}},
            id="step-naming-a-missing-backward",
        ),
    ],
)
def test_load_of_damaged_columns_names_the_fix(tmp_path, steps):
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 2, "steps": steps}))
    message = _load_error(path)
    assert "damaged" in message and "record the run again" in message


def test_load_of_a_non_integer_version_is_not_called_newer(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"format": FORMAT, "version": "1"}))
    message = _load_error(path)
    assert "newer" not in message and "upgrade" not in message
