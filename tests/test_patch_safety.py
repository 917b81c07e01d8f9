"""A patch only if it can be right (issue 39, point 3): real scripts, real runs, real patches.

- Two losses that share one expression, each reaching what the other's optimizer trains: a ``.detach()`` in
  the shared expression would cut both (the second loss has no graph left), so each loss gets its own copy
  of it, only where that copy computes what the shared expression held; else words, and no patch.
- A patch whose check failed is never offered as the fix (terminal, HTML report, ``--patch-out`` file); one no
  check ran for says it is unchecked.
- ``--check-fixes`` judges a finding by its own holder and line (not by a line another finding also cites),
  and checks a run's patches together, as ``--patch-out`` writes them, with one more run.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from test_check_fixes import checked_warm, diff, graphwatch_run, original_run, write

import graphwatch
from graphwatch.analysis.codemods import apply_edits
from graphwatch.model import Edit, PatchCheck
from graphwatch.rendering.finding_blocks import numbered_patches
from graphwatch.rendering.findings_html import finding_articles
from graphwatch.rendering.patch_file import combined_patch
from graphwatch.rendering.terminal import print_summary

# A critic and a Lagrange multiplier whose constraint term is written once and used by both losses
SHARED_TERM = """import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
log_alpha = torch.zeros((), requires_grad=True)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
alpha_opt = torch.optim.Adam([log_alpha], lr=1e-2)
for step in range(2):
    q_data = critic(torch.randn(8, 6))
    q_random = critic(torch.randn(8, 6))
    gap = (q_random - q_data).mean()
    td_loss = (q_data - torch.randn(8, 1)).pow(2).mean()
    alpha = log_alpha.exp()
    min_q_loss = alpha * (gap - 1.0)
    critic_loss = td_loss + min_q_loss
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    alpha_loss = -min_q_loss
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()
"""

# Two lists keep the graphs of one step: each is its own finding, with its own patch; the growth is both's
TWO_HOLDERS = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses, penalties = [], []
for step in range(5):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    penalty = model.weight.pow(2).sum()
    (loss + penalty).backward()
    opt.step()
    losses.append(loss)
    penalties.append(penalty)
print(f"mean {torch.stack(losses).mean().item():.6f} {torch.stack(penalties).mean().item():.6f}")
"""
UNCHECKED = "unchecked: `graphwatch run --check-fixes` re-runs it"


def summary(trace: graphwatch.Trace) -> str:
    out = io.StringIO()
    print_summary(trace, console=Console(file=out, width=1000, color_system=None))
    return out.getvalue()


@pytest.fixture(scope="module")
def checked_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, graphwatch.Trace, str]:
    """TWO_HOLDERS under ``graphwatch run --check-fixes --patch-out``: (its stderr, its trace, the patch file)."""
    folder = tmp_path_factory.mktemp("two-holders")
    write(folder, "train.py", TWO_HOLDERS)
    report, patches = folder.parent / f"{folder.name}-report", folder.parent / f"{folder.name}.patch"
    done = graphwatch_run("--check-fixes", "--out", str(report), "--patch-out", str(patches), "train.py", cwd=folder)
    assert done.returncode == 0, done.stderr
    return done.stderr, graphwatch.load(report / "trace.json"), patches.read_text()


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, graphwatch.Trace]]:
    """TWO_HOLDERS run in this process, no check: (the script, its trace)."""
    script = write(tmp_path_factory.mktemp("plain"), "train.py", TWO_HOLDERS)
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield script, original_run(script, monkeypatch)


def kept(trace: graphwatch.Trace) -> list[graphwatch.Finding]:
    return [f for f in trace.findings if f.kind == "graph-kept-alive"]


def first_kept_checked(script: Path, patch: str) -> PatchCheck:
    """``patch`` checked against the first graph-kept-alive finding of ``script`` (a train.py), in a process
    forked off the tests' warm Python (a check from this process would start its patched run cold)."""
    [check], _ = checked_warm(script, "graph-kept-alive", patch, first=True)
    return check


def test_two_losses_sharing_one_expression_each_get_their_own_copy_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    trace = original_run(write(tmp_path, "train.py", SHARED_TERM), monkeypatch)
    [finding] = [f for f in trace.findings if f.kind == "backward-through-freed-graph"]
    [remedy] = finding.remedies
    assert remedy.text.startswith("give each loss its own expression: `min_q_loss` at train.py:15 is used by the "
                                  "losses of both backwards (train.py:18 and train.py:22), so a `.detach()` there "
                                  "would cut both")  # fmt: skip
    assert "in the loss of the backward at train.py:22, a copy with `gap` detached" in remedy.text
    assert "in the loss of the backward at train.py:18, a copy with `alpha` detached" in remedy.text
    assert finding.patch is not None  # was: `alpha.detach() * (gap.detach() - 1.0)` on line 15: alpha_loss had no graph
    assert "-    min_q_loss" not in finding.patch
    assert "+    critic_loss = td_loss + (alpha.detach() * (gap - 1.0))\n" in finding.patch
    assert "+    alpha_loss = -(alpha * (gap.detach() - 1.0))\n" in finding.patch


def test_a_shared_expression_with_an_unnamed_value_to_detach_gets_words_and_no_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    script = SHARED_TERM.replace("    alpha = log_alpha.exp()\n", "").replace("alpha * (gap", "log_alpha.exp() * (gap")
    trace = original_run(write(tmp_path, "train.py", script), monkeypatch)
    [finding] = [f for f in trace.findings if f.kind == "backward-through-freed-graph"]
    [remedy] = finding.remedies
    assert finding.patch is None and not remedy.mechanical and not remedy.edits  # was: `gap.detach()` on the shared line
    assert "in the loss of the backward at train.py:17, a copy with what train.py:14 makes from alpha_opt's " \
        "parameters detached" in remedy.text


@pytest.mark.parametrize("change", [
    ("    critic_opt.step()\n", "    critic_opt.step()\n    gap = gap * 2\n"),  # a name the copy reads, changed
    ("alpha * (gap - 1.0)", "alpha * (gap - torch.rand(()))"),  # a call: the copy could compute another value
    ("alpha = log_alpha.exp()", "alpha = log_alpha"),  # a parameter the step between changes in place
    ("    critic_opt.step()\n", "    critic_opt.step()\n    rescale(gap)\n"),  # a call that could change it
])  # fmt: skip
def test_no_own_copy_where_it_could_compute_another_value(change: tuple[str, str]) -> None:
    source = SHARED_TERM.replace(*change)
    line = next(i for i, text in enumerate(source.splitlines(), 1) if text == "    alpha_loss.backward()")
    assert apply_edits(SHARED_TERM, [Edit("own-copy", "train.py", 22, "gap", until=15)]) is not None
    assert apply_edits(source, [Edit("own-copy", "train.py", line, "gap", until=15)]) is None


def test_a_finding_is_judged_by_its_own_holder_and_line_not_by_a_growth_another_holder_explains(
    checked_run: tuple[str, graphwatch.Trace, str],
) -> None:
    """Each patch leaves the other list keeping its graphs, and the growth that list explains: that growth is
    the other finding's, so each patch is checked (it was FAILED: "the finding is still there")."""
    _, trace, _ = checked_run
    findings = kept(trace)
    assert [f.evidence["holder"] for f in findings] == ["losses", "penalties"]
    for finding in findings:
        assert finding.check is not None and finding.check.checked, finding.check
        assert "the finding is gone" in finding.check.held and "no new finding" in finding.check.held


def test_the_patches_of_a_run_are_checked_together_once_as_patch_out_writes_them(
    checked_run: tuple[str, graphwatch.Trace, str],
) -> None:
    stderr, trace, patch_file = checked_run
    assert stderr.count("checking the 2 patches together, as --patch-out writes them") == 1
    assert "patches checked together" in stderr
    for finding in kept(trace):
        assert finding.check is not None
        assert finding.check.held[-1] == "checked with the run's 1 other patch applied too, as --patch-out writes them"
    assert "+    losses.append(loss.detach())\n+    penalties.append(penalty.detach())\n" in patch_file
    assert UNCHECKED not in patch_file and "left out" not in patch_file


def test_a_patch_printed_without_check_fixes_says_it_is_unchecked(plain_run: tuple[Path, graphwatch.Trace]) -> None:
    script, trace = plain_run
    assert len({f.patch for f in kept(trace) if f.patch}) == 2 and all(f.check is None for f in trace.findings)
    assert summary(trace).count(f"check: {UNCHECKED}") == 2
    html = "".join(finding_articles(trace.findings, trace.sources, cwd=str(script.parent)))
    assert html.count(f'<p class="check unchecked"><strong>Check:</strong> {UNCHECKED}</p>') == 2
    assert combined_patch(trace.findings, script.parent).splitlines()[1] == f"# {UNCHECKED}"


def test_a_patch_whose_check_failed_is_never_offered_as_the_fix(plain_run: tuple[Path, graphwatch.Trace]) -> None:
    """A wrong patch (the loss detached before its backward: the bias gets no gradient) fails its check: the
    summary and the report show it as text under the reason, and ``--patch-out`` leaves it out."""
    script, original = plain_run
    trace = copy.deepcopy(original)
    first, second = kept(trace)
    wrong = diff(script, "    (loss + penalty).backward()", "    (loss.detach() + penalty).backward()")
    first.patch, first.check = wrong, first_kept_checked(script, wrong)
    assert not first.check.checked and "model.bias: got no gradient in the patched run, stepped by opt (SGD)" in \
        "; ".join(first.check.failed)
    assert list(numbered_patches(trace.findings, str(script.parent)).values()) == [1]  # the other patch only
    assert second.patch in numbered_patches(trace.findings, str(script.parent))
    printed = summary(trace)
    assert "patch, not for copying: its check failed (the check below says why): it is not the fix to apply" in printed
    assert "check: FAILED: the finding is still there" in printed
    html = finding_articles(trace.findings, trace.sources, cwd=str(script.parent))[0]
    assert 'class="copy"' not in html and "Its check failed (the check below says why)" in html
    assert '<p class="check failed"><strong>Check:</strong> FAILED: the finding is still there' in html
    patch_file = combined_patch(trace.findings, script.parent)
    assert "# left out: the patch of graph-kept-alive at train.py:14, whose check failed: the finding is still " \
        "there" in patch_file
    assert "loss.detach() + penalty" not in patch_file and "+    penalties.append(penalty.detach())" in patch_file
