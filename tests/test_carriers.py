"""The tensor that carries a graph across steps is named as the training loop spells it, at the loop's line.

Each buggy program is named with the right kind, variable and line (lines are
found by their ``# at: <tag>`` comments); its correct twin is silent.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import graphwatch

LEAKS = {"graph-carried-across-steps", "retained-graph", "graph-kept-alive", "memory-growth"}


def watch() -> graphwatch.Session:
    return graphwatch.watch(summary=False, snapshots="off")


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(3, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, hidden: tuple) -> tuple:
        output, hidden = self.rnn(x, hidden)
        return self.out(output), hidden


def repackage_hidden(h: object) -> object:
    """As in PyTorch's word-language-model example."""
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)  # type: ignore[attr-defined]


def lstm_tuple_hidden(iterations: int = 4, detach: bool = True) -> None:
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hidden = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    for _ in range(iterations):
        if detach:
            hidden = repackage_hidden(hidden)
        opt.zero_grad()
        output, hidden = model(torch.randn(5, 2, 3), hidden)  # at: lstm-call
        loss = output.pow(2).mean()
        loss.backward(retain_graph=not detach)
        opt.step()


def gram(x: torch.Tensor) -> torch.Tensor:
    return x @ x.t() / x.numel()


class StyleLoss(nn.Module):
    def __init__(self, target_feature: torch.Tensor, detach: bool) -> None:
        super().__init__()
        self.target = gram(target_feature).detach() if detach else gram(target_feature)  # at: target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.loss = (gram(x) - self.target).pow(2).mean()
        return x


def module_attribute_target(iterations: int = 3, detach: bool = True) -> None:
    torch.manual_seed(0)
    features = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    style = StyleLoss(features(torch.randn(3, 4)), detach)
    image = torch.randn(3, 4, requires_grad=True)
    opt = torch.optim.Adam([image], lr=0.1)
    for _ in range(iterations):
        opt.zero_grad()
        style(features(image))
        style.loss.backward()
        opt.step()


def carried_without_optimizer(iterations: int = 6) -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(3, 4)
    h = torch.zeros(2, 4)
    for _ in range(iterations):
        h = cell(torch.randn(2, 3), h)  # at: carried
        loss = h.pow(2).mean()
        cell.zero_grad()
        loss.backward(retain_graph=True)
        for p in cell.parameters():
            p.data.add_(p.grad, alpha=-0.01)


class MemoryBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.tanh(self.f(x) + mem)
        return out, out.mean(0, keepdim=True)


def checkpointed_memory(iterations: int = 5, detach: bool = True) -> None:
    torch.manual_seed(0)
    block, head = MemoryBlock(), nn.Linear(8, 1)
    opt = torch.optim.SGD([*block.parameters(), *head.parameters()], lr=0.01)
    mem = torch.zeros(1, 8)
    for _ in range(iterations):
        opt.zero_grad()
        if detach:
            mem = mem.detach()
        out, mem = checkpoint(block, torch.randn(4, 8), mem, use_reentrant=False)  # at: block
        head(out).pow(2).mean().backward(retain_graph=not detach)
        opt.step()


@pytest.mark.parametrize(
    ("program", "steps"), [(lstm_tuple_hidden, 4), (module_attribute_target, 3), (checkpointed_memory, 5)]
)
def test_the_correct_twin_is_silent(program: Callable[[], None], steps: int) -> None:
    with watch() as gw:
        program()
    assert len(gw.trace.steps) == steps
    assert [f for f in gw.findings if f.kind in LEAKS] == []


def test_checkpointed_block_names_the_memory_it_carries(at: Callable[[object, str], str]) -> None:
    with watch() as gw:
        checkpointed_memory(detach=False)
    finding = next(f for f in gw.findings if f.kind == "graph-carried-across-steps")
    assert finding.evidence["carrier"] == "mem"
    assert finding.evidence["carrier_where"] == at(checkpointed_memory, "block")
    assert finding.fix.startswith("`mem = mem.detach()`")


def test_carried_state_without_optimizer_is_found_per_iteration(at: Callable[[object, str], str]) -> None:
    with watch() as gw:
        carried_without_optimizer()
    assert len(gw.trace.steps) == 6
    finding = next(f for f in gw.findings if f.kind == "graph-carried-across-steps")
    assert finding.evidence["carrier"] == "h" and finding.evidence["carrier_where"] == at(carried_without_optimizer, "carried")
    assert finding.fix.startswith("`h = h.detach()`")


def test_lstm_tuple_hidden_names_the_state_fed_back_in_the_loop(at: Callable[[object, str], str]) -> None:
    with pytest.raises(RuntimeError), watch() as gw:  # the optimizer step changes a saved weight
        lstm_tuple_hidden(detach=False)
    finding = next(f for f in gw.findings if f.kind == "graph-carried-across-steps")
    assert finding.evidence["carrier"] == "hidden"
    assert finding.evidence["carrier_where"] == at(lstm_tuple_hidden, "lstm-call")
    # a tuple: the file's own helper (it checks the type with isinstance and detaches) reads best (issue 39)
    assert finding.fix.startswith("`hidden = repackage_hidden(hidden)`")
    assert "output" not in finding.fix


def test_module_attribute_target_is_named_as_the_attribute(at: Callable[[object, str], str]) -> None:
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch():
        module_attribute_target(detach=False)
    finding = info.value.finding
    assert finding.evidence["carrier"] == "self.target"
    assert finding.evidence["carrier_at"] == at(StyleLoss.__init__, "target")
    assert finding.fix.startswith("keep a detached copy: `self.target.detach()` where it is made")


def test_no_placeholder_when_the_carrier_has_no_name() -> None:
    with watch() as gw:
        cell = nn.RNNCell(3, 4)
        states = [torch.zeros(2, 4)]
        for _ in range(4):
            states.append(cell(torch.randn(2, 3), states.pop()))
            states[-1].pow(2).mean().backward(retain_graph=True)
    texts = [str(f) for f in gw.findings]
    assert texts and not any("`the tensor" in t for t in texts)


def generator_first_gan(detach: bool = True) -> None:
    """PyTorch-GAN's order: G's step first, then D's on the same generated images."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2), nn.Tanh())
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    bce = nn.BCEWithLogitsLoss()
    for _ in range(3):
        opt_g.zero_grad()
        gen_imgs = G(torch.randn(8, 4))  # at: made
        bce(D(gen_imgs), torch.ones(8, 1)).backward()
        opt_g.step()
        opt_d.zero_grad()
        fake_loss = bce(D(gen_imgs.detach() if detach else gen_imgs), torch.zeros(8, 1))  # at: fed
        fake_loss.backward()  # at: d-backward
        opt_d.step()


def test_generator_first_gan_detaches_in_the_discriminators_loss(at: Callable[[object, str], str]) -> None:
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch():
        generator_first_gan(detach=False)
    finding = info.value.finding
    assert finding.evidence["pattern"] == "handoff" and finding.evidence["carrier"] == "gen_imgs"
    fed = at(generator_first_gan, "fed")
    assert finding.fix.startswith("`fake_loss = bce(D(gen_imgs.detach() if detach else gen_imgs.detach()), ")
    assert f"at {fed}: the loss of the backward at {at(generator_first_gan, 'd-backward')} must not reach" in finding.fix
    assert [(e.kind, e.where, e.target) for e in finding.remedies[0].edits] == [("detach-use", fed, "gen_imgs")]
    with watch() as gw:
        generator_first_gan(detach=True)
    assert gw.findings == []


def test_an_lstms_hidden_and_cell_state_are_detached_together() -> None:
    """`h, c = cell(x, (h, c))` carries both: the fix detaches both (detaching h alone still fails)."""
    cell, head = torch.nn.LSTMCell(4, 8), torch.nn.Linear(8, 1)
    with graphwatch.watch(summary=False) as gw:
        h, c = torch.zeros(2, 8), torch.zeros(2, 8)
        for _ in range(3):
            h, c = cell(torch.randn(2, 4), (h, c))
            head(h).pow(2).mean().backward(retain_graph=True)
    finding = next(f for f in gw.findings if f.kind == "graph-carried-across-steps")
    assert finding.evidence["detach"] == "h, c = h.detach(), c.detach()"
    assert finding.fix.startswith("`h, c = h.detach(), c.detach()` at the start of each step")
