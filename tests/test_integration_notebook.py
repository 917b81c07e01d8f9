"""Jupyter, for real: ``tests/notebooks/carried_state.ipynb`` runs on an ipykernel kernel through nbclient.

Its cells load the extension, watch one cell with ``%%graphwatch`` (an RNN state carried without
detach: the backward-twice error explains itself in the cell's output, and the summary shows under it
as HTML), then watch a state carried from one cell into the next with ``%graphwatch start`` /
``%graphwatch stop``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).parent / "notebooks" / "carried_state.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict]]:
    """Each cell's outputs after a real run of the notebook."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    folder = tmp_path_factory.mktemp("notebook")
    client = nbclient.NotebookClient(notebook, timeout=240, allow_errors=True, resources={"metadata": {"path": str(folder)}})
    client.execute()
    return [cell.get("outputs", []) for cell in notebook.cells]


def html_of(outputs: list[dict]) -> str:
    return "".join(o["data"].get("text/html", "") for o in outputs if o["output_type"] in ("execute_result", "display_data"))


def test_a_watched_cell_explains_its_error_and_shows_the_summary_under_it(executed: list[list[dict]]) -> None:
    outputs = executed[2]
    error = next(o for o in outputs if o["output_type"] == "error")
    assert error["ename"] == "BackwardTwiceError"
    assert error["evalue"].startswith("Trying to backward through the graph a second time")
    assert "carried into step 1 by `h`" in error["evalue"] and "Fixes, best first:" in error["evalue"]
    summary = html_of(outputs)
    assert 'class="graphwatch-summary"' in summary and "backward-through-freed-graph" in summary
    assert "h = h.detach()" in summary  # the fix, as the report shows it


def test_a_state_carried_from_one_cell_into_the_next_is_diagnosed(executed: list[list[dict]]) -> None:
    assert not any(o["output_type"] == "error" for cell in executed[3:] for o in cell)
    summary = html_of(executed[6])
    assert 'class="graphwatch-summary"' in summary and "graph-carried-across-steps" in summary
    assert "carried" in summary and "# the cell-to-cell carried state" in summary
