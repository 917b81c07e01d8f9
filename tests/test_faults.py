"""Faults: when the run, the disk or the trace file goes wrong, graphwatch keeps what it recorded and says so.

* An exception or KeyboardInterrupt in the middle of a step (in the forward,
  the backward, the optimizer step, between steps) propagates unchanged; the
  trace so far is kept, ``trace.ended_early`` says why, and ``gw.report(dir)``
  writes a report that says the run ended early.
* A KeyboardInterrupt landing inside graphwatch's own bookkeeping (its pack
  hook, graph walk, step end, holder search, snapshot, optimizer hook...), as
  a Ctrl-C can: the session still exits cleanly and the trace is still usable.
* ``graphwatch run`` stopped by SIGTERM or Ctrl-C (a real subprocess): the
  report is written and says the run ended early.
* A full output folder (a 64 KiB tmpfs, filled) and a read-only one (a
  read-only tmpfs): a clear :class:`graphwatch.UsageError` at save/report
  time, and the training itself unaffected.  Mounting needs root: these tests
  skip where ``mount`` fails.
* Damaged trace files (truncated, bit-flipped, fields of the wrong type,
  nested absurdly deep): ``graphwatch report`` exits 2 with a one-line
  message saying what is wrong — never a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from warm_child import SAY_READY, run_and_signal

import graphwatch
from graphwatch.cli import main
from graphwatch.rendering import svg
from graphwatch.signals import SignalGuard, Terminated

pytestmark = pytest.mark.usefixtures("no_session_left")

REPO = Path(graphwatch.__file__).resolve().parents[2]
TIMEOUT = 120
ENDED_EARLY = "The run ended early"  # what the HTML report says


class Boom(Exception):
    pass


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(steps: int = 5, model_and_opt=None, leak: bool = False) -> dict[str, torch.Tensor]:
    model, opt = model_and_opt or _model()
    seen: dict[str, torch.Tensor] = {}
    total = 0
    for i in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(6, 4)).exp().mean()
        loss.backward()
        opt.step()
        total = total + (loss if leak else loss.item())
        seen[f"loss{i}"] = loss.detach()
        seen.update({f"grad{i}.{n}": p.grad.clone() for n, p in model.named_parameters()})
    return seen


def _global_state() -> tuple:
    return (torch._C._autograd._top_saved_tensors_default_hooks(False), graphwatch.active_session(),
            torch.autograd.graph._engine_run_backward, signal.getsignal(signal.SIGINT))


def _assert_report_says_ended_early(gw: graphwatch.Session, folder: Path, reason: str) -> None:
    index = gw.report(folder)
    page = index.read_text()
    assert ENDED_EARLY in page and reason in page
    loaded = graphwatch.load(folder / "trace.json")
    assert loaded.ended_early == gw.trace.ended_early
    assert [s.index for s in loaded.steps] == [s.index for s in gw.trace.steps]


# ------------------------------------------------------- the user's exceptions
WHERE = ["forward", "backward", "optimizer", "between steps"]


@pytest.mark.parametrize("error", [Boom("boom"), KeyboardInterrupt()], ids=["exception", "KeyboardInterrupt"])
@pytest.mark.parametrize("where", WHERE)
def test_interrupted_step_keeps_the_trace_and_the_report_says_it_ended_early(where, error, tmp_path):
    model, opt = _model()
    calls = {"n": 0}

    def fail_on_step_3(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise error

    if where == "forward":
        model[1].register_forward_hook(fail_on_step_3)
    elif where == "backward":
        model[2].register_full_backward_hook(fail_on_step_3)
    elif where == "optimizer":
        opt.register_step_pre_hook(fail_on_step_3)
    before = _global_state()
    with pytest.raises(type(error)) as raised:
        with graphwatch.watch(summary=False) as gw:
            for _ in range(6):
                opt.zero_grad()
                model(torch.randn(6, 4)).exp().mean().backward()
                opt.step()
                if where == "between steps":
                    fail_on_step_3()
    assert raised.value is error  # the user's own exception, unchanged
    assert _global_state() == before
    steps = gw.trace.steps
    assert [s.index for s in steps] == list(range(len(steps)))
    complete = 4 if where == "between steps" else 3  # the hook's fourth call: after step 4, or inside it
    assert [s.source for s in steps[:complete]] == ["optimizer"] * complete  # the complete steps, all kept
    assert len(steps) == 4  # and the interrupted one is closed too (nothing after an interrupt between steps)
    reason = "KeyboardInterrupt" if isinstance(error, KeyboardInterrupt) else "Boom: boom"
    assert gw.trace.ended_early == reason
    _assert_report_says_ended_early(gw, tmp_path / "report", reason)


def test_keyboard_interrupt_inside_a_retained_backward_of_a_leaking_loop(tmp_path):
    """Findings made before the interrupt stay, with the report; the interrupted backward is recorded."""
    model, opt = _model()
    with pytest.raises(KeyboardInterrupt):
        with graphwatch.watch(summary=False) as gw:
            total = 0
            for i in range(5):
                opt.zero_grad()
                loss = model(torch.randn(6, 4)).exp().mean()
                total = total + loss  # the leak
                if i == 3:
                    loss.register_hook(lambda grad: (_ for _ in ()).throw(KeyboardInterrupt()))
                loss.backward(retain_graph=True)
                opt.step()
    assert gw.findings, "the leak found before the interrupt is kept"
    assert gw.trace.backwards[-1].error is None or "KeyboardInterrupt" not in gw.trace.backwards[-1].error
    assert len(gw.trace.backwards) == 4
    _assert_report_says_ended_early(gw, tmp_path / "report", "KeyboardInterrupt")


# ---------------------------------------------- a Ctrl-C inside graphwatch's own code
# (module, attribute) of graphwatch internals that a KeyboardInterrupt may land in, with the number of
# calls to let through first.  Each is reached in the training below (a leaking loop with snapshots).
INTERNALS = {
    "pack hook": ("graphwatch.capture.hooks.saved", "_new_handle", 7),
    "node tagging": ("graphwatch.capture.recorder.Recorder", "node_born", 9),
    "node record": ("graphwatch.capture.recorder.Recorder", "node_record", 9),
    "saved record": ("graphwatch.capture.recorder.Recorder", "saved_record", 3),
    "graph walk": ("graphwatch.backwards", "walk", 0),
    "quick graph walk": ("graphwatch.backwards", "quick_walk", 2),
    "backward start": ("graphwatch.capture.recorder.Recorder", "begin_backward", 2),
    "backward end": ("graphwatch.capture.recorder.Recorder", "end_backward", 2),
    "step end": ("graphwatch.capture.recorder.Recorder", "end_step", 2),
    "step findings": ("graphwatch.step_ends", "step_findings", 2),
    "holder search": ("graphwatch.capture.causes.holders", "find_holders", 1),
    "snapshot drawing": ("graphwatch.rendering.dot", "snapshot_dots", 0),  # (imported where a snapshot is drawn)
    "optimizer hook": ("graphwatch.capture.hooks.optimizer.GradResetTracker", "before_step", 2),
}


def _resolve(dotted: str):
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ImportError(dotted)


@pytest.mark.parametrize("point", sorted(INTERNALS))
def test_keyboard_interrupt_inside_graphwatchs_own_bookkeeping(point, monkeypatch, tmp_path):
    owner_name, attribute, let_through = INTERNALS[point]
    owner = _resolve(owner_name)
    original = getattr(owner, attribute)
    fired = {"calls": 0, "raised": False}

    def interrupted(*args, **kwargs):
        fired["calls"] += 1
        if fired["calls"] == let_through + 1:
            fired["raised"] = True
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, interrupted)
    before = _global_state()
    with pytest.raises(KeyboardInterrupt):
        with graphwatch.watch(summary=False) as gw:
            _train(6, leak=True)
    monkeypatch.undo()
    assert fired["raised"], f"the training never reached {point} {let_through + 1} times"
    assert _global_state() == before, "the session did not clean up"
    steps = gw.trace.steps
    assert [s.index for s in steps] == list(range(len(steps))), "step records out of order"
    assert gw.trace.ended_early == "KeyboardInterrupt"
    _assert_report_says_ended_early(gw, tmp_path / "report", "KeyboardInterrupt")
    # and the next session works as usual
    with graphwatch.watch(summary=False) as again:
        _train(2)
    assert len(again.trace.steps) == 2 and not again.findings


# ------------------------------------------------------------ graphwatch run + signals
SLEEPER = f"""\
import time
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
{SAY_READY}
while True:  # waits to be stopped
    time.sleep(0.05)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


@pytest.mark.parametrize(
    ("signum", "exit_code", "reason"),
    [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "KeyboardInterrupt")],
    ids=["SIGTERM", "SIGINT"],
)
def test_graphwatch_run_stopped_by_a_signal_writes_the_report_marked_ended_early(signum, exit_code, reason, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SLEEPER)
    out = tmp_path / "report"
    done = run_and_signal([sys.executable, "-m", "graphwatch", "run", "--out", str(out), str(script)], signum,
                          cwd=tmp_path, env=_env(), timeout=TIMEOUT)  # fmt: skip
    stderr = done.stderr
    assert done.returncode == exit_code, stderr
    assert "Exception ignored" not in stderr
    trace = graphwatch.load(out / "trace.json")
    assert reason in trace.ended_early
    assert [s.source for s in trace.steps] == ["optimizer"] * 5
    assert ENDED_EARLY in (out / "index.html").read_text()


# --------------------------------------------------------------- full and read-only disks
@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs(options)``: a fresh tmpfs mounted under tmp_path (skips where mount is not allowed)."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot run mount: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def _fill(folder: Path) -> None:
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.fixture
def full_folder(tmpfs) -> Path:
    folder = tmpfs("size=64k")
    _fill(folder)
    return folder


@pytest.fixture
def read_only_folder(tmpfs) -> Path:
    return tmpfs("ro,size=64k")


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name != "filler" and p.is_file())


def test_full_folder_report_and_save_raise_a_clear_error_and_training_is_unaffected(full_folder, tmp_path):
    bare = _train()
    with graphwatch.watch(summary=False) as gw:
        watched = _train()
    for name in bare:
        assert torch.equal(bare[name], watched[name]), name
    with pytest.raises(graphwatch.UsageError) as raised:
        gw.report(full_folder / "report")
    message = str(raised.value)
    assert "No space left on device" in message and str(full_folder / "report") in message
    with pytest.raises(graphwatch.UsageError, match=r"No space left on device.*free some space"):
        gw.save(full_folder / "trace.json")
    assert _leftovers(full_folder) == [], "temporary files left on the full disk"
    assert gw.save(tmp_path / "trace.json").is_file()  # the trace is intact: saved elsewhere it loads
    assert len(graphwatch.load(tmp_path / "trace.json").steps) == 5


def test_full_folder_as_out_fails_at_the_end_with_a_clear_error_after_training(full_folder, tmp_path):
    bare = _train()
    with pytest.raises(graphwatch.UsageError, match="No space left on device") as raised:
        with graphwatch.watch(summary=False, out=full_folder / "report") as gw:
            watched = _train()
    for name in bare:
        assert torch.equal(bare[name], watched[name]), name
    assert len(gw.trace.steps) == 5  # all recorded; the user can still save it elsewhere
    gw.save(tmp_path / "trace.json")
    assert len(_kept_trace(str(raised.value), " instead").steps) == 5  # and it was saved elsewhere


def _kept_trace(message: str, after: str) -> graphwatch.Trace:
    """The trace a report that could not be written saved to a temporary file instead (the file removed)."""
    path = Path(message.split("the trace was saved to ")[1].split(after)[0])
    try:
        return graphwatch.load(path)
    finally:
        path.unlink()


def test_full_folder_does_not_hide_the_users_own_exception(full_folder):
    """The training failed and the report cannot be written: the user must still see their exception."""
    with pytest.warns(UserWarning, match="No space left on device") as warned, pytest.raises(Boom):
        with graphwatch.watch(summary=False, out=full_folder / "report"):
            _train(2)
            raise Boom("the user's error")
    assert len(_kept_trace(str(warned[0].message), " instead").steps) == 2


def test_graphwatch_report_into_a_full_folder_exits_2(full_folder, tmp_path, capsys):
    with graphwatch.watch(summary=False) as gw:
        _train(2)
    gw.save(tmp_path / "trace.json")
    assert main(["report", str(tmp_path / "trace.json"), "--out", str(full_folder / "report"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphwatch: error: ") and "No space left on device" in err
    assert len(err.strip().splitlines()) == 1


def test_graphwatch_run_into_a_full_folder_runs_the_script_then_exits_2(full_folder, tmp_path, capsys):
    script = tmp_path / "train.py"
    marker = tmp_path / "ran"
    script.write_text(textwrap.dedent(f"""\
        import pathlib, torch
        w = torch.ones(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):
            opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
        pathlib.Path({str(marker)!r}).write_text(str(w.tolist()))
        """))
    assert main(["run", "--quiet", "--out", str(full_folder / "report"), str(script)]) == 2
    err = capsys.readouterr().err
    assert "graphwatch: error: " in err and "No space left on device" in err and "Traceback" not in err
    assert marker.is_file()  # the training ran to its end
    assert len(_kept_trace(err, " (graphwatch report").steps) == 3


def test_read_only_folder_is_refused_before_training(read_only_folder):
    with pytest.raises(graphwatch.UsageError, match="pass out= a folder you can write"):
        graphwatch.watch(summary=False, out=read_only_folder / "report")


def test_read_only_folder_report_and_save_raise_a_clear_error(read_only_folder, tmp_path):
    bare = _train()
    with graphwatch.watch(summary=False) as gw:
        watched = _train()
    for name in bare:
        assert torch.equal(bare[name], watched[name]), name
    with pytest.raises(graphwatch.UsageError, match="Read-only file system"):
        gw.report(read_only_folder / "report")
    with pytest.raises(graphwatch.UsageError, match="Read-only file system"):
        gw.save(read_only_folder / "trace.json")
    with pytest.raises(graphwatch.UsageError):
        gw.report(read_only_folder)  # the mount point itself
    assert gw.save(tmp_path / "trace.json").is_file()


def test_graphwatch_run_into_a_read_only_folder_exits_2_before_running_the_script(read_only_folder, tmp_path, capsys):
    script = tmp_path / "train.py"
    marker = tmp_path / "ran"
    script.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    assert main(["run", "--quiet", "--out", str(read_only_folder / "report"), str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphwatch: error: ") and "Read-only file system" in err
    assert not marker.exists()


# ------------------------------------------------------------------ damaged trace files
@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> Path:
    """A trace with every kind of record: leak, retained graph, backward twice, snapshots, holders."""
    model, opt = _model()
    with graphwatch.watch(summary=False) as gw:
        total = 0
        for i in range(5):
            opt.zero_grad()
            loss = model(torch.randn(3, 4)).pow(2).mean()
            loss.backward(retain_graph=(i == 1))
            total = total + loss
            opt.step()
        try:
            loss.backward()
        except RuntimeError:
            pass
    path = tmp_path_factory.mktemp("good") / "trace.json"
    gw.save(path)
    data = json.loads(path.read_text())
    assert all(data[k] for k in ("sites", "nodes", "saved", "backwards", "steps", "findings", "snapshots"))
    assert any("holders" in fields for _, fields in data["steps"]["extra"])  # steps are columns, holders extra
    return path


def _report(path: Path, out: Path, capsys) -> tuple[int, str]:
    code = main(["report", str(path), "--out", str(out), "-q"])
    return code, capsys.readouterr().err


def _assert_one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert err.startswith("graphwatch: error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


def test_truncated_traces_say_they_are_truncated(good_trace, tmp_path, capsys):
    text = good_trace.read_bytes()
    cuts = sorted({0, 1, len(text) - 1, *range(0, len(text), max(1, len(text) // 24))})
    for cut in cuts:
        damaged = tmp_path / "trace.json"
        damaged.write_bytes(text[:cut])
        code, err = _report(damaged, tmp_path / "out", capsys)
        _assert_one_line_error(code, err, "truncated or corrupted" if cut else "")
    assert len(cuts) >= 25


def test_bit_flipped_traces_render_or_say_what_is_wrong(good_trace, tmp_path, capsys):
    text = good_trace.read_bytes()
    rng = random.Random(0)
    outcomes = {0: 0, 2: 0}
    for _ in range(40):
        damaged = bytearray(text)
        position = rng.randrange(len(damaged))
        damaged[position] ^= 1 << rng.randrange(8)
        path = tmp_path / "trace.json"
        path.write_bytes(bytes(damaged))
        code, err = _report(path, tmp_path / "out", capsys)
        if code != 0:  # a flip inside a string or a number may leave a readable trace
            _assert_one_line_error(code, err, str(path))
        outcomes[code] += 1
    assert outcomes[2] > 0


def test_invalid_utf8_and_a_folder_say_what_is_wrong(good_trace, tmp_path, capsys):
    path = tmp_path / "trace.json"
    path.write_bytes(b"\xff\xfe" + good_trace.read_bytes())
    _assert_one_line_error(*_report(path, tmp_path / "out", capsys), "cannot read")
    _assert_one_line_error(*_report(tmp_path, tmp_path / "out", capsys), "cannot read")


def _wrong_values(good: object) -> list[object]:
    """JSON values that are not of the type the field holds in a good trace."""
    if isinstance(good, bool):
        return ["yes", 7]
    if isinstance(good, (int, float)):
        return ["7", [1], {"a": 1}] if not isinstance(good, float) else ["0.5", [1]]
    if isinstance(good, str):
        return [7, [1]]
    if isinstance(good, list):
        return ["x", 7, {"a": 1}]
    if isinstance(good, dict):
        return ["x", [1], 7]
    return [[1], {"a": 1}]  # None in a good trace: an optional int or str


def _column_values(column, count: int) -> list:
    if isinstance(column, list):
        return column
    return [column["all"]] * count if "all" in column else list(range(column["from"], column["from"] + count))


def _mutations(data: dict) -> Iterator[tuple[str, dict]]:
    for field, value in data.items():
        if field in ("format", "version"):
            continue
        for wrong in _wrong_values(value):
            yield f"{field}={wrong!r}", {**data, field: wrong}
        if isinstance(value, dict) and "columns" in value:  # steps and backwards: a column per field
            for name, column in value["columns"].items():
                values = _column_values(column, value["count"])
                for wrong in _wrong_values(values[0]):
                    columns = {**value["columns"], name: [wrong, *values[1:]]}
                    yield f"{field}.{name.split('.')[0]}={wrong!r}", {**data, field: {**value, "columns": columns}}
        if isinstance(value, list) and value and isinstance(value[0], dict):
            names = list(dict.fromkeys(name for row in value for name in row))  # fields left at their default are omitted
            for name in names:
                i = next(i for i, row in enumerate(value) if name in row)
                for wrong in _wrong_values(value[i][name]):
                    rows = [*value[:i], {**value[i], name: wrong}, *value[i + 1:]]
                    yield f"{field}[{i}].{name}={wrong!r}", {**data, field: rows}


def test_fields_of_the_wrong_type_are_named_not_a_traceback(good_trace, tmp_path, capsys):
    data = json.loads(good_trace.read_text())
    path = tmp_path / "trace.json"
    tried = 0
    for label, damaged in _mutations(data):
        path.write_text(json.dumps(damaged))
        try:
            code, err = _report(path, tmp_path / "out", capsys)
        except Exception as exc:
            pytest.fail(f"{label}: graphwatch report raised {type(exc).__name__}: {exc}")
        field = label.split("=")[0].split(".")[-1].split("[")[0]
        _assert_one_line_error(code, err, repr(field), "damaged")
        tried += 1
    assert tried > 150


def test_absurdly_nested_json_says_what_is_wrong(tmp_path, capsys):
    path = tmp_path / "trace.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    _assert_one_line_error(*_report(path, tmp_path / "out", capsys), "corrupted")


OUT_OF_RANGE = [2**70, -1, -(2**70), float("nan"), float("inf"), [[1]], {"a": [1]}, [None], "x", True]


def _range_mutations(data: dict) -> Iterator[tuple[str, str, dict]]:
    """(label, field, trace): every column, extra field, row field and evidence entry set to each bad value."""
    for field, value in data.items():
        if isinstance(value, dict) and "columns" in value:
            for name in value["columns"]:
                for bad in OUT_OF_RANGE:
                    columns = {**value["columns"], name: [bad] * value["count"]}
                    yield f"{field}.{name}={bad!r}", name.split(".")[0], {**data, field: {**value, "columns": columns}}
            for bad in (2**70, -1):
                yield f"{field}.count={bad!r}", "count", {**data, field: {**value, "count": bad}}
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for name, good in value[0].items():
                nested = good.items() if isinstance(good, dict) else [(None, None)]
                for key, _ in nested:
                    for bad in OUT_OF_RANGE:
                        row = {**value[0], name: bad if key is None else {**good, key: bad}}
                        yield f"{field}[0].{name}.{key}={bad!r}", name, {**data, field: [row, *value[1:]]}


def _drawn_once(render_svgs: Callable[[list[str]], list[Any] | None]) -> Callable[..., list[Any] | None]:
    """``render_svgs`` that lays out each distinct DOT text once (later calls get the same SVG); an error or a
    missing ``dot`` is met again each time."""
    kept: dict[str, str] = {}

    def drawn(sources: list[str], timeout: float = 30) -> list[Any] | None:
        new = [source for source in dict.fromkeys(sources) if source not in kept]
        results = dict(zip(new, render_svgs(new) or ())) if new else {}
        if new and not results:  # no dot program
            return None
        kept.update({source: result for source, result in results.items() if isinstance(result, str)})
        return [kept[source] if source in kept else results[source] for source in sources]

    return drawn


def test_fields_out_of_range_or_of_nested_wrong_shapes_are_named_not_a_traceback(good_trace, tmp_path, capsys,
                                                                                   monkeypatch):
    # Each trace that renders draws its snapshot: the same DOT text, unless the damage is in the snapshot, drawn
    # by `dot` for real once per distinct text (a drawing depends on its DOT text alone; what `dot` refuses is
    # refused each time)
    monkeypatch.setattr(svg, "render_svgs", _drawn_once(svg.render_svgs))
    data = json.loads(good_trace.read_text())
    # (only a list's first row is damaged: its other snapshots would be drawn unchanged for every damage)
    data["snapshots"] = data["snapshots"][:1]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    assert _report(path, tmp_path / "out", capsys)[0] == 0  # undamaged, it renders
    outcomes = {0: 0, 2: 0}
    for label, field, damaged in _range_mutations(data):
        path.write_text(json.dumps(damaged))  # NaN and Infinity as Python's json writes them
        try:
            code, err = _report(path, tmp_path / "out", capsys)
        except Exception as exc:
            pytest.fail(f"{label}: graphwatch report raised {type(exc).__name__}: {exc}")
        if code != 0:  # some values are legal where they land (a string in a free-text evidence entry)
            _assert_one_line_error(code, err, str(path), "damaged")
            assert repr(field) in err or "'count'" in err or "column" in err, (label, err)
        outcomes[code] += 1
    assert outcomes[2] > 500, outcomes


@pytest.mark.parametrize(
    ("where", "bad"),
    [("steps", 2**70), ("backwards", -1), ("steps", float("inf")), ("steps", float("nan"))],
    ids=["huge-step-index", "negative-backward-id", "infinite-seconds", "nan-seconds"],
)
def test_load_refuses_numbers_out_of_range(good_trace, tmp_path, where, bad):
    data = json.loads(good_trace.read_text())
    name = {"steps": "index" if isinstance(bad, int) else "seconds", "backwards": "id"}[where]
    data[where]["columns"][name] = [bad] * data[where]["count"]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    with pytest.raises(graphwatch.TraceFormatError, match=f"{name}.*damaged"):
        graphwatch.load(path)


class _StopInAFinalizer:
    def __del__(self) -> None:
        raise Terminated("received SIGTERM")  # (where a SIGTERM lands in a finalizer or a fork callback)


class _ErrorInAFinalizer:
    def __del__(self) -> None:
        raise ValueError("a finalizer's own error")


def test_once_sigterm_arrived_the_stop_python_drops_is_not_printed_and_other_errors_are(monkeypatch):
    """A SIGTERM to the process group can land in a callback whose exceptions Python prints and drops (the
    DataLoader forking a worker runs logging's fork callbacks): the stop is raised again in the script's next
    line, so it is not printed ("Exception ignored in ..." under the summary); a finalizer's own error still is,
    by the hook there was before, which is back once the guard ends."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    guard = SignalGuard(signals=(signal.SIGTERM,)).__enter__()
    try:
        guard._handle(signal.SIGTERM, None)  # SIGTERM arrives while the guard is not armed: noted, shielded
        _StopInAFinalizer()
        _ErrorInAFinalizer()
    finally:
        guard.__exit__(None, None, None)
    assert guard.terminated and [type(u.exc_value) for u in seen] == [ValueError]
    assert sys.unraisablehook == seen.append


def test_a_failure_while_looking_into_an_in_place_change_is_said_and_torchs_error_is_kept(monkeypatch):
    """graphwatch's own look at which line changed a saved tensor fails (simulated here by making it raise):
    torch's error still propagates with its message and graphwatch's plain hint, and a warning says that
    graphwatch could not look closer (before, the look failed in silence)."""
    from graphwatch.capture.causes.inplace import InplaceFinder

    def failing(*args, **kwargs):
        raise ValueError("simulated")

    monkeypatch.setattr(InplaceFinder, "cause", failing)
    w = torch.randn(4, requires_grad=True)
    with pytest.warns(UserWarning, match=r"could not look into the in-place change \(ValueError\('simulated'\)\)"):
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as raised:
            with graphwatch.watch(summary=False):
                y = (w * 2).exp()
                y.add_(1)
                y.sum().backward()
    assert "Something changed it in place after autograd saved it" in str(raised.value)
