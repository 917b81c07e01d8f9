"""Make the README's pictures from real output: the terminal summary and the HTML report.

Run from the repo root with the set-up venv: ``.venv/bin/python docs/make_images.py``.
It runs ``examples/rnn_retain_graph_bug.py`` under a session, saves the rich
summary as SVG, writes the HTML report, runs the notebook of
``tests/notebooks/`` on a real kernel for its ``%%graphwatch`` cell's output,
and has headless Chromium turn all three into PNGs in ``docs/``.
"""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import tempfile
from html import escape
from pathlib import Path

from rich.console import Console

import graphwatch
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
    notebook_output(out / "notebook.html")
    screenshot(out / "notebook.html", ROOT / "docs" / "notebook-output.png", "1100,1300")
    print("wrote docs/terminal-summary.png, docs/html-report.png and docs/notebook-output.png")


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
