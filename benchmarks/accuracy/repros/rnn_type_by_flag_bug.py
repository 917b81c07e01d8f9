"""Reproduces: a word language model whose hidden state is a tensor for `--model GRU` and a tuple `(h, c)` for
`--model LSTM` (OpenNMT/OpenNMT-py pull request #126, "Fix GRU - hidden state changed from tuple to tensor
after forward"; udacity/deep-learning-v2-pytorch pull request #97, tests that expected a tuple hidden state
where a GRU gives a tensor).  The script defines the upstream `repackage_hidden` helper but the loop never
calls it; a detach written for one type (`tuple(h.detach() for h in hidden)`) crashes the other configuration.
EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX:         output, hidden = model(x, hidden)  # HERE =>         hidden = repackage_hidden(hidden)\n        output, hidden = model(x, hidden)
"""
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="GRU", choices=["GRU", "LSTM"])
args = parser.parse_args()


class RNNModel(nn.Module):
    def __init__(self, rnn_type):
        super().__init__()
        self.rnn_type = rnn_type
        self.embed, self.out = nn.Embedding(20, 16), nn.Linear(16, 20)
        self.rnn = getattr(nn, rnn_type)(16, 16)

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.embed(x), hidden)
        return self.out(output), hidden

    def init_hidden(self, batch):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return weight.new_zeros(1, batch, 16), weight.new_zeros(1, batch, 16)
        return weight.new_zeros(1, batch, 16)


def repackage_hidden(h):
    """The hidden state with its history cut, a tensor or a tuple of them."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(part) for part in h)


def train(model, opt, stream):
    hidden = model.init_hidden(4)
    for i in range(5):
        x, y = stream[i * 8 : i * 8 + 8], stream[i * 8 + 1 : i * 8 + 9]
        opt.zero_grad()
        output, hidden = model(x, hidden)  # HERE
        loss = nn.functional.cross_entropy(output.reshape(-1, 20), y.reshape(-1))
        loss.backward()
        opt.step()


torch.manual_seed(0)
model = RNNModel(args.model)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
train(model, opt, torch.randint(0, 20, (41, 4)))
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
