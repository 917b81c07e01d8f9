"""Reproduces: "LSTM: Trying to backward through the graph a second time" (forum; hidden state (h, c) of
nn.LSTM fed into the next batch without repackaging).  EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX:     output, hidden = model(x, hidden)  # HERE =>     hidden = tuple(h.detach() for h in hidden)\n    output, hidden = model(x, hidden)
"""
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.out = nn.LSTM(8, 16), nn.Linear(16, 8)

    def forward(self, x, hidden):
        output, hidden = self.rnn(x, hidden)
        return self.out(output), hidden


torch.manual_seed(0)
model = LM()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
for step in range(5):
    x = torch.randn(6, 4, 8)
    opt.zero_grad()
    output, hidden = model(x, hidden)  # HERE
    loss = (output - x).pow(2).mean()
    loss.backward()
    opt.step()
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
