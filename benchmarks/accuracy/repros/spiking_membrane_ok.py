"""The correct twin of `spiking_membrane_bug.py`: the spiking network's membrane potential, kept on the neuron
as `self.mem`, is detached at the start of each batch (snntorch issue #250: the state reset or detached between
batches, as `utils.reset(net)` does for snntorch's neurons), so it carries its value into the next batch and no
graph.  EXPECT: silent
"""
import torch
from torch import nn


class Leaky(nn.Module):
    """A leaky integrate-and-fire neuron: the membrane decays by `beta`, integrates its input, and spikes
    (a sigmoid surrogate of the threshold's step) when it crosses `threshold`."""

    def __init__(self, size, beta=0.9, threshold=1.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold
        self.mem = torch.zeros(size)

    def forward(self, x):
        self.mem = self.beta * self.mem + x
        return torch.sigmoid(4.0 * (self.mem - self.threshold))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.lif, self.fc2 = nn.Linear(6, 10), Leaky(10), nn.Linear(10, 2)

    def forward(self, x):
        return self.fc2(self.lif(self.fc1(x)))


torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
inputs, targets = torch.randn(5, 8, 6), torch.randn(5, 2)
for batch in range(5):
    net.lif.mem = net.lif.mem.detach()
    opt.zero_grad()
    out = torch.stack([net(inputs[batch, t]) for t in range(8)]).mean(0)
    loss = nn.functional.mse_loss(out, targets[batch])
    loss.backward()
    opt.step()
    print(f"batch {batch} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in net.parameters()))
