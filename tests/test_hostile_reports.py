"""Reports made from hostile traces and hostile names (issue 27: injection, files read, files deleted).

A trace is data someone else may have written by hand: every string in it is
untrusted, its snapshots' DOT too.  These tests record a real run, edit its
trace as an attacker would, render it with ``graphwatch report`` and check what
reaches the page, the SVG files, the terminal and the disk.  The HTML checks
that matter (no script runs, no ``javascript:`` link is live) run in headless
Chromium.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import test_html_report
import warm_python
from test_html_report import CHROMIUM, chromium, console_messages, kept_alive, with_test_script

import graphwatch
from graphwatch.model import PatchCheck, save_trace, trace_to_dict
from graphwatch.rendering.html import write_report
from graphwatch.rendering.svg import dot_available

REPO = Path(graphwatch.__file__).resolve().parents[2]
needs_dot = pytest.mark.skipif(not dot_available(), reason="Graphviz `dot` is not installed")
browser = pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium (/usr/bin/chromium) is not installed")

TERMINAL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m\r"  # set the title, clear the screen, recolour, CSI, CR
BIDI = "\u202e } \u2066"  # Trojan Source: right-to-left override, left-to-right isolate
MARKUP = "<script>document.body.setAttribute('data-pwned','script')</script><img src=x onerror=\"document.body." \
    "setAttribute('data-pwned','img')\">"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env.update(PYTHONWARNINGS="ignore", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def graphwatch_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    return warm_python.run([sys.executable, "-m", "graphwatch", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def recorded(request: pytest.FixtureRequest) -> dict:
    """The trace of a real run that keeps every step's graph (findings, cited lines, snapshots), as JSON data:
    test_html_report's ``kept_alive``."""
    assert kept_alive  # the fixture, imported for this
    data = trace_to_dict(request.getfixturevalue("kept_alive"))
    assert data["findings"] and data["snapshots"] and data["sources"]
    assert any(f.get("patch") for f in data["findings"])
    return data


def hostile(recorded: dict, folder: Path, change) -> Path:
    """A copy of the recorded trace, edited by ``change(data)``, written to ``folder/hostile.json``."""
    data = copy.deepcopy(recorded)
    change(data)
    path = folder / "hostile.json"
    path.write_text(json.dumps(data))
    return path


# ------------------------------------------------------------------------------ injection
def _with_javascript_links(data: dict) -> None:
    for snap in data["snapshots"]:
        for field in ("dot", "focus"):
            snap[field] = snap[field].replace(
                "n0 [", 'n0 [URL="javascript:alert(8)" href="javascript:alert(9)" target="_top" image="/etc/passwd" '
                'id="x" class="y" ', 1,
            )  # fmt: skip
    first = data["snapshots"][0]
    first["dot"] = first["dot"].rstrip().removesuffix("}") + '\tn999 [label="<a href=\\"javascript:alert(10)\\">x</a>"]\n}'



@needs_dot
def test_javascript_urls_in_a_snapshots_dot_reach_neither_the_page_nor_the_svg_files(recorded, tmp_path):
    trace = hostile(recorded, tmp_path, _with_javascript_links)
    done = graphwatch_cli("report", str(trace), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    files = sorted((tmp_path / "out" / "snapshots").glob("*.svg"))
    assert len(files) == len(recorded["snapshots"])  # every picture still drawn
    for text in [page, *(f.read_text(encoding="utf-8") for f in files)]:
        assert not re.search(r"<[^<>]*javascript:", text)  # in no tag: only as text, escaped
        assert "xlink:href" not in text and "root:x:" not in text
        assert not re.search(r"<(image|foreignObject|use)\b", text)
        assert text.count("<script") == (1 if text is page else 0)  # the page's own copy script only
    assert '>&lt;a href="javascript:alert(10)"&gt;x&lt;/a&gt;</text>' in files[0].read_text(encoding="utf-8")  # text


@needs_dot
def test_a_snapshot_whose_dot_is_not_graphwatchs_is_not_drawn(recorded, tmp_path):
    def html_label(data: dict) -> None:
        data["snapshots"][0]["dot"] = 'digraph { n0 [label=<<table><tr><td href="javascript:alert(1)">x</td></tr></table>>] }'

    done = graphwatch_cli("report", str(hostile(recorded, tmp_path, html_label)), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "is not the kind graphwatch writes: an HTML-like label" in page
    assert 'href="javascript' not in page and "<table>" not in page


def _everywhere(data: dict, payload: str) -> None:
    """``payload`` in every string of the trace a report shows."""
    for finding in data["findings"]:
        finding["message"] += payload
        finding["fix"] = payload + finding["fix"]
        finding["evidence"]["sites"] = [payload + ".py:3", *finding["evidence"]["sites"]]
    for site in data["sites"]:
        site["file"] += payload
    for block in data["sources"]:
        block["lines"] = [payload + line for line in block["lines"]]
    for snap in data["snapshots"]:
        snap["reason"] += payload
    data["ended_early"] = "RuntimeError: " + payload
    data["torch_version"] += payload


@browser
@pytest.mark.browser
@needs_dot
def test_no_script_runs_and_no_javascript_link_is_live_in_chromium(recorded, tmp_path):
    trace = hostile(recorded, tmp_path, lambda data: (_with_javascript_links(data), _everywhere(data, MARKUP)))
    done = graphwatch_cli("report", str(trace), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    # and were escaping ever to fail, the page's policy would still run no script but its own:
    page = page.replace("</main>", "<script>document.body.setAttribute('data-pwned','injected')</script></main>")
    links = (
        "document.body.setAttribute('data-links', JSON.stringify([...document.querySelectorAll('*')].flatMap(e =>"
        " [e.getAttribute('href'), e.getAttributeNS('http://www.w3.org/1999/xlink', 'href'),"
        " e.getAttribute('src')]).filter(Boolean)))"
    )
    (tmp_path / "out" / "checked.html").write_text(with_test_script(page, links), encoding="utf-8")
    done = chromium("--virtual-time-budget=2000", "--dump-dom", (tmp_path / "out" / "checked.html").as_uri(),
                    profile=tmp_path / "profile")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert "data-links=" in dom, "the test's own script did not run"
    assert not re.search(r"\bdata-pwned=", dom)
    hrefs = json.loads(re.search(r'data-links="([^"]*)"', dom)[1].replace("&quot;", '"').replace("&amp;", "&"))
    assert hrefs and all(not h.strip().lower().startswith("javascript:") for h in hrefs), hrefs
    assert all(h.startswith(("#", "snapshots/", "trace")) for h in hrefs), hrefs
    assert not [m for m in console_messages(done.stderr) if "pwned" in m or "alert" in m]
    unguarded = tmp_path / "out" / "unguarded.html"  # the check is not vacuous: without the policy it would run
    unguarded.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page), encoding="utf-8")
    done_unguarded = chromium("--dump-dom", unguarded.as_uri(), profile=tmp_path / "profile")
    assert 'data-pwned="injected"' in done_unguarded.stdout
    for svg in (tmp_path / "out" / "snapshots").glob("*.svg"):  # opened on their own, as the page links them
        done = chromium("--dump-dom", svg.as_uri(), profile=tmp_path / "profile")
        assert done.returncode == 0 and "<svg" in done.stdout
        assert not re.search(r"<[^<>]*javascript:|\bdata-pwned=", done.stdout)


def test_terminal_escapes_from_a_trace_are_printed_visibly(recorded, tmp_path):
    trace = hostile(recorded, tmp_path, lambda data: _everywhere(data, TERMINAL + BIDI))
    for colour in ({}, {"FORCE_COLOR": "1"}):  # a pipe, and a console that writes colour codes of its own
        done = graphwatch_cli("report", str(trace), "--out", "out", cwd=tmp_path, **colour)
        assert done.returncode == 0, done.stderr.decode()
        printed = done.stdout + done.stderr
        for raw in ("\x1b]", "\x07", "\x1b[2J", "\x1b[31mred", "\x9b", "\r", "\u202e", "\u2066"):
            assert raw.encode() not in printed, raw
        assert b"\\u{1b}]0;pwned\\u{7}\\u{1b}[2J" in printed
        assert b"\\u{202e} } \\u{2066}" in printed
        assert b"\x1b[" in printed if colour else b"\x1b" not in printed  # rich's own colours only


def test_a_patch_with_bidi_controls_is_shown_marked_and_not_offered_for_copying(recorded, tmp_path):
    def trojan(data: dict) -> None:
        finding = next(f for f in data["findings"] if f.get("patch"))
        finding["patch"] = finding["patch"].replace("loss.item()", "loss.item()  #" + BIDI)

    trace = hostile(recorded, tmp_path, trojan)
    done = graphwatch_cli("report", str(trace), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "\u202e" not in page and "\u2066" not in page
    assert 'title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u{202e}</span>' in page
    assert "it is not offered for copying" in page and 'class="copy"' not in page
    printed = (done.stdout + done.stderr).decode()
    assert "patch, not for copying: this patch holds characters that hide or reorder text" in printed
    assert "\u202e" not in printed and "\\u{202e}" in printed
    untouched = graphwatch_cli("report", str(hostile(recorded, tmp_path, lambda data: None)), "--out", "clean",
                               cwd=tmp_path)  # fmt: skip
    assert untouched.returncode == 0 and 'class="copy"' in (tmp_path / "clean" / "index.html").read_text()


# ------------------------------------------------------------------------------ claimed verdicts (issue 40)
ETC_PATCH = "# in /etc: patch -p0\n--- passwd\n+++ passwd\n@@ -1,1 +1,2 @@\n root:x:0:0:root:/root:/bin/sh\n" \
    "+evil::0:0::/:/bin/sh\n"
FORGED_CHECK = {"checked": True, "steps": 4, "held": ["the patch applies", "the finding is gone"], "from_trace": False}


def test_a_forged_check_is_shown_as_the_traces_claim_and_a_patch_outside_the_folder_is_not_offered(recorded, tmp_path):
    """The report showed "Check: checked" and a copy button for a patch that adds a user to /etc/passwd."""
    def forged(data: dict) -> None:
        for finding in data["findings"]:
            if finding.get("patch"):
                finding["patch"], finding["check"] = ETC_PATCH, FORGED_CHECK

    passwd = Path("/etc/passwd").read_bytes() if Path("/etc/passwd").exists() else None
    done = graphwatch_cli("report", str(hostile(recorded, tmp_path, forged)), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert '<p class="check checked claimed"><strong>Check:</strong> checked, according to the trace, in 4 steps' in page
    assert 'class="copy"' not in page and "Patch, not to apply as it is" in page
    assert "This patch changes files outside the folder the run ran in (/etc); read it before applying it" in page
    printed = (done.stdout + done.stderr).decode()
    assert "check: checked, according to the trace, in 4 steps" in printed
    assert "patch, not for copying: this patch changes files outside the folder the run ran in (/etc)" in printed
    assert not re.search(r"^(# in /etc|--- passwd|\+evil)", printed, re.MULTILINE), "printed as a patch to apply"
    assert (Path("/etc/passwd").read_bytes() if passwd is not None else None) == passwd


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.py"])
def test_a_patch_naming_a_file_outside_the_folder_is_not_offered_for_copying(recorded, tmp_path, name):
    def outside(data: dict) -> None:
        for finding in data["findings"]:
            if finding.get("patch"):
                finding["patch"] = f"--- {name}\n+++ {name}\n@@ -1,1 +1,1 @@\n-a = 1\n+a = 2\n"

    done = graphwatch_cli("report", str(hostile(recorded, tmp_path, outside)), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert 'class="copy"' not in page and f"outside the folder the run ran in ({name})" in page
    assert not (tmp_path.parent / "outside.py").exists()


def test_a_check_computed_in_this_process_is_shown_as_a_verdict_and_as_a_claim_once_read_back(recorded, tmp_path):
    trace = graphwatch.load(hostile(recorded, tmp_path, lambda data: None))
    finding = next(f for f in trace.findings if f.patch)
    finding.check = PatchCheck(checked=True, steps=4, held=["the patch applies"])  # as --check-fixes makes it
    page = write_report(trace, tmp_path / "here").read_text(encoding="utf-8")
    assert "<strong>Check:</strong> checked in 4 steps: the patch applies" in page and 'class="copy"' in page
    save_trace(trace, tmp_path / "saved.json")
    again = write_report(graphwatch.load(tmp_path / "saved.json"), tmp_path / "again").read_text(encoding="utf-8")
    assert "<strong>Check:</strong> checked, according to the trace, in 4 steps: the patch applies" in again
    assert (tmp_path / "here" / "index.html").is_file() and (tmp_path / "again" / "index.html").is_file()


NAMES = """\
import sys, torch{watch}
class Box:
    pass
box = Box()
setattr(box, sys.argv[1], [])
w = torch.ones(3, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
with {context}:
    for i in range(6):
        opt.zero_grad()
        loss = (w.exp() * 2).sum()
        getattr(box, sys.argv[1]).append(loss)
        loss.backward()
        opt.step()
print("done")
"""


@needs_dot
@pytest.mark.parametrize("name", ["held\\", "held\x1b[31m\x07", "held\\\"\\l<b>"], ids=["backslash", "escape", "dot-escapes"])
def test_odd_names_are_drawn_and_under_w_error_a_picture_never_stops_training(name, tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text(NAMES.format(watch="", context="open(__file__)"))
    watched = tmp_path / "watched.py"
    watched.write_text(NAMES.format(watch=", graphwatch", context="graphwatch.watch(out='out', summary=False)"))
    runs = [warm_python.run([sys.executable, "-W", "error", str(script), name], cwd=tmp_path,
                            env={**_env(), "PYTHONWARNINGS": "error"}, capture_output=True, timeout=300)
            for script in (bare, watched)]  # fmt: skip
    assert [(r.returncode, r.stdout) for r in runs] == [(0, b"done\n")] * 2, runs[1].stderr.decode()[-3000:]
    assert b"could not draw" not in runs[1].stderr
    svgs = sorted((tmp_path / "out" / "snapshots").glob("*.svg"))
    assert svgs
    for svg in svgs:
        ElementTree.parse(svg)  # well-formed XML: the whole graph opens
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "could not render" not in page and "box.held" in page


# --------------------------------------------------------------------------- files read
@pytest.fixture
def secrets(tmp_path: Path) -> dict[str, Path]:
    """Files a hostile trace could cite: outside the folder it is rendered in, and inside another one."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "work").mkdir()
    secret = tmp_path / "outside" / "secret.txt"
    secret.write_text("SECRET-OUTSIDE line one\nSECRET-OUTSIDE line two\n")
    (tmp_path / "work" / "train.py").write_text("SECRET-CWD the renderer's own train.py\n" * 3)
    return {"secret": secret, "work": tmp_path / "work"}


@pytest.mark.parametrize(
    "cite", ["/etc/passwd:1", "ABSOLUTE", "../outside/secret.txt:1", "train.py:1", "CWD"],
    ids=["etc-passwd", "absolute", "relative-outside", "renderers-own-file", "options-cwd"],
)
def test_a_report_made_from_a_trace_reads_nothing_from_the_renderers_disk(recorded, secrets, cite):
    def cites(data: dict) -> None:
        where = {"ABSOLUTE": f"{secrets['secret']}:1", "CWD": "secret.txt:2"}.get(cite, cite)
        if cite == "CWD":
            data["options"]["cwd"] = str(secrets["secret"].parent)
        for finding in data["findings"]:
            finding["evidence"]["sites"] = [where]
        data["sites"].append({"file": where.rpartition(":")[0], "line": 1, "function": "f"})

    trace = hostile(recorded, secrets["work"], cites)
    done = graphwatch_cli("report", str(trace), "--out", "out", cwd=secrets["work"])
    assert done.returncode == 0, done.stderr.decode()
    page = (secrets["work"] / "out" / "index.html").read_text(encoding="utf-8")
    assert "SECRET" not in page and "root:x:0:0" not in page
    assert "also cited (source not in the trace)" in page


def test_the_cited_lines_are_stored_when_the_run_is_recorded(recorded):
    recorded_in = test_html_report.__file__  # where the kept_alive run ran
    blocks = [b for b in recorded["sources"] if b["file"] == os.path.relpath(recorded_in)]
    line = next(i for i, text in enumerate(Path(recorded_in).read_text().splitlines(), 1) if "# keeps every graph" in text)
    assert any(b["first"] == line - 3 and "total_loss += loss  # keeps every graph" in b["lines"][3] for b in blocks)


# ------------------------------------------------------------------------- files deleted
@needs_dot
def test_out_deletes_only_the_snapshots_graphwatch_wrote(recorded, tmp_path):
    out = tmp_path / "out"
    (out / "snapshots").mkdir(parents=True)
    (out / "snapshots" / "my_diagram.svg").write_text("<svg>mine</svg>")
    trace = graphwatch.load(hostile(recorded, tmp_path, lambda data: None))
    write_report(trace, out)
    first = json.loads((out / "report-files.json").read_text())["files"]
    assert len(first) == len(trace.snapshots) >= 2
    trace.snapshots = trace.snapshots[:1]
    write_report(trace, out)  # one snapshot: the others go, the user's stays
    second = json.loads((out / "report-files.json").read_text())["files"]
    assert len(second) == 1 and set(second) < set(first)
    assert {p.name for p in (out / "snapshots").iterdir()} == {"my_diagram.svg", Path(second[0]).name}
    assert (out / "snapshots" / "my_diagram.svg").read_text() == "<svg>mine</svg>"


def test_a_manifest_naming_other_files_deletes_none_of_them(recorded, tmp_path):
    out = tmp_path / "out"
    (out / "snapshots").mkdir(parents=True)
    (tmp_path / "precious.svg").write_text("mine")
    (out / "index.svg").write_text("mine")
    forged = ["../precious.svg", "snapshots/../../precious.svg", "/etc/hostname", "index.svg", "snapshots/link.svg"]
    (out / "snapshots" / "link.svg").symlink_to(tmp_path / "precious.svg")
    (out / "report-files.json").write_text(json.dumps({"files": forged}))
    write_report(graphwatch.load(hostile(recorded, tmp_path, lambda data: None)), out)
    assert (tmp_path / "precious.svg").read_text() == "mine" and (out / "index.svg").read_text() == "mine"
    assert (out / "snapshots" / "link.svg").is_symlink()


@pytest.mark.parametrize("how", ["report", "run"])
def test_a_snapshots_folder_linked_out_of_out_is_refused_and_nothing_there_is_touched(recorded, tmp_path, how):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.svg").write_text("mine")
    (elsewhere / "0-run-step0-0.svg").write_text("mine too")
    out = tmp_path / "out"
    out.mkdir()
    (out / "snapshots").symlink_to(elsewhere)
    if how == "report":
        done = graphwatch_cli("report", str(hostile(recorded, tmp_path, lambda data: None)), "--out", "out", cwd=tmp_path)
    else:
        (tmp_path / "train.py").write_text("print('ran')\n")
        done = graphwatch_cli("run", "--out", "out", "train.py", cwd=tmp_path)
        assert b"ran" not in done.stdout  # refused before the script runs
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines() == [
        f"graphwatch: error: cannot write the report to out: its snapshots folder is a link (to {elsewhere}), and "
        "graphwatch writes only inside the report folder; remove the link or pass another folder"
    ]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["0-run-step0-0.svg", "a.svg"]
    assert (elsewhere / "a.svg").read_text() == "mine"
