"""The fixes of "backward through the graph a second time", derived from what ran: each program here is a
script written to a temporary folder and run under graphwatch; the finding's remedy is applied to the file
with its edits, and the patched script must print what its correct twin prints (what trains is unchanged).
The fixes that must not be offered are checked too: no sum of the losses and no ``retain_graph=True`` where
the two backwards serve different optimizers, no detach in the generator's step.
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
from pathlib import Path

import pytest
import torch

import graphwatch
from graphwatch.analysis.codemods import CODEMODS, apply_edits
from graphwatch.model import Finding

pytestmark = pytest.mark.usefixtures("no_session_left")

HEAD = "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"

GAN = HEAD + """\
G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
D = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=0.01), torch.optim.Adam(D.parameters(), lr=0.01)
bce = nn.BCEWithLogitsLoss()
for step in range(3):
    fake = G(torch.randn(8, 4))  # at: made
    opt_d.zero_grad()
    err_real = bce(D(torch.randn(8, 2)), torch.ones(8, 1))
    err_real.backward()
    output = D(fake)  # at: d-use
    err_fake = bce(output, torch.zeros(8, 1))
    err_fake.backward()
    opt_d.step()
    opt_g.zero_grad()
    output = D(fake)  # at: g-use
    err_g = bce(output, torch.ones(8, 1))
    err_g.backward()
    opt_g.step()
    print(f"{err_real.item():.6f} {err_fake.item():.6f} {err_g.item():.6f}")
"""
GAN_FIXED = GAN.replace("output = D(fake)  # at: d-use", "output = D(fake.detach())  # at: d-use")

GENERATOR_FIRST = HEAD + """\
class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def forward(self, img):
        return self.model(img.view(img.size(0), -1))


G, D = nn.Sequential(nn.Linear(4, 6), nn.Tanh()), Discriminator()
opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=0.01), torch.optim.Adam(D.parameters(), lr=0.01)
bce = nn.BCEWithLogitsLoss()
for step in range(3):
    opt_g.zero_grad()
    gen_imgs = G(torch.randn(8, 4)).view(8, 2, 3)
    g_loss = bce(D(gen_imgs), torch.ones(8, 1))
    g_loss.backward()
    opt_g.step()
    opt_d.zero_grad()
    fake_loss = bce(D(gen_imgs), torch.zeros(8, 1))  # at: d-use
    d_loss = (bce(D(torch.randn(8, 2, 3)), torch.ones(8, 1)) + fake_loss) / 2
    d_loss.backward()
    opt_d.step()
    print(f"{g_loss.item():.6f} {d_loss.item():.6f}")
"""
GENERATOR_FIRST_FIXED = GENERATOR_FIRST.replace("bce(D(gen_imgs), torch.zeros", "bce(D(gen_imgs.detach()), torch.zeros")

CRITIC = HEAD + """\
q_net = nn.Linear(4, 1)
log_alpha = torch.zeros(1, requires_grad=True)
opt_c = torch.optim.Adam(q_net.parameters(), lr=0.01)
opt_a = torch.optim.Adam([log_alpha], lr=0.01)
for step in range(3):
    s, target = torch.randn(16, 4), torch.randn(16, 1)
    q = q_net(s)
    gap = q.pow(2).mean() - 1.0  # at: gap
    alpha = log_alpha.exp()  # at: alpha
    critic_loss = (q - target).pow(2).mean() + alpha * gap  # at: critic-loss
    opt_c.zero_grad()
    critic_loss.backward()
    opt_c.step()
    alpha_loss = -(log_alpha * gap)  # at: alpha-loss
    opt_a.zero_grad()
    alpha_loss.backward()
    opt_a.step()
    print(f"{critic_loss.item():.6f} {alpha_loss.item():.6f} {log_alpha.item():.6f}")
"""
CRITIC_FIXED = CRITIC.replace("alpha * gap  # at: critic", "alpha.detach() * gap  # at: critic").replace(
    "-(log_alpha * gap)", "-(log_alpha * gap.detach())"
)

ACTOR_CRITIC = HEAD + """\
actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)
opt_a, opt_c = torch.optim.Adam(actor.parameters(), lr=0.01), torch.optim.Adam(critic.parameters(), lr=0.01)
for step in range(3):
    s, reward = torch.randn(16, 4), torch.randn(16, 1)
    logp = actor(s).log_softmax(-1)[:, :1]
    advantage = reward - critic(s)  # at: advantage
    actor_loss = -(logp * advantage).mean()  # at: actor-loss
    critic_loss = advantage.pow(2).mean()  # at: critic-loss
    opt_a.zero_grad()
    actor_loss.backward()
    opt_a.step()
    opt_c.zero_grad()
    critic_loss.backward()
    opt_c.step()
    print(f"{actor_loss.item():.6f} {critic_loss.item():.6f}")
"""
ACTOR_CRITIC_FIXED = ACTOR_CRITIC.replace("(logp * advantage)", "(logp * advantage.detach())")

FORCES = HEAD + """\
model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(3):
    pos = torch.randn(8, 3, requires_grad=True)
    energy = model(pos)
    forces = -torch.autograd.grad(energy.sum(), pos)[0]  # at: grad
    e_loss = (energy - 1).pow(2).mean()
    f_loss = (forces - 0.5).pow(2).mean()
    opt.zero_grad()
    (e_loss + f_loss).backward()
    opt.step()
    print(f"{e_loss.item():.6f} {f_loss.item():.6f}")
"""
FORCES_FIXED = FORCES.replace("grad(energy.sum(), pos)", "grad(energy.sum(), pos, create_graph=True)")

GRAD_NORM = HEAD + """\
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    norm = sum(g.norm() for g in torch.autograd.grad(loss, list(model.parameters())))  # at: grad
    opt.zero_grad()
    loss.backward()  # at: backward
    opt.step()
    print(f"{loss.item():.6f} {norm.item():.6f}")
"""
GRAD_NORM_FIXED = GRAD_NORM.replace("list(model.parameters()))", "list(model.parameters()), retain_graph=True)")

TWICE = HEAD + """\
model = nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = model(torch.randn(4, 3)).pow(2).mean()
    loss.backward()
    loss.backward()  # at: second
    opt.step()
    print(f"{loss.item():.6f}")
"""
TWICE_FIXED = TWICE.replace("    loss.backward()  # at: second\n", "")

STYLE = HEAD + """\
def gram(x):
    flat = x.view(x.size(0), -1)
    return torch.mm(flat, flat.t()).div(flat.numel())


class StyleLoss(nn.Module):
    def __init__(self, target_feature):
        super().__init__()
        self.target = gram(target_feature)  # at: target

    def forward(self, x):
        self.loss = (gram(x) - self.target).pow(2).sum()
        return x


features = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
model = nn.Sequential(features, StyleLoss(features(torch.randn(4, 6))))
image = torch.randn(4, 6, requires_grad=True)
optimizer = torch.optim.LBFGS([image])


def closure():
    optimizer.zero_grad()
    model(image)
    loss = model[1].loss
    loss.backward()
    return loss


for step in range(2):
    optimizer.step(closure)
"""

# A mean teacher: the consistency loss uses the teacher's outputs, and its EMA update runs outside no_grad (the
# loop rebinds ``tp`` in a nested for: no state the step carries)
EMA_CONSISTENCY = HEAD + """\
import copy

student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
teacher = copy.deepcopy(student)
for p in teacher.parameters():
    p.requires_grad_(False)
opt = torch.optim.SGD(student.parameters(), lr=0.05)
for step in range(4):
    x = torch.randn(16, 8)
    loss = (student(x) - x.sum(1, keepdim=True)).pow(2).mean() + (student(x) - teacher(x)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for tp, sp in zip(teacher.parameters(), student.parameters()):
        tp.mul_(0.99).add_(0.01 * sp)  # at: ema
    print(f"{loss.item():.6f}")
"""
EMA_CONSISTENCY_FIXED = EMA_CONSISTENCY.replace(
    "        tp.mul_(0.99).add_(0.01 * sp)  # at: ema", "        with torch.no_grad():\n            tp.mul_(0.99).add_(0.01 * sp)"
)


def line(source: str, tag: str) -> int:
    lines = [n for n, text in enumerate(source.splitlines(), 1) if text.endswith(f"# at: {tag}")]
    assert len(lines) == 1, tag
    return lines[0]


def run_watched(script: Path) -> Finding:
    """Run ``script`` under graphwatch; the finding of the error it raises."""
    with pytest.raises(graphwatch.BackwardTwiceError) as info, contextlib.redirect_stdout(io.StringIO()):
        with graphwatch.watch(summary=False, snapshots="off"):
            runpy.run_path(str(script), run_name="__main__")
    return info.value.finding


def printed(script: Path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()


def patched_twin(tmp_path: Path, source: str, finding: Finding) -> Path:
    """The script with the first remedy's edits applied (it must be mechanical, and apply)."""
    remedy = finding.remedies[0]
    assert remedy.mechanical and remedy.edits, remedy
    patched = apply_edits(source, remedy.edits)
    assert patched is not None, remedy.edits
    path = tmp_path / "patched.py"
    path.write_text(patched)
    return path


def write(tmp_path: Path, source: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def edits(finding: Finding) -> list[tuple[str, int, str]]:
    return [(e.kind, e.line, e.target) for r in finding.remedies for e in r.edits]


def offers_sum_or_retain(finding: Finding) -> bool:
    return any("retain_graph=True" in r.text or re.search(r"\(\S+ \+ \S+\)\.backward", r.text) for r in finding.remedies)


def test_gan_detaches_fake_where_the_discriminators_loss_uses_it(tmp_path: Path) -> None:
    script = write(tmp_path, GAN)
    finding = run_watched(script)
    assert edits(finding) == [("detach-use", line(GAN, "d-use"), "fake")]  # never the generator's line
    assert line(GAN, "g-use") not in [e.line for r in finding.remedies for e in r.edits]
    assert not offers_sum_or_retain(finding)
    assert f"`fake` produced at {script}:{line(GAN, 'made')}" in finding.message
    why = finding.remedies[0].why
    assert "opt_d, which steps after the backward at" in why and "they are opt_g's" in why
    assert printed(patched_twin(tmp_path, GAN, finding)) == printed(write(tmp_path, GAN_FIXED, "fixed.py"))


def test_generator_first_gan_detaches_in_the_discriminators_loss_through_its_view(tmp_path: Path) -> None:
    """The discriminator views its input first: the tensor the loop passed it is still the one named."""
    finding = run_watched(write(tmp_path, GENERATOR_FIRST))
    assert edits(finding) == [("detach-use", line(GENERATOR_FIRST, "d-use"), "gen_imgs")]
    assert not offers_sum_or_retain(finding)
    patched = printed(patched_twin(tmp_path, GENERATOR_FIRST, finding))
    assert patched == printed(write(tmp_path, GENERATOR_FIRST_FIXED, "fixed.py"))


def test_critic_and_multiplier_get_two_detaches_and_no_sum(tmp_path: Path) -> None:
    finding = run_watched(write(tmp_path, CRITIC))
    assert sorted(edits(finding)) == [
        ("detach-use", line(CRITIC, "critic-loss"), "alpha"),  # the multiplier in the critic's loss
        ("detach-use", line(CRITIC, "alpha-loss"), "gap"),  # the gap in the multiplier's loss
    ]
    assert not offers_sum_or_retain(finding)
    assert printed(patched_twin(tmp_path, CRITIC, finding)) == printed(write(tmp_path, CRITIC_FIXED, "fixed.py"))


def test_actor_critic_detaches_the_advantage_in_the_actors_loss(tmp_path: Path) -> None:
    script = write(tmp_path, ACTOR_CRITIC)
    finding = run_watched(script)
    assert edits(finding) == [("detach-use", line(ACTOR_CRITIC, "actor-loss"), "advantage")]
    assert f"`advantage` produced at {script}:{line(ACTOR_CRITIC, 'advantage')}" in finding.message
    assert not offers_sum_or_retain(finding)
    patched = printed(patched_twin(tmp_path, ACTOR_CRITIC, finding))
    assert patched == printed(write(tmp_path, ACTOR_CRITIC_FIXED, "fixed.py"))


def test_force_matching_gets_create_graph_not_retain_graph(tmp_path: Path) -> None:
    finding = run_watched(write(tmp_path, FORCES))
    assert edits(finding) == [("create-graph", line(FORCES, "grad"), "")]
    assert "`forces`" in finding.remedies[0].why
    assert not offers_sum_or_retain(finding)  # retain_graph=True would leave the force term training nothing
    assert "energy.sum +" not in finding.message
    assert printed(patched_twin(tmp_path, FORCES, finding)) == printed(write(tmp_path, FORCES_FIXED, "fixed.py"))


def test_a_gradient_norm_read_before_the_backward_may_retain_and_says_why(tmp_path: Path) -> None:
    """Both calls reach only the parameters of the one optimizer that steps after both."""
    finding = run_watched(write(tmp_path, GRAD_NORM))
    [remedy] = finding.remedies
    assert remedy.text.startswith("`norm = sum(g.norm() for g in torch.autograd.grad(loss, list(model.parameters()), "
                                  "retain_graph=True))` at ")
    assert remedy.why.startswith("opt owns all 4 parameters both backwards reach")
    assert edits(finding) == [("retain-graph", line(GRAD_NORM, "grad"), "")]
    assert "create_graph" not in finding.message
    assert printed(patched_twin(tmp_path, GRAD_NORM, finding)) == printed(write(tmp_path, GRAD_NORM_FIXED, "fixed.py"))


def test_one_loss_backwarded_twice_drops_the_second_backward(tmp_path: Path) -> None:
    finding = run_watched(write(tmp_path, TWICE))
    assert edits(finding) == [("remove-statement", line(TWICE, "second"), "")]
    assert not offers_sum_or_retain(finding)
    assert printed(patched_twin(tmp_path, TWICE, finding)) == printed(write(tmp_path, TWICE_FIXED, "fixed.py"))


def test_a_style_target_kept_on_a_module_is_detached_where_its_init_makes_it(tmp_path: Path) -> None:
    """LBFGS calls the closure twice in one step; the target, made in ``__init__`` through a helper from
    parameters no optimizer owns, is named as ``__init__`` spells it, on the line that ran."""
    script = write(tmp_path, STYLE)
    finding = run_watched(script)
    assert edits(finding) == [("detach-made", line(STYLE, "target"), "self.target")]
    assert f"`self.target` made at {script}:{line(STYLE, 'target')}" in finding.message
    assert "(loss + loss)" not in finding.message and not offers_sum_or_retain(finding)
    assert "belong to no optimizer" in finding.remedies[0].why
    if "detach-made" in CODEMODS:  # (its codemod is the carried-state work's)
        patched_twin(tmp_path, STYLE, finding)


def test_an_ema_teacher_updated_outside_no_grad_is_named_with_its_update_and_patched_there(tmp_path: Path) -> None:
    """The graph the next step's backward runs into is the teacher's: its parameters, updated in place outside
    no_grad, carry it.  No loop variable is named (``tp`` is rebound by its own for: ``tp = tp.detach()`` there
    would raise before the loop ran once), and no line is read off an op that saved nothing."""
    script = write(tmp_path, EMA_CONSISTENCY)
    finding = run_watched(script)
    assert f"carried into step 2 by `teacher.parameters()`, updated in place outside `torch.no_grad()` at {script}:" \
        f"{line(EMA_CONSISTENCY, 'ema')}" in finding.message  # fmt: skip
    assert "`tp`" not in finding.message and "`loss`" not in finding.message.split("\n", 1)[1]
    assert finding.fix.startswith("update `teacher`'s parameters under `with torch.no_grad():`")
    assert edits(finding) == [("no-grad", line(EMA_CONSISTENCY, "ema"), "")]
    assert "stops recording the graph" in finding.remedies[0].why
    patched = patched_twin(tmp_path, EMA_CONSISTENCY, finding)
    assert printed(patched) == printed(write(tmp_path, EMA_CONSISTENCY_FIXED, "fixed.py"))

def test_every_patch_keeps_what_trains_on_the_correct_twin(tmp_path: Path) -> None:
    """The correct twins themselves run clean under graphwatch (no finding to patch)."""
    for source in (GAN_FIXED, GENERATOR_FIRST_FIXED, CRITIC_FIXED, ACTOR_CRITIC_FIXED, FORCES_FIXED, EMA_CONSISTENCY_FIXED):
        with contextlib.redirect_stdout(io.StringIO()), graphwatch.watch(summary=False, snapshots="off") as gw:
            runpy.run_path(str(write(tmp_path, source, "twin.py")), run_name="__main__")
        assert [f.kind for f in gw.findings if f.severity == "error"] == []
    assert torch.is_grad_enabled()
