"""The HTML report, from real training loops run under graphwatch: files, content, safety, a real browser."""

from __future__ import annotations

import base64
import doctest
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from html import escape, unescape
from pathlib import Path

import pytest
import torch
import warm_python

import graphwatch
from graphwatch.model import CallSite, Finding, Snapshot, SourceLines, StepRecord, Trace
from graphwatch.rendering import html, svg
from graphwatch.rendering.html import write_report
from graphwatch.rendering.svg import DOT_MISSING_NOTICE, DotError, dot_available

CHROMIUM = Path("/usr/bin/chromium")
EXAMPLES = Path(graphwatch.__file__).resolve().parents[2] / "examples"
needs_dot = pytest.mark.skipif(not dot_available(), reason="Graphviz `dot` is not installed")


def line_of(text: str) -> int:
    """The number of the first line of this file that contains ``text``."""
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


# ------------------------------------------------------------------------ real runs
@pytest.fixture(scope="module")
def kept_alive() -> Trace:
    """``total_loss += loss``: every step's graph stays alive."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total_loss = 0
    with graphwatch.watch(summary=False) as gw:
        for _ in range(10):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            total_loss += loss  # keeps every graph
            opt.step()
    return gw.trace


@pytest.fixture(scope="module")
def clean() -> Trace:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total_loss = 0.0
    with graphwatch.watch(summary=False) as gw:
        for _ in range(10):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            total_loss += loss.item()
            opt.step()
    return gw.trace


@pytest.fixture(scope="module")
def backward_twice() -> Trace:
    torch.manual_seed(0)
    cell = torch.nn.RNNCell(4, 8)
    h = torch.zeros(2, 8)
    with pytest.raises(graphwatch.BackwardTwiceError):
        with graphwatch.watch(summary=False) as gw:
            for _ in range(3):
                h = cell(torch.randn(2, 4), h)
                h.sum().backward()
    return gw.trace


@pytest.fixture(scope="module")
def report(kept_alive: Trace, clean: Trace, backward_twice: Trace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report with a section per run, as the demo writes it."""
    out = tmp_path_factory.mktemp("report")
    return write_report(
        [("total_loss += loss", kept_alive), ("total_loss += loss.item()", clean), ("backward twice", backward_twice)], out
    )


# ------------------------------------------------------------------------------ files
def test_files_of_a_combined_report(report: Path, kept_alive: Trace) -> None:
    out = report.parent
    assert report == out / "index.html"
    traces = [graphwatch.load(p) for p in sorted(out.glob("trace-*.json"))]
    assert len(traces) == 3
    assert [f.kind for f in traces[0].findings] == [f.kind for f in kept_alive.findings]
    if dot_available():
        assert len(list((out / "snapshots").glob("*.svg"))) == sum(len(t.snapshots) for t in traces)
    assert not [p for p in out.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def test_single_trace_writes_trace_json(clean: Trace, tmp_path: Path) -> None:
    index = write_report(clean, tmp_path / "new" / "folder")
    assert index.read_text().startswith("<!DOCTYPE html>")
    assert len(graphwatch.load(tmp_path / "new" / "folder" / "trace.json").steps) == len(clean.steps)


# ---------------------------------------------------------------------------- content
def test_self_contained(report: Path) -> None:
    page = report.read_text()
    # inline only: the one script (the patches' copy buttons) is in the page, nothing is loaded
    assert page.count("<script>") == page.count("<script") == 1
    assert "<link" not in page and "@import" not in page and " src=" not in page
    # the only URLs are the SVG namespace names Graphviz writes; nothing is fetched
    assert {m for m in re.findall(r'([\w:-]+)="https?://', page)} <= {"xmlns", "xmlns:xlink"}
    assert not re.search(r"url\(\s*['\"]?https?:", page)


def test_verdict_first_then_findings_charts_table_gallery(report: Path) -> None:
    page = report.read_text()
    order = [
        page.index('<h1 class="verdict bad">graphwatch: '),
        page.index("graph-kept-alive"),
        page.index('<svg class="chart"'),
        page.index('<table class="steps">'),
        page.index("Graph snapshots"),
    ]
    assert order == sorted(order)


def test_each_finding_with_fix_and_cited_source(report: Path, kept_alive: Trace) -> None:
    page = report.read_text()
    kinds = {f.kind for f in kept_alive.findings}
    assert "graph-kept-alive" in kinds
    line = line_of("# keeps every graph")
    assert f"{Path(__file__).name}:{line}</figcaption>" in page
    cited = "            total_loss += loss  # keeps every graph"
    assert f'<span class="cited"><span class="ln">{line}</span>{cited}</span>' in page
    assert "<strong>Fix:</strong> keep a number, not the graph: <code>total_loss += loss.item()</code>" in page
    assert "backward-through-freed-graph" in page


def test_three_charts_per_run_with_axis_labels(report: Path) -> None:
    page = report.read_text()
    assert page.count('<svg class="chart"') == 9
    for label in ("live saved tensors", "autograd nodes alive", "backward time", ">step<", ">ms<", ">nodes<"):
        assert label in page


def test_runs_have_contents_and_unique_ids(report: Path) -> None:
    page = report.read_text()
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for anchor in re.findall(r'href="#([^"]+)"', page):
        assert anchor in ids


def test_user_text_is_escaped(tmp_path: Path) -> None:
    evil = '<img src=x onerror="alert(1)">&'
    trace = Trace(
        sites=[CallSite(file="<stdin>", line=1, function="f", source=evil)],
        steps=[StepRecord(index=0, source="explicit")],
        findings=[Finding("graph-kept-alive", "warning", 0, f"message {evil}", f"fix `{evil}`", {"sites": [evil]})],
        snapshots=[Snapshot(0, evil, "digraph { a }")],
        ended_early=evil,
    )
    page = write_report([(evil, trace)], tmp_path).read_text()
    assert "<img" not in page and 'onerror="' not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;" in page


def test_source_shown_is_the_lines_the_trace_holds(tmp_path: Path) -> None:
    """Excerpts come from the lines the trace stored when it was recorded; the file on disk is not read."""
    (tmp_path / "train.py").write_text("this file on disk is not what the run read\n" * 5)
    trace = Trace(
        options={"cwd": str(tmp_path)},
        steps=[StepRecord(index=0, source="explicit")],
        findings=[Finding("retained-graph", "warning", 0, "m", "f", {"sites": ["train.py:3", "gone.py:9", "train.py:1"]})],
        sources=[SourceLines("train.py", 1, ["x = 1\n", "y = 2\n", "h = cell(x, h)\n", "z = 3\n"])],
    )
    page = write_report(trace, tmp_path / "out").read_text()
    assert page.count('<figure class="source">') == 1  # nearby lines of one file share an excerpt
    assert "<figcaption>train.py:1, 3</figcaption>" in page
    assert '<span class="cited"><span class="ln">3</span>h = cell(x, h)</span>' in page
    assert '<span class="cited"><span class="ln">1</span>x = 1</span>' in page
    assert '<span class="ctx"><span class="ln">2</span>y = 2</span>' in page
    assert "also cited (source not in the trace): gone.py:9" in page
    assert "on disk" not in page


def test_step_table_rows_and_cuda_column(kept_alive: Trace, tmp_path: Path) -> None:
    page = write_report(kept_alive, tmp_path / "cpu").read_text()
    assert page.count("<tr") == 1 + len(kept_alive.steps) and "CUDA allocated" not in page
    steps = [StepRecord(index=i, source="optimizer", cuda_allocated=2048 * i) for i in range(40)]
    page = write_report(Trace(steps=steps), tmp_path / "cuda").read_text()
    assert "<th>CUDA allocated</th>" in page and "<td>78.0 KiB</td>" in page
    assert '<tr class="gap"><td colspan="10">⋯ 20 steps omitted</td></tr>' in page


def test_long_run_charts_are_bucketed(tmp_path: Path) -> None:
    steps = [StepRecord(index=i, source="optimizer", live_nodes=i, backwards=[i], backward_seconds=1e-3) for i in range(5000)]
    page = write_report(Trace(steps=steps), tmp_path).read_text()
    bars = re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', page)
    assert 100 < len(bars) <= 400
    assert all(float(w) >= 0.8 for _, w in bars) and float(bars[-1][0]) < 380
    assert ">5,000<" in page or ">4,000<" in page  # the x axis reaches the last steps


def test_empty_trace(tmp_path: Path) -> None:
    page = write_report(Trace(), tmp_path).read_text()
    assert "graphwatch: no steps recorded" in page and "No steps were recorded." in page
    assert '<svg class="chart"' not in page


@needs_dot
def test_snapshots_inlined_with_step_and_reason(report: Path, kept_alive: Trace) -> None:
    page = report.read_text()
    assert kept_alive.snapshots
    first = kept_alive.snapshots[0]
    assert f"step {first.step} — {first.reason}" in page
    assert '<div class="svgbox"><svg' in page and "<?xml" not in page and "<!DOCTYPE svg" not in page


def test_without_dot_a_notice_replaces_the_pictures(
    kept_alive: Trace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    page = write_report(kept_alive, tmp_path / "out").read_text()
    assert escape(DOT_MISSING_NOTICE.split("`")[0]) in page and "<summary>DOT source</summary>" in page
    assert '<div class="svgbox">' not in page and not list((tmp_path / "out" / "snapshots").glob("*.svg"))


def test_a_graph_dot_cannot_draw_costs_only_its_picture(
    kept_alive: Trace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(dot_sources: list[str], timeout: float = 30) -> list[str | DotError]:
        return [DotError("dot took longer than 30 s to lay out the graph; draw fewer nodes") for _ in dot_sources]

    monkeypatch.setattr(svg, "render_svgs", fail)  # (the gallery imports it where it draws)
    page = write_report(kept_alive, tmp_path).read_text()
    assert page.count("dot took longer than 30 s") == len(kept_alive.snapshots) > 0
    assert "<summary>DOT source</summary>" in page and escape(DOT_MISSING_NOTICE.split("`")[0]) not in page


# ------------------------------------------------------------------- writing safely
@pytest.mark.parametrize("where", ["under a file", "/proc"])
def test_unwritable_folder_is_a_usage_error(clean: Trace, tmp_path: Path, where: str) -> None:
    if where == "/proc":
        if not Path("/proc/self").exists():
            pytest.skip("no /proc here")
        out = Path("/proc/graphwatch-report")
    else:
        (tmp_path / "a-file").write_text("")
        out = tmp_path / "a-file" / "report"
    with pytest.raises(graphwatch.UsageError, match=f"cannot write the report to {out}: .*pass a folder you can write"):
        write_report(clean, out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_folder_is_a_usage_error(clean: Trace, tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(graphwatch.UsageError, match="pass a folder you can write"):
            write_report(clean, tmp_path)
    finally:
        tmp_path.chmod(0o700)


def test_a_crash_leaves_the_previous_page_whole(
    clean: Trace, kept_alive: Trace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = write_report(clean, tmp_path)
    before = index.read_text()

    def crash(dot_sources: list[str], timeout: float = 30) -> list[str]:
        raise RuntimeError("dot crashed")

    monkeypatch.setattr(svg, "render_svgs", crash)
    with pytest.raises(RuntimeError, match="dot crashed"):
        write_report(kept_alive, tmp_path)
    assert index.read_text() == before
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(html)
    assert result.attempted and not result.failed


# -------------------------------------------------------------------- a real browser
def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", "--window-size=1280,1400", *args,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def with_test_script(page: str, script: str) -> str:
    """``page`` with the test's ``script`` run at its end: added to the page's Content-Security-Policy, which
    lets only the page's own script run (the test of that policy is in tests/test_hostile_reports.py)."""
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert page.count("script-src ") == 1
    page = page.replace("script-src ", f"script-src 'sha256-{digest}' ")
    return page.replace("</body>", f"<script>{script}</script></body>")


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def png_colours(path: Path) -> dict[tuple[int, ...], int]:
    """Pixel counts per colour of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, pos = {}, 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunks[kind] = chunks.get(kind, b"") + data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour_type in (2, 6) and not interlace
    channels = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(chunks[b"IDAT"]), width * channels
    previous, counts = bytearray(stride), {}
    for y in range(height):
        kind, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = row[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                row[x] = (row[x] + left) & 0xFF
            elif kind == 2:
                row[x] = (row[x] + up) & 0xFF
            elif kind == 3:
                row[x] = (row[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                row[x] = (row[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        for x in range(0, stride, channels):
            pixel = tuple(row[x : x + 3])
            counts[pixel] = counts.get(pixel, 0) + 1
        previous = row
    return counts


browser = pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium (/usr/bin/chromium) is not installed")


@pytest.mark.browser
@browser
def test_console_errors_are_detected(tmp_path: Path) -> None:
    """The check below is not vacuous: a page with a script error shows up in Chromium's log."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>undefinedFunction()</script>")
    done = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert any("undefinedFunction" in line for line in console_messages(done.stderr))


@pytest.mark.browser
@browser
def test_report_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    done = chromium("--dump-dom", report.as_uri(), profile=tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_messages(done.stderr) == []
    dom = done.stdout
    assert "graph-kept-alive" in dom and "backward-through-freed-graph" in dom
    assert dom.count('<svg class="chart"') == 9

    shot = tmp_path / "report.png"
    # half-size pixels of a 1280-pixel-wide layout: a quarter of the bytes for the pure-Python decoder
    done = chromium(
        f"--screenshot={shot}", "--force-device-scale-factor=0.5", report.as_uri(), profile=tmp_path / "profile"
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert console_messages(done.stderr) == []
    counts = png_colours(shot)
    _background, most = max(counts.items(), key=lambda item: item[1])
    assert len(counts) > 50, "the screenshot has almost no colours: is the page blank?"
    assert most < 0.9 * sum(counts.values()), "nine tenths of the screenshot is one colour"
    # the verdict's red and the saved-tensor chart's orange are on screen
    assert any(r > 200 and g < 80 and b < 80 for r, g, b in counts)
    assert any(r > 220 and 120 < g < 150 and b < 40 for r, g, b in counts)


def test_a_reused_folder_keeps_no_snapshot_of_the_earlier_report(tmp_path: Path) -> None:
    """Writing a report into a folder that holds an earlier one removes the earlier snapshots (graphwatch's
    own files only: what else is there stays)."""
    with graphwatch.watch(summary=False, snapshots=[0, 1, 2]) as many:
        for _ in range(3):
            x = torch.ones(3, requires_grad=True)
            with many.step():
                (x.exp() * 2).sum().backward()
    with graphwatch.watch(summary=False) as few:
        x = torch.ones(3, requires_grad=True)
        (x.exp() * 2).sum().backward()
    out = tmp_path / "report"
    write_report(many.trace, out)
    before = sorted(p.name for p in (out / "snapshots").glob("*.svg"))
    (out / "notes.txt").write_text("mine")
    (out / "snapshots" / "mine.png").write_bytes(b"png")
    write_report(few.trace, out)
    after = sorted(p.name for p in (out / "snapshots").glob("*.svg"))
    assert len(before) == 3 and len(after) == 1
    page = (out / "index.html").read_text()
    assert all(f"snapshots/{name}" in page for name in after)
    assert (out / "notes.txt").read_text() == "mine" and (out / "snapshots" / "mine.png").exists()


@pytest.mark.browser
@browser
def test_a_patch_is_shown_with_a_copy_button_that_works(report: Path, tmp_path: Path) -> None:
    """The kept-alive finding's patch is in the page; clicking its button runs the copy (the clipboard is
    denied to headless Chromium: the button then says to select the text) with no script error."""
    page = report.read_text()
    assert '<div class="patch">' in page and "total_loss += loss.item()" in page
    clicked = tmp_path / "clicked.html"
    clicked.write_text(with_test_script(page, "document.querySelector('button.copy').click()"))
    done = chromium("--virtual-time-budget=3000", "--dump-dom", clicked.as_uri(), profile=tmp_path / "profile")
    assert console_messages(done.stderr) == []
    assert re.search(r'<button type="button" class="copy">(copied|select the text to copy)</button>', done.stdout)


@needs_dot
def test_snapshot_hover_titles_name_the_op_its_line_and_step(tmp_path: Path) -> None:
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        y = x.exp().sum()  # the line the titles cite
        y.backward()
    svg = next((write_report(gw.trace, tmp_path).parent / "snapshots").glob("*.svg")).read_text()
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# the line the titles" in text)
    assert f"<title>ExpBackward0 at {os.path.relpath(__file__)}:{line}, step 0</title>" in svg
    assert "<title>ExpBackward0 → SumBackward0</title>" in svg
    assert not re.search(r"<title>(n\d+|%\d+|legend\d+)|<title>[^<]*&#45;&gt;", svg)  # no Graphviz's own names


@needs_dot
def test_snapshots_show_a_focused_picture_one_legend_and_the_whole_graph_a_click_away(tmp_path: Path) -> None:
    """An RNN unrolled 20 times a step carries its state: the page shows each snapshot's focused picture
    (about 30 nodes at most, the crossing kept), one legend for the report, and links the whole graph."""
    cell, head = torch.nn.RNNCell(8, 16), torch.nn.Linear(16, 1)
    with graphwatch.watch(summary=False) as gw:
        h = torch.zeros(4, 16)
        for _ in range(3):
            for _ in range(20):
                h = cell(torch.randn(4, 8), h)
            head(h).pow(2).mean().backward(retain_graph=True)
    page = write_report(gw.trace, tmp_path).read_text()
    assert page.count('<div class="legend">') == 1
    figures = re.findall(r'<figure class="snapshot">(.*?)</figure>', page, re.S)
    assert not any("graphwatch legend" in figure for figure in figures)  # no legend in each picture
    assert len(figures) == len(gw.trace.snapshots) >= 2
    for figure, snapshot in zip(figures, gw.trace.snapshots):
        shown = figure.count('class="node"')
        link = re.search(r'<a href="(snapshots/[^"]+)">the whole graph</a>', figure)
        assert link is not None
        whole = (tmp_path / link[1]).read_text().count('class="node"')
        assert 5 <= shown <= 45 < whole, (snapshot.reason, shown, whole)  # backward nodes, tensors, folds
        assert "nodes of step" in figure or "nodes of steps" in figure  # what was folded, and from when
    crossing = figures[[s.reason for s in gw.trace.snapshots].index("graph crosses steps")]
    assert 'stroke="red"' in crossing  # the carried edge is kept in the focused picture


@needs_dot
def test_a_kept_alive_finding_has_a_picture_of_its_holder_and_what_it_keeps(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(summary=False) as gw:
        total_loss = 0
        for _ in range(5):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss
    kept = [s for s in gw.trace.snapshots if s.reason.startswith("kept alive by `total_loss`")]
    assert len(kept) == 1 and "autograd node" in kept[0].reason
    # the holder, drawn by name, with what its graph keeps
    # (drawn again at the session's end, the moment its finding's message describes)
    assert re.search(r'n\d+ \[label="total_loss\n \(\)\n keeps steps 0..3: \d+ nodes" fillcolor=darkolivegreen1', kept[0].dot)
    page = write_report(gw.trace, tmp_path).read_text()
    assert "kept alive by `total_loss` at the end of step 4: the graphs of steps 0..3" in page


MEASURE = """
document.body.setAttribute('data-measured', JSON.stringify([...document.querySelectorAll('figure.snapshot')].map(
  f => [f.querySelector('svg').getBoundingClientRect().width, f.getBoundingClientRect().width,
        f.querySelectorAll('svg g.node').length,
        Math.min(...[...f.querySelectorAll('svg g.node text')].map(t => t.getBoundingClientRect().height))])));
"""
READABLE = 9  # CSS pixels: the height of a node's line of text on screen, at the least


@pytest.mark.browser
@browser
@needs_dot
@pytest.mark.parametrize("example", ["rnn_retain_graph_bug", "total_loss_bug"])
def test_focused_snapshots_fill_their_card_in_chromium(example: str, tmp_path: Path) -> None:
    """In a real browser, an RNN bug's and a kept-alive bug's focused pictures are as wide as their card
    (less its padding), hold at most about 30 node boxes, and their text is readable where it is shown."""
    out = tmp_path / "report"
    warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--out", str(out), str(EXAMPLES / f"{example}.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    page = tmp_path / "measured.html"
    page.write_text(with_test_script((out / "index.html").read_text(), MEASURE))
    done = chromium("--window-size=1280,2000", "--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    attribute = re.search(r'data-measured="([^"]*)"', done.stdout)
    assert attribute is not None, done.stderr[-2000:]
    measured = json.loads(unescape(attribute[1]))
    assert measured, "no snapshot in the report"
    for svg_width, card_width, nodes, text_height in measured:
        assert svg_width >= card_width - 40, (svg_width, card_width)  # the card's padding and border
        assert nodes <= 35, nodes  # backward nodes, their tensors, the folded parts
        assert text_height >= READABLE, text_height
