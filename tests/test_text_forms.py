"""How sessions and findings read as text (``print(gw)``, ``repr``, IPython), how a notebook shows a finding
without the model importing the renderer, and the options of the session ``@graphwatch.step`` starts."""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import warm_python
from IPython.lib.pretty import RepresentationPrinter, pretty

import graphwatch
from graphwatch.model import PatchCheck, Trace
from graphwatch.rendering.notebook import finding_text
from graphwatch.rendering.wording import session_text

PACKAGE = Path(graphwatch.__file__).resolve().parent
REPO = PACKAGE.parents[1]  # the repository (the package lives in its src/)


def kept_totals() -> graphwatch.Session:
    """A loop whose ``total`` keeps every step's graph: a graph-kept-alive finding with a patch."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        total = 0
        for _ in range(6):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            total += loss
    return gw


@pytest.fixture(scope="module")
def session() -> graphwatch.Session:
    return kept_totals()


def test_a_finding_says_what_was_found_in_one_line_and_in_full(session: graphwatch.Session) -> None:
    finding = next(f for f in session.findings if f.kind == "graph-kept-alive")
    line = repr(finding)
    assert "\n" not in line and line.startswith("<Finding graph-kept-alive (warning, with a patch) at step ")
    assert "`total`" in line and len(line) < 200
    full = pretty(finding)  # the model's own text view: the message and the fix, no patch without its check
    assert finding.message in full and f"fix: {finding.fix}" in full and "patch" not in full
    shown = io.StringIO()  # IPython's text view once graphwatch registered its formatter: the patch and its check
    printer = RepresentationPrinter(shown)
    finding_text(finding, printer, False)
    printer.flush()
    assert shown.getvalue().startswith(full) and (finding.patch or "?").rstrip() in shown.getvalue()
    assert shown.getvalue().endswith("  check: unchecked: `graphwatch run --check-fixes` re-runs it")
    assert repr([finding]) == f"[{line}]"


def test_a_session_says_what_it_found(session: graphwatch.Session) -> None:
    line = repr(session)
    assert line.startswith("<graphwatch.Session ended: 6 steps, ") and "graph-kept-alive at step 3" in line
    text = str(session)  # print(gw)
    assert text.startswith(f"graphwatch: {len(session.findings)} problems in 6 steps (session ended)")
    for finding in session.findings:
        assert str(finding) in text
    assert "gw.report(DIR)" in text and pretty(session) == text
    assert "object at 0x" not in line + text


def test_print_session_shows_each_patch_with_its_check_state(session: graphwatch.Session) -> None:
    """``print(gw)`` says what ``graphwatch run --check-fixes`` found for each patch, as the terminal summary
    does: unchecked, checked, or FAILED, and a failed patch is never offered as the fix to apply."""
    kept = next(f for f in session.findings if f.kind == "graph-kept-alive" and f.patch)
    patch = (kept.patch or "").rstrip("\n")
    unchecked = str(session)
    assert f"  patch (patch -p0):\n{patch}\n  check: unchecked: `graphwatch run --check-fixes` re-runs it" in unchecked
    passed = PatchCheck(checked=True, steps=6, held=["the finding is gone"])
    text = session_text(Trace(findings=[dataclasses.replace(kept, check=passed)]), "ended")
    assert f"{patch}\n  check: checked in 6 steps: the finding is gone" in text
    failed = PatchCheck(checked=False, failed=["`w` got no gradient\x1b[2J"])
    text = session_text(Trace(findings=[dataclasses.replace(kept, check=failed)]), "ended")
    assert "patch (patch -p0)" not in text and "  patch, not for copying: its check failed" in text
    assert "  check: FAILED: `w` got no gradient\\u{1b}[2J" in text and "\x1b" not in text


def test_a_session_that_is_watching_says_so(no_session_left: None) -> None:
    with graphwatch.watch(summary=False) as gw:
        assert repr(gw) == "<graphwatch.Session watching: 0 steps, no graph leaks>"
    assert repr(graphwatch.watch()) == "<graphwatch.Session not entered: 0 steps, no graph leaks>"


def test_ipython_shows_a_finding_as_html_once_graphwatch_is_imported(tmp_path: Path) -> None:
    """A real IPython shell started before ``import graphwatch`` (as in a notebook), without ``%load_ext``."""
    code = textwrap.dedent("""
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        import graphwatch
        finding = graphwatch.Finding("retained-graph", "warning", 3, "the message", "the fix")
        shown, _ = shell.display_formatter.format(finding)
        print(sorted(shown), 'class="graphwatch-summary"' in shown["text/html"], shown["text/plain"].split(":")[0])
    """)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["['text/html',", "'text/plain']", "True", "[retained-graph]", "step", "3"]


def test_ipythons_text_view_shows_a_findings_patch_with_its_check_state(tmp_path: Path) -> None:
    """A real IPython shell: a finding's text/plain view (the IPython prompt, a notebook's plain output) shows its
    patch only with the check's line, and a patch whose check failed as not for copying."""
    code = textwrap.dedent("""
        import dataclasses
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        import graphwatch
        from graphwatch.model import PatchCheck
        finding = graphwatch.Finding("retained-graph", "warning", 3, "the message", "the fix",
                                     patch="--- a.py\\n+++ a.py\\n@@ -1 +1 @@\\n-x\\n+y\\n")
        failed = dataclasses.replace(finding, check=PatchCheck(checked=False, failed=["`w` got no gradient"]))
        for shown in (finding, failed):
            print(shell.display_formatter.format(shown)[0]["text/plain"])
            print("=====")
    """)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    unchecked, failed, _ = run.stdout.split("=====\n")
    assert "  patch (patch -p0):\n--- a.py\n+++ a.py" in unchecked
    assert unchecked.rstrip().endswith("  check: unchecked: `graphwatch run --check-fixes` re-runs it")
    assert "patch (patch -p0)" not in failed and "  patch, not for copying: its check failed" in failed
    assert failed.rstrip().endswith("  check: FAILED: `w` got no gradient")


def _imports(path: Path) -> list[str]:
    """The graphwatch modules a file of the package imports, anywhere in it (also inside functions), absolute."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found += [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [name for name in found if name == "graphwatch" or name.startswith("graphwatch.")]


def test_the_model_imports_nothing_above_it() -> None:
    """capture -> model -> analysis -> rendering: the model reads no layer above it, not even lazily; besides
    itself it uses only graphwatch's errors, which import no graphwatch module."""
    above = [
        f"{path.name}: {name}"
        for path in sorted((PACKAGE / "model").glob("*.py"))
        for name in _imports(path)
        if not name.startswith(("graphwatch.model", "graphwatch.errors"))
    ]
    assert above == [] and _imports(PACKAGE / "errors.py") == []


def test_importing_the_model_alone_loads_no_other_part_of_graphwatch() -> None:
    """The model package imported under an empty ``graphwatch`` package: nothing else of graphwatch gets loaded."""
    code = textwrap.dedent(f"""
        import sys, types
        package = types.ModuleType("graphwatch")
        package.__path__ = [{str(PACKAGE)!r}]
        sys.modules["graphwatch"] = package
        import graphwatch.model
        graphwatch.model.Finding("k", "warning", 0, "m", "f").__repr__()
        print(" ".join(sorted(name for name in sys.modules if name.startswith("graphwatch."))))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    loaded = run.stdout.split()
    assert loaded and all(name.startswith(("graphwatch.model", "graphwatch.errors")) for name in loaded), loaded


# ------------------------------------------------------------------------- @graphwatch.step alone
STEP_SCRIPT = """\
import torch, graphwatch
{configure}
w = torch.ones(3, requires_grad=True)

@graphwatch.step
def train_step():
    (w * 2).sum().backward()

for _ in range(3):
    train_step()
"""


def run_script(tmp_path: Path, configure: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(STEP_SCRIPT.format(configure=configure))
    return warm_python.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})},
    )  # fmt: skip


def test_the_session_step_starts_writes_the_report_configure_names(tmp_path: Path) -> None:
    run = run_script(tmp_path, 'graphwatch.configure(out="step-report")')
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "step-report" / "index.html").is_file() and "no graph leaks in 3 steps" in run.stderr
    assert "report: step-report/index.html" in run.stderr
    trace = graphwatch.load(tmp_path / "step-report" / "trace.json")
    assert [s.source for s in trace.steps] == ["explicit"] * 3


def test_the_report_folder_of_a_step_session_from_the_environment(tmp_path: Path) -> None:
    run = run_script(tmp_path, "", env={"GRAPHWATCH_OUT": "from-env"})
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "from-env" / "index.html").is_file()


def test_configure_after_the_session_started_or_with_a_wrong_option_is_a_usage_error(tmp_path: Path) -> None:
    late = run_script(tmp_path, "")
    assert late.returncode == 0 and not (tmp_path / "graphwatch-report").exists()
    script = (tmp_path / "train.py").read_text() + 'graphwatch.configure(out="late")\n'
    (tmp_path / "train.py").write_text(script)
    run = warm_python.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})  # fmt: skip
    assert run.returncode == 1 and "graphwatch.errors.UsageError: graphwatch.configure() after the first" in run.stderr
    with pytest.raises(graphwatch.UsageError, match="did you mean 'level'"):
        graphwatch.configure(levle="light")
