"""The default level's adaptive capture: full detail on the first, sampled and suspicious steps, the light
level's cost elsewhere, and no diagnosis lost for a bug that first appears on a late step seen light.

Each late bug is checked against the same loop watched with ``level="full"`` (every step in full detail):
the same findings at the same lines, and an error raised on a light step explained in the same words.
Lines are found by the ``# at: <tag>`` comments of this file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.capture.lines.callsite import display_path
from graphwatch.capture.steps.detail import FIRST_STEPS, HOLD_STEPS
from graphwatch.model import Finding

_SOURCE = Path(__file__).read_text(encoding="utf-8").splitlines()


def at(tag: str) -> str:
    lines = [n for n, text in enumerate(_SOURCE, 1) if re.search(rf"# at: {re.escape(tag)}$", text)]
    assert len(lines) == 1, tag
    return f"{display_path(__file__)}:{lines[0]}"


pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: one torch thread, no session left)


def watch(level: str = "default") -> graphwatch.Session:
    return graphwatch.watch(summary=False, snapshots="off", level=level)


def full_steps(gw: graphwatch.Session) -> list[int]:
    return [step for span in gw.trace.full_detail for step in range(span.first, min(span.end, len(gw.trace.steps)))]


def only(findings: list[Finding], kind: str) -> Finding:
    matching = [f for f in findings if f.kind == kind]
    assert len(matching) == 1, [str(f) for f in findings]
    return matching[0]


def mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


# ------------------------------------------------------------------ loops
def clean(steps: int) -> None:
    model, opt = mlp()
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()


def late_total(steps: int = 400, start: int = 300) -> None:
    model, opt = mlp()
    total = 0.0
    for step in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        if step >= start:
            total += loss  # at: late-total


def periodic_validation(steps: int = 1100) -> list[torch.Tensor]:
    model, opt = mlp()
    x_val, val_losses = torch.randn(32, 8), []
    for step in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        if step % 500 == 499:  # a validation pass without torch.no_grad(), its losses kept
            val_losses.append(model(x_val).pow(2).mean())  # at: validation
    return val_losses


def backward_twice_at(late: int, steps: int = 800) -> None:
    model, opt = mlp()
    for step in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()  # at: twice-loss
        loss.backward()  # at: twice-first
        if step == late:
            loss.backward()  # at: twice-second
        opt.step()


def hidden_not_detached_from(late: int, steps: int = 800) -> None:
    torch.manual_seed(0)
    cell, head = nn.RNNCell(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
    h = torch.zeros(2, 8)
    for step in range(steps):
        if step < late:
            h = h.detach()
        opt.zero_grad()
        h = cell(torch.randn(2, 4), h)  # at: hidden
        head(h).pow(2).mean().backward()  # at: hidden-backward
        opt.step()


def gan_not_detached_at(late: int, steps: int = 800) -> None:
    torch.manual_seed(0)
    G, D = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=0.01), torch.optim.SGD(D.parameters(), lr=0.01)
    bce = nn.BCEWithLogitsLoss()
    for step in range(steps):
        fake = G(torch.randn(8, 4))
        opt_g.zero_grad()
        bce(D(fake), torch.ones(8, 1)).backward()  # at: gan-g
        opt_g.step()
        opt_d.zero_grad()
        d_fake = D(fake if step == late else fake.detach())  # at: gan-d-fake
        (bce(D(torch.randn(8, 2)), torch.ones(8, 1)) + bce(d_fake, torch.zeros(8, 1))).backward()  # at: gan-d
        opt_d.step()


def inplace_at(late: int, steps: int = 800) -> None:
    model, opt = mlp()
    for step in range(steps):
        opt.zero_grad()
        out = torch.exp(model(torch.randn(4, 8)))  # at: inplace-exp
        if step == late:
            out.add_(1)
        out.mean().backward()
        opt.step()


def no_grad_at(late: int, steps: int = 800) -> None:
    model, opt = mlp()

    def train_on(x: torch.Tensor) -> None:
        loss = model(x).pow(2).mean()  # at: no-grad-loss
        loss.backward()  # at: no-grad-backward

    for step in range(steps):
        opt.zero_grad()
        if step == late:
            with torch.no_grad():  # at: no-grad-block
                train_on(torch.randn(4, 8))
        else:
            train_on(torch.randn(4, 8))
        opt.step()


def late_retain(steps: int = 300, start: int = 200) -> None:
    model, opt = mlp()
    for step in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward(retain_graph=step >= start)  # at: late-retain
        opt.step()


# ------------------------------------------------------------------ which steps
def test_the_first_and_the_sampled_steps_are_seen_in_full_detail_the_others_light() -> None:
    with watch() as gw:
        clean(520)
    assert full_steps(gw) == [*range(FIRST_STEPS), 64, 256, 512]
    assert [span.reason for span in gw.trace.full_detail] == ["first steps", "sampled", "sampled", "sampled"]
    saved = [step.saved_packed for step in gw.trace.steps]
    assert all(saved[i] for i in full_steps(gw)) and not any(saved[i] for i in range(520) if i not in full_steps(gw))
    assert not gw.findings
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None  # nothing left pushed


def test_the_full_level_sees_every_step_and_the_light_level_none() -> None:
    with watch("full") as full:
        clean(20)
    with watch("light") as light:
        clean(20)
    assert full_steps(full) == list(range(20)) and all(step.saved_packed for step in full.trace.steps)
    assert not light.trace.full_detail and not any(step.saved_packed for step in light.trace.steps)


def test_the_summary_says_which_steps_were_seen_in_full_detail() -> None:
    from graphwatch.rendering.wording import detail_text

    with watch() as gw:
        clean(70)
    assert detail_text(gw.trace).startswith("full detail in 4 steps of 70: 0-2 (first steps); 64 (sampled); the other 66")


def test_a_retain_graph_backward_on_a_light_step_switches_to_full_detail() -> None:
    with watch() as gw:
        late_retain()
    signal = next(span for span in gw.trace.full_detail if span.first > 200)
    assert signal.first == 201 and signal.reason == f"a retain_graph=True backward at {at('late-retain')}"
    assert gw.trace.steps[201].saved_packed and gw.trace.steps[201 + HOLD_STEPS - 1].saved_packed
    assert at("late-retain") in only(gw.findings, "retained-graph").evidence["sites"]


def test_a_new_code_path_on_a_light_step_switches_to_full_detail() -> None:
    with watch() as gw:
        late_total()
    signal = next(span for span in gw.trace.full_detail if span.first > 300)
    assert signal.reason.startswith("a new code path: step 301 made")
    assert signal.first == 302 and signal.end >= 302 + HOLD_STEPS


# ------------------------------------------------------------------ late bugs, as at the full level
def findings_at(level: str, loop: Callable[[], object]) -> list[tuple[str, list[str]]]:
    with watch(level) as gw:
        loop()
    return sorted((f.kind, [s for s in f.evidence["sites"] if "test_adaptive" in s]) for f in gw.findings)


def test_an_accumulator_that_starts_late_is_found_at_its_line() -> None:
    with watch() as gw:
        late_total()
    finding = only(gw.findings, "graph-kept-alive")
    assert finding.evidence["holder"] == "total" and at("late-total") in finding.evidence["sites"]
    assert 300 < finding.step < 310
    assert [f.kind for f in gw.findings] == [kind for kind, _ in findings_at("full", late_total)]


def test_a_validation_pass_every_500_steps_without_no_grad_is_found_at_its_line() -> None:
    with watch() as gw:
        periodic_validation()
    finding = only(gw.findings, "graph-kept-alive")
    assert finding.evidence["holder"] == "val_losses" and at("validation") in finding.evidence["sites"]
    assert 500 < finding.step < 510 and finding.evidence["kept"]["bytes"] > 0  # the saved tensors, read from the graph
    assert {f.kind for f in gw.findings} <= {kind for kind, _ in findings_at("full", periodic_validation)}


def late_kept_validation(steps: int = 600, start: int = 300) -> None:
    """A validation forward without no_grad every step, its losses kept from step ``start`` on."""
    model, opt = mlp()
    x_val, val_losses = torch.randn(32, 8), []
    for step in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        val_loss = model(x_val).pow(2).mean()  # at: kept-validation
        if step >= start:
            val_losses.append(val_loss)


def test_validation_graphs_kept_from_light_steps_get_the_full_levels_fix_at_its_line() -> None:
    """The graphs kept are made on light steps; their saved tensors, read after the fact, take the line a full
    step that ran the same code saved them at, so the fix is the evaluation's ``no_grad``, with its patch."""
    found = []
    for level in ("default", "full"):
        with watch(level) as gw:
            late_kept_validation()
        finding = only(gw.findings, "graph-kept-alive")
        found.append((finding.evidence["graph_at"], finding.evidence["evaluation_at"], finding.fix, finding.patch))
    assert found[0] == found[1] and found[0][1] == [at("kept-validation")] and found[0][3]
    assert found[0][2].startswith(f"run the forward at {at('kept-validation')} under `with torch.no_grad():`")


def evaluate(model: nn.Module, x_val: torch.Tensor) -> torch.Tensor:
    model.eval()  # at: eval-switch
    total = torch.zeros(())
    for chunk in x_val.split(8):
        total = total + model(chunk).pow(2).mean()
    return total


def epochs_with_validation(epochs: int = 3, steps: int = 100) -> None:
    """Each epoch ends with a validation pass in a function of its own, without no_grad, and the best
    validation loss is kept as a tensor, with its graph.  The first pass runs in step 100, begun light at
    step 99's ``optimizer.step()``: no step seen in full detail ran its lines before."""
    model, opt = mlp()
    x_val, best = torch.randn(32, 8), None
    for _ in range(epochs):
        model.train()
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
        val_loss = evaluate(model, x_val)  # at: validation-call
        if best is None or val_loss < best:
            best = val_loss


def test_a_first_validation_pass_after_model_eval_is_seen_in_full_detail_and_fixed_at_its_line() -> None:
    """``model.eval()`` at a line not seen before, in a step that has made nothing yet, turns that step to
    full detail from its start: the validation's graph has its lines, and the fix and its patch are the
    full level's, ``no_grad`` around the loop's call of the validation (not the holder's ``.detach()`` alone)."""
    found, sessions = [], []
    for level in ("default", "full"):
        with watch(level) as gw:
            epochs_with_validation()
        sessions.append(gw)
        kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
        found.append(sorted((f.fix, f.patch or "") for f in kept))
    assert found[0] == found[1]
    no_grad = f"run the forward at {at('validation-call')} under `with torch.no_grad():`"
    assert any(fix.startswith(no_grad) and patch for fix, patch in found[0])
    span = next(span for span in sessions[0].trace.full_detail if span.first == 100)
    assert span.reason == f"a new code path: a module switched to evaluation mode at {at('eval-switch')}"
    assert 200 not in full_steps(sessions[0])  # the next epoch's validation, at a line seen: light


def periodic_leak(steps: int = 600) -> None:
    model, opt = mlp()
    kept = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        if step % 100 == 99:
            kept.append(loss)  # at: periodic
    assert len(kept) == steps // 100


def test_a_periodic_leak_on_light_steps_is_found_at_a_sampled_step_and_every_step_keeps_its_totals() -> None:
    """No light step sees it (no node more, no new line): the sampled step's census does, comparing with the
    last step end it looked at (step 64), not with the light step before it."""
    with watch() as gw:
        periodic_leak()
    finding = only(gw.findings, "graph-kept-alive")
    assert finding.step == 256 and finding.evidence["holder"] == "kept" and at("periodic") in finding.evidence["sites"]
    steps = gw.trace.steps
    assert [s.index for s in steps] == list(range(600)) and all(s.nodes_created == 7 for s in steps)
    assert all(bool(s.saved_packed) == (s.index in full_steps(gw)) for s in steps)  # light steps save nothing seen


ERRORS: dict[str, tuple[Callable[[int], None], type[Exception]]] = {
    "same tensor twice": (backward_twice_at, graphwatch.BackwardTwiceError),
    "hidden not detached": (hidden_not_detached_from, graphwatch.BackwardTwiceError),
    "gan handoff": (gan_not_detached_at, graphwatch.BackwardTwiceError),
    "in-place": (inplace_at, RuntimeError),
    "no_grad": (no_grad_at, graphwatch.LossWithoutGraphError),
}


LATE = 777  # the step each error is first raised on: a light one (the last sampled step before it is 768)
_ERROR_RUNS: dict[tuple[str, str], tuple[str, graphwatch.Session]] = {}  # (error, level): its message and session
# (the three tests below read the same ten runs: under `pytest -n auto --dist loadgroup` they share one worker)
shares_the_error_runs = pytest.mark.xdist_group("adaptive-error-runs")


def error_of(level: str, name: str) -> tuple[str, graphwatch.Session]:
    """The message of the error ``ERRORS[name]`` raises at step :data:`LATE` when watched at ``level``, and the
    session: each loop runs once per level in this process, whichever test asks first."""
    if (name, level) not in _ERROR_RUNS:
        loop, kind = ERRORS[name]
        with pytest.raises(kind) as info, watch(level) as gw:
            loop(LATE)
        _ERROR_RUNS[name, level] = (str(info.value), gw)
    return _ERROR_RUNS[name, level]


@shares_the_error_runs
@pytest.mark.parametrize("name", list(ERRORS))
def test_an_error_first_raised_on_a_late_light_step_is_explained_as_on_a_full_step(name: str) -> None:
    light, gw = error_of("default", name)
    full, _ = error_of("full", name)
    assert LATE not in full_steps(gw)[:-1] and not gw.trace.steps[LATE - 1].saved_packed  # it ran light
    assert "graphwatch: " in light and light == full


@shares_the_error_runs
def test_each_error_names_its_lines() -> None:
    same, _ = error_of("default", "same tensor twice")
    assert f"created at {at('twice-loss')}" in same and f"`loss` is backwarded twice in step {LATE}" in same
    hidden, _ = error_of("default", "hidden not detached")
    assert f"produced at {at('hidden')}" in hidden and "h = h.detach()" in hidden
    gan, _ = error_of("default", "gan handoff")
    assert at("gan-g") in gan and at("gan-d") in gan and "fake.detach()" in gan
    inplace, _ = error_of("default", "in-place")
    assert inplace.startswith("one of the variables needed for gradient computation has been modified")
    assert f"graphwatch: the tensor was saved at {at('inplace-exp')} (" in inplace and f"(step {LATE})" in inplace
    no_grad, gw = error_of("default", "no_grad")
    assert f"made under the `with torch.no_grad():` block at {at('no-grad-block')}" in no_grad
    [remedy] = only(gw.findings, "loss-without-graph").remedies  # the statements to run with grad enabled
    assert [(e.kind, e.where, e.until) for e in remedy.edits] == [
        ("enable-grad", at("no-grad-loss"), int(at("no-grad-backward").rsplit(":", 1)[1]))
    ]


@shares_the_error_runs
def test_a_late_error_leaves_the_same_findings_as_at_the_full_level() -> None:
    for name in ERRORS:
        found = []
        for level in ("default", "full"):
            _, gw = error_of(level, name)
            found.append(sorted((f.kind, f.fix, f.patch or "") for f in gw.findings))  # with the remedies' patches
        assert found[0] == found[1], name


def test_a_holder_of_light_steps_graphs_knows_whether_a_backward_ran_through_it() -> None:
    """The holders of the session's last census, of graphs made on light steps (their records built after the
    fact, from nodes that save no tensor), say what the full level's say: whether a backward ran through the
    held value, which decides whether a fix may detach it."""
    seen = []
    for level in ("default", "full"):
        model, opt = mlp()
        kept: list[torch.Tensor] = []
        total = torch.zeros(())
        with watch(level) as gw:
            for step in range(80):
                scaled = model(torch.randn(4, 8)) + 1  # (no saved tensor slot: no freed one tells)
                loss = scaled.pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step in (70, 79):  # (two steps apart: kept graphs that grew step after step would be seen in full)
                    kept.append(scaled)  # a part of the loss: a backward ran through it
                    total = total + loss.detach() * model(torch.randn(1, 8)).sum()  # no backward runs through it
        assert level == "full" or not {70, 79} & set(full_steps(gw))  # kept[0] and kept[1] made on light steps
        seen.append(sorted((h.name, h.numel, h.backwarded) for h in gw.trace.steps[-1].holders))
    assert seen[0] == seen[1]
    assert [h for h in seen[0] if h[0] != "loss"] == [("kept[0]", 4, True), ("kept[1]", 4, True), ("total", 1, False)]


# ------------------------------------------------------------------ transparency across switches
def trained(steps: int) -> dict[str, torch.Tensor]:
    model, opt = mlp()
    for step in range(steps):
        opt.zero_grad()
        x = torch.randn(4, 8)
        with torch.autograd.graph.save_on_cpu() if step % 7 == 3 else torch.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t
        ):
            loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_switching_hooks_at_step_boundaries_changes_no_gradient(bare_and_watched, same_tensors) -> None:
    bare, watched, gw = bare_and_watched(lambda: trained(70), snapshots="off")
    same_tensors(bare, watched)
    assert full_steps(gw) == [0, 1, 2, 64]
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_hooks_the_user_keeps_entered_across_a_boundary_stay_on_top() -> None:
    user = (lambda t: t, lambda t: t)
    model, opt = mlp()
    with watch() as gw:
        context = torch.autograd.graph.saved_tensors_hooks(*user)
        for step in range(8):
            if step == 2:
                context.__enter__()  # entered in a full step, left in a light one
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            assert torch._C._autograd._top_saved_tensors_default_hooks(False) == (user if step >= 2 else None) or step < 2
        context.__exit__(None, None, None)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert gw.trace.steps[5].saved_packed == 0


# ------------------------------------------------------------------ steps of growing length
def growing_episodes(steps: int = 200, kept_from: int | None = None) -> None:
    """A policy-gradient loop: one episode per step, one forward per time step and a backward of their sum, the
    episodes longer as training goes on (5 time steps at first, 54 at the end); from step ``kept_from`` on, the
    episodes' returns are added up with their graphs."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    total = 0.0
    for step in range(steps):
        returns = [policy(torch.randn(1, 4)).sum() for _ in range(5 + step // 4)]
        episode = torch.stack(returns).sum()
        opt.zero_grad()
        episode.pow(2).backward()
        opt.step()
        if kept_from is not None and step >= kept_from:
            total = total + episode  # at: growing-total


def test_episodes_that_grow_as_the_agent_learns_are_looked_at_a_few_times_not_at_every_longest_one() -> None:
    """Every fourth episode is the longest yet: a signal each time without the slack (about 50 of 200 steps
    held in full detail); with it, the margin doubles after each look that found nothing."""
    with watch() as gw:
        growing_episodes()
    made = [span for span in gw.trace.full_detail if "autograd nodes" in span.reason]
    assert 1 <= len(made) <= 5, [span.reason for span in made]
    assert not gw.findings and len(full_steps(gw)) <= FIRST_STEPS + 1 + 5 * HOLD_STEPS


def test_an_accumulator_that_starts_after_the_episodes_grew_is_found_as_at_the_full_level() -> None:
    with watch() as gw:
        growing_episodes(300, kept_from=150)
    finding = only(gw.findings, "graph-kept-alive")
    assert finding.evidence["holder"] == "total" and at("growing-total") in finding.evidence["sites"]
    assert finding.step <= 256  # (at the latest by the sampled step: the slack leaves no node-count signal)
    assert sorted(f.kind for f in gw.findings) == [kind for kind, _ in findings_at("full", lambda: growing_episodes(300, 150))]
