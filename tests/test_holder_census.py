"""The census of what the user's frames hold: values of types that can never hold a tensor are passed over
without a look, the globals two frames share are looked at once, and the names found are the same as the long
way finds them; nothing looked at is kept alive after the look."""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.capture.causes.holders import (
    _INERT,
    _of_a_user_class,
    _tensors_in,
    tensors_in_frame,
    tensors_in_user_frames,
)


class _Keeper:
    """A class of the user's own: its instances' attributes are looked into."""


def _graph(value: float) -> torch.Tensor:
    return torch.ones(1, requires_grad=True) * value


def _inert_values() -> list[object]:
    """One value of each type the census passes over without a look."""
    values: list[object] = [
        None, True, 1, 1.5, 2j, "s", b"b", bytearray(b"b"), range(2), slice(1), {1}, frozenset({2}), property(),
        ..., NotImplemented, _graph.__code__, print, (1).__add__, int.__add__, str.join, dict.__dict__["fromkeys"],
        types.FunctionType.__dict__["__code__"], slice.__dict__["start"],
    ]
    assert {type(v) for v in values} == _INERT  # (one of each)
    return values


def test_values_passed_over_hold_nothing_the_long_way_either(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looked at the long way (a builtin's module has no file: in a working directory of the user's, it counts
    as the user's), none of them is looked into or holds a tensor."""
    monkeypatch.chdir(tmp_path)
    for value in _inert_values():
        assert not isinstance(value, (torch.Tensor, list, tuple, dict, nn.Module)), value
        assert not _of_a_user_class(value), value
        assert list(_tensors_in("value", value)) == [], value


def test_modules_built_into_python_are_never_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sys``, ``gc`` or ``time`` have no file, as ``__main__`` has none in a notebook: in a working directory of the
    user's, they are still not looked into (a census in a script that imports ``sys`` used to walk ``vars(sys)``),
    nor are the builtin classes and functions they define; a file-less module of another name still is."""
    monkeypatch.chdir(tmp_path)
    import gc
    import time

    for value in (sys, gc, time, float, dict, print, sys.getsizeof):
        assert not _of_a_user_class(value), value
    sys.graphwatch_census_probe = _graph(1)  # type: ignore[attr-defined]
    try:
        assert list(_tensors_in("sys", sys)) == []
    finally:
        del sys.graphwatch_census_probe  # type: ignore[attr-defined]
    odd = type("Odd", (), {"__module__": "graphwatch_census_odd"})  # sys.modules may hold any object
    monkeypatch.setitem(sys.modules, "graphwatch_census_odd", object())
    assert _of_a_user_class(odd())  # (no file, no name: as before, the user's in a working directory of theirs)
    notebook = types.ModuleType("__main__")  # (no __file__: a notebook's main module)
    notebook.loss = _graph(2)
    assert _of_a_user_class(notebook) and [name for name, _ in _tensors_in("nb", notebook)] == ["nb.loss"]


def test_a_keys_repr_is_asked_only_in_the_path_of_a_tensor_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A census meets many dicts whose values hold no tensor: their keys are not spelled, so the user's
    ``__repr__`` runs only for the key on the way to a tensor with a graph."""
    monkeypatch.chdir(tmp_path)
    asked: list[str] = []

    class Key:
        def __init__(self, name: str) -> None:
            self.name = name

        def __repr__(self) -> str:
            asked.append(self.name)
            return f"Key({self.name})"

    held = {Key("a"): 1.0, Key("b"): [2.0, "x"], Key("c"): _Keeper(), Key("d"): [0.5, _graph(1)], Key("e"): [3.0]}
    assert [name for name, _ in _tensors_in("held", held)] == ["held[Key(d)][1]"]
    assert asked == ["d"]


def every_kind_of_value() -> dict[str, object]:
    """Names of a frame: a value of each type passed over (also as attributes of a user's object, module and
    function and of an ``nn.Module``), and of each kind that must be looked at."""
    inert = {f"a_{type(value).__name__}": value for value in _inert_values()}
    own_module = types.ModuleType("user_settings")
    own_module.__file__ = __file__
    vars(own_module).update(inert)
    own_module.held = _graph(2)  # a user module's global

    def own_function() -> None:
        pass

    vars(own_function).update(inert)
    own_function.cache = [_graph(3)]
    keeper = _Keeper()
    vars(keeper).update(inert)
    keeper.loss = _graph(4)
    keeper.inner = _Keeper()
    keeper.inner.history = {"loss": _graph(5), "lr": 0.1}
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    vars(model[0]).update(inert)
    model[0].outputs = [1.0, _graph(6), "x"]  # a module attribute list
    return {
        **inert,
        "library_module": torch,
        "library_class": nn.Linear,
        "library_function": torch.nn.functional.relu,
        "library_object": torch.optim.SGD([nn.Parameter(torch.ones(1))]),
        "builtin_module": sys,  # (a module built into Python: never the user's, whatever the working directory)
        "builtin_class": float,
        "own_module": own_module,
        "own_function": own_function,
        "keeper": keeper,
        "model": model,
        "losses": [0.5, _graph(7), None, _graph(8)],
        "pair": (_graph(9), 3),
        "metrics": {"loss": _graph(10), 3: 1.0, None: _graph(11)},  # a dict with tensors
        "plain": _graph(12),
        "__dunder": _graph(13),
    }


def test_a_frame_with_every_kind_of_value_names_what_the_long_way_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = {**every_kind_of_value(), "sys": sys, "tensors_in_frame": tensors_in_frame}
    exec(compile("found = list(tensors_in_frame(sys._getframe()))", "<census>", "exec"), namespace)  # its own frame
    assert [name for name, _ in namespace["found"]] == [
        "own_module.held",
        "own_function.cache[0]",
        "keeper.loss",
        "keeper.inner.history['loss']",
        "model.0.outputs[1]",
        "losses[1]",
        "losses[3]",
        "pair[0]",
        "metrics['loss']",
        "metrics[None]",
        "plain",
    ]


def test_globals_two_frames_share_are_looked_at_once_with_the_same_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inner frame's globals (this module's) are its caller's too: each tensor keeps the name the first look
    gives it, as when every frame's globals are looked at."""
    monkeypatch.chdir(tmp_path)
    global _SHARED
    _SHARED = [_graph(1)]
    outer = _graph(2)
    also = _SHARED[0]  # (named by the inner frame's look at the globals)

    def inner() -> tuple[list[str], list[str]]:
        mine = _graph(3)
        frames = [sys._getframe(), sys._getframe(1)]
        once = [name for name, _ in tensors_in_user_frames(frames[0], limit=2)]
        seen: set[int] = set()
        every_frame = []
        for frame in frames:
            for name, tensor in tensors_in_frame(frame):
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    every_frame.append(name)
        del mine
        return once, every_frame

    try:
        once, every_frame = inner()
    finally:
        del _SHARED
    assert once == every_frame == ["mine", "_SHARED[0]", "outer"]
    del outer, also


_SHARED: list[torch.Tensor]


def test_a_users_plain_functions_are_passed_over_without_asking_whose_file_they_are_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of the user's holds many functions (and its classes hold their methods): one with no
    attribute of its own holds nothing a census reads, and is passed over without the question whose file it is
    in (half a light step end's census in a script of many functions); one given an attribute is still looked
    into, and named as before."""
    monkeypatch.chdir(tmp_path)
    helpers = types.ModuleType("user_helpers")
    helpers.__file__ = str(tmp_path / "user_helpers.py")

    class Trainer:  # (a class of the user's: its methods are in its dict)
        def fit(self) -> None: ...
        def evaluate(self) -> None: ...

    helpers.Trainer = Trainer
    for i in range(60):  # (a census reads a module's first 64 names)
        exec(f"def helper_{i}():\n    return {i}", vars(helpers))
    helpers.helper_7.memo = [_graph(7)]  # type: ignore[attr-defined]  # (a function that keeps a graph)
    from graphwatch.capture.causes import held_values

    asked: list[str] = []
    original = held_values._of_a_user_class

    def counting(value: object, files: dict[str, bool] | None = None) -> bool:
        asked.append(type(value).__name__)
        return original(value, files)

    monkeypatch.setattr(held_values, "_of_a_user_class", counting)
    assert [name for name, _ in _tensors_in("helpers", helpers)] == ["helpers.helper_7.memo[0]"]
    assert asked.count("function") == 1  # helper_7, which has an attribute; not the 59 others, nor fit, evaluate
    assert asked.count("module") == 1 and asked.count("type") == 1


def test_the_census_keeps_nothing_it_looked_at_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    keeper = _Keeper()
    keeper.loss = _graph(1)
    keeper.inner = _Keeper()
    model = nn.Linear(2, 2)
    model.kept = [_graph(2)]
    looked_at = [weakref.ref(keeper), weakref.ref(keeper.inner), weakref.ref(keeper.loss), weakref.ref(model)]
    looked_at.append(weakref.ref(model.kept[0]))
    names = [name for name, _ in tensors_in_user_frames(sys._getframe(), limit=1)]
    assert names == ["keeper.loss", "model.kept[0]"]
    del keeper, model  # (before 3.13, the frame's locals snapshot that the look filled must not hold them)
    assert [ref() for ref in looked_at] == [None] * len(looked_at)


def test_step_end_searches_keep_nothing_they_looked_at_alive(one_thread: None) -> None:
    """Each step end of a session (every step in full detail) searches a keeper that carries every step's graph;
    the keeper the loop replaces is gone at once, while the session still runs."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    with graphwatch.watch(summary=False, snapshots="off", level="full") as gw:
        keeper = _Keeper()
        keeper.total = torch.zeros(())
        for _ in range(6):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            old, keeper = keeper, _Keeper()
            keeper.total = old.total + loss  # the graphs of every step so far
            looked_at = weakref.ref(old)
            del old
            assert looked_at() is None
            gw.end_step()
    assert "keeper.total" in {h.name for s in gw.trace.steps for h in s.holders}


def _train(model: nn.Module, keep: Callable[[torch.Tensor], None] = lambda loss: None) -> list[float]:
    """Twelve SGD steps of ``model`` on fixed data (the default level's census runs at several of their ends);
    ``keep`` sees each step's loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.linspace(-1, 1, 32).reshape(8, 4), torch.linspace(0, 1, 8).reshape(8, 1)
    losses = []
    for _ in range(12):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        keep(loss)
        losses.append(loss.item())
    return losses


def test_a_dict_the_users_tracer_grows_while_the_census_reads_it_breaks_nothing(one_thread: None) -> None:
    """A line profiler of the user's counts every trace event into a dict its frame holds (another thread
    writing into a dict does the same): the census reads the dict while it grows, and the loop runs and
    trains as it does without graphwatch."""
    events: dict[int, str] = {}  # the profiler's counts, held by this frame: the census looks into it

    def tracer(frame: types.FrameType, event: str, arg: object) -> Callable:
        events[len(events)] = event  # a new entry for every event, the census's own lines' too
        return tracer

    def traced(model: nn.Module) -> list[float]:
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            return _train(model)
        finally:
            sys.settrace(previous)

    torch.manual_seed(0)
    bare = traced(nn.Linear(4, 1))
    torch.manual_seed(0)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        watched = traced(nn.Linear(4, 1))
    assert watched == bare
    assert len(gw.trace.steps) == 12 and events


class _ReprFails:
    """A dict key of the user's whose ``__repr__`` raises."""

    def __repr__(self) -> str:
        raise ValueError("no repr")


def test_a_dict_key_whose_repr_raises_is_named_by_its_type_and_the_loop_runs_on(one_thread: None) -> None:
    """The census spells a key by its ``repr``; where the user's ``__repr__`` raises, the path names the key's
    type, the kept graphs are still found, and the loop trains as without graphwatch."""
    torch.manual_seed(0)
    bare = _train(nn.Linear(4, 1))
    torch.manual_seed(0)
    table: dict[object, list[torch.Tensor]] = {_ReprFails(): []}
    kept = next(iter(table.values()))
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        watched = _train(nn.Linear(4, 1), kept.append)  # every step's graph, kept under the key
    assert watched == bare
    paths = {h.name for s in gw.trace.steps for h in s.holders}
    assert any(path.startswith("table[<_ReprFails>][") for path in paths), paths
    assert "graph-kept-alive" in {f.kind for f in gw.findings}


class _GoneProxy:
    """A proxy of the user's whose ``__dict__`` is its target's, and the target is gone: reading it raises."""

    @property
    def __dict__(self) -> dict:  # type: ignore[override]
        raise RuntimeError("the proxied object is gone")


def test_an_object_whose_attributes_cannot_be_read_is_passed_over_and_the_loop_runs_on(one_thread: None) -> None:
    """The census looks into objects of the user's classes through their ``__dict__``; one whose ``__dict__``
    raises is passed over (a graph kept beside it is still found) and the loop trains as without graphwatch."""
    torch.manual_seed(0)
    bare = _train(nn.Linear(4, 1))
    torch.manual_seed(0)
    proxy, kept = _GoneProxy(), []
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        watched = _train(nn.Linear(4, 1), kept.append)
    assert watched == bare and proxy is not None
    assert any(h.name.startswith("kept[") for s in gw.trace.steps for h in s.holders)


class _GoneProxyTrainer(_GoneProxy):
    """A trainer whose ``__dict__`` raises, running the loop in its own method: ``self`` is one of the frame's
    names that graphwatch reads (parameter names at the first optimizer step, the holder census)."""

    def run(self) -> list[float]:
        self.model = nn.Linear(4, 1)  # (stored in the instance, though reading its __dict__ raises)
        return _train(self.model)


def test_a_loop_run_by_an_object_whose_attributes_cannot_be_read_trains_as_without_graphwatch(one_thread: None) -> None:
    torch.manual_seed(0)
    bare = _GoneProxyTrainer().run()
    torch.manual_seed(0)
    with graphwatch.watch(summary=False) as gw:  # (the first backward's snapshot names parameters through self too)
        watched = _GoneProxyTrainer().run()
    assert watched == bare and len(gw.trace.steps) == 12 and gw.trace.snapshots
