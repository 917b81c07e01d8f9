"""pytest plugin: fail a test whose training code leaks an autograd graph.

Registered through the ``pytest11`` entry point, so installing graphwatch
enables it.  Two ways in:

* the ``graphwatch_session`` fixture: the test runs inside a strict session
  (``graphwatch.watch(strict=True, summary=False)``) and gets it as the
  fixture's value;
* the ``@pytest.mark.graphwatch`` marker: the same for a whole test (or class,
  or module via ``pytestmark``) without naming the fixture.  Its keyword
  arguments go to :func:`graphwatch.watch`, e.g.
  ``@pytest.mark.graphwatch(level="light")``; a positional argument, an
  unknown option or a bad value is an error at the test's setup that names
  the marker.

A leak (a kind in ``graphwatch.analysis.LEAK_KINDS``) fails the test with the
findings' text: at the end of the step where it shows (the strict session
raises :class:`graphwatch.GraphLeakError` inside the test, which stops it), or,
for findings made when the session ends (the last step's, memory growth over
the steps), when the test body returns.  ``strict=False`` in the marker
records findings without failing.  Findings the failure does not show go to
the test's report section "graphwatch" (``-rP`` shows it for passing tests).
An error that passes through graphwatch's code (torch's in-place error with
graphwatch's paragraph, a ``BackwardTwiceError``) fails the test with a
traceback that ends at the test's own line: graphwatch's and torch's frames
are left out, the message is shown in full.

Example::

    import pytest, torch

    @pytest.mark.graphwatch
    def test_training_loop_frees_its_graphs():
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()

    def test_with_the_session(graphwatch_session):
        ...
        assert graphwatch_session.findings == []
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Any

import pytest
import torch

from .analysis import LEAK_KINDS
from .errors import GraphLeakError, UsageError, without_own_frames
from .session import Session, watch

TORCH_FOLDER = os.path.normcase(os.path.dirname(os.path.abspath(torch.__file__))) + os.sep
OWN_FOLDER = os.path.normcase(os.path.dirname(os.path.abspath(__file__))) + os.sep
FIXTURE = "graphwatch_session"
MARKER = "graphwatch"
_SESSION = pytest.StashKey[Session]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**options): run the test inside a strict graphwatch session and fail it on a leak finding; "
        "options go to graphwatch.watch()",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marked tests use the fixture, last among their fixtures (closest to the test body)."""
    for item in items:
        if item.get_closest_marker(MARKER) is not None:
            names = getattr(item, "fixturenames", None)
            if names is not None and FIXTURE not in names:
                names.append(FIXTURE)


def session_options(item: pytest.Item) -> dict[str, Any]:
    """Options for :func:`graphwatch.watch`: strict, no printed summary, then the marker's keywords (a
    positional argument is a :class:`~graphwatch.UsageError`: its meaning would be a guess)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return {"strict": True, "summary": False}
    if marker.args:
        raise UsageError(f"the marker takes keyword options only: e.g. @pytest.mark.{MARKER}(level={marker.args[0]!r})")
    return {"strict": True, "summary": False, **marker.kwargs}


def _marker_text(item: pytest.Item) -> str:
    """The test's marker as it is written: ``@pytest.mark.graphwatch('light', strict=False)``."""
    marker = item.get_closest_marker(MARKER)
    given = [*map(repr, marker.args), *(f"{k}={v!r}" for k, v in marker.kwargs.items())] if marker else []
    return f"@pytest.mark.{MARKER}({', '.join(given)})"


@pytest.fixture
def graphwatch_session(request: pytest.FixtureRequest) -> Iterator[Session]:
    """The test runs inside a strict graphwatch session, which this fixture returns.

    A leak fails the test with the finding's text.  Options come from a
    ``@pytest.mark.graphwatch(...)`` marker on the test, if any.
    """
    item = request.node
    try:
        session = watch(**session_options(item))
    except UsageError as error:  # the marker's options: one line naming the marker, no traceback
        raise pytest.fail.Exception(f"{_marker_text(item)}: {error}", pytrace=False) from None
    session.__enter__()
    item.stash[_SESSION] = session
    try:
        yield session
    finally:
        del item.stash[_SESSION]
        if session.active:  # the test body did not run (e.g. another fixture failed): just clean up
            _end(session, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    """End the test's session when its body returns, so that end-of-session findings fail the test itself.

    An old-style hook wrapper, so the plugin loads with any pytest >= 7.
    """
    session = item.stash.get(_SESSION, None)
    outcome = yield
    if session is None:
        return
    error = outcome.excinfo[1] if outcome.excinfo is not None else None
    ours = error is not None and _through_graphwatch(error.__traceback__)  # (before the session's exit trims it)
    _end(session, error)
    if error is not None and ours and hasattr(outcome, "force_exception"):
        # its text says everything (torch's message, then graphwatch's paragraph): the traceback ends at the
        # test's own line, with no page of torch's or graphwatch's source before the message
        error.__traceback__ = without_own_frames(error.__traceback__, folders=[TORCH_FOLDER])
        outcome.force_exception(error)
    leaks = [f for f in session.findings if f.kind in LEAK_KINDS]
    fail = bool(leaks) and session.strict and (error is None or isinstance(error, GraphLeakError))
    explained = str(error) if error is not None else ""  # a BackwardTwiceError carries its finding's text
    others = [f for f in session.findings if not (fail and f in leaks) and f.message not in explained]
    if others:  # findings the failure message does not show: a report section ("Captured graphwatch call")
        item.add_report_section("call", "graphwatch", "\n".join(map(str, others)))
    if fail:
        # One plain failure with the findings' text, instead of a traceback through torch and graphwatch.
        try:
            pytest.fail("graphwatch: the test leaks a graph:\n" + "\n".join(map(str, leaks)), pytrace=False)
        except pytest.fail.Exception as failure:
            if not hasattr(outcome, "force_exception"):  # pluggy < 1.1: raising fails the call
                raise
            outcome.force_exception(failure)


def _through_graphwatch(tb: TracebackType | None) -> bool:
    """True when a frame of graphwatch's own code is on the traceback ``tb``."""
    return any(os.path.normcase(frame.f_code.co_filename).startswith(OWN_FOLDER) for frame, _ in traceback.walk_tb(tb))


def _end(session: Session, exc: BaseException | None) -> None:
    """Exit the session; a strict session's leak error at its last step end is reported with the findings."""
    try:
        session.__exit__(type(exc) if exc is not None else None, exc, exc.__traceback__ if exc is not None else None)
    except GraphLeakError:
        pass  # its findings are in session.findings
