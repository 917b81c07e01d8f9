"""Each finding kind, on a small loop written here: what its message says, which lines it names, its evidence.

Lines are found by the ``# at: <tag>`` comments of this file, so the tests
read like the reports: ``at("rnn-carry")`` is ``test_diagnoses.py:<line>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphwatch
from graphwatch.analysis.findings import FindingLog
from graphwatch.capture.lines.callsite import display_path
from graphwatch.model import Finding

_SOURCE = Path(__file__).read_text(encoding="utf-8").splitlines()


def at(tag: str) -> str:
    """``file:line`` of the one line of this file tagged ``# at: tag``, spelled as graphwatch spells it."""
    lines = [n for n, text in enumerate(_SOURCE, 1) if re.search(rf"# at: {re.escape(tag)}$", text)]
    assert len(lines) == 1, tag
    return f"{display_path(__file__)}:{lines[0]}"


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: one torch thread, no session left)


def watch(**options: object) -> graphwatch.Session:
    return graphwatch.watch(summary=False, snapshots="off", **options)


def only(findings: list[Finding], kind: str) -> Finding:
    matching = [f for f in findings if f.kind == kind]
    assert len(matching) == 1, [str(f) for f in findings]
    return matching[0]


def cited(finding: Finding, tag: str) -> bool:
    return at(tag) in finding.evidence["sites"]


# ------------------------------------------------------------------ loops
class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.rec = nn.Linear(4, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.inp(x) + self.rec(h))  # at: cell-tanh


def rnn_no_detach(steps: int = 3) -> None:
    torch.manual_seed(0)
    cell, head = Cell(), nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    h = torch.zeros(2, 8)
    for _ in range(steps):
        opt.zero_grad()
        h = cell(torch.randn(2, 4), h)  # at: rnn-carry
        loss = head(h).pow(2).mean()
        loss.backward()  # at: rnn-backward
        opt.step()


def leaky_rnn_retained(steps: int = 8) -> Iterator[int]:
    """Silent: the state is never detached and retain_graph=True hides the error.

    Like the other loops here, it yields each step's index just before the
    optimizer step that ends the step.
    """
    torch.manual_seed(0)
    encoder, head = nn.Linear(8, 64), nn.Linear(64, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.01)
    h = torch.zeros(32, 64)
    for i in range(steps):
        opt.zero_grad()
        h = 0.5 * h + torch.tanh(encoder(torch.randn(32, 8)))  # at: leaky-carry
        loss = head(h).pow(2).mean()
        loss.backward(retain_graph=True)  # at: leaky-backward
        yield i
        opt.step()


def shared_graph() -> None:
    a = torch.rand(1, 4, requires_grad=True)
    c = (a**2) * 2
    d, e = c.mean(), c.sum()
    d.backward()  # at: d-backward
    e.backward()  # at: e-backward


def shared_graph_trained() -> None:
    """The same two losses, and one optimizer that owns everything both reach and steps after both."""
    a = torch.rand(1, 4, requires_grad=True)
    opt = torch.optim.SGD([a], lr=0.1)
    c = (a**2) * 2
    d, e = c.mean(), c.sum()
    d.backward()  # at: trained-d-backward
    e.backward()  # at: trained-e-backward
    opt.step()


def same_tensor_twice() -> None:
    w = torch.tensor([1.0], requires_grad=True)
    y = torch.mul(torch.add(w, 2.0), torch.add(w, 1))
    y.backward()  # at: y-first
    y.backward()  # at: y-second


def gan(detach: bool, steps: int = 2) -> Iterator[int]:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    D = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters()), torch.optim.Adam(D.parameters())
    bce = nn.BCEWithLogitsLoss()
    for i in range(steps):
        fake = G(torch.randn(8, 4))  # at: gan-fake
        opt_d.zero_grad()
        d_fake = D(fake.detach() if detach else fake)  # at: gan-d-fake
        d_loss = bce(D(torch.randn(8, 2)), torch.ones(8, 1)) + bce(d_fake, torch.zeros(8, 1))
        d_loss.backward()  # at: gan-d-backward
        opt_d.step()
        opt_g.zero_grad()
        bce(D(fake), torch.ones(8, 1)).backward()  # at: gan-g-backward
        yield i
        opt_g.step()


class Points(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.xyz = nn.Parameter(torch.randn(16, 3))
        self.cached: torch.Tensor | None = None

    def perturbed(self) -> torch.Tensor:
        if self.cached is None:
            self.cached = self.xyz * torch.sigmoid(self.xyz)  # at: cache-made
        return self.cached


def cached_parameter_tensor() -> None:
    torch.manual_seed(0)
    points = Points()
    opt = torch.optim.SGD(points.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = points.perturbed().pow(2).mean()  # at: cache-use
        loss.backward()
        opt.step()


def two_losses(retain_last: bool, steps: int = 4) -> Iterator[int]:
    torch.manual_seed(0)
    trunk, head1, head2 = nn.Sequential(nn.Linear(16, 64), nn.Tanh()), nn.Linear(64, 1), nn.Linear(64, 1)
    opt = torch.optim.SGD([*trunk.parameters(), *head1.parameters(), *head2.parameters()], lr=0.01)
    for i in range(steps):
        features = trunk(torch.randn(32, 16))
        loss1, loss2 = head1(features).pow(2).mean(), head2(features).abs().mean()
        opt.zero_grad()
        loss1.backward(retain_graph=True)
        loss2.backward(retain_graph=retain_last)  # at: loss2-backward
        yield i
        opt.step()


def losses_in_a_loop(steps: int = 3) -> None:
    torch.manual_seed(0)
    trunk, heads = nn.Linear(8, 32), [nn.Linear(32, 1) for _ in range(3)]
    image = torch.rand(4, 8, requires_grad=True)
    opt = torch.optim.Adam([image])
    for _ in range(steps):
        opt.zero_grad()
        features = torch.tanh(trunk(image))
        for head in heads:
            head(features).pow(2).mean().backward(retain_graph=True)  # at: each-loss-backward
        opt.step()


def running_total(steps: int = 6) -> Iterator[int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0.0
    for i in range(steps):
        loss = F.mse_loss(model(torch.randn(32, 16)), torch.randn(32, 1))
        opt.zero_grad()
        loss.backward()
        total_loss += loss  # at: total
        yield i
        opt.step()


def validation_kept(no_grad: bool, steps: int = 6) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val, history = torch.randn(64, 16), []
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(32, 16)).pow(2).mean().backward()
        opt.step()
        with torch.no_grad() if no_grad else torch.enable_grad():
            val_loss = model(x_val).pow(2).mean()  # at: val-forward
        history.append(val_loss)


def no_zero_grad(accumulate: int = 1, steps: int = 4) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps * accumulate):
        F.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1)).backward()  # at: zg-backward
        if (i + 1) % accumulate == 0:
            opt.step()  # at: zg-step
            if accumulate > 1:
                opt.zero_grad()


def mlp(steps: int = 4) -> Iterator[int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters())
    for i in range(steps):
        opt.zero_grad()
        F.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1)).backward()
        yield i
        opt.step()


def run(loop: Callable[[], object]) -> None:
    result = loop()
    if isinstance(result, Iterator):
        for _ in result:
            pass


def torch_message(loop: Callable[[], object]) -> str:
    """The error torch raises for ``loop`` without graphwatch."""
    with pytest.raises(RuntimeError) as info:
        run(loop)
    return str(info.value)


# ------------------------------------------------- backward through freed graph
def test_backward_twice_error_explains_the_carried_hidden_state() -> None:
    bare = torch_message(rnn_no_detach)
    try:
        with watch() as gw:
            rnn_no_detach()
    except RuntimeError as caught:  # the error is still a RuntimeError
        error = caught
    assert isinstance(error, graphwatch.BackwardTwiceError)
    text = str(error)
    assert text.startswith(bare), "torch's own message comes first"
    explanation = text[len(bare) :]
    assert (
        f"graphwatch: the backward at {at('rnn-backward')} (`loss.backward()  # at: rnn-backward`) (step 1) reached "
        f"TanhBackward0, created at {at('cell-tanh')}" in explanation
    )
    assert f"in step 0, whose saved tensors the backward at {at('rnn-backward')}" in explanation
    assert "(step 0, retain_graph=False) had already freed" in explanation
    assert f"carried into step 1 by `h` produced at {at('rnn-carry')} (`h = cell(torch.randn(2, 4), h)" in explanation
    assert f"1. `h = h.detach()` at the start of each step, before {at('rnn-carry')}" in explanation
    assert f"3. not `retain_graph=True` at {at('rnn-backward')}" in explanation
    finding = error.finding
    assert finding is only(gw.findings, "backward-through-freed-graph")
    assert finding.severity == "error" and finding.step == 1 and finding.evidence["steps"] == [0, 1]
    assert finding.evidence["pattern"] == "recurrent" and finding.evidence["freeing_retain_graph"] is False
    assert all(cited(finding, tag) for tag in ("rnn-backward", "rnn-carry", "cell-tanh"))
    assert finding.fix == finding.evidence["fixes"][0]
    assert only(gw.findings, "graph-carried-across-steps").severity == "error"


def test_two_outputs_of_one_graph_trained_by_one_optimizer_may_be_summed() -> None:
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch():
        shared_graph_trained()
    text = str(info.value)
    assert "`d` and `e` share one graph in step 0" in text
    one = f"1. backward once through the sum: `(d + e).backward()` in place of the backwards at {at('trained-d-backward')}"
    assert one in text
    assert (
        f"2. `d.backward(retain_graph=True)` at {at('trained-d-backward')}; "
        f"the last backward, at {at('trained-e-backward')}, must not retain" in text
    )
    why = "opt owns all 1 parameters both backwards reach and steps after both, with no optimizer step between them"
    assert [r.why.startswith(why) for r in info.value.finding.remedies] == [True, True]
    sum_, retain = info.value.finding.remedies  # the retain is the one an edit makes: the finding's patch
    assert not sum_.edits and [(e.kind, e.where) for e in retain.edits] == [("retain-graph", at("trained-d-backward"))]


def test_two_outputs_of_one_graph_with_no_optimizer_get_no_sum_and_no_retain() -> None:
    """Nothing tells whether both losses are meant to reach what they share: neither is offered."""
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch():
        shared_graph()
    finding = info.value.finding
    assert "`d` and `e` share one graph in step 0" in finding.message
    assert finding.remedies == [] and "(d + e)" not in finding.message and "retain_graph=True on" not in finding.message
    assert finding.fix.startswith("graphwatch offers no fix: no optimizer was seen")


def test_one_tensor_backwarded_twice() -> None:
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch():
        same_tensor_twice()
    finding = info.value.finding
    assert finding.evidence["pattern"] == "same-tensor"
    assert finding.fix.startswith(f"drop the second `y.backward()` at {at('y-second')}")
    assert [(e.kind, e.where) for e in finding.remedies[0].edits] == [("remove-statement", at("y-second"))]
    assert finding.remedies[0].mechanical and len(finding.remedies) == 1  # no retain_graph=True: it adds them twice
    assert f"the backward at {at('y-first')} freed its graph" in finding.message


def test_gan_without_detach_is_a_handoff_not_a_carried_graph() -> None:
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch() as gw:
        run(lambda: gan(detach=False))
    finding = info.value.finding
    assert finding.evidence["pattern"] == "handoff"
    assert f"`fake` produced at {at('gan-fake')}" in finding.message
    assert f"the one at {at('gan-d-backward')} ran through its graph first and freed it" in finding.message
    assert finding.fix.startswith(f"`d_fake = D(fake.detach() if detach else fake.detach())` at {at('gan-d-fake')}")
    remedy = finding.remedies[0]
    assert remedy.mechanical and [(e.kind, e.where, e.target) for e in remedy.edits] == [
        ("detach-use", at("gan-d-fake"), "fake")
    ]  # D's loss, never G's (the generator step needs fake's graph)
    assert "opt_d, which steps after the backward at" in remedy.why and "they are opt_g's" in remedy.why
    assert not any("retain_graph" in r.text or "+" in r.text.split("`")[1] for r in finding.remedies)
    assert [f.kind for f in gw.findings] == ["backward-through-freed-graph"]


def test_cached_parameter_tensor_is_recomputed_not_detached() -> None:
    with pytest.raises(graphwatch.BackwardTwiceError) as info, watch():
        cached_parameter_tensor()
    finding = info.value.finding
    assert finding.evidence["pattern"] == "cached"
    assert finding.fix.startswith("compute `self.cached` inside the step that uses it")
    assert f"made at {at('cache-made')}" in finding.message and f"used at {at('cache-use')}" in finding.message


def test_repeated_error_is_one_finding() -> None:
    with watch() as gw:
        for _ in range(3):
            try:
                shared_graph()
            except RuntimeError:
                pass
    finding = only(gw.findings, "backward-through-freed-graph")
    assert finding.evidence["occurrences"] == 3


# ------------------------------------------------------------ carried silently
def test_carried_graph_names_the_tensor_and_how_the_time_grows() -> None:
    with watch(level="full") as gw:  # every step's evidence (the default level sees steps 6 and 7 light)
        run(leaky_rnn_retained)
    finding = only(gw.findings, "graph-carried-across-steps")
    assert finding.severity == "warning" and finding.step == 1
    assert finding.evidence["steps"] == [1, 2, 3, 4, 5, 6, 7] and finding.evidence["occurrences"] == 7
    assert finding.evidence["carrier"] == "h" and cited(finding, "leaky-carry") and cited(finding, "leaky-backward")
    earlier = [row[1] for row in finding.evidence["per_step"]]
    assert earlier == sorted(earlier) and earlier[-1] > earlier[0]
    assert f"`h` produced at {at('leaky-carry')}" in finding.message
    assert "in one step is fed into the next" in finding.message
    assert re.search(r"step 1: \d+ of its \d+ nodes \(\d+%, about [\d.]+ ms of [\d.]+ ms\)", finding.message)
    assert "grows by about 5.0 nodes per step" in finding.message
    assert finding.evidence["bytes"] == max(
        sum(b for s, b in step.saved_alive_by_step.items() if s < step.index) for step in gw.trace.steps
    )
    assert "of earlier steps' saved tensors stay alive with it" in finding.message
    assert finding.fix.startswith(f"`h = h.detach()` at the start of each step, before {at('leaky-carry')}")
    assert "retained-graph" not in [f.kind for f in gw.findings], "the retained graph is carried on, not unused"


# --------------------------------------------------------------- retained graph
def test_retain_graph_on_the_last_backward() -> None:
    with watch() as gw:
        run(lambda: two_losses(retain_last=True))
    finding = only(gw.findings, "retained-graph")
    assert finding.step == 0 and finding.evidence["steps"] == [0, 1, 2, 3]
    assert finding.evidence["sites"] == [finding.evidence["sites"][0]] and cited(finding, "loss2-backward")
    assert finding.evidence["bytes"] >= 4 * 32 * 64, "at least the trunk's tanh output stays alive"
    assert f"the backward at {at('loss2-backward')}" in finding.message and "`loss2`" in finding.message
    assert finding.fix.startswith(f"drop retain_graph=True at {at('loss2-backward')}: it is the last backward")


def test_retain_graph_on_the_first_backward_only_is_fine() -> None:
    with watch() as gw:
        run(lambda: two_losses(retain_last=False))
    assert gw.findings == []


def test_retain_graph_on_every_loss_of_a_loop() -> None:
    with watch() as gw:
        losses_in_a_loop()
    finding = only(gw.findings, "retained-graph")
    assert cited(finding, "each-loss-backward") and "retain_graph=i < len(losses) - 1" in finding.fix


# --------------------------------------------------------------- kept alive
def test_running_total_of_loss_tensors() -> None:
    with watch() as gw:
        run(running_total)
    finding = only(gw.findings, "graph-kept-alive")
    # steps 0 and 1 alive could still be a variable's last value and set-up: growth shows at step 3
    assert finding.step == 3 and finding.evidence["holder"] == "total_loss" and cited(finding, "total")
    kept = finding.evidence["kept"]  # at the session's last step end (5): the graphs of steps 0..4
    assert kept["step"] == 5 and kept["spans"] == [[0, 4]] and kept["nodes"] >= 5
    made = f"({at('total')} (`total_loss += loss  # at: total`))"
    assert f"`total_loss` {made} keeps the graphs of steps 0..4" in finding.message
    assert finding.fix == f"keep a number, not the graph: `total_loss += loss.item()` at {at('total')}"


def test_validation_without_no_grad() -> None:
    with watch() as gw:
        validation_kept(no_grad=False)
    finding = only(gw.findings, "graph-kept-alive")
    assert finding.evidence["holder"] == "history" and finding.evidence["never_backwarded"]
    assert finding.evidence["kept"]["bytes"] > 0 and cited(finding, "val-forward")
    assert finding.fix.startswith(f"run the forward at {at('val-forward')} under `with torch.no_grad():`")


def test_validation_under_no_grad_and_gan_with_detach_keep_nothing() -> None:
    with watch() as gw:
        validation_kept(no_grad=True)
        run(lambda: gan(detach=True, steps=4))
    assert gw.findings == []


# --------------------------------------------------------------- memory growth
def test_memory_growth_fits_bytes_per_step_and_projects() -> None:
    with watch(level="full") as gw:  # every step's saved tensors counted (a light step's are not)
        run(leaky_rnn_retained)
    finding = only(gw.findings, "memory-growth")
    ev = finding.evidence
    # each step keeps tanh's output (32x64 floats) and the encoder's input (32x8 floats)
    assert ev["unit"] == "bytes" and ev["per_step_slope"] == pytest.approx(4 * (32 * 64 + 32 * 8))
    live = [s.live_activation_bytes for s in gw.trace.steps]
    assert ev["bytes"] == live[-1] and ev["bytes_first"] == live[0]
    assert ev["projected_bytes"] == pytest.approx(live[-1] + ev["per_step_slope"] * (80 - 8), rel=0.05)
    assert ev["r2"] > 0.99 and ev["steps"] == [0, 7]
    assert "grows by 9.0 KiB per step" in finding.message and "by step 80" in finding.message
    assert ev["explained_by"] == [f"graph-carried-across-steps at {ev['sites'][0]}"] and cited(finding, "leaky-carry")


def test_memory_growth_of_nodes_only() -> None:
    with watch() as gw:
        run(lambda: running_total(8))
    ev = only(gw.findings, "memory-growth").evidence
    assert ev["unit"] == "nodes" and ev["bytes_per_step"] is None and ev["nodes_per_step"] > 4


# --------------------------------------------------------------- zero_grad
def test_missing_zero_grad_is_one_finding() -> None:
    with watch() as gw:
        no_zero_grad()
    finding = only(gw.findings, "missing-zero-grad")
    assert finding.step == 1 and finding.evidence["steps"] == [1, 2, 3] and finding.evidence["parameters"] == 2
    assert cited(finding, "zg-step") and cited(finding, "zg-backward")
    assert finding.fix.startswith(f"call `opt.zero_grad()` before the backward at {at('zg-backward')}")
    assert "in 3 steps from step 1 on" in finding.message


def test_gradient_accumulation_is_not_missing_zero_grad() -> None:
    with watch() as gw:
        no_zero_grad(accumulate=4)
    assert gw.findings == []


# --------------------------------------------------------------- strict mode
@pytest.mark.parametrize(
    ("loop", "kind", "first"),
    [
        (leaky_rnn_retained, "graph-carried-across-steps", 1),
        # one earlier graph alive could be a variable's last value: growth shows at step 3 (README)
        (running_total, "graph-kept-alive", 3),
        (lambda: two_losses(retain_last=True), "retained-graph", 1),
    ],
    ids=["carried", "kept", "retained"],
)
def test_strict_mode_fails_at_the_end_of_the_first_leaking_step(
    loop: Callable[[], Iterator[int]], kind: str, first: int
) -> None:
    reached = -1
    with pytest.raises(graphwatch.GraphLeakError) as info, watch(strict=True):
        for reached in loop():  # noqa: B007  (read after the loop: where strict mode raised)
            pass
    assert reached == first, f"raised by the optimizer step that ends step {first}"
    assert isinstance(info.value, AssertionError)
    assert str(info.value).startswith(f"graphwatch strict mode: step {first} leaks a graph")
    assert [f.kind for f in info.value.findings] == [kind]
    assert graphwatch.active_session() is None


def test_strict_mode_fails_on_a_leak_found_when_the_session_ends() -> None:
    x = torch.randn(64, 64, requires_grad=True)
    with pytest.raises(graphwatch.GraphLeakError), watch(strict=True):
        loss = torch.tanh(x @ x).sum()  # still alive when the session ends: its retained graph holds memory
        loss.backward(retain_graph=True)


@pytest.mark.parametrize(
    "loop",
    [mlp, lambda: two_losses(retain_last=False), lambda: gan(detach=True, steps=3)],
    ids=["mlp", "multi-task", "gan"],
)
def test_strict_mode_passes_clean_loops(loop: Callable[[], Iterator[int]]) -> None:
    with watch(strict=True) as gw:
        run(loop)
    assert gw.findings == []


# --------------------------------------------------------------- merging
def test_finding_log_merges_evidence_and_rerenders() -> None:
    from graphwatch.analysis.findings import make_finding
    from graphwatch.model import Remedy

    def step(index: int, parameters: int) -> Finding:
        evidence = {"key": "t.py:9", "sites": ["t.py:9", "t.py:8"], "steps": [index], "parameters": parameters,
                    "optimizer_at": "t.py:9 (`opt.step()`)", "optimizer": "opt", "backward_at": "t.py:8"}
        return make_finding("missing-zero-grad", "warning", index, evidence, [Remedy("call `opt.zero_grad()`")])

    log = FindingLog([])
    assert log.add(step(1, 2)) and not log.add(step(2, 3)) and not log.add(step(3, 1))
    (finding,) = log.findings
    assert finding.step == 1 and finding.evidence["steps"] == [1, 2, 3]
    assert finding.evidence["parameters"] == 3 and finding.evidence["occurrences"] == 3
    assert finding.evidence["sites"] == ["t.py:9", "t.py:8"]
    assert "in 3 steps from step 1 on" in finding.message
