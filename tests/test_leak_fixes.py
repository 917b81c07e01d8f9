"""The fixes of the leak findings, from what ran, on the cases issue 23 names: both sides of each rule.

Each program runs under ``graphwatch run`` in a scratch folder; the patch is applied with the real
``patch -p0``; the patched program runs again, under graphwatch (no finding, no error) and plainly, where
its printed losses are compared with a known-good fix written by hand: a fix must not change what trains.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import warm_python
from test_patches import REPO, apply_patch, graphwatch_run, needs_patch_tool

import graphwatch

pytestmark = needs_patch_tool


def run_plain(folder: Path, script: str) -> str:
    done = warm_python.run([sys.executable, script], cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def diagnose(folder: Path, source: str, script: str = "train.py") -> graphwatch.Trace:
    (folder / script).write_text(source)
    _, trace = graphwatch_run(folder, script)
    return trace


def finding_of(trace: graphwatch.Trace, kind: str) -> graphwatch.Finding:
    found = [f for f in trace.findings if f.kind == kind]
    assert len(found) == 1, [str(f) for f in trace.findings]
    return found[0]


def trains_like(folder: Path, reference: str) -> None:
    """The (patched) train.py prints what ``reference``, a known-good version of it, prints."""
    (folder / "reference.py").write_text(reference)
    assert run_plain(folder, "train.py") == run_plain(folder, "reference.py")


def patched_runs_clean(folder: Path, patch: str | None, script: str = "train.py") -> None:
    assert patch is not None, "no patch"
    apply_patch(folder, patch)
    run, trace = graphwatch_run(folder, script)
    assert run.returncode == 0, run.stderr
    assert trace.findings == [], [str(f) for f in trace.findings]


# ------------------------------------------------------------------ a state returned by train_step()
TRAIN_STEP_LSTM = """\
import torch
from torch import nn


def train_step(lstm, head, opt, x, hidden):
    opt.zero_grad()
    out, hidden = lstm(x, hidden)
    loss = head(out).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.item(), hidden


def main():
    torch.manual_seed(0)
    lstm, head = nn.LSTM(4, 8), nn.Linear(8, 1)
    opt = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
    hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    for step in range(4):
        x = torch.randn(5, 2, 4)
        loss, hidden = train_step(lstm, head, opt, x, hidden)
        print(f"{loss:.6f}")


main()
"""
# the known-good fix, written by hand elsewhere: the state detached as the step starts
TRAIN_STEP_FIXED = TRAIN_STEP_LSTM.replace(
    "    opt.zero_grad()\n", "    opt.zero_grad()\n    hidden = tuple(h.detach() for h in hidden)\n", 1
)


def test_an_lstm_state_returned_by_train_step_gets_a_tuple_aware_patch_in_the_loop(tmp_path: Path) -> None:
    trace = diagnose(tmp_path, TRAIN_STEP_LSTM)
    carried = finding_of(trace, "graph-carried-across-steps")
    assert carried.evidence["pattern"] == "recurrent"  # fed back by the loop, not a value cached once
    assert carried.fix.startswith("`hidden = tuple(h.detach() for h in hidden)` at the start of each step, before train.py:21")
    assert not any(r.text.startswith("compute `hidden` inside the step") for r in carried.remedies)
    error = finding_of(trace, "backward-through-freed-graph")
    assert error.fix == carried.fix and error.patch == carried.patch
    assert "+        hidden = tuple(h.detach() for h in hidden)\n         loss, hidden = train_step(" in (carried.patch or "")
    patched_runs_clean(tmp_path, carried.patch)
    trains_like(tmp_path, TRAIN_STEP_FIXED)


def test_a_tensor_state_returned_by_train_step_is_detached_as_a_tensor(tmp_path: Path) -> None:
    source = TRAIN_STEP_LSTM.replace("nn.LSTM(4, 8)", "nn.GRU(4, 8)").replace(
        "(torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))", "torch.zeros(1, 2, 8)"
    )
    carried = finding_of(diagnose(tmp_path, source), "graph-carried-across-steps")
    assert carried.fix.startswith("`hidden = hidden.detach()` at the start of each step")
    patched_runs_clean(tmp_path, carried.patch)


STARTS_AS_NONE = """\
import torch
from torch import nn

torch.manual_seed(0)
lstm, head = nn.LSTM(4, 8), nn.Linear(8, 1)
opt = torch.optim.SGD([*lstm.parameters(), *head.parameters()], lr=0.1)
hidden = None  # the LSTM starts from zeros
for step in range(4):
    opt.zero_grad()
    out, hidden = lstm(torch.randn(5, 2, 4), hidden)
    loss = head(out).pow(2).mean()
    loss.backward()
    opt.step()
    print(f"{loss.item():.6f}")
"""


def test_a_state_that_starts_as_none_gets_a_none_safe_patch(tmp_path: Path) -> None:
    carried = finding_of(diagnose(tmp_path, STARTS_AS_NONE), "graph-carried-across-steps")
    assert carried.fix.startswith("`if hidden is not None: hidden = tuple(h.detach() for h in hidden)`")
    assert carried.remedies[0].edits[0].value_type == "Optional[tuple[Tensor]]"
    patched_runs_clean(tmp_path, carried.patch)  # the first step, where it is None, runs
    detached_after_the_step = "    opt.step()\n    hidden = tuple(h.detach() for h in hidden)\n"
    trains_like(tmp_path, STARTS_AS_NONE.replace("    opt.step()\n", detached_after_the_step))


STACKED = """\
import torch
from torch import nn

torch.manual_seed(0)
cells = nn.ModuleList([nn.LSTMCell(4, 8), nn.LSTMCell(8, 8)])
head = nn.Linear(8, 1)
opt = torch.optim.SGD([*cells.parameters(), *head.parameters()], lr=0.1)
states = [(torch.zeros(2, 8), torch.zeros(2, 8)) for _ in cells]
for step in range(4):
    x = torch.randn(2, 4)
    new = []
    for cell, state in zip(cells, states):
        h, c = cell(x, state)
        new.append((h, c))
        x = h
    states = new
    loss = head(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"{loss.item():.6f}")
"""


def test_a_nested_state_a_list_of_per_layer_tuples_is_detached_as_it_ran(tmp_path: Path) -> None:
    """Not ``x`` (each step makes it anew; it carries from layer to layer): the per-layer ``(h, c)`` list."""
    carried = finding_of(diagnose(tmp_path, STACKED), "graph-carried-across-steps")
    assert carried.fix.startswith("`states = [tuple(h.detach() for h in layer) for layer in states]`")
    patched_runs_clean(tmp_path, carried.patch)
    trains_like(tmp_path, STACKED.replace("    states = new\n", "    states = [(h.detach(), c.detach()) for h, c in new]\n"))


LIGHTNING = """\
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Recurrent(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(6, 8, batch_first=True), nn.Linear(8, 1)
        self.hidden = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        out, self.hidden = self.lstm(x.unsqueeze(1), self.hidden)
        loss = nn.functional.mse_loss(self.head(out[:, -1]), y)
        print(f"{loss.item():.6f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(16, 6), torch.randn(16, 1)), batch_size=4)
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trainer.fit(Recurrent(), data)
"""


# (looked up, not imported: importing Lightning here sets PYTORCH_NVML_BASED_CUDA_CHECK and TORCHINDUCTOR_CACHE_DIR
# in this process's environment, and warm_python then starts every later script cold, 3-5 s of CPU each)
@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs lightning")
def test_under_lightning_a_state_kept_on_the_module_is_detached_without_crashing_at_step_0(tmp_path: Path) -> None:
    carried = finding_of(diagnose(tmp_path, LIGHTNING), "graph-carried-across-steps")
    assert carried.fix.startswith("`if self.hidden is not None: self.hidden = tuple(h.detach() for h in self.hidden)`")
    patch = carried.patch or ""
    assert "+        if self.hidden is not None:\n+            self.hidden = tuple(h.detach() for h in self.hidden)\n" in patch
    patched_runs_clean(tmp_path, carried.patch)


# ------------------------------------------------------------------ .item() only for one element
KEPT = """\
import torch
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    for step in range(8):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        logits = model(x)
        loss = (logits - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(KEPT)  # keep (for plotting)
    print(f"{len(history)} kept")


main()
"""


def test_a_kept_tensor_of_many_elements_is_detached_not_turned_into_a_number(tmp_path: Path) -> None:
    kept = finding_of(diagnose(tmp_path, KEPT.replace("KEPT", "logits")), "graph-kept-alive")
    assert kept.fix.startswith("keep a detached tensor, not the graph: `history.append(logits.detach())` at train.py:17")
    assert "32 elements" in kept.fix and "32 elements" in kept.remedies[0].why
    assert all(".item()" not in r.text.split("(`.item()` would raise")[0] for r in kept.remedies)
    assert [(e.kind, e.target) for r in kept.remedies for e in r.edits] == [("detach-use", "logits")]
    assert "+        history.append(logits.detach())  # keep (for plotting)\n" in (kept.patch or "")
    patched_runs_clean(tmp_path, kept.patch)


def test_a_kept_tensor_of_one_element_becomes_a_number_and_the_comment_stays(tmp_path: Path) -> None:
    kept = finding_of(diagnose(tmp_path, KEPT.replace("KEPT", "loss")), "graph-kept-alive")
    assert kept.fix == "keep a number, not the graph: `history.append(loss.item())` at train.py:17"
    assert "+        history.append(loss.item())  # keep (for plotting)\n" in (kept.patch or "")
    patched_runs_clean(tmp_path, kept.patch)


def test_an_expression_kept_is_put_in_parentheses_before_item(tmp_path: Path) -> None:
    source = KEPT.replace("loss = (", "perte_ü = (").replace("loss.backward()", "perte_ü.backward()")
    kept = finding_of(diagnose(tmp_path, source.replace("KEPT", "perte_ü * 2")), "graph-kept-alive")
    assert "`history.append((perte_ü * 2).item())`" in kept.fix
    patched_runs_clean(tmp_path, kept.patch)


MODULE_LEVEL = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total = 0
for step in range(8):
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total = total + loss
print(f"mean loss {total.item() / 8:.4f}")
"""


def test_a_module_level_loop_gets_a_patch_that_keeps_its_printout(tmp_path: Path) -> None:
    kept = finding_of(diagnose(tmp_path, MODULE_LEVEL), "graph-kept-alive")
    assert kept.fix == "keep a number, not the graph: `total = total + loss.item()` at train.py:14"
    assert '+print(f"mean loss {total / 8:.4f}")' in (kept.patch or "")  # total is a number now
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, MODULE_LEVEL)


# ------------------------------------------------------------------ holders reached through objects
POLICY = """\
import torch
from torch import nn


class Policy:
    def __init__(self):
        self.actor, self.critic = nn.Linear(4, 2), nn.Linear(4, 1)
        self.baseline = torch.zeros(())

    def update_baseline(self, value):
        self.baseline = 0.9 * self.baseline + 0.1 * value.mean()


class Trainer:
    def __init__(self, policy):
        self.policy = policy
        self.opt = torch.optim.SGD([*policy.actor.parameters(), *policy.critic.parameters()], lr=0.01)

    def train_step(self, obs):
        value = self.policy.critic(obs)
        logp = self.policy.actor(obs).log_softmax(-1)[:, 0]
        loss = -(logp * (1.0 - value.detach().squeeze(-1))).mean() + value.pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.policy.update_baseline(value)
        return loss.item()


def main():
    torch.manual_seed(0)
    trainer = Trainer(Policy())
    for step in range(10):
        print(f"{trainer.train_step(torch.randn(16, 4)):.6f}")


main()
"""


def test_a_moving_average_on_an_object_is_named_at_its_line_and_detached_there(tmp_path: Path) -> None:
    trace = diagnose(tmp_path, POLICY)
    kept = finding_of(trace, "graph-kept-alive")  # one finding: no second, site-less copy
    assert kept.evidence["holder"] == "self.policy.baseline" and kept.evidence["sites"][0] == "train.py:11"
    assert "outside the training loop's frames" not in kept.message
    assert kept.fix == (
        "keep the value without its graph: `self.baseline = (0.9 * self.baseline + 0.1 * value.mean()).detach()` "
        "at train.py:11"
    )
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, POLICY)  # nothing trained through it


BUFFER = """\
import torch
from torch import nn


class Normalizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("running", torch.zeros(8))

    def forward(self, x):
        y = self.lin(x)
        self.running = 0.9 * self.running + 0.1 * y.mean(0)
        return y - self.running.detach()


torch.manual_seed(0)
model = Normalizer()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"{loss.item():.6f}")
"""


def test_a_module_buffer_updated_outside_no_grad_is_named_at_its_line(tmp_path: Path) -> None:
    kept = finding_of(diagnose(tmp_path, BUFFER), "graph-kept-alive")
    assert kept.evidence["holder"] == "model.running" and kept.evidence["sites"][0] == "train.py:13"
    assert kept.fix.startswith("keep the value without its graph: `self.running = (0.9 * self.running")
    patched_runs_clean(tmp_path, kept.patch)
    trains_like(tmp_path, BUFFER)


# the accuracy corpus's reproduction, printing the last loss (the teacher makes the student's target)
EMA = (REPO / "benchmarks" / "accuracy" / "repros" / "ema_teacher_bug.py").read_text() + 'print(f"{loss.item():.6f}")\n'


def test_an_ema_update_is_patched_at_its_line_read_from_the_source_as_the_precise_level_sees_it(tmp_path: Path) -> None:
    """The in-place update saves no tensor, so no pack notes its line: the default level reads it from the
    source, the one statement outside no_grad that changes in place a name bound to a teacher parameter; the
    precise level, which notes every call's line, names the same.  The update loop goes under no_grad."""
    default = finding_of(diagnose(tmp_path, EMA), "graph-kept-alive")
    assert default.fix.startswith("update `teacher`'s parameters under `with torch.no_grad():`")
    assert default.evidence["sites"][0] == "train.py:25"
    run = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--level", "precise", "--out", "precise", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    precise = finding_of(graphwatch.load(tmp_path / "precise" / "trace.json"), "graph-kept-alive")
    assert run.returncode == 0 and precise.evidence["sites"][0] == "train.py:25"
    assert "+    with torch.no_grad():\n+        for tp, sp in zip(" in (default.patch or "")
    assert default.patch == precise.patch
    patched_runs_clean(tmp_path, default.patch)
    trains_like(tmp_path, EMA)  # the teacher is updated as before


# ------------------------------------------------------------------ what must not be patched
def test_an_evaluation_forward_in_a_file_that_does_not_bind_torch_gets_no_no_grad_patch(tmp_path: Path) -> None:
    source = (
        "from torch import nn, optim, randn\n\nmodel = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))\n"
        "opt = optim.SGD(model.parameters(), lr=0.01)\n"
        "xv, history = randn(32, 16), []\nfor step in range(8):\n    loss = model(randn(32, 16)).pow(2).mean()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    history.append(model(xv).mean())\n"
    )
    kept = finding_of(diagnose(tmp_path, source), "graph-kept-alive")
    assert kept.fix.startswith("run the forward at train.py:11 under `with torch.no_grad():`")
    assert kept.patch is None  # `torch.no_grad()` would be a NameError there


def test_zero_grad_is_patched_only_where_the_optimizer_is_named(tmp_path: Path) -> None:
    source = (
        "import torch\n\n\ndef backward(model, x):\n    model(x).pow(2).mean().backward()\n\n\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(4):\n    backward(model, torch.randn(8, 4))\n    opt.step()\n"
    )
    finding = finding_of(diagnose(tmp_path, source), "missing-zero-grad")
    assert finding.fix.startswith("call `opt.zero_grad()` before the backward at train.py:5")
    assert finding.patch is None  # `opt` is not a name inside backward()


# ------------------------------------------------------------------ one finding per cause
def test_a_kept_alive_finding_that_names_its_holder_absorbs_the_one_that_could_not() -> None:
    """The same graphs (made on the same line) kept at one step end by "something" and at another by
    ``trainer.policy.baseline``: one finding, with the holder's name, line and remedies, whichever came first."""
    from graphwatch.analysis.findings import FindingLog, make_finding
    from graphwatch.model import Remedy

    def kept(holder: str | None, step: int) -> graphwatch.Finding:
        evidence = {
            "key": "t.py:11" if holder else "t.py:20", "sites": ["t.py:11", "t.py:20"] if holder else ["t.py:20"],
            "steps": [step], "kept": {"step": step, "spans": [[0, 1]], "nodes": 2, "bytes": 64, "items": None},
            "holder": holder, "holder_at": "t.py:11" if holder else None, "graph_at": ["t.py:20"],
            "never_backwarded": False, "evaluation_at": [],
        }  # fmt: skip
        return make_finding("graph-kept-alive", "warning", step, evidence, [Remedy(f"fix {holder}")])

    for first, second in ((kept(None, 3), kept("policy.baseline", 4)), (kept("policy.baseline", 3), kept(None, 4))):
        log = FindingLog([])
        assert log.add(first) and not log.add(second)
        (finding,) = log.findings
        assert finding.evidence["holder"] == "policy.baseline" and finding.evidence["key"] == "t.py:11"
        assert finding.fix == "fix policy.baseline" and finding.evidence["sites"][0] == "t.py:11"
        assert finding.evidence["steps"] == [3, 4] and "`policy.baseline`" in finding.message
    other = kept(None, 5)
    other.evidence["graph_at"] = ["t.py:30"]  # graphs made elsewhere: another cause
    log = FindingLog([kept("policy.baseline", 3)])
    assert log.add(other) and len(log.findings) == 2
