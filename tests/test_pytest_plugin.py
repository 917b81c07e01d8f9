"""The pytest plugin (``graphwatch.pytest_plugin``), run on small test files through pytest's ``pytester``."""

from __future__ import annotations

import re
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

HEADER = """\
import pytest
import torch


def train(steps, keep_graphs=False):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        total_loss += loss if keep_graphs else loss.item()
    return total_loss
"""


@pytest.fixture(scope="module", autouse=True)
def _warm_up() -> None:
    """Import, in this process, what a first watched optimizer step imports (torch._dynamo and friends).

    pytester's in-process runs drop the modules a run imported; torch cannot import
    some of them twice (TORCH_LIBRARY registrations), so they must exist before.
    """
    import torch

    import graphwatch

    with graphwatch.watch(summary=False):
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()


def plugin_args() -> list[str]:
    """``-p graphwatch.pytest_plugin`` unless the installed ``pytest11`` entry point loads it already."""
    installed = any(ep.name == "graphwatch" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "graphwatch.pytest_plugin"]


def run(pytester: pytest.Pytester, body: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_training=HEADER + body)
    return pytester.runpytest(*plugin_args(), "--strict-markers", "-p", "no:cacheprovider", *args)


def test_a_leaking_test_fails_with_the_finding_text(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch
def test_leaks():
    train(6, keep_graphs=True)
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["graphwatch: the test leaks a graph:", "[[]graph-kept-alive[]]*`total_loss`*", "  fix: *"])
    assert "Traceback" not in result.stdout.str() and "session.py" not in result.stdout.str()


def test_a_clean_test_passes_with_the_marker_and_the_fixture(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch
def test_marked():
    train(6)


def test_fixture(graphwatch_session):
    assert graphwatch_session.active and graphwatch_session.strict
    train(6)
    assert len(graphwatch_session.trace.steps) == 6 and graphwatch_session.findings == []


def test_unwatched():
    train(6, keep_graphs=True)  # no marker, no fixture: graphwatch stays out of it
""")
    result.assert_outcomes(passed=3)


def test_leaks_found_when_the_session_ends_fail_the_test_itself(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
KEPT = []


def test_retains(graphwatch_session):
    w = torch.ones(1000, requires_grad=True)
    y = (w.exp() * 2).sum()
    y.backward(retain_graph=True)  # and no backward follows: the graph is kept for nothing
    KEPT.append(y)
    assert graphwatch_session.active  # the step, and its finding, end after the test body
""")
    result.assert_outcomes(failed=1, errors=0)
    result.stdout.fnmatch_lines(["*graphwatch: the test leaks a graph:*", "*[[]retained-graph[]]*retain_graph=True*"])
    assert "Traceback" not in result.stdout.str()


def test_marker_options_go_to_watch(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch(level="light")
def test_light(graphwatch_session):
    assert graphwatch_session.level == "light"
    train(3)


@pytest.mark.graphwatch(strict=False)
def test_not_strict(graphwatch_session):
    train(6, keep_graphs=True)
    assert graphwatch_session.findings


@pytest.mark.graphwatch(levle="light")
def test_typo():
    pass
""", "-rP")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*unknown option 'levle'; did you mean 'level'?*"])
    result.stdout.fnmatch_lines(["*Captured graphwatch call*", "*graph-kept-alive*"])


def test_a_failing_test_keeps_its_own_error_and_shows_the_findings(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch(strict=False)
def test_fails():
    train(6, keep_graphs=True)
    assert 1 == 2
""")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 1 == 2*", "*Captured graphwatch call*", "*graph-kept-alive*"])


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_empty="")
    result = pytester.runpytest(*plugin_args(), "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.graphwatch(**options): run the test inside a strict graphwatch session*"])


def test_a_backward_twice_failure_shows_the_users_frames_and_the_explanation_once(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch
def test_backward_twice():
    x = torch.ones(3, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward()
    y.backward()  # the failing line
""")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "y.backward()  # the failing line" in out and "BackwardTwiceError: Trying to backward through" in out
    assert "graphwatch/session.py" not in out and "graphwatch/capture" not in out  # no graphwatch source or locals
    failure = out.split("short test summary info")[0]  # (pytest's one-line summary repeats the error's text)
    assert failure.count("Fixes, best first:") == 1
    # the traceback ends at the test's own backward line: no page of torch's source before the message
    assert "torch/autograd" not in failure and "torch/_tensor.py" not in failure
    assert re.search(r">\s+y\.backward\(\)  # the failing line\n.*\nE\s+graphwatch\.errors\.BackwardTwiceError", failure)
    assert len(failure.splitlines()) < 30, failure


def test_a_positional_marker_argument_is_an_error_naming_the_marker(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch("light")
def test_positional():
    train(2)
""")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "@pytest.mark.graphwatch('light'): the marker takes keyword options only: "
        "e.g. @pytest.mark.graphwatch(level='light')"
    ])
    assert "Traceback" not in result.stdout.str() and "graphwatch/session.py" not in result.stdout.str()


def test_an_unknown_marker_option_is_an_error_naming_the_marker(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch(levle="light")
def test_typo():
    pass
""")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["@pytest.mark.graphwatch(levle='light'): *unknown option 'levle'; did you mean 'level'?*"])
    assert "graphwatch/options.py" not in result.stdout.str()


def test_an_inplace_failure_ends_at_the_tests_own_line_with_the_whole_message(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
@pytest.mark.graphwatch
def test_inplace():
    x = torch.ones(3, requires_grad=True)
    y = x.exp()
    y.add_(1)  # changes the tensor exp saved
    y.sum().backward()  # the failing line
""")
    result.assert_outcomes(failed=1)
    failure = result.stdout.str().split("short test summary info")[0]
    assert "src/graphwatch" not in failure and "graphwatch/capture" not in failure  # no graphwatch frame
    assert "torch/autograd" not in failure and "torch/_tensor.py" not in failure
    # torch's message and graphwatch's paragraph, in full, right under the test's own line; the traceback ends there
    assert re.search(r">\s+y\.sum\(\)\.backward\(\)  # the failing line\n.*\nE\s+RuntimeError: one of the variables", failure)
    assert "E       graphwatch: the tensor was saved at test_training.py:" in failure and "Fix: `y = y.add(1)`" in failure
    assert re.search(r"\n\ntest_training\.py:\d+: RuntimeError\n", failure)
