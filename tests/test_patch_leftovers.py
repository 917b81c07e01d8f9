"""Issue 39's leftovers, "a patch only if it can be right": an accumulator tensor grown in place with a loss
(``stats.add_(loss)``) gets the kept-value patch, and a kept value that is an expression, not a name, is
detached as a whole.  Real runs of ``graphwatch run``; each patch applied with ``patch -p0`` and the patched
program run, clean, printing what the hand-fixed program prints."""

from __future__ import annotations

from pathlib import Path

import torch
from test_kept_value_use import HEAD, TRAINED, edits, kept_fix
from test_leak_fixes import patched_runs_clean, trains_like
from test_patches import needs_patch_tool

from graphwatch.analysis.codemods import apply_edits
from graphwatch.analysis.codemods.numbers import takes_numbers
from graphwatch.capture.causes.held_values import value_at
from graphwatch.model import Edit

LOOP = (
    "for step in range(8):\n    x = torch.randn(16, 8)\n    loss = model(x).pow(2).mean()\n    opt.zero_grad()\n"
    "    loss.backward()\n    opt.step()\n"
)


# ------------------------------------------------------------------ a tensor grown in place: stats.add_(loss)
@needs_patch_tool
def test_a_loss_added_in_place_to_a_tensor_is_kept_as_a_number_and_the_tensor_s_uses_stay(tmp_path: Path) -> None:
    """``loss_sum.add_(loss * 16)`` holds every step's graph; ``.item()`` adds the same number and the holder
    stays a tensor, so its own ``.item()`` is left as it is."""
    keep, fixed = "loss_sum.add_(loss * 16)", "loss_sum.add_((loss * 16).item())"
    after = 'print(f"mean loss {loss_sum.item() / 128:.6f}")\n'
    source = HEAD + "loss_sum = torch.zeros(())\n" + LOOP + f"    {keep}\n" + after + TRAINED
    kept = kept_fix(tmp_path, source)
    assert edits(kept) == [("item", 14, "loss * 16")]
    assert kept.fix == f"keep a number, not the graph: `{fixed}` at train.py:14"
    assert "`loss_sum` adds it in place, so it stays a tensor" in kept.remedies[0].why
    assert f"+    {fixed}\n" in (kept.patch or "") and "loss_sum.item() / 128" in (kept.patch or "")
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, source.replace(keep, fixed))


@needs_patch_tool
def test_per_sample_losses_added_in_place_are_detached_as_a_whole_expression(tmp_path: Path) -> None:
    """Sixteen elements: ``.item()`` would raise, so the expression kept is detached, in parentheses."""
    keep, fixed = "per_sample.add_(losses * 2)", "per_sample.add_((losses * 2).detach())"
    after = 'print(f"per-sample total {per_sample.sum().item():.6f}")\n'
    loop = LOOP.replace("loss = model(x).pow(2).mean()", "losses = model(x).pow(2).squeeze(1)\n    loss = losses.mean()")
    source = HEAD + "per_sample = torch.zeros(16)\n" + loop + f"    {keep}\n" + after + TRAINED
    kept = kept_fix(tmp_path, source)
    assert edits(kept) == [("detach-use", 15, "losses * 2")]
    assert f"+    {fixed}\n" in (kept.patch or "")
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, source.replace(keep, fixed))


def test_an_in_place_sum_takes_numbers_whatever_the_holder_is_used_for() -> None:
    """The holder of ``total.add_(v)`` is a tensor whatever ``v`` is: a use that needs a tensor still works."""
    source = "total = torch.zeros(())\nfor x in data:\n    total.add_(f(x))\nprint(torch.stack([total]).item())\n"
    assert takes_numbers(source, 3)
    assert not takes_numbers(source.replace("total.add_(f(x))", "total += f(x)"), 3)
    assert apply_edits(source, [Edit("item", "t.py", 3, "f(x)")]) == source.replace("f(x))", "f(x).item())", 1)


def test_a_kept_expression_is_detached_whole_and_only_where_it_is_spelled_once() -> None:
    assert apply_edits("total += loss * 2  # kept\n", [Edit("detach-use", "t.py", 1, "loss * 2")]) == (
        "total += (loss * 2).detach()  # kept\n"
    )
    assert apply_edits("total += f(a)\n", [Edit("detach-use", "t.py", 1, "f(a)")]) == "total += f(a).detach()\n"
    assert apply_edits("total += f(a) + f(a)\n", [Edit("detach-use", "t.py", 1, "f(a)")]) is None


# ------------------------------------------------------------------ a holder inside a Sequential: model.1.running_mean
HAND_NORM = """\
import torch
from torch import nn


class HandNorm(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.running_mean = torch.zeros(features)

    def forward(self, x):
        mean = x.mean(0)
        self.running_mean = 0.9 * self.running_mean + 0.1 * mean
        return x - mean


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), HandNorm(16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(8):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"running mean {model[1].running_mean.sum().item():.6f}")
""" + TRAINED


@needs_patch_tool
def test_a_statistic_kept_by_a_numbered_submodule_is_named_and_fixed_at_the_line_that_updates_it(
    tmp_path: Path,
) -> None:
    """``model.1.running_mean`` (a Sequential's child, as the module names it) is found at its class's update
    line, not at the line that built the model, and that line keeps the value without its graph."""
    update = "self.running_mean = 0.9 * self.running_mean + 0.1 * mean"
    kept = kept_fix(tmp_path, HAND_NORM)
    assert kept.evidence["holder"] == "model.1.running_mean"
    assert kept.evidence["sites"][0] == "train.py:12"
    assert edits(kept) == [("detach-made", 12, "self.running_mean")]
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, HAND_NORM.replace(update, "self.running_mean = (0.9 * self.running_mean + 0.1 * mean).detach()"))


def test_a_numbered_submodule_s_attribute_is_read_as_the_module_names_it() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Identity(), torch.nn.Tanh()))
    assert value_at(None, "model.1.1", {"model": model}) is model[1][1]
    assert value_at(None, "model.0.weight", {"model": model}) is model[0].weight
    assert value_at(None, "model.7.weight", {"model": model}) is None
