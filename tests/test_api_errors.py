"""Every public entry point answers a wrong argument type with a clear error.

For each function and method of ``graphwatch.__all__`` that takes arguments
(``watch``/``Session`` options, ``step``, ``load``, ``make_dot``, and a
session's ``save``, ``report``, ``summary``, ``step``) each argument is
given values of the wrong type: None, a number, a dict, a string, a list, a
tensor, a plain object.  The call must raise a ``TypeError`` or
``ValueError`` (``graphwatch.UsageError`` and ``TraceFormatError`` are
ValueErrors) whose message names what was expected — never an
AttributeError, KeyError, IndexError or RuntimeError from deep inside.

Flags (``strict``, ``summary``, ``show_attrs``, ``show_saved``, ``legend``)
take any value's truthiness, as Python does; only a tensor, whose truth is
ambiguous, has no truthiness, and torch says so itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

WRONG: dict[str, Any] = {
    "None": None,
    "int": 7,
    "float": 2.5,
    "dict": {"a": 1},
    "str": "not-what-was-asked",
    "list": [1, "a"],
    "tensor": torch.ones(2),
    "object": object(),
}
INTERNAL = (AttributeError, KeyError, IndexError, RuntimeError, AssertionError)


@pytest.fixture(scope="module")
def graph():
    """A session that recorded a retained graph, and the graph's output (for make_dot's overlay)."""
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        x = torch.ones(3, requires_grad=True)
        y = (x.exp() * 2).sum()
        y.backward(retain_graph=True)
    return gw, y


# (what, argument, the kinds of WRONG that are really wrong for it, words one of which the message must hold,
#  a function of (session, graph output, value) that makes the call)
Call = Callable[[graphwatch.Session, torch.Tensor, Any], Any]
NOT_A_PATH = ("None", "int", "float", "dict", "list", "tensor", "object")
CASES: list[tuple[str, str, tuple[str, ...], tuple[str, ...], Call]] = [
    ("watch", "level", tuple(WRONG), ("level=",), lambda gw, y, v: graphwatch.watch(level=v)),
    ("watch", "keep_steps", ("None", "float", "dict", "str", "list", "tensor", "object"), ("keep_steps=",),
     lambda gw, y, v: graphwatch.watch(keep_steps=v)),
    ("watch", "max_snapshots", ("None", "float", "dict", "str", "list", "tensor", "object"), ("max_snapshots=",),
     lambda gw, y, v: graphwatch.watch(max_snapshots=v)),
    ("watch", "snapshots", ("None", "int", "float", "dict", "str", "list", "object"), ("snapshots=",),
     lambda gw, y, v: graphwatch.watch(snapshots=v)),
    ("watch", "out", ("int", "float", "dict", "list", "tensor", "object"), ("out", "PathLike"),
     lambda gw, y, v: graphwatch.watch(out=v)),
    ("Session", "level", tuple(WRONG), ("level=",), lambda gw, y, v: graphwatch.Session(level=v)),
    ("Session", "keep_steps", ("None", "str", "tensor"), ("keep_steps=",), lambda gw, y, v: graphwatch.Session(keep_steps=v)),
    ("step", "fn", tuple(WRONG), ("@graphwatch.step",), lambda gw, y, v: graphwatch.step(v)),
    ("configure", "level", tuple(WRONG), ("level=",), lambda gw, y, v: graphwatch.configure(level=v)),
    ("configure", "keep_steps", ("None", "float", "dict", "str", "list", "tensor", "object"), ("keep_steps=",),
     lambda gw, y, v: graphwatch.configure(keep_steps=v)),
    ("configure", "out", ("int", "float", "dict", "list", "tensor", "object"), ("out", "PathLike"),
     lambda gw, y, v: graphwatch.configure(out=v)),
    ("load", "path", NOT_A_PATH, ("PathLike", "path"), lambda gw, y, v: graphwatch.load(v)),
    ("load", "path", ("str",), ("does not exist",), lambda gw, y, v: graphwatch.load(v)),
    ("make_dot", "var", ("None", "int", "float", "dict", "str", "list", "object"), ("tensor",),
     lambda gw, y, v: graphwatch.make_dot(v)),
    ("make_dot", "params", ("int", "float", "str", "list", "tensor", "object"), ("params",),
     lambda gw, y, v: graphwatch.make_dot(y, params=v)),
    ("make_dot", "max_attr_chars", ("None", "dict", "str", "list", "tensor", "object"), ("max_attr_chars",),
     lambda gw, y, v: graphwatch.make_dot(y, show_attrs=True, max_attr_chars=v)),
    ("make_dot", "max_nodes", ("None", "dict", "str", "list", "tensor", "object"), ("max_nodes",),
     lambda gw, y, v: graphwatch.make_dot(y, trace=gw.trace, max_nodes=v)),
    ("make_dot", "trace", ("int", "float", "dict", "str", "list", "tensor", "object"), ("trace",),
     lambda gw, y, v: graphwatch.make_dot(y, trace=v)),
    ("make_dot", "current_step", ("float", "dict", "str", "list", "tensor", "object"), ("current_step",),
     lambda gw, y, v: graphwatch.make_dot(y, trace=gw.trace, current_step=v)),
    ("make_dot", "retained", ("int", "float", "str", "tensor", "object"), ("retained",),
     lambda gw, y, v: graphwatch.make_dot(y, trace=gw.trace, retained=v)),
    ("Session.save", "path", NOT_A_PATH, ("PathLike", "path"), lambda gw, y, v: gw.save(v)),
    ("Session.report", "out_dir", NOT_A_PATH, ("PathLike", "out_dir"), lambda gw, y, v: gw.report(v)),
    ("load_ipython_extension", "ipython", tuple(WRONG), ("IPython shell",),
     lambda gw, y, v: graphwatch.load_ipython_extension(v)),
    ("Session.summary", "console", ("int", "float", "dict", "str", "list", "tensor", "object"), ("console",),
     lambda gw, y, v: gw.summary(v)),
]

def _params():
    for what, argument, kinds, words, call in CASES:
        for kind in kinds:
            yield pytest.param(call, WRONG[kind], words, id=f"{what}({argument}={kind})")


@pytest.mark.parametrize(("call", "value", "words"), list(_params()))
def test_wrong_argument_type_gets_a_clear_error(call, value, words, graph, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing a call might write lands in the repository
    gw, y = graph
    with pytest.raises(Exception) as raised:
        call(gw, y, value)
    error = raised.value
    assert not isinstance(error, INTERNAL), f"internal error: {type(error).__name__}: {error}"
    assert isinstance(error, (TypeError, ValueError)), f"{type(error).__name__}: {error}"
    assert any(word in str(error) for word in words), f"the message names none of {words}: {error}"
    assert graphwatch.active_session() is None


@pytest.mark.parametrize("flag", ["strict", "summary"])
@pytest.mark.parametrize("kind", ["None", "int", "dict", "str", "list"])
def test_session_flags_take_any_truthiness(flag, kind):
    session = graphwatch.watch(**{flag: WRONG[kind], "summary": False} if flag == "strict" else {flag: WRONG[kind]})
    assert isinstance(session, graphwatch.Session)


@pytest.mark.parametrize("flag", ["show_attrs", "show_saved", "legend"])
@pytest.mark.parametrize("kind", ["None", "int", "dict", "str", "list"])
def test_make_dot_flags_take_any_truthiness(flag, kind, graph):
    gw, y = graph
    assert graphwatch.make_dot(y, trace=gw.trace, **{flag: WRONG[kind]}).source.startswith("digraph")


def test_session_methods_without_an_active_session_say_how_to_use_them(graph):
    gw, _ = graph
    with pytest.raises(graphwatch.UsageError, match="needs an active session"):
        with gw.step():
            pass
    with pytest.raises(TypeError):
        graphwatch.active_session(1)  # takes no argument: Python's own message


def test_every_public_name_is_covered():
    covered = {what.split(".")[0] for what, *_ in CASES}
    plain = {  # constants, exception classes and plain records: nothing to call with a wrong type
        "FINDING_KINDS", "BackwardTwiceError", "ExplainedError", "Finding", "GraphLeakError", "GraphwatchError",
        "LossWithoutGraphError", "Trace", "TraceFormatError", "UsageError", "active_session",
    }
    assert set(graphwatch.__all__) - plain <= covered, set(graphwatch.__all__) - plain - covered
    assert {"save", "report", "summary"} <= {what.split(".")[1] for what, *_ in CASES if "." in what}


def test_watch_shows_its_options_and_names_a_wrong_out():
    """IDEs and help() see watch()'s real keyword options; a non-path ``out`` is a UsageError naming it."""
    options = [name for name, p in inspect.signature(graphwatch.watch).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert options == ["strict", "level", "summary", "out", "keep_steps", "snapshots", "max_snapshots"]
    with pytest.raises(graphwatch.UsageError, match=r"^out=123: give the report folder as a path"):
        graphwatch.watch(out=123)
