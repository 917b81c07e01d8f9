"""``untrained-parameters``: an optimizer steps parameters that no backward ever reaches (real torch loops).

A finding for a GAN whose generator step detaches the generator's output, and for a layer in the optimizer
that the forward never calls; silence for frozen parameters, a branch taken every few steps, a GAN done
right, gradients of zeros, short runs, ``zero_grad(set_to_none=True)`` after each step and ``step(closure)``.
Every case runs at the default level and at ``level="full"``.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import warm_python
from torch import nn

import graphwatch
from graphwatch.analysis import FINDING_KINDS, LEAK_KINDS
from graphwatch.model import load_trace

KIND = "untrained-parameters"
STEPS = 14  # more than the finding's 10 steps, few enough for a test of a second
LEVELS = pytest.mark.parametrize("level", ["default", "full"])
REPO = Path(graphwatch.__file__).resolve().parents[2]


def _untrained(session: graphwatch.Session) -> list[graphwatch.Finding]:
    return [f for f in session.findings if f.kind == KIND]


def _gan(level: str, detach_at_generator_step: bool) -> graphwatch.Session:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    D = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1))
    opt_G = torch.optim.Adam(G.parameters(), 1e-3)
    opt_D = torch.optim.Adam(D.parameters(), 1e-3)
    bce = nn.BCEWithLogitsLoss()
    with graphwatch.watch(level=level, summary=False) as gw:
        for _ in range(STEPS):
            fake = G(torch.randn(16, 4))
            opt_D.zero_grad()
            loss_D = bce(D(torch.randn(16, 2)), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
            loss_D.backward()
            opt_D.step()
            opt_G.zero_grad()
            scored = D(fake.detach() if detach_at_generator_step else fake)
            bce(scored, torch.ones(16, 1)).backward()
            opt_G.step()
    return gw


class _Net(nn.Module):
    """A layer ``fc`` the forward calls and, optionally, ``extra`` used on the steps ``use_extra`` says."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.extra = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, use_extra: bool = False, scale: float = 1.0) -> torch.Tensor:
        out = self.fc(x)
        return out + scale * self.extra(x) if use_extra else out


def _train(level: str, steps: int = STEPS, use_extra=lambda step: False, scale: float = 1.0,
           set_to_none_after: bool = False, frozen: bool = False) -> graphwatch.Session:  # fmt: skip
    torch.manual_seed(0)
    net = _Net()
    if frozen:
        net.extra.requires_grad_(False)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with graphwatch.watch(level=level, summary=False) as gw:
        for step in range(steps):
            opt.zero_grad(set_to_none=False)
            net(torch.randn(8, 4), use_extra(step), scale).pow(2).mean().backward()
            opt.step()
            if set_to_none_after:
                opt.zero_grad(set_to_none=True)
    return gw


# ----------------------------------------------------------------------------- found
@LEVELS
def test_gan_detached_at_the_generator_step_names_its_optimizer_and_generator(level: str) -> None:
    gw = _gan(level, detach_at_generator_step=True)
    [finding] = _untrained(gw)
    ev = finding.evidence
    assert ev["optimizer"] == "opt_G"
    assert ev["parameters_text"] == "all 4 parameters of G"
    assert ev["names"] == ["G.0.weight", "G.0.bias", "G.2.weight", "G.2.bias"]
    assert ev["optimizer_steps"] == STEPS and ev["bare_steps"] == STEPS
    assert ev["others_train"] == ["opt_D (Adam)"]
    assert ev["sites"] and ev["sites"][0].endswith(f"{Path(__file__).name}:{_line_of('opt_G.step()')}")
    assert "`opt_G.step()`" in finding.message and "all 4 parameters of G never held a gradient" in finding.message
    assert "`.detach()`" in finding.message
    assert "opt_G" in finding.fix and finding.remedies and not any(r.edits for r in finding.remedies)  # words only


@LEVELS
def test_layer_the_forward_never_calls_is_named(level: str) -> None:
    gw = _train(level)
    [finding] = _untrained(gw)
    assert finding.evidence["optimizer"] == "opt"
    assert finding.evidence["parameters_text"] == "all 2 parameters of net.extra"
    assert finding.evidence["names"] == ["net.extra.weight", "net.extra.bias"]
    assert "module the forward never calls" in finding.message


def test_untrained_parameters_is_a_finding_kind_but_not_a_leak() -> None:
    assert KIND in FINDING_KINDS and KIND not in LEAK_KINDS


def test_strict_session_does_not_raise_on_it() -> None:
    """Like missing-zero-grad: a problem the report names, not a graph leak that strict mode fails on."""
    torch.manual_seed(0)
    net = _Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with graphwatch.watch(strict=True, summary=False) as gw:
        for _ in range(STEPS):
            opt.zero_grad()
            net(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    assert [f.kind for f in gw.findings] == [KIND]


def test_graphwatch_run_reports_it_and_its_trace_keeps_the_evidence(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        textwrap.dedent(f"""\
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        head = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01)
        for step in range({STEPS}):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
        """)
    )
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO / "src"))
    result = warm_python.run([sys.executable, "-m", "graphwatch", "run", "--strict", "--out", "out", "train.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stderr  # --strict fails on leaks only
    assert f"1 problem in {STEPS} steps" in result.stderr and KIND in result.stderr  # (the summary: on stderr)
    trace = load_trace(tmp_path / "out" / "trace.json")
    [finding] = [f for f in trace.findings if f.kind == KIND]
    assert finding.evidence["sites"] == ["train.py:9"]
    starved = [p.name for p in trace.parameters if p.starved]
    assert starved == ["head.weight", "head.bias"]
    assert KIND in json.dumps(json.loads((tmp_path / "out" / "trace.json").read_text())["findings"])


# ----------------------------------------------------------------------------- silent
@LEVELS
def test_silent_on_a_gan_that_detaches_only_at_the_discriminator_step(level: str) -> None:
    gw = _gan(level, detach_at_generator_step=False)
    assert _untrained(gw) == []
    assert {p.name for p in gw.trace.parameters if p.trained} >= {"G.0.weight", "D.0.weight"}


@LEVELS
def test_silent_on_frozen_parameters_left_in_the_optimizer(level: str) -> None:
    gw = _train(level, use_extra=lambda step: True, frozen=True)
    assert _untrained(gw) == []
    assert [p.bare_steps for p in gw.trace.parameters if p.name.startswith("net.extra")] == [0, 0]


@LEVELS
def test_silent_on_a_branch_taken_every_few_steps(level: str) -> None:
    """The branch runs on steps 3, 10, 17: none of the first steps a default session sees in full detail."""
    gw = _train(level, steps=20, use_extra=lambda step: step % 7 == 3)
    assert _untrained(gw) == []
    assert [p.first_held_step for p in gw.trace.parameters if p.name.startswith("net.extra")] == [3, 3]


@LEVELS
def test_silent_on_gradients_of_zeros(level: str) -> None:
    gw = _train(level, use_extra=lambda step: True, scale=0.0)
    assert _untrained(gw) == []
    extra = [p for p in gw.trace.parameters if p.name.startswith("net.extra")]
    assert [(p.first_held_step, p.trained) for p in extra] == [(0, False), (0, False)]  # held zeros: not non-zero


@LEVELS
def test_silent_on_too_few_steps(level: str) -> None:
    gw = _train(level, steps=6)
    assert _untrained(gw) == []
    assert [p.bare_steps for p in gw.trace.parameters if p.name.startswith("net.extra")] == [6, 6]


@LEVELS
def test_silent_when_zero_grad_sets_gradients_to_none_after_each_step(level: str) -> None:
    gw = _train(level, use_extra=lambda step: True, set_to_none_after=True)
    assert _untrained(gw) == []
    assert all(p.first_held_step == 0 for p in gw.trace.parameters)


@LEVELS
def test_silent_on_step_with_a_closure_after_zero_grad(level: str) -> None:
    """LBFGS makes its gradients inside ``step(closure)``, after the pre-step hook: those steps prove nothing."""
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(net.parameters(), max_iter=2)
    x = torch.randn(8, 4)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = net(x).pow(2).mean()
        loss.backward()
        return loss

    with graphwatch.watch(level=level, summary=False) as gw:
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            opt.step(closure)
    assert _untrained(gw) == []


def _line_of(text: str) -> int:
    """The line of this file that ``text`` is on (the first after ``_gan``'s definition)."""
    lines = Path(__file__).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def _gan("))
    return next(i for i, line in enumerate(lines[start:], start) if text in line) + 1
