"""torch's "element 0 of tensors does not require grad" error when the cut has left the stack (issue 38,
point 2): the ``@torch.no_grad()`` function that had returned (its ``def`` and the call that ran it), the
``with torch.no_grad():`` block already left, the op that makes no graph (``argmax``, a comparison,
``torch.tensor(loss.item())``, a NumPy round trip, ``.detach()``), and the ``requires_grad_(False)`` that froze
every parameter the optimizer owns, each named at its line; correct programs that look alike stay silent."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch
import warm_python

import graphwatch
from graphwatch.model import Finding

pytestmark = pytest.mark.usefixtures("no_session_left")

HEAD = """\
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
"""

DECORATED = HEAD + """
@torch.no_grad()  # at: decorator
def compute_loss(model, x, y):  # at: cut
    return F.cross_entropy(model(x), y)


model = nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss = compute_loss(model, x, y)  # at: call
    opt.zero_grad()
    loss.backward()  # at: backward
    opt.step()
"""

LOOP = """
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
{body}
    opt.zero_grad()
    loss.backward()  # at: backward
    opt.step()
"""

CUTS = {
    "argmax": ("    logits = model(x)\n    pred = logits.argmax(1).float()  # at: cut\n"
               "    loss = F.mse_loss(pred, y.float())", "`.argmax()`"),
    "comparison": ("    pred = model(x)[:, :1]\n    loss = F.binary_cross_entropy((pred > 0).float(), y[:, None].float().clamp(max=1))"
                   "  # at: cut", "`>`"),
    "number": ("    loss = F.cross_entropy(model(x), y)\n    loss = torch.tensor(loss.item())  # at: cut",
               "`.item()`, `torch.tensor()`"),
    "numpy": ("    out = model(x)\n    out = torch.from_numpy(out.detach().numpy())  # at: cut\n"
              "    loss = F.cross_entropy(out, y)", "`.detach()`, `.numpy()`, `torch.from_numpy()`"),
    "detach": ("    out = model(x).detach()  # at: cut\n    loss = F.cross_entropy(out, y)", "`.detach()`"),
    "data": ("    out = model(x)\n    loss = F.cross_entropy(out.data, y)  # at: cut", "`.data`"),
}

LEFT_BLOCK = HEAD + LOOP.format(body="    with torch.no_grad():  # at: block\n        out = model(x)  # at: cut\n"
                                     "    loss = F.cross_entropy(out, y)")

FROZEN = HEAD + """
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
model.requires_grad_(False)  # at: cut
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss = F.cross_entropy(model(x), y)  # at: call
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

FROZEN_LOOP = HEAD + """
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
head = nn.Linear(3, 3)
head.requires_grad_(False)
for p in model.parameters():  # at: loop
    p.requires_grad = False  # at: cut
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss = F.cross_entropy(model(x), y)  # at: call
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

MANUAL_SGD = HEAD + """
model = nn.Linear(4, 3)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss = F.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
print(round(sum(p.sum().item() for p in model.parameters()), 4))
"""

FROZEN_BACKBONE = HEAD + """
backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
backbone.requires_grad_(False)
head = nn.Linear(8, 3)
opt = torch.optim.SGD(head.parameters(), lr=0.1)
data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(3)]
with torch.no_grad():
    cached = [(backbone(x), y) for x, y in data]
for feats, y in cached:
    loss = F.cross_entropy(head(feats), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(round(sum(p.sum().item() for p in head.parameters()), 4))
"""


def line(source: str, tag: str) -> int:
    [number] = [n for n, text in enumerate(source.splitlines(), 1) if text.endswith(f"# at: {tag}")]
    return number


def explained(tmp_path: Path, source: str) -> tuple[Path, str, Finding]:
    """The script run under a session: the error's text and its one finding."""
    script = tmp_path / "train.py"
    script.write_text(source)
    with pytest.raises(graphwatch.LossWithoutGraphError) as info, contextlib.redirect_stdout(io.StringIO()):
        with graphwatch.watch(summary=False, snapshots="off") as gw:
            runpy.run_path(str(script), run_name="__main__")
    assert [f.kind for f in gw.findings] == ["loss-without-graph"]
    return script, str(info.value), gw.findings[0]


def silent(tmp_path: Path, source: str) -> str:
    """What the script prints, run bare and under a session (the same), the session finding nothing."""
    script = tmp_path / "ok.py"
    script.write_text(source)
    printed = []
    for watched in (False, True):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.ExitStack() as stack:
            gw = stack.enter_context(graphwatch.watch(summary=False, snapshots="off")) if watched else None
            runpy.run_path(str(script), run_name="__main__")
        printed.append(out.getvalue())
        assert gw is None or gw.findings == []
    assert printed[0] == printed[1]
    return printed[1]


def test_a_loss_from_a_no_grad_decorated_function_names_its_def_and_the_call(tmp_path: Path) -> None:
    script, text, finding = explained(tmp_path, DECORATED)
    at = {tag: f"{script}:{line(DECORATED, tag)}" for tag in ("decorator", "cut", "call", "backward")}
    assert f"made by `compute_loss`, whose `def` at {at['cut']} (`def compute_loss(model, x, y):" in text
    assert f"decorated with `@torch.no_grad()` ({at['decorator']})" in text
    assert f"the call at {at['call']} (`loss = compute_loss(model, x, y)" in text and "ran it, and it had returned" in text
    assert finding.evidence["sites"][:3] == [at["cut"], at["decorator"], at["call"]]
    assert [r.edits for r in finding.remedies] == [[]]  # which part trains is the user's call: words, no patch


def test_a_left_no_grad_block_names_the_block_and_the_line_run_in_it(tmp_path: Path) -> None:
    script, text, finding = explained(tmp_path, LEFT_BLOCK)
    cut, block = f"{script}:{line(LEFT_BLOCK, 'cut')}", f"{script}:{line(LEFT_BLOCK, 'block')}"
    assert f"made from {cut} (`out = model(x)" in text and f"run inside the `with torch.no_grad():` block at {block}" in text
    assert finding.evidence["sites"][:2] == [cut, block]


@pytest.mark.parametrize("case", sorted(CUTS))
def test_an_op_without_a_gradient_is_named_with_its_line(tmp_path: Path, case: str) -> None:
    body, ops = CUTS[case]
    source = HEAD + LOOP.format(body=body)
    script, text, finding = explained(tmp_path, source)
    cut = f"{script}:{line(source, 'cut')}"
    assert f"was computed from {ops} at {cut} (`" in text
    assert finding.evidence["sites"][0] == cut and finding.evidence["op"] == ops
    assert f"{script}:{line(source, 'backward')}" in finding.evidence["sites"]


@pytest.mark.parametrize("source", [FROZEN, FROZEN_LOOP], ids=["requires_grad_", "loop"])
def test_a_frozen_model_names_the_freezing_line_and_the_optimizers_frozen_parameters(tmp_path: Path, source: str) -> None:
    script, text, finding = explained(tmp_path, source)
    cut, call = f"{script}:{line(source, 'cut')}", f"{script}:{line(source, 'call')}"
    assert f"was computed by `model` at {call}" in text and ", none of whose parameters requires grad" in text
    assert f" at {cut} (`" in text and finding.evidence["sites"][0] == cut
    if "# at: loop" in source:
        assert f"the loop at {script}:{line(source, 'loop')} (`for p in model.parameters():" in text
    names = ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"]
    assert "the optimizer `opt` owns 4 parameters, 4 of which require no grad" in text
    assert finding.evidence["optimizer"] == "opt" and finding.evidence["frozen"] == names


def test_a_loss_made_from_numbers_alone_still_says_what_to_look_for(tmp_path: Path) -> None:
    source = HEAD + "w = torch.ones(3)\nloss = (w * 2).sum()\nloss.backward()\n"
    _, text, finding = explained(tmp_path, source)
    assert "no `torch.no_grad()` block or decorator around it is on the stack" in text
    assert finding.remedies == []


@pytest.mark.parametrize("source", [MANUAL_SGD, FROZEN_BACKBONE], ids=["manual-sgd", "frozen-backbone"])
def test_correct_programs_with_no_grad_and_frozen_parts_stay_silent(tmp_path: Path, source: str) -> None:
    printed = silent(tmp_path, source)
    assert printed.strip().replace("-", "").replace(".", "").isdigit()
    assert torch.is_grad_enabled()


def test_graphwatch_run_shows_the_decorated_function_in_the_terminal_report_and_trace(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(DECORATED)
    env = dict(os.environ, NO_COLOR="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = warm_python.run([sys.executable, "-m", "graphwatch", "run", "--out", str(tmp_path / "out"), str(script)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    def_line = f"train.py:{line(DECORATED, 'cut')}"
    assert f"whose `def` at {def_line} (`def compute_loss(model, x, y):" in result.stderr
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    [found] = [f for f in trace["findings"] if f["kind"] == "loss-without-graph"]
    assert found["evidence"]["sites"][0].endswith(def_line) and "whose `def` at" in found["message"]
    report = (tmp_path / "out" / "index.html").read_text()
    assert f"whose <code>def</code> at {def_line} (<code>def compute_loss(model, x, y):" in report  # (code spans)
