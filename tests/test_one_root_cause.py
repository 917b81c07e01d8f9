"""One root cause, one finding: holders fed by what one ``return`` gave are one ``graph-kept-alive`` finding.

A ``train()`` that returns the loss tensor, kept by its caller in a list and in a running total (PyTorch's
seq2seq tutorial keeps it in ``print_loss_total`` and ``plot_loss_total``), keeps every step's graph through
both; one edit at the ``return`` fixes both, so the finding is one, naming every holder and its line.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import graphwatch
from graphwatch.analysis.patch_checks import LineMap, judge
from graphwatch.model import Trace

STEPS = 10


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train(model: nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss  # at: return


def test_a_returned_loss_kept_in_a_list_and_a_total_is_one_finding_naming_both(
    at: Callable[[object, str], str],
) -> None:
    model, opt = _model()
    losses = []
    total = 0.0
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(STEPS):
            loss = _train(model, opt)
            losses.append(loss)  # at: list
            total += loss  # at: total
    kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert len(kept) == 1, [str(f) for f in gw.findings]
    finding, test = kept[0], test_a_returned_loss_kept_in_a_list_and_a_total_is_one_finding_naming_both
    holders = {finding.evidence["holder"]} | {h["holder"] for h in finding.evidence["also"]}
    assert holders == {"losses", "total"}
    lines = {at(test, "list"), at(test, "total"), at(_train, "return")}
    assert lines <= set(finding.evidence["sites"])  # every holder's line and the `return`, where the fix goes
    assert "`losses`" in finding.message and "`total`" in finding.message
    assert finding.evidence["returned"]["at"] == at(_train, "return")
    edits = {f"{edit.file}:{edit.line}" for remedy in finding.remedies for edit in remedy.edits}
    assert edits == {at(_train, "return")}  # the one patch, at the `return`
    growth = [f for f in gw.findings if f.kind == "memory-growth"]
    assert all(len(f.evidence["sites"]) == 1 for f in growth)  # explained by that one finding



def _kept(holder: str, sites: list[str], **more: object) -> graphwatch.Finding:
    return graphwatch.Finding("graph-kept-alive", "warning", 3, "m", "f", {"holder": holder, "sites": sites, **more})


def test_a_patch_that_leaves_one_holder_of_the_return_leaves_the_finding() -> None:
    found = _kept("losses", ["train.py:21", "train.py:13", "train.py:22"], also=[{"holder": "total", "at": "train.py:22"}])
    still = _kept("total", ["train.py:22", "train.py:13"])  # the patched run: `total` still keeps the graphs
    check = judge(Trace(findings=[found]), Trace(findings=[still]), [found], steps=5, lines=LineMap())
    assert not check.checked
    assert check.failed[0].startswith("the finding is still there: graph-kept-alive in step 3 at train.py:22")
    assert "no new finding" in check.held  # `total` is that finding's, not a new one


def test_a_finding_is_gone_when_its_own_holders_and_lines_are_gone() -> None:
    found = _kept("losses", ["train.py:21", "train.py:13", "train.py:22"], also=[{"holder": "total", "at": "train.py:22"}])
    other = _kept("history", ["train.py:40", "train.py:13"])  # another holder, through the same `return` line
    check = judge(Trace(findings=[found]), Trace(findings=[other]), [found], steps=5, lines=LineMap())
    assert "the finding is gone" in check.held
    assert any(f.startswith("the patched run has a new finding") for f in check.failed)
