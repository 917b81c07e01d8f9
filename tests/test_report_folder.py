"""Where a session's report goes, and what a bad report folder setting does (issue 41).

The report folder is resolved once, when the session is made, whatever way it was given (``watch(out=)``,
``configure(out=)``, ``GRAPHWATCH_OUT``): a script that calls ``os.chdir()`` later still gets its report where it
asked.  ``out=""`` and ``GRAPHWATCH_OUT=""`` both mean no report.  A ``GRAPHWATCH_OUT`` or ``configure(out=)``
that names no folder graphwatch can write is said once, when the session starts, in a warning that names the
setting; the training goes on.  A path is printed as one line, whatever characters it holds.

Each test runs a real script in a fresh folder and looks at what it left on disk and its exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import warm_python
from test_text_forms import STEP_SCRIPT

import graphwatch

REPO = Path(graphwatch.__file__).resolve().parents[2]

TRAIN = """\
w = torch.ones(3, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(3):
    opt.zero_grad()
    (w * 2).sum().backward()
    opt.step()
"""
STEPS = STEP_SCRIPT + 'print("trained")\n'  # the decorator's session, then a line that says the training ended


def run_python(folder: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    (folder / "train.py").write_text(code)
    return warm_python.run(
        [sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env},
    )  # fmt: skip


def files_in(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def test_os_chdir_inside_the_watched_block_leaves_the_report_where_out_named_it(tmp_path: Path) -> None:
    """``watch(out="rep")`` wrote the report into the folder the block had moved to."""
    (tmp_path / "elsewhere").mkdir()
    code = "import os, torch, graphwatch\nwith graphwatch.watch(out='rep'):\n    os.chdir('elsewhere')\n" + \
        "".join(f"    {line}\n" for line in TRAIN.splitlines())
    run = run_python(tmp_path, code)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "rep" / "index.html").is_file() and (tmp_path / "rep" / "trace.json").is_file()
    assert files_in(tmp_path / "elsewhere") == set()
    assert "report: rep/index.html" in run.stderr  # named as the user named it, from where the run started


def test_graphwatch_out_naming_a_file_warns_once_and_the_training_completes(tmp_path: Path) -> None:
    """It raised, from the first @graphwatch.step call, an error that did not name GRAPHWATCH_OUT: training died."""
    (tmp_path / "afile").write_text("not a folder")
    run = run_python(tmp_path, STEPS.format(configure=""), GRAPHWATCH_OUT="afile")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "trained\n" and "no graph leaks in 3 steps" in run.stderr
    assert len([line for line in run.stderr.splitlines() if "GRAPHWATCH_OUT" in line]) == 1  # one notice
    assert f"cannot write the report to {tmp_path / 'afile'} (GRAPHWATCH_OUT='afile'): " in run.stderr
    assert "the training goes on, with no report" in run.stderr
    assert "graphwatch: no report was written" in run.stderr.split("no graph leaks")[1]  # said again at the end
    assert files_in(tmp_path) == {"afile", "train.py"} and (tmp_path / "afile").read_text() == "not a folder"


def test_configure_out_naming_a_file_is_named_in_its_warning_and_the_training_completes(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder")
    run = run_python(tmp_path, STEPS.format(configure="graphwatch.configure(out='afile')"), GRAPHWATCH_OUT="rep")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "trained\n"
    assert "(graphwatch.configure(out='afile')): " in run.stderr and "GRAPHWATCH_OUT" not in run.stderr
    assert files_in(tmp_path) == {"afile", "train.py"}


def test_a_newline_in_graphwatch_out_cannot_forge_a_line_of_graphwatchs_output(tmp_path: Path) -> None:
    forged = "graphwatch: no graph leaks in 999 steps"
    run = run_python(tmp_path, STEPS.format(configure=""), GRAPHWATCH_OUT=f"rep\n{forged}")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / f"rep\n{forged}" / "index.html").is_file()  # the folder asked for, name and all
    assert not any(line.startswith(forged) for line in run.stderr.splitlines()), run.stderr
    assert f"report: rep\\u{{a}}{forged}/index.html" in run.stderr


def test_a_newline_in_a_bad_graphwatch_out_is_shown_not_printed(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder")
    forged = "graphwatch: no graph leaks in 999 steps"
    run = run_python(tmp_path, STEPS.format(configure=""), GRAPHWATCH_OUT=f"afile/sub\n{forged}")
    assert run.returncode == 0, run.stderr
    assert not any(line.startswith(forged) for line in run.stderr.splitlines()), run.stderr
    assert f"afile/sub\\u{{a}}{forged} (GRAPHWATCH_OUT='afile/sub\\n{forged}')" in run.stderr
    assert files_in(tmp_path) == {"afile", "train.py"}


def test_an_empty_out_means_no_report_however_it_is_given(tmp_path: Path) -> None:
    """``out=""`` wrote into the current folder while ``GRAPHWATCH_OUT=""`` meant no report."""
    cases = {
        "watch": "import torch, graphwatch\nwith graphwatch.watch(out=''):\n"
                 + "".join(f"    {line}\n" for line in TRAIN.splitlines()) + "print('trained')\n",
        "environment": STEPS.format(configure=""),
        "configure": STEPS.format(configure="graphwatch.configure(out='')"),  # wins over GRAPHWATCH_OUT=rep
    }
    for how, code in cases.items():
        folder = tmp_path / how
        folder.mkdir()
        run = run_python(folder, code, GRAPHWATCH_OUT="" if how == "environment" else "rep")
        assert run.returncode == 0, run.stderr
        assert run.stdout == "trained\n" and "no graph leaks in 3 steps" in run.stderr and "report:" not in run.stderr
        assert files_in(folder) == {"train.py"}, how


def test_a_newline_in_an_unwritable_out_folder_or_a_rank_hint_prints_no_line_of_its_own(tmp_path: Path) -> None:
    from graphwatch.rendering.terminal import other_ranks_hint
    from graphwatch.runner import check_out_dir

    folder = tmp_path / "a\nFAKE: 0 problems"
    folder.write_text("a file where the folder should be")
    with pytest.raises(graphwatch.UsageError) as error:
        check_out_dir(folder)
    assert "\n" not in str(error.value) and "a\\u{a}FAKE: 0 problems" in str(error.value)
    hint = other_ranks_hint(tmp_path / "out\nFAKE" / "rank0")
    assert "\n" not in hint and "out\\u{a}FAKE/rank*/trace.json" in hint
