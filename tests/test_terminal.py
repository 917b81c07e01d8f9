"""The terminal summary, from real training loops run under graphwatch, rendered into in-memory consoles."""

from __future__ import annotations

import doctest
import io
import re
from pathlib import Path

import pytest
import torch
from rich.console import Console
from rich.panel import Panel

import graphwatch
from graphwatch.model import Trace
from graphwatch.rendering import charts, sources, terminal, wording
from graphwatch.rendering.terminal import Summary, make_console, print_summary

ANSI = re.compile(r"\x1b\[")
# (named here: the summary's patch shows the lines around the one it edits, which must not spell it)
FIXES_HEADING = "Fixes, best first:"
HERE = Path(__file__).name


def line_of(text: str) -> int:
    """The number of the first line of this file that contains ``text``."""
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def render(renderable: object, terminal_: bool = False, width: int = 120) -> str:
    console = Console(
        file=io.StringIO(), width=width, force_terminal=terminal_, color_system="standard" if terminal_ else None
    )
    console.print(renderable)
    return console.file.getvalue()


# ------------------------------------------------------------------------ real runs
@pytest.fixture(scope="module")
def rnn_leak() -> Trace:
    """An RNN whose hidden state is never detached, backwarded with retain_graph=True: 30 steps, each seen in
    full detail (``level="full"``: the tests read the carried graph and the memory of every step, where the
    default level sees steps light once the retained graph is judged)."""
    torch.manual_seed(0)
    cell = torch.nn.RNNCell(4, 8)
    h = torch.zeros(2, 8)
    with graphwatch.watch(summary=False, snapshots="off", level="full") as gw:
        for _ in range(30):
            with gw.step():
                h = cell(torch.randn(2, 4), h)  # the carried hidden state
                loss = h.pow(2).sum()
                loss.backward(retain_graph=True)
    return gw.trace


def clean_run(steps: int) -> Trace:
    """The trace of ``steps`` clean SGD steps of a small MLP."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
    return gw.trace


@pytest.fixture(scope="module")
def clean() -> Trace:
    return clean_run(8)


@pytest.fixture(scope="module")
def backward_twice() -> Trace:
    """The hidden state carried without retain_graph: the second step's backward fails."""
    torch.manual_seed(0)
    cell = torch.nn.RNNCell(4, 8)
    opt = torch.optim.SGD(cell.parameters(), lr=0.01)
    h = torch.zeros(2, 8)
    with pytest.raises(graphwatch.BackwardTwiceError):
        with graphwatch.watch(summary=False, snapshots="off") as gw:
            for _ in range(5):
                opt.zero_grad()
                h = cell(torch.randn(2, 4), h)
                h.pow(2).sum().backward()
                opt.step()
    return gw.trace


@pytest.fixture(scope="module")
def interrupted() -> Trace:
    model = torch.nn.Linear(4, 1)
    with pytest.raises(KeyboardInterrupt):
        with graphwatch.watch(summary=False, snapshots="off") as gw:
            for step in range(10):
                model(torch.randn(8, 4)).sum().backward()
                if step == 2:
                    raise KeyboardInterrupt
    return gw.trace


# --------------------------------------------------------------------------- verdict
def test_clean_run_says_no_leaks(clean: Trace) -> None:
    out = render(Summary(clean))
    assert out.splitlines()[0] == "graphwatch: no graph leaks in 8 steps"
    assert "findings" not in out and "ended early" not in out
    assert "per step" in out and "live saved tensors" in out and "nodes alive" in out


def test_leak_verdict_counts_problems_first(rnn_leak: Trace) -> None:
    out = render(Summary(rnn_leak))
    problems = len(wording.problems(rnn_leak))
    assert problems >= 1
    assert out.splitlines()[0] == f"graphwatch: {problems} problem{'s' * (problems > 1)} in 30 steps"


def test_empty_trace(clean: Trace) -> None:
    out = render(Summary(Trace()))
    assert out.strip() == "graphwatch: no steps recorded"


# -------------------------------------------------------------------------- findings
def test_findings_panel_names_kind_steps_fix_and_lines(rnn_leak: Trace) -> None:
    out = render(Summary(rnn_leak))
    for finding in rnn_leak.findings:
        assert f"{finding.kind}  {wording.steps_text(wording.finding_steps(finding))}" in out
    assert "graph-carried-across-steps" in out
    assert "steps 1–29" in out  # the carried graph, seen from step 1 on
    assert "fix: `h = h.detach()`" in out
    assert f"{HERE}:{line_of('# the carried hidden state')}" in out
    assert f"{HERE}:{line_of('loss.backward(retain_graph=True)')}" in out


def test_backward_twice_finding_and_early_end(backward_twice: Trace) -> None:
    out = render(Summary(backward_twice))
    assert "backward-through-freed-graph" in out
    assert "the run ended early: BackwardTwiceError\n" in out  # the error itself holds torch's text and ours
    assert "explained, with its fixes, in the error that ended the run" in out
    assert f"{HERE}:{line_of('h.pow(2).sum().backward()')}" in out


def test_keyboard_interrupt_is_reported(interrupted: Trace) -> None:
    out = render(Summary(interrupted))
    assert "the run ended early: KeyboardInterrupt" in out.splitlines()


# ------------------------------------------------------------------ table, sparklines
def step_rows(out: str) -> list[int]:
    """Step numbers of the per-step table's rows."""
    return [int(m[1]) for m in re.finditer(r"^\s+(\d+)\s+\d+\s+\d+ · ", out, re.MULTILINE)]


def test_long_run_table_is_sampled(rnn_leak: Trace) -> None:
    out = render(Summary(rnn_leak))
    marked = sorted(wording.marked_steps(rnn_leak))
    shown = step_rows(out)
    assert shown[:5] == [0, 1, 2, 3, 4] and shown[-5:] == [25, 26, 27, 28, 29]
    assert set(marked) <= set(shown) and len(shown) < 30
    omitted = sum(int(n) for n in re.findall(r"(\d+) steps omitted", out))
    assert omitted == 30 - len(shown)
    assert f"{len(shown)} of 30 steps shown" in out


def test_short_run_shows_every_step(clean: Trace) -> None:
    out = render(Summary(clean))
    assert step_rows(out) == list(range(8))
    assert "omitted" not in out


def test_sparklines_show_growing_memory(rnn_leak: Trace) -> None:
    line = next(row for row in render(Summary(rnn_leak)).splitlines() if row.startswith("nodes alive"))
    spark = line.split()[2]
    assert spark[0] == "▁" and spark[-1] == "█"
    assert f"{rnn_leak.steps[0].live_nodes} → {rnn_leak.steps[-1].live_nodes}" in line


# ---------------------------------------------------------------- report, composing
def test_report_location_is_printed(clean: Trace, tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=200)
    print_summary(clean, console=console, report=tmp_path / "rep")
    print_summary(clean, console=console, report=tmp_path / "rep" / "index.html")
    lines = console.file.getvalue().splitlines()
    assert lines.count(f"report: {tmp_path / 'rep' / 'index.html'}") == 2


def test_summary_composes_with_other_renderables(clean: Trace) -> None:
    out = render(Panel(Summary(clean, title="mlp"), title="example"))
    assert "graphwatch: no graph leaks in 8 steps  (mlp)" in out and "example" in out


# ------------------------------------------------------------------- colour or plain
def test_terminal_gets_colour(rnn_leak: Trace) -> None:
    assert ANSI.search(render(Summary(rnn_leak), terminal_=True))


def test_plain_text_when_not_a_terminal(rnn_leak: Trace) -> None:
    file = io.StringIO()
    print_summary(rnn_leak, console=make_console(file))
    assert "graph-carried-across-steps" in file.getvalue()
    assert not ANSI.search(file.getvalue())


@pytest.mark.parametrize("no_color", ["", "1"])
def test_no_color_env_gives_plain_text_on_a_terminal(
    rnn_leak: Trace, no_color: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # a terminal, as far as rich can tell
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("NO_COLOR", no_color)
    print_summary(rnn_leak)
    err = capsys.readouterr().err
    assert "graphwatch: " in err and " in 30 steps" in err
    assert bool(ANSI.search(err)) is not bool(no_color)


def test_ascii_console_gets_ascii_text(rnn_leak: Trace) -> None:
    console = Console(file=io.TextIOWrapper(io.BytesIO(), encoding="ascii"), width=120)
    assert console.options.ascii_only
    console.print(Summary(rnn_leak))
    console.file.seek(0)
    out = console.file.read()
    assert out.isascii() and "graph-carried-across-steps" in out
    spark = next(line for line in out.splitlines() if line.startswith("nodes alive")).split()[2]
    assert spark[0] == "_" and spark[-1] == "@"


@pytest.mark.parametrize("module", [terminal, wording, charts, sources], ids=lambda m: m.__name__)
def test_docstring_examples_run(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed


def test_a_backward_twice_explanation_is_printed_once() -> None:
    """The error that ends the run carries the explanation with its fixes, best first; the summary points at
    it in one line, names the early end by the error's type, and repeats no fix."""
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(graphwatch.BackwardTwiceError) as raised, graphwatch.watch(summary=False) as gw:
        y = (x.exp() * 2).sum()
        y.backward()
        y.backward()
    finding = next(f for f in gw.findings if f.kind == "backward-through-freed-graph")
    assert finding.message in str(raised.value) and FIXES_HEADING in str(raised.value)
    text = render(Summary(gw.trace))
    assert FIXES_HEADING not in text and "fix: " not in text and finding.message not in text
    assert "explained, with its fixes, in the error that ended the run" in text
    assert "the run ended early: BackwardTwiceError\n" in text


def test_a_caught_backward_twice_error_is_explained_in_the_summary_with_its_fixes_once() -> None:
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        y = (x.exp() * 2).sum()
        y.backward()
        try:
            y.backward()
        except RuntimeError:
            pass  # the run goes on: the summary is where the explanation is read
    text = render(Summary(gw.trace), width=400)
    assert "Fixes, best first:" in text and "fix: " not in text and "ended early" not in text


def test_an_early_end_without_an_explanation_is_one_short_line_cut_at_a_word() -> None:
    trace = Trace(ended_early="RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total)")
    line = next(row for row in render(Summary(trace)).splitlines() if "ended early" in row)
    assert line.strip() == "the run ended early: RuntimeError: CUDA out of memory"


def test_the_footer_range_ends_at_the_loops_last_step_and_names_the_peak() -> None:
    """The session's own last step (after the loop, graphs let go) does not hide the growth."""
    from graphwatch.model import StepRecord

    steps = [StepRecord(index=i, source="optimizer", live_activation_bytes=1024 * i, live_nodes=10 * i) for i in range(4)]
    steps.append(StepRecord(index=4, source="session-end"))
    text = render(Summary(Trace(steps=steps)))
    assert "0 B → 3.0 KiB (max 3.0 KiB, step 3)" in text
    assert "0 → 30 (max 30, step 3)" in text


def test_output_to_no_terminal_is_not_hard_wrapped(rnn_leak: Trace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI log or `| tee` gets each finding's message on one line (no 80-column wrap breaking code spans),
    no box as wide as the log, and no line padded with spaces to the console's width."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    print_summary(rnn_leak, console=make_console(out))
    lines = out.getvalue().splitlines()
    for finding in rnn_leak.findings:
        assert f"  {finding.message}" in lines
    assert "findings" in lines and not any(line.startswith("╭") for line in lines)
    assert max(len(line) for line in lines) <= max(len(f.message) for f in rnn_leak.findings) + 10
    # no table row is padded; a patch is printed as it is (a blank line of its context is one space)
    patched = {line for f in rnn_leak.findings if f.patch for line in f.patch.splitlines()}
    assert patched, "no patch to look at"
    assert not [line for line in lines if line.endswith(" ") and line not in patched]
    assert all(f.patch in out.getvalue() for f in rnn_leak.findings if f.patch)


def test_a_sampled_table_of_a_run_with_no_finding_names_no_finding_in_its_caption() -> None:
    """30 clean steps: the table shows the first and the last, and says only that (no finding was seen)."""
    trace = clean_run(30)
    assert not trace.findings
    out = render(Summary(trace))
    shown = step_rows(out)
    assert shown == [0, 1, 2, 3, 4, 25, 26, 27, 28, 29]
    assert re.search(r"^10 of 30 steps shown: the first and the last *$", out, re.MULTILINE), out


def test_the_reasons_for_full_detail_past_those_listed_are_counted_in_the_right_number() -> None:
    from graphwatch.model import DetailSpan, StepRecord

    steps = [StepRecord(index=i, source="optimizer") for i in range(100)]
    spans = [DetailSpan(0, 3, "first steps"), DetailSpan(20, 21, "a signal"), DetailSpan(64, 65, "sampled")]
    trace = Trace(options={"level": "default"}, steps=steps, full_detail=spans)
    assert "(first steps); 2 more reasons; the other" in wording.detail_text(trace, groups=1)
    assert "(a signal); 1 more reason; the other" in wording.detail_text(trace, groups=2)
