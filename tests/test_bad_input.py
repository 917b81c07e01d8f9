"""Bad input gets a :class:`graphwatch.UsageError` whose message names the fix.

The tests run as root in CI, where ``chmod`` does not stop writes; a path
below a regular *file* (or inside /proc) is unwritable for everyone.
"""

from __future__ import annotations

import os

import pytest
import torch

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")


@pytest.fixture
def under_a_file(tmp_path):
    """A path whose parent is a regular file: no one can create it."""
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    return blocker / "sub"


def _usage_error(fn, *args, **kwargs) -> str:
    with pytest.raises(graphwatch.UsageError) as raised:
        fn(*args, **kwargs)
    assert isinstance(raised.value, graphwatch.GraphwatchError) and isinstance(raised.value, ValueError)
    return str(raised.value)


# ---------------------------------------------------------------- options
def test_unknown_option_suggests_the_close_one():
    message = _usage_error(graphwatch.watch, strikt=True)
    assert "unknown option 'strikt'" in message
    assert "did you mean 'strict'?" in message


def test_unknown_option_without_a_close_match_lists_the_options():
    message = _usage_error(graphwatch.watch, frobnicate=1)
    assert "unknown option 'frobnicate'" in message and "did you mean" not in message
    for option in ("strict", "level", "summary", "out", "keep_steps"):
        assert option in message


def test_bad_level_names_the_levels():
    message = _usage_error(graphwatch.watch, level="fast")
    assert "level='fast'" in message
    assert "'default'" in message and "'light'" in message


@pytest.mark.parametrize("keep_steps", [0, -3, 2.5, "5"])
def test_bad_keep_steps_says_what_to_give(keep_steps):
    assert "give a whole number of steps, at least 1" in _usage_error(graphwatch.watch, keep_steps=keep_steps)


def test_bad_snapshots_word_names_the_choices():
    message = _usage_error(graphwatch.watch, snapshots="on")
    assert "'auto', 'off' or a list of step numbers" in message


def test_bad_snapshots_list_names_the_choices():
    message = _usage_error(graphwatch.watch, snapshots=["first"])
    assert "list of step numbers" in message


def test_bad_options_install_nothing():
    before = torch._C._autograd._top_saved_tensors_default_hooks(False)
    with pytest.raises(graphwatch.UsageError):
        with graphwatch.watch(strikt=True):
            pytest.fail("never entered")
    assert graphwatch.active_session() is None
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is before


# ------------------------------------------------------------ out= folder
def test_out_below_a_regular_file_is_refused_before_training(under_a_file):
    message = _usage_error(graphwatch.watch, out=under_a_file)
    assert str(under_a_file) in message
    assert "is not a writable folder" in message and "pass out= a folder you can write" in message


def test_out_that_is_a_regular_file_is_refused(under_a_file):
    message = _usage_error(graphwatch.watch, out=under_a_file.parent)
    assert "pass out= a folder you can write" in message


def test_out_inside_proc_is_refused_before_training():
    assert os.path.isdir("/proc")
    message = _usage_error(graphwatch.watch, out="/proc/graphwatch-report")
    assert "pass out= a folder you can write" in message


def test_out_in_a_folder_that_does_not_exist_yet_is_accepted(tmp_path):
    gw = graphwatch.watch(summary=False, out=tmp_path / "new" / "report")  # created when the report is written
    assert gw.out == tmp_path / "new" / "report"


# ----------------------------------------------------------------- gw.save
def _finished_session() -> graphwatch.Session:
    with graphwatch.watch(summary=False) as gw:
        x = torch.ones(2, requires_grad=True)
        x.exp().sum().backward()
    return gw


def test_save_below_a_regular_file_names_the_fix(under_a_file):
    gw = _finished_session()
    message = _usage_error(gw.save, under_a_file / "trace.json")
    assert f"cannot write {under_a_file / 'trace.json'}" in message
    assert "create it or choose another path" in message
    assert not os.path.exists(under_a_file)


def test_save_into_proc_names_the_fix():
    gw = _finished_session()
    message = _usage_error(gw.save, "/proc/graphwatch-trace.json")
    assert "cannot write /proc/graphwatch-trace.json" in message
    assert "choose a writable folder" in message


def test_save_onto_a_folder_names_the_fix(tmp_path):
    gw = _finished_session()
    message = _usage_error(gw.save, tmp_path)
    assert f"cannot write {tmp_path}" in message and "choose another folder" in message
    assert os.listdir(tmp_path) == []  # no temporary file left behind


# ----------------------------------------------------------------- gw.step
def test_step_after_the_session_ended_names_the_fix():
    gw = _finished_session()
    with pytest.raises(graphwatch.UsageError) as raised:
        with gw.step():
            pytest.fail("never entered")
    assert "gw.step() needs an active session" in str(raised.value)
    assert "inside `with graphwatch.watch() as gw:`" in str(raised.value)


def test_step_of_a_session_never_entered_names_the_fix():
    gw = graphwatch.watch(summary=False)
    with pytest.raises(graphwatch.UsageError, match="needs an active session"):
        with gw.step():
            pytest.fail("never entered")
    assert graphwatch.active_session() is None


def test_step_of_another_session_than_the_active_one_is_refused():
    stale = _finished_session()
    with graphwatch.watch(summary=False) as gw:
        with pytest.raises(graphwatch.UsageError, match="needs an active session"):
            with stale.step():
                pass
        assert graphwatch.active_session() is gw


def test_step_decorator_on_a_non_callable_names_the_fix():
    with pytest.raises(graphwatch.UsageError) as raised:
        graphwatch.step(42)
    assert "@graphwatch.step" in str(raised.value) and "def train_step" in str(raised.value)
