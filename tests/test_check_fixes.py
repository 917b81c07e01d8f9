"""``graphwatch run --check-fixes`` and ``--stop-after``: real scripts, real subprocess runs, real patches.

A right patch is "checked"; a deliberately wrong one is caught: a detach put on a GAN's generator step (the
generator stops learning) and ``.item()`` on a kept tensor of 32 elements (training crashes).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import warm_python
from dot_calls import dot_that_keeps_its_input

import graphwatch
from graphwatch.analysis.patch_checks import steps_to_run
from graphwatch.cli import _write_trace, main
from graphwatch.fix_checks import check_patch
from graphwatch.model import PatchCheck
from graphwatch.runner import run_script

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# examples/gan_bug.py, run for 6 steps, printing its losses
GAN = (EXAMPLES / "gan_bug.py").read_text().replace("for _ in range(3):", "for step in range(6):").replace(
    "        opt_g.step()\n", '        opt_g.step()\n        print(f"step {step} d {d_loss.item():.6f} g {g_loss.item():.6f}")\n'
)

KEPT_LOGITS = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x_val = torch.randn(32, 4)
val_history = []
for step in range(8):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    val_logits = model(x_val).squeeze(1)
    val_history.append(val_logits)
print(f"mean logit {torch.stack(val_history).mean().item():.6f}")
"""

# Run in a fresh process from the folder of train.py: the zygote forked first (as `graphwatch run --check-fixes` does),
# then train.py run under graphwatch and each patch of sys.argv[3:] checked against its finding of kind sys.argv[1]:
# its one finding of that kind (sys.argv[2] "only"), or the first (sys.argv[2] "first"); prints the checks and how
# each patched run was started.
CHECKS_PATCHES = """import dataclasses, json, sys
from graphwatch import fix_checks, warm_start
from graphwatch.analysis.patch_checks import steps_to_run
from graphwatch.runner import run_script

warm_start.start_zygote()
started = []
start_run = fix_checks.start_run
fix_checks.start_run = lambda *args: started.append(start_run(*args)) or started[-1]
run = run_script("train.py", [], session_options={"snapshots": "off"}, capture_output=True)
found = [f for f in run.trace.findings if f.kind == sys.argv[1]]
assert found and (sys.argv[2] == "first" or len(found) == 1), f"{len(found)} findings of kind {sys.argv[1]}"
finding = found[0]
steps = steps_to_run(run.trace, [finding])
checks = [fix_checks.check_patch(run.trace, run.script, [], patch, [finding], steps=steps) for patch in sys.argv[3:]]
warm_start.stop_zygote()
print(json.dumps({"checks": [dataclasses.asdict(c) for c in checks], "started": [type(p).__name__ for p in started]}))
"""

# Run in a fresh process from the folder of train.py: the zygote forked first, then train.py run as a patched run
# (fix_checks.rerun, all its steps) with its report folder in sys.argv[1]; prints what that folder holds
PATCHED_RUN_FILES = """import json, sys
from pathlib import Path
from graphwatch import fix_checks, warm_start

warm_start.start_zygote()
trace, why = fix_checks.rerun(Path("train.py").resolve(), [], Path.cwd(), 8, "default", Path(sys.argv[1]), 300.0)
warm_start.stop_zygote()
assert trace is not None, why
files = sorted(str(p.relative_to(sys.argv[1])) for p in Path(sys.argv[1]).rglob("*"))
print(json.dumps({"files": files, "kinds": [f.kind for f in trace.findings]}))
"""


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def diff(path: Path, old: str, new: str) -> str:
    """A patch for ``patch -p0`` from ``path``'s folder: the line ``old`` becomes ``new``."""
    before = path.read_text()
    assert before.count(old) == 1
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), before.replace(old, new).splitlines(keepends=True),
                                        fromfile=path.name, tofile=path.name))


def original_run(script: Path, monkeypatch: pytest.MonkeyPatch) -> graphwatch.Trace:
    """The script run under graphwatch in this process, from its folder (as ``graphwatch run`` would)."""
    monkeypatch.chdir(script.parent)
    run = run_script(script.name, [], session_options={"snapshots": "off"}, capture_output=True)
    return run.trace


def found(folder: Path, text: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, graphwatch.Trace, graphwatch.Finding]:
    """The script ``text`` written to ``folder``, its run, and its one finding of ``kind``."""
    script = write(folder, "train.py", text)
    trace = original_run(script, monkeypatch)
    [finding] = [f for f in trace.findings if f.kind == kind]
    return script, trace, finding


def checked(trace: graphwatch.Trace, script: Path, patch: str, finding: graphwatch.Finding, args: tuple[str, ...] = ()) -> PatchCheck:
    return check_patch(trace, script, list(args), patch, [finding], steps=steps_to_run(trace, [finding]))


def checked_warm(
    script: Path, kind: str, *patches: str, env: Mapping[str, str] | None = None, first: bool = False
) -> tuple[list[PatchCheck], list[str]]:
    """``script`` (a train.py) run under graphwatch in a process of its own (forked off the tests' warm Python) and
    each patch checked against its one finding of ``kind`` (its first, when ``first``), the patched runs started as
    ``graphwatch run --check-fixes`` starts them: the checks, and the kind of process each patched run was."""
    driver = write(script.parent.parent, f"checks-{script.parent.name}.py", CHECKS_PATCHES)
    which = "first" if first else "only"
    done = warm_python.run([sys.executable, str(driver), kind, which, *patches], cwd=script.parent, env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return [PatchCheck(**check) for check in result["checks"]], result["started"]


def folder_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def graphwatch_run(*args: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="1000", **variables)  # one terminal line per summary line
    return warm_python.run([sys.executable, "-m", "graphwatch", "run", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


# ------------------------------------------------------------------ --stop-after
def test_stop_after_ends_the_script_at_the_end_of_step_n_and_changes_nothing_before(tmp_path: Path) -> None:
    script = write(tmp_path / "gan", "gan.py", GAN.replace("D(fake), zeros", "D(fake.detach()), zeros"))
    bare = warm_python.run([sys.executable, script.name], cwd=script.parent, capture_output=True, text=True, timeout=300)
    done = graphwatch_run("--quiet", "--out", str(tmp_path / "report"), "--stop-after", "3", script.name, cwd=script.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == bare.stdout.splitlines()[:3]  # steps 0..2 ran whole, with their prints
    trace = graphwatch.load(tmp_path / "report" / "trace.json")
    assert trace.ended_early == "stopped at the end of step 2, as asked (--stop-after 3)"
    assert [o.steps for o in trace.optimizers] == [3, 3]  # the fourth step's optimizer steps never ran


def test_stop_after_refuses_a_step_count_that_is_not_a_positive_number(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", "print('ran')\n")
    done = graphwatch_run("--stop-after", "0", script.name, cwd=tmp_path)
    assert done.returncode == 2 and "'0' is not a number of steps" in done.stderr and "ran" not in done.stdout


# ------------------------------------------------------------------ --trace-only
def test_trace_only_writes_the_trace_and_no_report_or_pictures_and_names_the_trace(tmp_path: Path) -> None:
    script = write(tmp_path / "val", "train.py", KEPT_LOGITS)
    report = tmp_path / "report"
    done = graphwatch_run("--trace-only", "--out", str(report), script.name, cwd=script.parent)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in report.iterdir()) == ["trace.json"]  # no index.html, no snapshots/*.svg
    assert "graph-kept-alive" in [f.kind for f in graphwatch.load(report / "trace.json").findings]
    assert f"trace: {report / 'trace.json'} (graphwatch report TRACE.json --out DIR draws its report)" in done.stderr
    assert "index.html" not in done.stderr


def test_trace_only_under_torchrun_writes_each_ranks_trace_in_its_folder_and_rank_1_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(write(tmp_path / "job", "train.py", "x = 1\n").parent)
    run = run_script("train.py", [], capture_output=True)
    run.trace.rank, run.trace.world_size = 1, 2  # (as torchrun's rank 1 records them)
    capsys.readouterr()
    assert _write_trace(run, tmp_path / "report", summary=True) == tmp_path / "report" / "rank1" / "trace.json"
    assert graphwatch.load(tmp_path / "report" / "rank1" / "trace.json").rank == 1
    assert sorted(p.name for p in (tmp_path / "report").rglob("*")) == ["rank1", "trace.json"]
    assert capsys.readouterr() == ("", "")  # rank 0 speaks for the job


def test_run_help_says_what_trace_only_writes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--trace-only write only DIR/trace.json (under torchrun DIR/rankR/trace.json), no HTML page and no " \
        "pictures; `graphwatch report DIR/trace.json` draws them later" in shown


def test_a_patched_run_writes_only_its_trace_no_report_and_no_pictures(tmp_path: Path) -> None:
    script = write(tmp_path / "val", "train.py", KEPT_LOGITS)
    driver = write(tmp_path, "patched_run.py", PATCHED_RUN_FILES)
    done = warm_python.run([sys.executable, str(driver), str(tmp_path / "report")], cwd=script.parent,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    patched = json.loads(done.stdout.splitlines()[-1])
    assert patched["files"] == ["trace.json"]  # (a whole report would hold index.html and snapshots/*.svg)
    assert "graph-kept-alive" in patched["kinds"]  # the trace read back from it


def test_check_fixes_with_trace_only_keeps_the_verdicts_in_the_trace_and_writes_no_report(tmp_path: Path) -> None:
    script = write(tmp_path / "val", "train.py", KEPT_LOGITS)
    report = tmp_path / "report"
    done = graphwatch_run("--check-fixes", "--trace-only", "--quiet", "--out", str(report), script.name, cwd=script.parent)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in report.iterdir()) == ["trace.json"]
    [kept] = [f for f in graphwatch.load(report / "trace.json").findings if f.kind == "graph-kept-alive"]
    assert kept.check is not None and kept.check.checked, kept.check


# ------------------------------------------------------------------ what trained
def test_the_trace_records_each_optimizer_and_which_parameters_got_gradients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = write(tmp_path, "gan.py", GAN.replace("g_loss = bce(D(fake), ones)", "g_loss = bce(D(fake.detach()), ones)")
                   .replace("D(fake), zeros", "D(fake.detach()), zeros"))
    trace = original_run(script, monkeypatch)
    assert [(o.label, o.first_step, o.steps) for o in trace.optimizers] == [("opt_d (Adam)", 0, 6), ("opt_g (Adam)", 0, 6)]
    trained = {p.name: p.first_grad_step for p in trace.parameters}
    assert trained == {"D.0.weight": 0, "D.0.bias": 0, "D.2.weight": 0, "D.2.bias": 0,
                       "G.0.weight": None, "G.0.bias": None, "G.2.weight": None, "G.2.bias": None}  # G never learns
    assert [(p.optimizer, p.group, p.index, p.shape) for p in trace.parameters][4] == (1, 0, 0, (16, 4))


def test_old_traces_load_without_what_trained_and_new_ones_keep_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = original_run(write(tmp_path, "gan.py", GAN.replace("D(fake), zeros", "D(fake.detach()), zeros")), monkeypatch)
    path = tmp_path / "trace.json"
    graphwatch.model.save_trace(trace, path)
    again = graphwatch.load(path)
    assert again.parameters == trace.parameters and again.optimizers == trace.optimizers
    data = json.loads(path.read_text())
    data["version"] = 4
    for name in ("optimizers", "parameters"):
        del data[name]
    path.write_text(json.dumps(data))
    old = graphwatch.load(path)
    assert old.optimizers == [] and old.parameters == [] and all(f.check is None for f in old.findings)


# ------------------------------------------------------------------ right and wrong patches
@pytest.fixture(scope="module")
def gan_checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PatchCheck]:
    """The GAN's error, from one run, checked against the right detach (on D's step) and the wrong one (on G's)."""
    script = write(tmp_path_factory.mktemp("gan"), "train.py", GAN)
    right = diff(script, "D(fake), zeros", "D(fake.detach()), zeros")
    wrong = diff(script, "g_loss = bce(D(fake), ones)", "g_loss = bce(D(fake.detach()), ones)")  # silences the error
    checks, _ = checked_warm(script, "backward-through-freed-graph", right, wrong)
    return dict(zip(("right", "wrong"), checks, strict=True))


@pytest.mark.xdist_group("gan-checks")  # (one worker makes the shared run)
def test_the_right_detach_for_a_gan_is_checked(gan_checks: dict[str, PatchCheck]) -> None:
    check = gan_checks["right"]
    assert check.checked, check.failed
    assert "the 4 parameters that got gradients before still get them, stepped by the same optimizers" in check.held
    assert "opt_g (Adam), which never stepped before the error, now steps and gives every parameter it owns a gradient" \
        in check.held


@pytest.mark.xdist_group("gan-checks")
def test_a_detach_on_the_generator_step_is_caught_the_generator_stops_learning(gan_checks: dict[str, PatchCheck]) -> None:
    check = gan_checks["wrong"]
    assert not check.checked
    assert "the finding is gone" in check.held  # the error is silenced ...
    assert check.failed == [  # ... but G no longer learns
        "G.0.weight, G.0.bias, G.2.weight and 1 more (4 parameters): owned by opt_g (Adam), got no gradient in 5 steps "
        "of the patched run"
    ]


def test_item_on_a_kept_tensor_of_32_elements_is_caught_it_crashes_training(tmp_path: Path) -> None:
    script = write(tmp_path / "val", "train.py", KEPT_LOGITS)
    wrong = diff(script, "val_history.append(val_logits)", "val_history.append(val_logits.item())")
    right = diff(script, "val_history.append(val_logits)", "val_history.append(val_logits.detach())")
    [check, right_check], _ = checked_warm(script, "graph-kept-alive", wrong, right)
    assert not check.checked
    assert check.failed == [
        "cannot tell whether the finding is gone: the patched run ended before step 4, where it showed",
        "the patched run raised a new error: RuntimeError: a Tensor with 32 elements cannot be converted to Scalar",
    ]
    assert right_check.checked


def test_a_patch_that_does_not_apply_and_an_argument_outside_the_folder_are_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, trace, kept = found(tmp_path / "val", KEPT_LOGITS, "graph-kept-alive", monkeypatch)
    stale = diff(script, "val_history.append(val_logits)", "val_history.append(val_logits.detach())")
    script.write_text(KEPT_LOGITS.replace("val_history.append(val_logits)", "val_history += [val_logits]"))
    check = checked(trace, script, stale, kept)
    assert not check.checked and check.failed[0].startswith("the patch does not apply: ")
    outside = write(tmp_path / "elsewhere", "data.txt", "x")
    check = checked(trace, script, stale, kept, args=("--data", str(outside)))
    assert check.failed == [f"not checked: the argument {outside} names a path outside the folder the check copies "
                            f"({script.parent}), where the patched run could write; run from a folder that holds it, "
                            "or allow it with --check-allow-path PATH"]


# ------------------------------------------------------------------ the command
def test_check_fixes_marks_the_patch_checked_in_the_terminal_the_trace_and_the_report_laid_out_once(
    tmp_path: Path,
) -> None:
    """The report is written before the checks, after each verdict and at the end: each of its graphs goes to
    ``dot`` once (counted by a ``dot`` first on the PATH that keeps what each process gives it, :mod:`dot_calls`)."""
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(EXAMPLES / "rnn_hidden_bug.py", folder)
    (folder / ".git").mkdir()  # left out of the copy, and said so
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = folder_digest(folder)
    report, drawing = tmp_path / "report", shutil.which("dot") is not None
    path, laid_out = dot_that_keeps_its_input(tmp_path) if drawing else (os.environ["PATH"], dict)
    done = graphwatch_run("--check-fixes", "--out", str(report), "rnn_hidden_bug.py", cwd=folder, PATH=path)
    assert done.returncode == 1  # the script's own error, as without --check-fixes
    assert folder_digest(folder) == before  # the user's files are untouched
    assert "check: checked in 4 steps: the patch applies; the finding is gone; the patched run raised no error" in done.stderr
    assert "(not copied: .git/)" in done.stderr
    trace = graphwatch.load(report / "trace.json")
    checks = [f.check for f in trace.findings if f.patch]
    assert len(checks) == 2 and all(c is not None and c.checked and c.steps == 4 for c in checks)
    html = (report / "index.html").read_text()
    assert html.count('<p class="check checked"><strong>Check:</strong> checked in 4 steps: the patch applies;') == 1
    if drawing:  # graphwatch's own process laid out the most: its report's graphs, each once
        graphs = {graph for snap in trace.snapshots for graph in (snap.dot, snap.focus) if graph}
        assert graphs and max(map(len, laid_out().values())) == len(graphs)


TOTAL_LOSS_WITH_DATA = """import torch
from torch import nn

scale = float(open("data/scale.txt").read())
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
total_loss = 0
for step in range(8):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean() * scale
    loss.backward()
    opt.step()
    total_loss += loss
print(f"mean loss {total_loss.item() / 8:.6f}")
"""


def test_check_fixes_says_what_failed_in_the_terminal_and_the_report(tmp_path: Path) -> None:
    """The data folder is a link to a folder elsewhere: not copied (the rerun could write through it), so the
    patched run cannot read its data and the patch is not called checked."""
    folder = tmp_path / "project"
    write(tmp_path / "datasets", "scale.txt", "2.0")
    write(folder, "train.py", TOTAL_LOSS_WITH_DATA)
    (folder / "data").symlink_to(tmp_path / "datasets", target_is_directory=True)
    report = tmp_path / "report"
    done = graphwatch_run("--check-fixes", "--out", str(report), "train.py", cwd=folder)
    assert done.returncode == 0, done.stderr
    assert "check: FAILED: cannot tell whether the finding is gone: the patched run ended before step 3, where it " \
        "showed; the patched run raised a new error: FileNotFoundError: [Errno 2] No such file or directory: " \
        "'data/scale.txt'; " in done.stderr
    assert "(not copied: data/ (a link to a folder))" in done.stderr
    [check] = {id(f.check): f.check for f in graphwatch.load(report / "trace.json").findings if f.check}.values()
    assert not check.checked and check.held == ["the patch applies", "no new finding"]
    assert check.failed[2] == "model.weight, model.bias (2 parameters): no longer stepped by opt (SGD)"
    html = (report / "index.html").read_text()
    assert '<p class="check failed"><strong>Check:</strong> FAILED: cannot tell whether the finding is gone: ' in html
