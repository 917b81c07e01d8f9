"""pytest plugin: fail a test whose training code leaks an autograd graph.

Registered through the ``pytest11`` entry point, so installing graphwatch
enables it.  Two ways in:

* the ``graphwatch_session`` fixture: the test runs inside a strict session
  (``graphwatch.watch(strict=True, summary=False)``) and gets it as the
  fixture's value;
* the ``@pytest.mark.graphwatch`` marker: the same for a whole test (or class,
  or module via ``pytestmark``) without naming the fixture.  Its keyword
  arguments go to :func:`graphwatch.watch`, e.g.
  ``@pytest.mark.graphwatch(level="light")``.

A leak (a kind in ``graphwatch.analysis.LEAK_KINDS``) fails the test with the
findings' text: at the end of the step where it shows (the strict session
raises :class:`graphwatch.GraphLeakError` inside the test, which stops it), or,
for findings made when the session ends (the last step's, memory growth over
the steps), when the test body returns.  ``strict=False`` in the marker
records findings without failing.  Findings the failure does not show go to
the test's report section "graphwatch" (``-rP`` shows it for passing tests).

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
from collections.abc import Generator, Iterator
from typing import Any

import pytest
import torch

from .analysis import LEAK_KINDS
from .errors import BackwardTwiceError, GraphLeakError, without_own_frames
from .session import Session, watch

TORCH_FOLDER = os.path.normcase(os.path.dirname(os.path.abspath(torch.__file__))) + os.sep
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
    """Options for :func:`graphwatch.watch`: strict, no printed summary, then the marker's keywords."""
    marker = item.get_closest_marker(MARKER)
    return {"strict": True, "summary": False, **(marker.kwargs if marker is not None else {})}


@pytest.fixture
def graphwatch_session(request: pytest.FixtureRequest) -> Iterator[Session]:
    """The test runs inside a strict graphwatch session, which this fixture returns.

    A leak fails the test with the finding's text.  Options come from a
    ``@pytest.mark.graphwatch(...)`` marker on the test, if any.
    """
    item = request.node
    session = watch(**session_options(item))
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
    _end(session, error)
    if isinstance(error, BackwardTwiceError) and hasattr(outcome, "force_exception"):
        # its text says everything: the traceback ends at the test's own backward call, with no page of
        # torch's or graphwatch's source before the message
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


def _end(session: Session, exc: BaseException | None) -> None:
    """Exit the session; a strict session's leak error at its last step end is reported with the findings."""
    try:
        session.__exit__(type(exc) if exc is not None else None, exc, exc.__traceback__ if exc is not None else None)
    except GraphLeakError:
        pass  # its findings are in session.findings
