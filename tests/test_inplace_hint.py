"""The "modified by an inplace operation" error that an optimizer step causes names that step and the cause."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphwatch

INPLACE = "one of the variables needed for gradient computation has been modified by an inplace operation"


def gan_reusing_d_output(steps: int = 2) -> None:
    """G's loss reuses D's output from before D's optimizer step (a common GAN ordering bug)."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    D = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_d, opt_g = torch.optim.SGD(D.parameters(), lr=0.1), torch.optim.SGD(G.parameters(), lr=0.1)
    bce = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        output = D(G(torch.randn(8, 4)))
        opt_d.zero_grad()
        bce(output, torch.zeros(8, 1)).backward(retain_graph=True)
        opt_d.step()  # at: d-step
        opt_g.zero_grad()
        bce(output, torch.ones(8, 1)).backward()
        opt_g.step()


def rnn_retained_across_steps(steps: int = 3, retain_graph: bool = True) -> None:
    torch.manual_seed(0)
    cell, head = nn.RNNCell(3, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    h = torch.zeros(2, 4)
    for _ in range(steps):
        opt.zero_grad()
        h = cell(torch.randn(2, 3), h)
        head(h).pow(2).mean().backward(retain_graph=retain_graph)
        opt.step()  # at: rnn-step


def message(program: object) -> str:
    with pytest.raises(RuntimeError) as raised:
        program()  # type: ignore[operator]
    return str(raised.value)


def test_backward_after_the_optimizer_step_of_the_same_step_names_that_step(at: object) -> None:
    bare = message(gan_reusing_d_output)
    with graphwatch.watch(summary=False, snapshots="off"):
        text = message(gan_reusing_d_output)
    assert bare.startswith(INPLACE) and text.startswith(bare + "\n\ngraphwatch: ")  # torch's text first, unchanged
    assert f"optimizer.step() at {at(gan_reusing_d_output, 'd-step')} updated this parameter" in text  # type: ignore[operator]
    assert "run this backward before that optimizer step (`bce(output, torch.ones(8, 1)).backward()` at " in text
    assert "or recompute the forward after the step" in text
    assert "Something changed it in place" not in text


def test_a_graph_reused_after_an_optimizer_step_names_the_carried_tensor(at: object) -> None:
    with graphwatch.watch(summary=False, snapshots="off"):
        text = message(rnn_retained_across_steps)
    assert text.startswith(INPLACE)
    assert f"optimizer.step() at {at(rnn_retained_across_steps, 'rnn-step')} updated this parameter" in text  # type: ignore[operator]
    assert "a graph of an earlier step is reused (carried by `h`)" in text


def loss_backwarded_again_after_a_step(steps: int = 3) -> None:
    """One retained graph backwarded in every step: the optimizer step in between changes its saved weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 4)).sum()
    for _ in range(steps):
        opt.zero_grad()
        loss.backward(retain_graph=True)
        opt.step()  # at: retained-step


def rnn_carried_without_detach(steps: int = 3) -> None:
    rnn_retained_across_steps(steps, retain_graph=False)  # the step's backward frees what the next one reaches


def carried_finding(program: object) -> tuple[str, str]:
    """(the error's text, the graph-carried-across-steps finding's message) of ``program`` run watched."""
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        text = message(program)
    [finding] = [f for f in gw.findings if f.kind == "graph-carried-across-steps"]
    return text, finding.message


def test_the_finding_and_the_error_name_the_same_optimizer_step(at: object) -> None:
    text, finding = carried_finding(loss_backwarded_again_after_a_step)
    line = at(loss_backwarded_again_after_a_step, "retained-step")  # type: ignore[operator]
    assert f"optimizer.step() at {line} updated this parameter in place" in text
    assert f"the backward failed because optimizer.step() at {line} (`opt.step()  # at: retained-step`) updated in place" in finding
    assert "freed" not in finding


def test_a_second_backward_through_a_freed_graph_still_says_freed() -> None:
    text, finding = carried_finding(rnn_carried_without_detach)
    assert text.startswith("Trying to backward through the graph a second time")
    assert "the backward failed because an earlier step's backward had freed that graph" in finding
    assert "optimizer.step()" not in finding


def test_a_users_inplace_change_is_named_when_the_backward_runs_elsewhere(at: object) -> None:
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False, snapshots="off"):
        y = x.exp()
        y.add_(1)  # at: user-add
        text = message(lambda: y.sum().backward())
    line = at(test_a_users_inplace_change_is_named_when_the_backward_runs_elsewhere, "user-add")  # type: ignore[operator]
    assert text.startswith(INPLACE) and f"then changed in place at {line} (`y.add_(1)" in text
    assert "Something changed it in place" not in text


# ------------------------------------------------------------- the line that changed the tensor
class MaskedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        att = (self.query(x) @ x.transpose(-1, -2)).softmax(-1)  # at: att-saved
        att[:, :, 0] = 0  # at: att-masked
        return att @ x


class ReluThenDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.1, inplace=True)  # at: dropout-built

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.act(self.fc(x)))  # at: dropout-runs


class SigmoidThenRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Sequential(
            nn.Linear(4, 4),
            nn.Sigmoid(),
            nn.ReLU(inplace=True),  # at: relu-built
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x)  # at: relu-runs


class MaskedView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = self.fc(x).exp()
        half = wide[..., :4]
        y = half.sin()
        half[..., 0] = 0  # at: view-masked
        return y.sum(-1, keepdim=True) * wide


def train(model: nn.Module, steps: int = 2) -> None:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 3, 4)).pow(2).mean().backward()
        opt.step()


def explained(model: nn.Module) -> tuple[str, graphwatch.Session]:
    """The error's text (torch's own, unchanged, first: checked against a bare run) and the session."""
    bare = message(lambda: train(model))
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        text = message(lambda: train(model))
    assert text.startswith(bare + "\n\ngraphwatch: the tensor was saved at ")
    return text, gw


def finding_of(gw: graphwatch.Session) -> object:
    [finding] = [f for f in gw.findings if f.kind == "modified-in-place"]
    return finding


def test_a_masked_attention_names_the_setitem_and_clones_before_it(at: object) -> None:
    text, gw = explained(MaskedAttention())
    assert f"saved at {at(MaskedAttention.forward, 'att-saved')}" in text  # type: ignore[operator]
    assert f"then changed in place at {at(MaskedAttention.forward, 'att-masked')}" in text  # type: ignore[operator]
    finding = finding_of(gw)
    [remedy] = finding.remedies  # type: ignore[attr-defined]
    assert remedy.mechanical and remedy.text.startswith("`att = att.clone(); att[:, :, 0] = 0` at ")
    assert [(e.kind, e.where, e.target) for e in remedy.edits] == [
        ("out-of-place", at(MaskedAttention.forward, "att-masked"), "att")  # type: ignore[operator]
    ]


def test_a_dropout_built_inplace_after_a_relu_is_patched_where_it_is_built(at: object) -> None:
    text, gw = explained(ReluThenDropout())
    assert f"then changed in place at {at(ReluThenDropout.forward, 'dropout-runs')}" in text  # type: ignore[operator]
    assert f"`self.drop`, an nn.Dropout built with inplace=True at {at(ReluThenDropout.__init__, 'dropout-built')}" in text  # type: ignore[operator]
    [remedy] = finding_of(gw).remedies  # type: ignore[attr-defined]
    assert remedy.mechanical and remedy.text.startswith("`self.drop = nn.Dropout(0.1, inplace=False)` at ")
    assert [e.where for e in remedy.edits] == [at(ReluThenDropout.__init__, "dropout-built")]  # type: ignore[operator]


def test_a_relu_built_inplace_after_a_sigmoid_in_a_sequential_is_patched_where_it_is_built(at: object) -> None:
    text, gw = explained(SigmoidThenRelu())
    assert f"then changed in place at {at(SigmoidThenRelu.forward, 'relu-runs')}" in text  # type: ignore[operator]
    assert "`self.gate.2`, an nn.ReLU built with inplace=True" in text
    [remedy] = finding_of(gw).remedies  # type: ignore[attr-defined]
    assert remedy.text.startswith("`nn.ReLU(inplace=False),` at ")
    assert [e.where for e in remedy.edits] == [at(SigmoidThenRelu.__init__, "relu-built")]  # type: ignore[operator]


def test_a_setitem_on_a_view_is_named_without_a_patch(at: object) -> None:
    """Cloning a view before the change would leave its base unchanged: the line is named, no patch."""
    text, gw = explained(MaskedView())
    assert f"then changed in place at {at(MaskedView.forward, 'view-masked')}" in text  # type: ignore[operator]
    assert not any(r.mechanical or r.edits for r in finding_of(gw).remedies)  # type: ignore[attr-defined]


def test_a_parameter_updated_in_place_is_named_without_an_out_of_place_patch() -> None:
    w = torch.randn(3, requires_grad=True)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        y = (w * w).sum()
        with torch.no_grad():
            w.add_(1)
        with pytest.raises(RuntimeError) as raised:
            y.backward()
    text = str(raised.value)
    assert "a parameter, then updated in place at " in text and "(`w.add_(1)`)" in text
    assert "ran after the update at " in text and "run this backward before the update at " in text
    assert "instead of x.add_(1)" not in text and ".clone() it first" not in text  # (the update is what trains)
    assert not any(r.edits for r in finding_of(gw).remedies)  # type: ignore[attr-defined]
