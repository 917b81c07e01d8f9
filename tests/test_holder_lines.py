"""Holders are named where the user can fix them: the line that appends to or assigns the holder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import graphwatch


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.outputs: list[torch.Tensor] = []  # at: created

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        loss = self.net(x).pow(2).mean()
        self.outputs.append(loss)  # at: appended
        return loss


def attribute_list(iterations: int = 8) -> None:
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(iterations):
        opt.zero_grad()
        loss = model.training_step(torch.randn(8, 4))
        loss.backward()
        opt.step()


def test_a_list_kept_on_a_module_is_cited_at_the_method_that_appends(at: Callable[[object, str], str]) -> None:
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        attribute_list()
    kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in gw.findings]
    assert kept[0].evidence["holder"] == "model.outputs"
    assert kept[0].evidence["sites"][0] == at(Model.training_step, "appended")
    assert "`self.outputs.append(loss.item())`" in kept[0].fix


HISTORY: list[torch.Tensor] = []


@graphwatch.step
def decorated_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    HISTORY.append(model(torch.randn(16, 4)).pow(2).mean())  # at: history


def test_a_global_list_under_the_step_decorator_is_cited_at_the_append_once(at: Callable[[object, str], str]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(8):
            decorated_step(model, opt)
    HISTORY.clear()
    kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in gw.findings]  # no second "something outside" finding
    assert kept[0].evidence["holder"] == "HISTORY"
    assert kept[0].evidence["sites"][0] == at(decorated_step, "history")
    assert "no_grad" in kept[0].fix  # the appended forward is never backwarded


SHORT_RUN = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for _ in range(3):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    history.append(loss)
probe = model(torch.randn(2, 4)).sum()  # work after the loop: the session's last step
"""


def _assert_named_at_the_append(findings: list[graphwatch.Finding], where: str) -> None:
    kept = [f for f in findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in findings]
    assert kept[0].evidence["holder"] == "history" and kept[0].evidence["sites"][0] == where


def test_a_leak_first_seen_when_a_with_block_ends_is_named(at: Callable[[object, str], str]) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(3):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            history.append(loss)  # at: history
        model(torch.randn(2, 4)).sum()  # work after the loop: the session's last step
    where = at(test_a_leak_first_seen_when_a_with_block_ends_is_named, "history")
    _assert_named_at_the_append(gw.findings, where)
    assert [f.step for f in gw.findings if f.kind == "graph-kept-alive"] == [3]  # found as the session ended


def test_a_leak_first_seen_when_the_script_ends_is_named_at_its_line(tmp_path: Path) -> None:
    script = tmp_path / "short_run.py"
    script.write_text(SHORT_RUN)
    env = dict(os.environ, PYTHONPATH=str(Path(graphwatch.__file__).parent.parent))
    done = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--out", "out", script.name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr
    _assert_named_at_the_append(graphwatch.load(tmp_path / "out" / "trace.json").findings, "short_run.py:13")


def keyed_history(iterations: int = 8) -> dict[str, list]:
    """A Keras-style history: a dict of lists, each appended to by its key."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history: dict[str, list] = {"train_loss": [], "lr": []}  # at: created
    for _ in range(iterations):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        history["train_loss"].append(loss)  # at: appended
        history["lr"].append(0.01)
    return history


def test_a_dict_of_lists_is_named_by_its_key_at_the_line_that_appends_by_that_key(
    at: Callable[[object, str], str],
) -> None:
    """``history["train_loss"].append(loss)``: the list under the key keeps the graphs, each of its items one
    step's loss; named so, at that line, and its items are the losses themselves (no part of an item to store)."""
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        keyed_history()
    kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in gw.findings]
    assert kept[0].evidence["holder"] == "history['train_loss']"
    assert kept[0].evidence["sites"][0] == at(keyed_history, "appended")
    assert kept[0].evidence["item_path"] is None and kept[0].evidence["kept"]["items"] >= 2
    assert "the part" not in kept[0].fix and at(keyed_history, "created") not in str(kept[0])


RUNNING_TOTALS = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
running = {"loss": 0.0, "batches": 0}
for _ in range(6):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    running["loss"] += loss
    running["batches"] += 1
"""


def test_a_running_total_kept_in_a_dict_is_named_by_its_key_at_the_line_that_adds(tmp_path: Path) -> None:
    """``running["loss"] += loss`` in a script's globals: the total under the key is the holder, at that line
    (not the line that made the dict)."""
    script = tmp_path / "running_totals.py"
    script.write_text(RUNNING_TOTALS)
    env = dict(os.environ, PYTHONPATH=str(Path(graphwatch.__file__).parent.parent))
    done = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--trace-only", "--out", "out", script.name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kept = [f for f in graphwatch.load(tmp_path / "out" / "trace.json").findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in kept]
    assert kept[0].evidence["holder"] == "running['loss']"
    assert kept[0].evidence["sites"][0] == "running_totals.py:13"
