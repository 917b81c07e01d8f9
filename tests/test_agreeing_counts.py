"""One kept-alive finding, read in every view: its message, its picture (the DOT source, the SVG the report
writes, the caption), and the trace saved to JSON.  Every count and step range is the same figure with the
same meaning, counted once at one step end (issue: a report said 24 nodes in the message, 21 in the node's
box and 3 in the caption; 233.0 KiB against 128.0 KiB; "steps 0..73" for a total reset every epoch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import graphwatch
from graphwatch.analysis.evidence import human_bytes, spans_text

# "... keeps the graphs of steps 50..73 alive at the end of step 74: 167 autograd nodes, 3.9 KiB of saved tensors"
MESSAGE = re.compile(
    r"keeps the graphs of (?P<steps>.+?) alive at the end of step (?P<step>\d+): (?P<nodes>[\d,]+) autograd nodes?"
    r"(?:, (?P<bytes>[\d.]+ (?:B|KiB|MiB|GiB)) of saved tensors)?"
)
CAPTION = re.compile(
    r"kept alive by `(?P<holder>[^`]+)` at the end of step (?P<step>\d+): the graphs of (?P<steps>.+?) "
    r"\((?P<nodes>[\d,]+) autograd nodes?(?:, (?P<bytes>[\d.]+ (?:B|KiB|MiB|GiB)) of saved tensors)?\)$"
)
NOTE = re.compile(r"keeps (?P<steps>steps? [^:\"]+): (?P<nodes>[\d,]+) nodes?(?:, (?P<bytes>[\d.]+ (?:B|KiB|MiB|GiB)) saved)?")


def train(epochs: int, steps: int, keep: str, out: Path) -> graphwatch.Session:
    """A loop of ``epochs`` x ``steps`` whose ``kept`` (reset each epoch) keeps graphs: ``keep`` is "total"
    (``total += loss``), "list" (``kept.append(loss)``) or "outputs" (a validation forward without no_grad)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(summary=False, out=out) as gw:
        for _ in range(epochs):
            kept: object = 0 if keep == "total" else []
            for _ in range(steps):
                opt.zero_grad()
                loss = model(torch.randn(32, 16)).pow(2).mean()
                loss.backward()
                opt.step()
                if keep == "total":
                    kept = kept + loss  # type: ignore[operator]
                elif keep == "list":
                    kept.append(loss)  # type: ignore[attr-defined]
                else:
                    kept.append(model(torch.randn(32, 16)))  # type: ignore[attr-defined]  # validation, with a graph
    return gw


def views(gw: graphwatch.Session, out: Path) -> dict[str, dict[str, str | None]]:
    """The figures of the session's kept-alive finding as each view shows them."""
    finding = next(f for f in gw.findings if f.kind == "graph-kept-alive")
    saved = next(f for f in graphwatch.load(out / "trace.json").findings if f.kind == "graph-kept-alive")
    snapshot = next(s for s in gw.trace.snapshots if s.reason.startswith("kept alive by"))
    message, caption = MESSAGE.search(finding.message), CAPTION.search(snapshot.reason)
    assert message and caption, (finding.message, snapshot.reason)
    kept = saved.evidence["kept"]
    trace = {"step": str(kept["step"]), "steps": spans_text(kept["spans"]), "nodes": f"{kept['nodes']:,}",
             "bytes": human_bytes(kept["bytes"]) if kept["bytes"] else None}  # fmt: skip
    shown = {name: {key: found.group(key) for key in ("step", "steps", "nodes", "bytes")}
             for name, found in (("message", message), ("caption", caption))}  # fmt: skip
    return {"trace": trace, **shown}


def notes_in(picture: str) -> list[dict[str, str | None]]:
    """The notes under the drawn outputs, once each, in the order drawn (a DOT label's, an SVG text's)."""
    texts = re.findall(r'label="((?:[^"\\]|\\.)*)"', picture) or re.findall(r"<text[^>]*>([^<]*)</text>", picture)
    return [found.groupdict() for text in texts for found in NOTE.finditer(text)]


def test_a_running_total_counts_the_same_in_message_picture_and_trace(tmp_path: Path) -> None:
    gw = train(1, 9, "total", tmp_path)
    seen = views(gw, tmp_path)
    assert seen["message"] == seen["trace"] == seen["caption"], seen
    snapshot = next(s for s in gw.trace.snapshots if s.reason.startswith("kept alive by"))
    expected = {"steps": seen["trace"]["steps"], "nodes": seen["trace"]["nodes"], "bytes": seen["trace"]["bytes"]}
    for picture in (snapshot.dot, snapshot.focus or ""):
        assert notes_in(picture) == [expected], picture
    svg = "\n".join(p.read_text() for p in (tmp_path / "snapshots").glob("*.svg"))
    assert {tuple(n.items()) for n in notes_in(svg)} == {tuple(expected.items())}
    assert snapshot.reason in (tmp_path / "index.html").read_text().replace("&#x60;", "`")
    # what the count means: the autograd nodes of the kept steps' graphs alive at that step end
    step = gw.trace.steps[int(seen["trace"]["step"] or 0)]
    kept = gw.findings[0].evidence["kept"]
    steps = [s for first, last in kept["spans"] for s in range(first, last + 1)]
    assert kept["nodes"] == sum(step.nodes_alive_by_step[s] for s in steps) and kept["nodes"] > len(steps)


def test_a_total_reset_every_epoch_is_said_to_keep_only_the_steps_since_its_reset(tmp_path: Path) -> None:
    gw = train(3, 6, "total", tmp_path)
    kept = next(f for f in gw.findings if f.kind == "graph-kept-alive").evidence["kept"]
    last = kept["step"]
    assert last == 17 and kept["spans"] == [[12, 16]], kept  # the third epoch's steps before the last
    seen = views(gw, tmp_path)
    assert seen["message"]["steps"] == "steps 12..16" and seen["message"] == seen["trace"] == seen["caption"]


def test_items_of_a_list_each_count_their_own_step_and_add_up_to_the_message(tmp_path: Path) -> None:
    gw = train(1, 6, "list", tmp_path)
    seen = views(gw, tmp_path)
    assert seen["message"] == seen["trace"] == seen["caption"], seen
    snapshot = next(s for s in gw.trace.snapshots if s.reason.startswith("kept alive by"))
    notes = notes_in(snapshot.dot)
    assert [n["steps"] for n in notes] == [f"step {s}" for s in range(5)]
    assert sum(int(n["nodes"] or 0) for n in notes) == int(seen["message"]["nodes"] or 0)


@pytest.mark.parametrize("steps", [8])
def test_saved_bytes_of_kept_outputs_are_one_figure_in_every_view(tmp_path: Path, steps: int) -> None:
    gw = train(1, steps, "outputs", tmp_path)
    seen = views(gw, tmp_path)
    assert seen["trace"]["bytes"] is not None, "the validation outputs keep saved tensors"
    assert seen["message"] == seen["trace"] == seen["caption"], seen
    snapshot = next(s for s in gw.trace.snapshots if s.reason.startswith("kept alive by"))
    kept = gw.findings[0].evidence["kept"]
    total = sum(gw.trace.steps[kept["step"]].saved_alive_by_step.get(s, 0) for s in range(kept["step"]))
    assert human_bytes(total) == seen["trace"]["bytes"]
    assert all(n["bytes"] for n in notes_in(snapshot.dot))
