"""Reproduces: an LSTM language model whose `train_step()` returns the hidden state `(h, c)` and the loop
feeds it back in without detaching it (forum: "backward through the graph a second time" in a train_step
helper).  The fix detaches the tuple element by element.  EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX:     output, hidden = model(x, hidden)  # HERE =>     hidden = tuple(h.detach() for h in hidden)\n    output, hidden = model(x, hidden)
"""
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.rnn, self.out = nn.Embedding(20, 8), nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 20)

    def forward(self, x, hidden):
        output, hidden = self.rnn(self.embed(x), hidden)
        return self.out(output), hidden


def train_step(model, opt, x, y, hidden):
    opt.zero_grad()
    output, hidden = model(x, hidden)  # HERE
    loss = nn.functional.cross_entropy(output.reshape(-1, 20), y.reshape(-1))
    loss.backward()
    opt.step()
    return loss.item(), hidden


torch.manual_seed(0)
model = LM()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
stream = torch.randint(0, 20, (4, 61))
hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
for step in range(6):
    x, y = stream[:, step * 10 : step * 10 + 10], stream[:, step * 10 + 1 : step * 10 + 11]
    loss, hidden = train_step(model, opt, x, y, hidden)
    print(f"step {step} loss {loss:.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
