"""A kept tensor's fix chosen by how the kept value is used later (issue 39): ``.item()`` only when every later
use takes a number, ``.detach()`` when one needs a tensor or cannot be told; a tensor a function returns and
its caller keeps fixed at the ``return``.  Real runs of ``graphwatch run``; each patch applied with ``patch
-p0`` and the patched program run, clean, printing what the hand-fixed program prints."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_leak_fixes import diagnose, finding_of, patched_runs_clean, trains_like
from test_patches import needs_patch_tool

from graphwatch.analysis.codemods.numbers import takes_numbers
from graphwatch.analysis.codemods.returned import returned_value
from graphwatch.model import Finding

pytestmark = needs_patch_tool

HEAD = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
"""
TRAINED = 'print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))\n'


def kept_fix(tmp_path: Path, source: str) -> Finding:
    """The one graph-kept-alive finding of a run of ``source`` as train.py."""
    return finding_of(diagnose(tmp_path, source), "graph-kept-alive")


def edits(finding: Finding) -> list[tuple[str, int, str]]:
    return [(e.kind, e.line, e.target) for e in finding.remedies[0].edits]


# ------------------------------------------------------------------ the holder's later use, read from the source
EPOCH_OUTPUTS = """\
import torch
from torch import nn


class Trainer:
    def __init__(self):
        self.net = nn.Linear(8, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
        self.outputs = []

    def training_step(self, x):
        loss = self.net(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.outputs.append(loss)
        return loss

    def on_epoch_end(self):
        print(f"epoch mean {torch.stack(self.outputs).mean().item():.6f}")
        self.outputs.clear()


torch.manual_seed(0)
trainer = Trainer()
for epoch in range(2):
    for step in range(6):
        trainer.training_step(torch.randn(16, 8))
    trainer.on_epoch_end()
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in trainer.net.parameters()))
"""


def test_a_list_another_method_stacks_keeps_detached_tensors_not_numbers(tmp_path: Path) -> None:
    """``torch.stack(self.outputs)`` at the epoch's end raises on floats: ``.item()`` would break it."""
    kept = kept_fix(tmp_path, EPOCH_OUTPUTS)
    assert kept.fix.startswith("keep a detached tensor, not the graph: `self.outputs.append(loss.detach())` at train.py:16")
    assert "a later use of `self.outputs` needs a tensor" in kept.fix
    assert edits(kept) == [("detach-use", 16, "loss")]
    assert "+        self.outputs.append(loss.detach())\n" in (kept.patch or "")
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, EPOCH_OUTPUTS.replace("self.outputs.append(loss)", "self.outputs.append(loss.detach())"))


NUMBER_USES = {  # the holder made, what the loop keeps in it, the hand fix, the later use
    "sum": ("losses = []\n", "losses.append(loss)", "losses.append(loss.item())", 'print(f"{sum(losses) / len(losses):.4f}")'),
    "f-string": ("total = 0\n", "total += loss", "total += loss.item()", 'print(f"{total:.3f}")'),
    "torch.tensor": ("hist = []\n", "hist.append(loss)", "hist.append(loss.item())",
                     'curve = torch.tensor(hist)\nprint(f"{curve.mean().item():.4f} {curve.min().item():.4f}")'),
}  # fmt: skip


@pytest.mark.parametrize("use", NUMBER_USES)
def test_a_holder_only_summed_printed_or_made_into_a_new_tensor_keeps_numbers(use: str, tmp_path: Path) -> None:
    start, keep, fixed, after = NUMBER_USES[use]
    loop = (
        "for step in range(8):\n    loss = model(torch.randn(16, 8)).pow(2).mean()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()\n"
    )
    source = HEAD + start + loop + f"    {keep}\n{after}\n" + TRAINED
    kept = kept_fix(tmp_path, source)
    assert edits(kept) == [("item", 13, "loss")]
    assert kept.fix == f"keep a number, not the graph: `{fixed}` at train.py:13"
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, source.replace(keep, fixed))


def test_a_holder_handed_to_a_function_keeps_a_detached_tensor(tmp_path: Path) -> None:
    """What ``report`` does with the list cannot be told from the line that uses it: a detached tensor works
    for any use."""
    source = (
        HEAD + "def report(values):\n    print(f\"{torch.stack(values).mean().item():.4f}\")\n\n\nlosses = []\n"
        "for step in range(8):\n    loss = model(torch.randn(16, 8)).pow(2).mean()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()\n    losses.append(loss)\nreport(losses)\n" + TRAINED
    )
    kept = kept_fix(tmp_path, source)
    assert edits(kept) == [("detach-use", 17, "loss")]
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, source.replace("losses.append(loss)", "losses.append(loss.detach())"))


@pytest.mark.parametrize(
    ("use", "numbers"),
    [
        ("print(torch.stack(hist).mean())", False),
        ("print(torch.cat(hist))", False),
        ("print(hist[-1].mean())", False),
        ("report(hist)", False),
        ("print([v.item() for v in hist])", False),  # each item used as a tensor
        ("print(sum(hist) / len(hist))", True),
        ('print("%d %.4f" % (len(hist), hist[-1]))', True),
        ('print("{:.4f}".format(hist[-1]))', True),
        ('print(", ".join(f"{v:.4f}" for v in hist))', True),
        ("print(hist[-1].item())", True),  # the .item() call is taken out with the patch
        ("curve = torch.tensor(hist)", True),
    ],
)
def test_the_later_uses_that_take_numbers_and_those_that_need_tensors(use: str, numbers: bool) -> None:
    source = f"hist = []\nfor x in data:\n    hist.append(f(x))\n{use}\n"
    assert takes_numbers(source, 3) is numbers


def test_a_holder_fed_into_another_holder_takes_numbers_only_if_that_one_does() -> None:
    source = "total = 0\nout = []\nfor x in data:\n    total += f(x)\n    out.append(total / 4)\nUSE\n"
    assert takes_numbers(source.replace("USE", 'print(" ".join(f"{v:.3f}" for v in out))'), 4)
    assert not takes_numbers(source.replace("USE", "print(torch.stack(out))"), 4)


# ------------------------------------------------------------------ a tensor returned by train() and kept by its caller
CHAR_RNN = """\
import torch
from torch import nn

torch.manual_seed(0)
rnn = nn.RNN(8, 16)
head = nn.Linear(16, 4)
opt = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.05)


def train(line_tensor, category_tensor):
    opt.zero_grad()
    out, _ = rnn(line_tensor)
    output = head(out[-1])
    loss = nn.functional.cross_entropy(output, category_tensor)
    loss.backward()
    opt.step()
    return output, loss


current_loss = 0
all_losses = []
for it in range(1, 13):
    output, loss = train(torch.randn(5, 1, 8), torch.tensor([it % 4]))
    current_loss += loss
    if it % 4 == 0:
        print("%d %.4f" % (it, loss))
        all_losses.append(current_loss / 4)
        current_loss = 0
print(" ".join(f"{v:.6f}" for v in all_losses))
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in rnn.parameters()))
"""


def test_a_loss_train_returns_and_its_caller_adds_up_is_made_a_number_at_the_return(tmp_path: Path) -> None:
    kept = kept_fix(tmp_path, CHAR_RNN)
    assert kept.fix.startswith("return a number, not the graph: `return output, loss.item()` at train.py:17")
    assert "what `train()` returns is kept by its caller: `current_loss` at train.py:24" in kept.fix
    assert edits(kept) == [("item", 17, "loss")]
    assert "+    return output, loss.item()\n" in (kept.patch or "")
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, CHAR_RNN.replace("return output, loss\n", "return output, loss.item()\n"))


def test_a_returned_loss_the_caller_stacks_is_detached_at_the_return(tmp_path: Path) -> None:
    source = CHAR_RNN.replace("current_loss += loss\n", "current_loss += loss\n    kept.append(loss)\n").replace(
        "all_losses = []\n", "all_losses = []\nkept = []\n"
    ) + "print(f\"{torch.stack(kept).mean().item():.6f}\")\n"
    trace = diagnose(tmp_path, source)
    fixes = [f for f in trace.findings if f.kind == "graph-kept-alive"]
    assert fixes and all(f.fix.startswith("return a detached tensor, not the graph: `return output, loss.detach()`")
                         for f in fixes)  # fmt: skip
    assert {f.patch for f in fixes} == {fixes[0].patch}
    patched_runs_clean(tmp_path, fixes[0].patch)
    trains_like(tmp_path, source.replace("return output, loss\n", "return output, loss.detach()\n"))


SEQ2SEQ = """\
import torch
from torch import nn

torch.manual_seed(0)
encoder = nn.GRU(8, 16)
decoder = nn.Linear(16, 8)
enc_opt = torch.optim.SGD(encoder.parameters(), lr=0.05)
dec_opt = torch.optim.SGD(decoder.parameters(), lr=0.05)


def train(input_tensor, target_tensor):
    enc_opt.zero_grad()
    dec_opt.zero_grad()
    out, hidden = encoder(input_tensor)
    loss = 0
    for di in range(target_tensor.size(0)):
        loss += nn.functional.mse_loss(decoder(out[di]), target_tensor[di])
    loss.backward()
    enc_opt.step()
    dec_opt.step()
    return loss / target_tensor.size(0)


print_loss_total = 0
plot_loss_total = 0
plot_losses = []
for it in range(1, 13):
    loss = train(torch.randn(5, 1, 8), torch.randn(5, 1, 8))
    print_loss_total += loss
    plot_loss_total += loss
    if it % 4 == 0:
        print(f"{it} {print_loss_total / 4:.4f}")
        print_loss_total = 0
    if it % 2 == 0:
        plot_losses.append(plot_loss_total / 2)
        plot_loss_total = 0
print(" ".join(f"{v:.4f}" for v in plot_losses))
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in encoder.parameters()))
"""


def test_two_holders_fed_by_one_return_get_the_same_patch_there_and_it_fixes_both(tmp_path: Path) -> None:
    """The seq2seq tutorial's ``print_loss_total`` and ``plot_loss_total``: each finding's patch is the one edit
    of ``train()``'s return, so applying it alone leaves neither (``--check-fixes`` judged each by the other)."""
    trace = diagnose(tmp_path, SEQ2SEQ)
    fixes = [f for f in trace.findings if f.kind == "graph-kept-alive"]
    assert fixes and all(edits(f) == [("item", 21, "loss / target_tensor.size(0)")] for f in fixes)
    assert fixes[0].fix.startswith("return a number, not the graph: `return (loss / target_tensor.size(0)).item()`")
    assert {f.patch for f in fixes} == {fixes[0].patch}
    patched_runs_clean(tmp_path, fixes[0].patch)
    trains_like(tmp_path, SEQ2SEQ.replace("return loss / target_tensor.size(0)", "return loss.item() / target_tensor.size(0)"))


def test_a_returned_loss_the_caller_backwards_is_never_changed_at_the_return(tmp_path: Path) -> None:
    """The caller runs the backward through what ``compute`` returns: a number or a detached tensor there
    would change what trains, so the fix stays where the caller keeps it."""
    source = (
        HEAD + "\n\ndef compute(x):\n    return model(x).pow(2).mean()\n\n\ntotal = 0\nfor step in range(8):\n"
        "    loss = compute(torch.randn(16, 8))\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "    total += loss\nprint(f\"{total:.4f}\")\n" + TRAINED
    )
    kept = kept_fix(tmp_path, source)
    assert edits(kept) == [("item", 19, "loss")]
    assert kept.fix.startswith("keep a number, not the graph: `total += loss.item()` at train.py:19")
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, source.replace("total += loss\n", "total += loss.item()\n"))


def test_the_return_a_kept_value_came_from_is_found_once_per_file_text_and_line() -> None:
    """A leak is judged again at every step end; following the callers of a tutorial-sized file took seconds
    each time (issue 39's tutorials: most of a run), so the answer for one file text and line is reused."""
    line = CHAR_RNN.splitlines().index("    current_loss += loss") + 1
    first = returned_value(CHAR_RNN, line)
    assert first is not None and first.as_item == "return output, loss.item()"
    assert returned_value(CHAR_RNN, line) is first
    assert returned_value(CHAR_RNN + "\n", line) == first  # another text: found afresh, the same answer


def test_a_list_kept_through_an_average_of_a_returned_loss_is_fixed_at_the_return() -> None:
    """The seq2seq tutorial appends ``plot_loss_avg = plot_loss_total / plot_every`` to ``plot_losses``: that
    holder too is fed by what ``train()`` returns, so its fix is the one at the ``return`` (a fix of its own at
    the append, ``.detach()``, broke once the return's ``.item()`` was applied with it)."""
    source = SEQ2SEQ.replace(
        "        plot_losses.append(plot_loss_total / 2)\n",
        "        plot_loss_avg = plot_loss_total / 2\n        plot_losses.append(plot_loss_avg)\n",
    )
    lines = source.splitlines()
    returned = returned_value(source, lines.index("        plot_losses.append(plot_loss_avg)") + 1)
    assert returned is not None
    assert (returned.line, returned.as_item) == (
        lines.index("    return loss / target_tensor.size(0)") + 1, "return (loss / target_tensor.size(0)).item()"
    )
