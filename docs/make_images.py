"""Make the README's pictures from real output: the terminal summary and the HTML report.

Run from the repo root with the set-up venv: ``.venv/bin/python docs/make_images.py``.
It runs ``examples/rnn_retain_graph_bug.py`` under a session, saves the rich
summary as SVG, writes the HTML report, runs the notebook of
``tests/notebooks/`` on a real kernel for its ``%%graphwatch`` cell's output,
and has headless Chromium turn them into PNGs in ``docs/``: the summary, the
top of the report, the report's snapshots (its legend and focused pictures;
those of ``examples/validation_no_grad_bug.py`` too, whose kept-alive picture
draws the holder) and the notebook's output.
"""

from __future__ import annotations

import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from html import escape
from pathlib import Path

from rich.console import Console

import graphwatch
from graphwatch.rendering.html import write_report
from graphwatch.rendering.terminal import Summary

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
]


def screenshot(page: Path, png: Path, size: str) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("needs Debian's chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
             f"--screenshot={png}", page.as_uri()],
            check=True, capture_output=True, timeout=120,
        )


def main() -> None:
    example = ROOT / "examples" / "rnn_retain_graph_bug.py"
    with graphwatch.watch(summary=False) as gw:
        runpy.run_path(str(example), run_name="__main__")
    out = Path(tempfile.mkdtemp())
    console = Console(record=True, width=110, file=open("/dev/null", "w"), force_terminal=True)
    console.print(Summary(gw.trace, report=Path("graphwatch-report")))
    console.save_svg(str(out / "summary.svg"), title="graphwatch run examples/rnn_retain_graph_bug.py")
    screenshot(out / "summary.svg", ROOT / "docs" / "terminal-summary.png", "1100,900")
    report = gw.report(out / "report")
    screenshot(report, ROOT / "docs" / "html-report.png", "1280,1600")
    with graphwatch.watch(summary=False) as kept:
        runpy.run_path(str(ROOT / "examples" / "validation_no_grad_bug.py"), run_name="__main__")
    both = write_report([("rnn_retain_graph_bug.py", gw.trace), ("validation_no_grad_bug.py", kept.trace)], out / "both")
    screenshot(snapshots_only(both), ROOT / "docs" / "html-snapshots.png", "1280,2200")
    notebook_output(out / "notebook.html")
    screenshot(out / "notebook.html", ROOT / "docs" / "notebook-output.png", "1100,1300")
    print("wrote docs/terminal-summary.png, docs/html-report.png, docs/html-snapshots.png and docs/notebook-output.png")


def snapshots_only(index: Path) -> Path:
    """A copy of the report that shows its legend and the snapshots that show a problem (a graph that crosses
    steps, what a kept-alive finding keeps), side by side as the report lays them out."""
    page = index.read_text()
    head = page.split("<body>", 1)[0]
    legend = re.search(r'<div class="legend">.*?</div>', page, re.S)
    figures = re.findall(r'<figure class="snapshot">.*?</figure>', page, re.S)
    shown = [f for f in figures if "crosses steps" in f or "kept alive" in f]
    gallery = f'<h3>Graph snapshots</h3>{legend[0] if legend else ""}<div class="gallery">{"".join(shown)}</div>'
    copy = index.with_name("snapshots.html")
    copy.write_text(f'{head}<body><main><section class="run">{gallery}</section></main></body></html>')
    return copy


def notebook_output(page: Path) -> None:
    """The outputs of the ``%%graphwatch`` cell of ``tests/notebooks/carried_state.ipynb``, run for real
    (nbclient, an ipykernel kernel), as a notebook shows them: the error's explanation, then the summary."""
    import nbclient
    import nbformat

    notebook = nbformat.read(ROOT / "tests" / "notebooks" / "carried_state.ipynb", as_version=4)
    nbclient.NotebookClient(notebook, timeout=240, allow_errors=True).execute()
    cell = notebook.cells[2]
    parts = [f"<pre style='background:#f5f5f5;padding:8px'>{escape(cell.source)}</pre>"]
    for output in cell.outputs:
        if output["output_type"] == "error":
            text = f"{output['ename']}: {output['evalue']}"
            parts.append(f"<pre style='background:#fdecea;padding:8px;white-space:pre-wrap'>{escape(text)}</pre>")
        elif "text/html" in output.get("data", {}):
            parts.append(output["data"]["text/html"])
    page.write_text(f"<!DOCTYPE html><meta charset='utf-8'><body style='font-family:sans-serif'>{''.join(parts)}")


if __name__ == "__main__":
    main()
