"""Jupyter, for real: ``tests/notebooks/carried_state.ipynb`` runs on an ipykernel kernel through nbclient.

Its cells load the extension, watch one cell with ``%%graphwatch`` (an RNN state carried without detach:
the cell fails as it would without graphwatch, the backward-twice error explains itself in the cell's
output and the summary shows under the cell as HTML), watch a state carried from one cell into the next
with ``%graphwatch start`` / ``gw = %graphwatch stop``, show a finding as HTML, and run a correct cell
with ``--strict --level light --out DIR``.  Then the name the line under a summary gives (``gw``, or ``gw2``
when the notebook's own ``gw`` is something else) is used in the next cell, after a clean cell and after a
cell that raised, and two cells pass bad options.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from graphwatch import UsageError

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).parent / "notebooks" / "carried_state.ipynb"


class Run:
    """A real run of the notebook: each cell's outputs and the status its execution replied."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        self.status: dict[int, str] = {}
        client = nbclient.NotebookClient(
            notebook, timeout=240, allow_errors=True, resources={"metadata": {"path": str(folder)}},
            on_cell_executed=self._executed,
        )  # fmt: skip
        client.execute()
        self.outputs: list[list[dict[str, Any]]] = [cell.get("outputs", []) for cell in notebook.cells]

    def _executed(self, cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        self.status[cell_index] = execute_reply["content"]["status"]

    def html(self, index: int) -> str:
        shown = ("execute_result", "display_data")
        return "".join(o["data"].get("text/html", "") for o in self.outputs[index] if o["output_type"] in shown)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(tmp_path_factory.mktemp("notebook"))


def test_a_watched_cell_explains_its_error_and_shows_the_summary_under_it(run: Run) -> None:
    kinds = [o["output_type"] for o in run.outputs[2]]
    assert kinds.index("error") < kinds.index("display_data")  # the summary under the traceback
    error = next(o for o in run.outputs[2] if o["output_type"] == "error")
    assert error["ename"] == "BackwardTwiceError"
    assert error["evalue"].startswith("Trying to backward through the graph a second time")
    assert "carried into step 1 by `h`" in error["evalue"] and "Fixes, best first:" in error["evalue"]
    summary = run.html(2)
    assert 'class="graphwatch-summary"' in summary and "backward-through-freed-graph" in summary
    assert "h = h.detach()" in summary  # the fix, as the report shows it
    # the cell named as IPython names it (the third cell run: In[3]), its cited line read back from the kernel
    assert "In[3]:4" in summary and "ipykernel" not in summary and "ipykernel" not in error["evalue"]
    assert "source not found" not in summary and "# the carried state" in summary


def test_a_watched_cell_that_raises_fails_as_it_would_without_graphwatch(run: Run) -> None:
    assert run.status[2] == "error"  # "Run All" stops there
    assert [run.status[i] for i in (0, 1, 3, 4, 5, 6, 7, 8, 9)] == ["ok"] * 9


def text(run: Run, index: int) -> str:
    """What cell ``index`` printed, and the text views of what it displayed."""
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in run.outputs[index])


def test_the_next_cell_uses_the_name_the_summary_gives_after_a_clean_cell(run: Run) -> None:
    assert "this session is `gw` in the next cells: gw.summary()" in run.html(10)
    assert "gw.findings: these findings" in text(run, 10)
    assert run.status[11] == "ok" and "after a clean cell: 2 steps, 0 findings" in text(run, 11)


def test_the_next_cell_uses_the_name_the_summary_gives_after_a_cell_that_raised(run: Run) -> None:
    assert run.status[12] == "error" and "modified by an inplace operation" in run.outputs[12][0]["evalue"]
    assert "this session is `gw` in the next cells" in run.html(12)
    assert run.status[13] == "ok" and "after a cell that raised: ['modified-in-place'] active: False" in text(run, 13)


def test_the_notebooks_own_gw_is_left_alone_and_the_summary_names_the_session_instead(run: Run) -> None:
    assert "this session is `gw2` in the next cells: gw2.summary()" in run.html(15)
    assert "gw2.report(DIR)" in text(run, 15)
    assert run.status[16] == "ok" and "the notebook's own gw | Session 1" in text(run, 16)


@pytest.mark.parametrize(
    ("index", "reason"),
    [(17, "%%graphwatch --bogus: unrecognized arguments: --bogus; options: [--strict]"),
     (18, '%%graphwatch --out "unterminated: No closing quotation; options: [--strict]')],
    ids=["unknown-option", "unclosed-quote"],
)
def test_a_bad_option_is_an_ipython_usage_error_with_its_reason(run: Run, index: int, reason: str) -> None:
    assert run.status[index] == "error"
    [error] = run.outputs[index]  # nothing else: argparse printed nothing on stderr
    assert error["output_type"] == "error" and error["evalue"].startswith(reason)
    assert "UsageError" in error["ename"]


def test_a_state_carried_from_one_cell_into_the_next_is_diagnosed(run: Run) -> None:
    assert not any(o["output_type"] == "error" for cell in run.outputs[3:10] for o in cell)  # (cells 12, 17, 18 fail)
    summary = run.html(6)
    assert 'class="graphwatch-summary"' in summary and "graph-carried-across-steps" in summary
    assert "# the cell-to-cell carried state" in summary  # the line that carries it


def test_a_finding_shows_as_the_report_shows_it(run: Run) -> None:
    finding = run.html(7)
    assert 'class="graphwatch-summary"' in finding and "graph-carried-across-steps" in finding
    assert '<p class="fix">' in finding or "Fix:" in finding


def test_options_as_graphwatch_run_spells_them(run: Run) -> None:
    """``--strict --level light --out DIR`` on a correct loop: silent, and the report is in ``DIR``."""
    assert "no graph leaks in 3 steps" in run.html(8)
    assert "report written: True" in "".join(o.get("text", "") for o in run.outputs[9])


@pytest.mark.parametrize(
    ("line", "cell", "words"),
    [("stop", None, "no session was started"), ("", None, "takes `start [options]` or `stop`"),
     ("start", "x = 1", "is for the line magic"), ("--level fast", "x = 1", "invalid choice: 'fast'"),
     ("--bogus", "x = 1", "unrecognized arguments: --bogus"), ('--out "dir', "x = 1", "No closing quotation")],
    ids=["stop-without-start", "no-action", "start-on-a-cell", "bad-level", "unknown-option", "unclosed-quote"],
)
def test_misuse_says_what_the_magic_takes(
    line: str, cell: str | None, words: str, no_session_left: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.error import UsageError as IPythonUsageError

    from graphwatch.integrations.notebook import graphwatch_magic

    with pytest.raises(UsageError, match=re.escape(words)) as raised:
        graphwatch_magic(line, cell)
    assert isinstance(raised.value, IPythonUsageError)  # IPython shows its message alone, no traceback
    assert capsys.readouterr().err == ""  # argparse printed nothing
