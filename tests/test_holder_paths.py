"""A kept graph's holder is named by the path a user would type, at the line where the graph went in, once.

Each program keeps every step's graph in a holder that is not a plain variable of the loop: an object's
attribute kept in a dict, a private attribute, a tuple kept in a list, a hook's closure, a global fed from
what a function returned.  The finding names the path and cites the line that ran (the ``+=``, the append, the
``add_``), and a holder fed from another one is that one's finding.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import warm_python
from torch import nn

import graphwatch

STEPS = 10


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _the_kept_finding(gw: graphwatch.Session) -> graphwatch.Finding:
    kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in gw.findings]
    return kept[0]


class AverageMeter:
    def __init__(self) -> None:
        self.sum: float | torch.Tensor = 0
        self.count = 0

    def update(self, val: torch.Tensor, n: int = 1) -> None:
        self.sum += val * n  # at: meter
        self.count += n


def test_a_meter_in_a_dict_is_named_by_its_path_at_the_line_that_adds_to_it(at: Callable[[object, str], str]) -> None:
    model, opt = _model()
    meters = {"loss": AverageMeter()}
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(STEPS):
            meters["loss"].update(_train_step(model, opt), 16)
    finding = _the_kept_finding(gw)
    assert finding.evidence["holder"] == "meters['loss'].sum"
    assert finding.evidence["sites"][0] == at(AverageMeter.update, "meter")
    assert "`self.sum += (val * n).item()`" in finding.fix


class Policy:
    def __init__(self) -> None:
        self._moving_avg = torch.zeros(())

    def baseline(self, reward: torch.Tensor) -> None:
        self._moving_avg += 0.05 * (reward - self._moving_avg)  # at: moving average


def test_a_private_attribute_of_a_plain_object_is_named_at_its_update(at: Callable[[object, str], str]) -> None:
    model, opt = _model()
    policy = Policy()
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(STEPS):
            policy.baseline(_train_step(model, opt))
    finding = _the_kept_finding(gw)
    assert finding.evidence["holder"] == "policy._moving_avg"
    assert finding.evidence["sites"][0] == at(Policy.baseline, "moving average")


def test_a_replay_buffer_of_tuples_names_the_item_that_carries_the_graph(at: Callable[[object, str], str]) -> None:
    model, opt = _model()
    buffer = []
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(STEPS):
            state = torch.randn(8)
            action = model(state)
            buffer.append((state, action, torch.randn(())))  # at: store
            opt.zero_grad()
            action.sum().backward()
            opt.step()
    finding = _the_kept_finding(gw)
    where = at(test_a_replay_buffer_of_tuples_names_the_item_that_carries_the_graph, "store")
    assert finding.evidence["holder"] == "buffer" and finding.evidence["sites"][0] == where
    assert finding.evidence["item_path"].startswith("buffer[") and finding.evidence["item_path"].endswith("][1]")
    assert finding.fix.startswith(f"store `action` without its graph at {where}")
    assert not any(edit for remedy in finding.remedies for edit in remedy.edits)  # `(...).detach()` would raise


class Stats:
    def __init__(self) -> None:
        self.loss_sum = torch.zeros(())


def test_a_statistics_tensor_added_to_in_place_is_named_at_the_add(at: Callable[[object, str], str]) -> None:
    model, opt = _model()
    stats = Stats()
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(STEPS):
            stats.loss_sum.add_(_train_step(model, opt))  # at: add
    finding = _the_kept_finding(gw)
    assert finding.evidence["holder"] == "stats.loss_sum"
    assert finding.evidence["sites"][0] == at(test_a_statistics_tensor_added_to_in_place_is_named_at_the_add, "add")


def keep_activations(model: nn.Module) -> None:
    activations = []

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        activations.append(output)  # at: hook

    model[1].register_forward_hook(hook)


def test_a_forward_hook_closure_s_list_is_named_at_the_hook_s_append(at: Callable[[object, str], str]) -> None:
    model, opt = _model()
    keep_activations(model)  # the list lives only in the hook's closure
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(STEPS):
            _train_step(model, opt)
    finding = _the_kept_finding(gw)
    assert finding.evidence["holder"] == "activations"
    assert finding.evidence["sites"][0] == at(keep_activations, "hook")
    assert "`activations.append(output.detach())`" in finding.fix


def test_a_list_of_penalties_over_an_outer_loop_is_one_finding_at_the_append(at: Callable[[object, str], str]) -> None:
    model, opt = _model()
    penalties = []
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(3):
            for _ in range(4):
                penalty = sum(p.pow(2).sum() for p in model.parameters())
                loss = model(torch.randn(16, 8)).pow(2).mean() + 1e-4 * penalty
                opt.zero_grad()
                loss.backward()
                opt.step()
                penalties.append(penalty)  # at: penalty
    finding = _the_kept_finding(gw)
    where = at(test_a_list_of_penalties_over_an_outer_loop_is_one_finding_at_the_append, "penalty")
    assert finding.evidence["holder"] == "penalties" and finding.evidence["sites"][0] == where


CHAR_RNN = """\
import torch
from torch import nn


def train(rnn, optimizer, line, category):
    hidden = torch.zeros(1, 16)
    optimizer.zero_grad()
    for i in range(line.size(0)):
        hidden = torch.tanh(rnn(torch.cat((line[i], hidden), 1)))
    loss = nn.functional.cross_entropy(hidden[:, :3], category)
    loss.backward()
    optimizer.step()
    return hidden, loss


torch.manual_seed(0)
rnn = nn.Linear(21, 16)
optimizer = torch.optim.SGD(rnn.parameters(), lr=0.005)
current_loss = 0
all_losses = []
for it in range(1, 13):
    output, loss = train(rnn, optimizer, torch.randn(6, 1, 5), torch.randint(0, 3, (1,)))
    current_loss += loss
    if it % 4 == 0:
        all_losses.append(current_loss / 4)
        current_loss = 0
"""


def test_a_loss_returned_and_kept_by_the_caller_is_one_finding_at_the_caller_s_line(tmp_path: Path) -> None:
    script = tmp_path / "char_rnn.py"
    script.write_text(CHAR_RNN)
    env = dict(os.environ, PYTHONPATH=str(Path(graphwatch.__file__).parent.parent), OMP_NUM_THREADS="1")
    done = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--out", "out", script.name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    findings = graphwatch.load(tmp_path / "out" / "trace.json").findings
    kept = [f for f in findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in findings]  # the list fed from `current_loss` is its finding
    assert kept[0].evidence["holder"] == "current_loss"
    assert kept[0].evidence["sites"][0] == "char_rnn.py:23"  # where the graph went in
    assert kept[0].evidence["fed"] == {"holder": "all_losses", "at": "char_rnn.py:25"}
    assert "char_rnn.py:25" in kept[0].evidence["sites"]  # what it fed
    edits = [edit for remedy in kept[0].remedies for edit in remedy.edits]
    assert edits and {edit.line for edit in edits} <= {13, 23}  # fixed at the `return`, or where the caller keeps it
    assert {f"char_rnn.py:{edit.line}" for edit in edits} <= set(kept[0].evidence["sites"])  # the lines it edits
