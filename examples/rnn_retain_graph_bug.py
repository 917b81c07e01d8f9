"""A recurrent state never detached, with ``retain_graph=True`` added so it does not fail: every step is slower.

Bug: the leaky recurrent state ``h = 0.5 * h + torch.tanh(encoder(x))`` keeps
every earlier step's graph attached.  ``retain_graph=True`` silences "Trying to
backward through the graph a second time", so nothing fails: instead each
backward runs through all earlier steps, and the graph and its saved tensors
grow with every step.  Seed post 000 ("那么你可能会出现内存溢出的情况,并且,
每一次迭代会比上一次更慢,越往后越慢").  (The recurrence here saves no
parameter; with an LSTM, whose old graph saved the weights the optimizer then
updates, torch fails instead: see ``lstm_retain_graph_bug.py``.)

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``rnn_retain_graph_fixed.py``.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    encoder = nn.Linear(8, 64)
    head = nn.Linear(64, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.01)
    h = torch.zeros(32, 64)
    for _ in range(8):
        opt.zero_grad()
        x = torch.randn(32, 8)
        h = 0.5 * h + torch.tanh(encoder(x))  # graphwatch: carried
        loss = head(h).pow(2).mean()
        loss.backward(retain_graph=True)
        opt.step()


if __name__ == "__main__":
    main()
