"""torch's "element 0 of tensors does not require grad" error, explained: the ``no_grad`` block or decorator
that made the loss without a graph is named from the frames of the failing backward, and a ``with`` block
gets the statements the loss needs put under ``torch.enable_grad()``; the patched script then runs and
trains its input as intended."""

from __future__ import annotations

import contextlib
import io
import runpy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphwatch
from graphwatch.analysis.codemods import apply_edits
from graphwatch.model import Finding

pytestmark = pytest.mark.usefixtures("no_session_left")

ATTACK = """\
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def evaluate(batches):
    correct = 0
    with torch.no_grad():  # at: block
        for x, y in batches:
            correct += (model(x).argmax(-1) == y).sum().item()
            x_adv = x.clone().requires_grad_()  # at: first
            loss = F.cross_entropy(model(x_adv), y)
            loss.backward()  # at: backward
            x_adv = x + 0.1 * x_adv.grad.sign()
            correct += (model(x_adv).argmax(-1) == y).sum().item()
    return correct


print(evaluate([(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(2)]))
"""

DECORATED = """\
import torch
from torch import nn

model = nn.Linear(4, 1)


@torch.no_grad()  # at: decorator
def probe(x):
    loss = model(x).pow(2).mean()
    loss.backward()


probe(torch.randn(3, 4))
"""


def line(source: str, tag: str) -> int:
    [number] = [n for n, text in enumerate(source.splitlines(), 1) if text.endswith(f"# at: {tag}")]
    return number


def explained(script: Path) -> tuple[str, Finding]:
    with pytest.raises(graphwatch.LossWithoutGraphError) as info, contextlib.redirect_stdout(io.StringIO()):
        with graphwatch.watch(summary=False, snapshots="off"):
            runpy.run_path(str(script), run_name="__main__")
    return str(info.value), info.value.finding


def patched_run(script: Path, source: str, finding: Finding, wrapped: str) -> str:
    """The finding's one remedy puts the lines tagged ``first``..``backward`` under ``torch.enable_grad()``
    (``wrapped``: how the patched file reads there); what the patched script prints."""
    [remedy] = finding.remedies
    assert remedy.mechanical and [(e.kind, e.line, e.until) for e in remedy.edits] == [
        ("enable-grad", line(source, "first"), line(source, "backward"))
    ]
    patched = apply_edits(source, remedy.edits)
    assert patched is not None and wrapped in patched
    script.write_text(patched)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()


def test_an_attack_inside_an_evaluations_no_grad_block_is_named_and_patched(tmp_path: Path) -> None:
    script = tmp_path / "attack.py"
    script.write_text(ATTACK)
    with pytest.raises(RuntimeError) as bare:
        runpy.run_path(str(script), run_name="__main__")
    text, finding = explained(script)
    assert text.startswith(str(bare.value) + "\n\ngraphwatch: ")  # torch's message first, unchanged
    assert f"made under the `with torch.no_grad():` block at {script}:{line(ATTACK, 'block')}" in text
    assert finding.kind == "loss-without-graph"
    printed = patched_run(script, ATTACK, finding, "            with torch.enable_grad():\n                x_adv = x.clone()")
    assert printed.strip().isdigit()  # the attack now has its gradients
    assert torch.is_grad_enabled()


CALLED = """\
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def fgsm(x, y):
    x = x.clone().requires_grad_(True)  # at: first
    loss = F.cross_entropy(model(x), y)
    loss.backward()  # at: backward
    return (x + 0.1 * x.grad.sign()).detach()


with torch.no_grad():  # at: block
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    x_adv = fgsm(x, y)
    print(round(x_adv.sum().item(), 4), x_adv.requires_grad)
"""


def test_an_attack_called_inside_a_no_grad_block_is_patched_in_the_function_that_backwards(tmp_path: Path) -> None:
    script = tmp_path / "called.py"
    script.write_text(CALLED)
    text, finding = explained(script)
    assert f"made under the `with torch.no_grad():` block at {script}:{line(CALLED, 'block')}" in text
    printed = patched_run(script, CALLED, finding, "    with torch.enable_grad():\n        x = x.clone()")
    assert printed.strip().endswith(" False")  # the attack runs; what it returns still has no graph
    assert torch.is_grad_enabled()


def test_a_no_grad_decorator_is_named_without_a_patch(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(DECORATED)
    text, finding = explained(script)
    assert f"made under the `@torch.no_grad()` decorator at {script}:{line(DECORATED, 'decorator')}" in text
    assert "(of `probe`)" in text
    assert [r.edits for r in finding.remedies] == [[]]  # moving a loss out of a decorated function is for the user


def test_a_loss_without_a_graph_outside_no_grad_names_the_detach_that_cut_it(at: Callable[..., str]) -> None:
    w = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        loss = (w * 2).sum().detach()  # at: detach
        with pytest.raises(graphwatch.LossWithoutGraphError) as info:
            loss.backward()
    detach = at(test_a_loss_without_a_graph_outside_no_grad_names_the_detach_that_cut_it, "detach")
    assert f"was computed from `.detach()` at {detach}" in str(info.value)  # (issue 38: the cut, off the stack)
    assert [f.kind for f in gw.findings] == ["loss-without-graph"] and [r.edits for r in gw.findings[0].remedies] == [[]]
