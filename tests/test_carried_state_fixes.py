"""The detach of a state the loop means to carry (issue 39): for every value the script can give it, and on
the object that holds it, as the user's code spells it.

Each program runs under ``graphwatch run`` in a scratch folder; the patch is applied with the real ``patch
-p0``; the patched program then runs plainly in every configuration it has, and prints what a known-good fix
written by hand (upstream's ``repackage_hidden`` for the word language model) prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

import warm_python
from test_leak_fixes import finding_of, patched_runs_clean, trains_like
from test_patches import apply_patch, needs_patch_tool

import graphwatch

pytestmark = needs_patch_tool

# the word language model's shape: `hidden` is a tensor for a GRU, a tuple `(h, c)` for an LSTM, by --model
WORD_LM = """\
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="GRU")
args = parser.parse_args()


class RNNModel(nn.Module):
    def __init__(self, rnn_type):
        super().__init__()
        self.rnn_type = rnn_type
        self.encoder, self.decoder = nn.Embedding(20, 16), nn.Linear(16, 20)
        self.rnn = getattr(nn, rnn_type)(16, 16)

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(output), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(1, bsz, 16), weight.new_zeros(1, bsz, 16))
        return weight.new_zeros(1, bsz, 16)
HELPER

def train():
    torch.manual_seed(0)
    model = RNNModel(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    stream = torch.randint(0, 20, (41, 4))
    hidden = model.init_hidden(4)
    for i in range(4):
        x, y = stream[i * 10 : i * 10 + 10], stream[i * 10 + 1 : i * 10 + 11]
        opt.zero_grad()
        output, hidden = model(x, hidden)
        loss = nn.functional.cross_entropy(output.reshape(-1, 20), y.reshape(-1))
        loss.backward()
        opt.step()
        print(f"{loss.item():.6f}")


train()
"""
# upstream's helper, written by hand: a tensor detached, a tuple item by item
UPSTREAM_HELPER = """

def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)

"""
CALLED = "        opt.zero_grad()\n        hidden = repackage_hidden(hidden)\n"
KNOWN_GOOD = WORD_LM.replace("HELPER\n", UPSTREAM_HELPER).replace("        opt.zero_grad()\n", CALLED)


def run_with(folder: Path, script: str, *args: str) -> graphwatch.Trace:
    """``graphwatch run script args...`` in ``folder``; the trace it wrote."""
    out = folder / "out"
    command = [sys.executable, "-m", "graphwatch", "run", "--out", str(out), script, *args]
    warm_python.run(command, cwd=folder, capture_output=True, text=True, timeout=300)
    return graphwatch.load(out / "trace.json")


def prints_like_in_every_configuration(folder: Path, reference: str) -> None:
    for model in ("GRU", "LSTM"):
        patched = run_plain_with(folder, "train.py", model)
        assert patched == reference_prints(folder, reference, model), model


_REFERENCE_PRINTS: dict[tuple[str, str], str] = {}


def reference_prints(folder: Path, reference: str, model: str) -> str:
    """What the known-good ``reference`` prints run plainly with ``--model model``: once per module (the tests
    compare their patched programs with the same hand-written fix, and a plain run is deterministic)."""
    if (reference, model) not in _REFERENCE_PRINTS:
        (folder / "reference.py").write_text(reference)
        _REFERENCE_PRINTS[(reference, model)] = run_plain_with(folder, "reference.py", model)
    return _REFERENCE_PRINTS[(reference, model)]


def run_plain_with(folder: Path, script: str, model: str) -> str:
    done = warm_python.run([sys.executable, script, "--model", model], cwd=folder, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_state_the_script_makes_a_tensor_or_a_tuple_gets_a_helper_that_detaches_both(tmp_path: Path) -> None:
    """Run as a GRU (a tensor), the patch must still work for the LSTM (a tuple) the flag also makes."""
    (tmp_path / "train.py").write_text(WORD_LM.replace("HELPER\n", "\n"))
    carried = finding_of(run_with(tmp_path, "train.py", "--model", "GRU"), "graph-carried-across-steps")
    assert carried.fix.startswith("`hidden = repackage_hidden(hidden)` at the start of each step")
    assert "a tuple in one place and a tensor in another" in (carried.remedies[0].why or "")
    assert carried.evidence["detach"] == "hidden = repackage_hidden(hidden)"  # the finding's words say its fix
    patch = carried.patch or ""
    assert "+def repackage_hidden(state):\n" in patch and "+        hidden = repackage_hidden(hidden)\n" in patch
    apply_patch(tmp_path, patch)
    prints_like_in_every_configuration(tmp_path, KNOWN_GOOD)


def test_the_scripts_own_repackage_hidden_is_reused_not_added_again(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(WORD_LM.replace("HELPER\n", UPSTREAM_HELPER))
    carried = finding_of(run_with(tmp_path, "train.py", "--model", "LSTM"), "graph-carried-across-steps")
    assert carried.fix.startswith("`hidden = repackage_hidden(hidden)`")
    assert "the script's own `repackage_hidden` detaches it" in (carried.remedies[0].why or "")
    assert "+def " not in (carried.patch or "no patch")
    apply_patch(tmp_path, carried.patch or "")
    prints_like_in_every_configuration(tmp_path, KNOWN_GOOD)


KV_CACHE = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.cache_k = torch.zeros(0, d)


class Model(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.attn, self.out = Attention(d), nn.Linear(d, 1)

    def forward(self, x):
        k = self.attn.k(x)
        self.attn.cache_k = torch.cat([self.attn.cache_k, k])
        scores = self.attn.q(x) @ self.attn.cache_k.T
        return self.out(scores.softmax(-1) @ self.attn.cache_k)


torch.manual_seed(0)
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x = torch.randn(3, 8)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    print(f"{loss.item():.6f}")
"""


def test_a_cache_kept_on_a_submodule_is_detached_by_the_path_the_outer_forward_names(tmp_path: Path) -> None:
    """Not ``self.cache_k`` in the outer model's ``forward`` (whose ``self`` has none): ``self.attn.cache_k``,
    before the line that keeps it; never "compute it inside the step", which would drop the cache."""
    (tmp_path / "train.py").write_text(KV_CACHE)
    carried = finding_of(run_with(tmp_path, "train.py"), "graph-carried-across-steps")
    assert carried.fix.startswith(
        "`self.attn.cache_k = self.attn.cache_k.detach()` at the start of each step, before train.py:19"
    )
    assert not any("inside the step that uses it" in r.text for r in carried.remedies)
    assert all("`self.cache_k`" not in r.text for r in carried.remedies)
    assert carried.evidence["detach"] == "self.attn.cache_k = self.attn.cache_k.detach()"  # as the fix spells it
    assert "+        self.attn.cache_k = self.attn.cache_k.detach()\n         self.attn.cache_k = torch.cat(" in (
        carried.patch or ""
    )
    patched_runs_clean(tmp_path, carried.patch)
    kept_detached = "torch.cat([self.attn.cache_k.detach(), k])"
    trains_like(tmp_path, KV_CACHE.replace("torch.cat([self.attn.cache_k, k])", kept_detached))
