"""``import graphwatch`` loads only what watching needs (issue 41): LibCST, the codemods and the renderers
that only a report, a patch or a drawing needs load when first used.

A short script, and every pytest run (the plugin registers itself through the
``pytest11`` entry point, so it imports graphwatch in every pytest run of a
user who installed it), would otherwise pay for them.  Each test reads the ``sys.modules``
of a fresh interpreter right after its ``import torch`` (and ``torch._dynamo``, for a script that optimizes or
compiles; the two import tests share one), forked off a lean server that imported them and nothing of graphwatch
(tests/lean_python.py) rather than started cold each time; no timings (benchmarks/import_cost.py measures what
this saves).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lean_python
import pytest

import graphwatch

pytestmark = pytest.mark.xdist_group("lean-python")  # (one worker: one lean server, one import of torch._dynamo)
REPO = Path(graphwatch.__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
PATCHES = ("libcst", "graphwatch.analysis.codemods")  # what makes a patch, or a fix sentence's edited line
DRAWING = ("graphwatch.rendering.dot", "graphwatch.rendering.svg")  # what draws a graph snapshot (DOT text, SVG)
MAKE_DOT = ("graphviz",)  # what only make_dot needs (the Digraph it returns): never a session
REPORTS = ("rich", "graphwatch.rendering.html", "graphwatch.rendering.terminal")  # the HTML report, the summary
HEAVY = PATCHES + DRAWING + MAKE_DOT + REPORTS
OPTIMIZING = ("torch._dynamo",)  # what a script's first optimizer imports (and torch.compile): none of HEAVY
SHOWS_ITS_START = """\
import json, os, sys, torch
print(sys.argv, sys.path, os.getcwd(), os.environ.get("ASKED"), repr(sys.stdin.read()), __name__)
print(json.dumps(sorted(sys.modules)))
print("to stderr", file=sys.stderr)
raise ValueError("raised by the code")
"""
PRINT_LOADED = f"import json as _j, sys as _s\nprint(_j.dumps([m for m in {HEAVY!r} if m in _s.modules]))"


def loaded_after(code: str, cwd: Path, after_torch: tuple[str, ...] = ()) -> tuple[set[str], str]:
    """Run ``code`` in a fresh interpreter after its ``import torch`` and its imports of ``after_torch`` (in
    ``cwd``); which of :data:`HEAVY` it had loaded at the end, and what it printed before that."""
    done = lean_python.run(f"{code}\n{PRINT_LOADED}", cwd, after_torch)
    assert done.returncode == 0, done.stderr
    *printed, last = done.stdout.splitlines()
    return set(json.loads(last)), "\n".join(printed)


@pytest.fixture(scope="module")
def loaded_by_imports(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    """One fresh interpreter: what of :data:`HEAVY` ``import graphwatch`` had loaded, then what importing the
    pytest plugin after it had (the plugin imports graphwatch first, so this is what importing it alone loads)."""
    loaded_by_plugin, printed = loaded_after(f"import graphwatch\n{PRINT_LOADED}\nimport graphwatch.pytest_plugin",
                                             tmp_path_factory.mktemp("imports"))  # fmt: skip
    return set(json.loads(printed)), loaded_by_plugin


def test_import_graphwatch_loads_no_libcst_codemods_or_renderers(loaded_by_imports: tuple[set[str], set[str]]) -> None:
    loaded_by_graphwatch, _ = loaded_by_imports
    assert loaded_by_graphwatch == set()


def test_importing_the_pytest_plugin_loads_no_libcst_codemods_or_renderers(
    loaded_by_imports: tuple[set[str], set[str]],
) -> None:
    _, loaded_by_plugin = loaded_by_imports
    assert loaded_by_plugin == set()


def test_the_lean_interpreter_starts_and_ends_as_a_fresh_one_after_import_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the other tests rely on: a child of the lean server has what ``python -c`` has after ``import torch``
    (the same ``sys.argv``, ``sys.path``, folder, environment, standard input, output, traceback and exit code,
    every module, and besides them only standard-library ones: nothing of graphwatch, LibCST, rich or graphviz)."""
    monkeypatch.setenv("ASKED", "yes")
    lean = lean_python.run(SHOWS_ITS_START, tmp_path)
    cold = subprocess.run([sys.executable, "-c", SHOWS_ITS_START], cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    (lean_start, lean_modules), (cold_start, cold_modules) = (done.stdout.splitlines() for done in (lean, cold))
    assert (lean.returncode, lean_start, lean.stderr) == (cold.returncode, cold_start, cold.stderr)
    assert lean.returncode == 1 and "ValueError: raised by the code" in lean.stderr
    assert f"{tmp_path} yes '' __main__" in lean_start
    assert set(json.loads(cold_modules)) <= set(json.loads(lean_modules))
    extra = {name.partition(".")[0] for name in set(json.loads(lean_modules)) - set(json.loads(cold_modules))}
    assert extra <= {*sys.stdlib_module_names, "lean_python", "warm_python"}


def test_the_public_names_that_load_on_first_use_still_work(tmp_path: Path) -> None:
    code = """
import graphwatch, torch
names = dir(graphwatch)
y = (torch.ones(2, requires_grad=True) * 2).sum()
print("make_dot" in names, "fillcolor=lightblue" in graphwatch.make_dot(y, params={}).source)
from graphwatch import make_dot
print(make_dot is graphwatch.make_dot)
try:
    graphwatch.no_such_name
except AttributeError as error:
    print(error)
"""
    loaded, printed = loaded_after(code, tmp_path)
    assert printed.splitlines() == ["True True", "True", "module 'graphwatch' has no attribute 'no_such_name'"]
    assert {"graphviz", "graphwatch.rendering.dot"} <= loaded


def test_watching_a_near_empty_script_loads_no_codemods_and_draws_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty.py").write_text("print(1)\n")
    code = "from graphwatch.cli import main\nassert main(['run', '--out', 'out', 'empty.py']) == 0"
    loaded, printed = loaded_after(code, tmp_path)
    assert printed == "1"
    assert loaded.isdisjoint(PATCHES + DRAWING + MAKE_DOT)
    assert set(REPORTS) <= loaded  # the summary and the report are still made
    assert "No graph snapshots were taken in this run." in (tmp_path / "out" / "index.html").read_text()


def test_a_findings_patch_loads_the_codemods_and_the_drawing_and_they_work(tmp_path: Path) -> None:
    """A run with a finding makes its patch and draws its snapshots (DOT text, then SVG by ``dot``) without the
    graphviz package, which only ``make_dot``'s return value needs (about 45 ms at a run's first drawn backward)."""
    shutil.copy(REPO / "examples" / "total_loss_bug.py", tmp_path / "total_loss_bug.py")
    code = "from graphwatch.cli import main\nmain(['run', '--quiet', '--out', 'out', 'total_loss_bug.py'])"
    loaded, _ = loaded_after(code, tmp_path, OPTIMIZING)
    assert set(PATCHES + DRAWING + REPORTS) <= loaded
    assert loaded.isdisjoint(MAKE_DOT)
    trace = graphwatch.load(tmp_path / "out" / "trace.json")
    patch = next(f.patch for f in trace.findings if f.patch)
    assert "+" in patch and ".item()" in patch  # the codemod's edit: keep a number, not the graph
    assert trace.snapshots and trace.snapshots[0].dot.startswith("digraph")
    if shutil.which("dot"):
        assert "<svg" in (tmp_path / "out" / "index.html").read_text()


def test_drawing_code_loaded_inside_a_compiled_function_is_hidden_from_dynamo_too(tmp_path: Path) -> None:
    """The first backward's snapshot loads the drawing code from inside a compiled step: Dynamo must skip its
    frames as graphwatch's others (test_compile_breaks.py), not compile graphs of them."""
    code = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from test_compile_breaks import compile_stats, train_step_with_backward_inside
bare = compile_stats(train_step_with_backward_inside, None)
print("graphwatch.rendering.dot" in sys.modules)
watched = compile_stats(train_step_with_backward_inside, "default")
print("graphwatch.rendering.dot" in sys.modules)
print(bare["graphs"], watched["graphs"], sum(bare["breaks"].values()), sum(watched["breaks"].values()))
print(bare["warnings"] == watched["warnings"])
"""
    _, printed = loaded_after(code, tmp_path, OPTIMIZING)
    drawn_before, drawn_after, counts, same_warnings = printed.splitlines()[-4:]
    assert (drawn_before, drawn_after) == ("False", "True")  # loaded by the session, inside the compiled step
    bare_graphs, watched_graphs, bare_breaks, watched_breaks = counts.split()
    assert (watched_graphs, watched_breaks) == (bare_graphs, bare_breaks)
    assert same_warnings == "True"


def test_a_session_that_shows_and_writes_nothing_makes_its_patches_when_its_trace_is_read(tmp_path: Path) -> None:
    """A patch parses the user's file (seconds for a file of thousands of lines, as the sessions of PyTorch's own
    test suite meet, one per test): a ``summary=False`` session with no report makes it when ``gw.trace`` is
    first read, the same patch."""
    (tmp_path / "train.py").write_text("""\
import sys, torch, graphwatch
from torch import nn
model, total = nn.Linear(4, 1), 0
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with graphwatch.watch(summary=False) as gw:
    for _ in range(4):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss
print([f.patch for f in gw._recorder.trace.findings])  # (the records as the session left them)
kept = [f for f in gw.trace.findings if f.kind == "graph-kept-alive"]
print(len(kept), "+        total += loss.item()" in (kept[0].patch or ""))
""")
    loaded, printed = loaded_after("import runpy\nruns = runpy.run_path('train.py')", tmp_path, OPTIMIZING)
    before, after = printed.splitlines()
    assert before.strip("[]").split(", ") and set(before.strip("[]").split(", ")) == {"None"}
    assert after == "1 True"
    assert set(PATCHES) <= loaded
