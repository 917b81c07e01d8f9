"""A ``dot`` first on the PATH that keeps what each call lays out and runs Graphviz's: tests count the graphs
laid out, and by which process (one call may lay out several graphs: :func:`graphwatch.rendering.svg.render_svgs`).

Example (not run: it needs Graphviz)::

    path, laid_out = dot_that_keeps_its_input(tmp_path)
    ...  # run graphwatch with PATH=path
    laid_out()  # {parent pid: [graph, ...]}
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path


def dot_that_keeps_its_input(folder: Path) -> tuple[str, Callable[[], dict[str, list[str]]]]:
    """(a PATH with the keeping ``dot`` first, what has been laid out so far: each calling process's id to the
    graphs it gave ``dot``, in order).  Needs Graphviz's ``dot`` on the PATH."""
    real = shutil.which("dot")
    assert real is not None, "Graphviz's dot is not installed"
    kept, program = folder / "dot-input", folder / "dot-bin" / "dot"
    kept.mkdir()
    program.parent.mkdir()
    program.write_text(f'#!/bin/sh\nf="{kept}/$PPID.$$"\ncat > "$f"\nexec "{real}" "$@" < "$f"\n')
    program.chmod(0o755)

    def laid_out() -> dict[str, list[str]]:
        by_process: dict[str, list[str]] = {}
        for call in sorted(kept.iterdir(), key=lambda p: p.stat().st_mtime_ns):
            graphs = re.split(r"(?m)^(?=digraph )", call.read_text())
            by_process.setdefault(call.name.split(".")[0], []).extend(g for g in graphs if g.strip())
        return by_process

    return f"{program.parent}{os.pathsep}{os.environ['PATH']}", laid_out
