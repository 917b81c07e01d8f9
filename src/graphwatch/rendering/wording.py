"""What a summary says, in the terminal and in the HTML report alike: the verdict, the problems, which
steps a finding was seen in, which steps a table shows, why a run ended early.

Example::

    >>> from graphwatch.model import StepRecord, Trace
    >>> verdict([Trace(steps=[StepRecord(index=0, source="optimizer")])])
    ('graphwatch: no graph leaks in 1 step', True)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ..analysis.evidence import counted
from ..model import Finding, StepRecord, Trace
from ..model.columns import AVERAGE_AFTER, field_values
from ..model.records import OWN_ESTIMATED
from .patch_checks import check_text
from .patch_file import not_for_copying
from .visible import visible

# memory-growth cites the first and last step of its fit, not every step it saw
_RANGE_KINDS = frozenset({"memory-growth"})


def problems(trace: Trace) -> list[Finding]:
    """The findings that are problems (errors and warnings, not notes).

    >>> problems(Trace(findings=[Finding("memory-growth", "info", 9, "m", "f")]))
    []
    """
    return [f for f in trace.findings if f.severity != "info"]


def verdict(traces: Sequence[Trace]) -> tuple[str, bool]:
    """The one-line verdict over one or more traces, and whether it is good news.

    >>> verdict([Trace(steps=[StepRecord(index=i, source="optimizer") for i in range(40)])])
    ('graphwatch: no graph leaks in 40 steps', True)
    """
    steps = sum(len(t.steps) for t in traces)
    found = sum(len(problems(t)) for t in traces)
    where = counted(steps, "step") if len(traces) == 1 else f"{counted(len(traces), 'run')}, {counted(steps, 'step')}"
    if found:
        return f"graphwatch: {counted(found, 'problem')} in {where}", False
    if not steps:
        return "graphwatch: no steps recorded", True
    if all(nothing_watched(t) for t in traces):
        return f"graphwatch: {NOTHING_WATCHED} in this process", False
    return f"graphwatch: no graph leaks in {where}", True


NOTHING_WATCHED = "nothing watched: no backward ran"  # (a verdict, then where)


def nothing_watched(trace: Trace) -> bool:
    """Whether the run trained nothing graphwatch could watch: no backward ran, and no step ended but the one
    the session's end closes (a script that failed before its loop, training only in child processes).

    >>> nothing_watched(Trace(steps=[StepRecord(index=0, source="session-end")]))
    True
    >>> verdict([Trace(steps=[StepRecord(index=0, source="session-end")])])
    ('graphwatch: nothing watched: no backward ran in this process', False)
    """
    return not trace.backwards and all(step.source == "session-end" for step in trace.steps)


def nothing_watched_text(trace: Trace) -> str | None:
    """What to do when :func:`nothing_watched` (None otherwise): nothing was checked, which is no clean bill."""
    if not trace.steps or not nothing_watched(trace):
        return None
    if trace.ended_early:
        return "no backward ran before the run ended, so nothing was checked: fix the error and run it again"
    return (
        "no backward ran in this process, so nothing was checked. Training in processes it starts "
        "(torch.multiprocessing, mp.spawn) is not watched from here: wrap each worker's loop in "
        "`with graphwatch.watch(out=...)` (one folder per worker), or launch the workers with torchrun "
        "(`torchrun --nproc-per-node N -m graphwatch run train.py`)"
    )


def finding_steps(finding: Finding) -> list[int]:
    """The steps a finding was seen in (for ``memory-growth``: every step of its fit).

    >>> finding_steps(Finding("memory-growth", "warning", 9, "m", "f", {"steps": [0, 3]}))
    [0, 1, 2, 3]
    """
    steps = sorted(set(finding.evidence.get("steps") or [finding.step]))
    if finding.kind in _RANGE_KINDS and len(steps) == 2:
        return list(range(steps[0], steps[1] + 1))
    return steps


def steps_text(steps: Sequence[int]) -> str:
    """A short way to say which steps: ``step 3``, ``steps 1–4``, ``steps 1, 5, 9``, ``12 steps, 1…40``.

    >>> steps_text([3]), steps_text([1, 2, 3, 4]), steps_text([1, 5, 9]), steps_text([1, 2, 9, 10, 11])
    ('step 3', 'steps 1–4', 'steps 1, 5, 9', '5 steps, 1…11')
    """
    if not steps:
        return "no step"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps[-1] - steps[0] == len(steps) - 1:
        return f"steps {steps[0]}–{steps[-1]}"
    if len(steps) <= 3:
        return "steps " + ", ".join(map(str, steps))
    return f"{counted(len(steps), 'step')}, {steps[0]}…{steps[-1]}"


def marked_steps(trace: Trace) -> dict[int, str]:
    """Step -> the kinds of the findings first seen in it (a repeated problem marks only where it began).

    >>> marked_steps(Trace(findings=[Finding("retained-graph", "warning", 3, "m", "f", {"steps": [3, 4]})]))
    {3: 'retained-graph'}
    """
    marks: dict[int, list[str]] = {}
    for finding in trace.findings:
        kinds = marks.setdefault(finding.step, [])
        if finding.kind not in kinds:
            kinds.append(finding.kind)
    return {step: ", ".join(kinds) for step, kinds in marks.items()}


def step_values(steps: Sequence[StepRecord], name: str) -> list[Any]:
    """Every step's ``name`` (a field, or ``live_saved_bytes``), read column by column: a long run's settled
    steps are not built again.

    >>> step_values([StepRecord(index=0, source="optimizer", live_activation_bytes=3, live_leaf_bytes=4)], "live_saved_bytes")
    [7]
    """
    if name == "live_saved_bytes":
        activations, leaves = field_values(steps, "live_activation_bytes"), field_values(steps, "live_leaf_bytes")
        return [a + b for a, b in zip(activations, leaves)]
    return field_values(steps, name)


def sample_steps(
    steps: Sequence[StepRecord], keep: Collection[int], head: int = 5, tail: int = 5, most: int = 20
) -> list[StepRecord | int]:
    """The steps worth a table row: the first ``head``, up to ``most`` of ``keep``, the last ``tail``.

    Each run of left-out steps becomes one int, the number of steps left out
    there; runs shorter than three steps are shown instead.

    >>> rows = sample_steps([StepRecord(index=i, source="optimizer") for i in range(100)], keep={50, 53})
    >>> [r if isinstance(r, int) else r.index for r in rows]
    [0, 1, 2, 3, 4, 45, 50, 51, 52, 53, 41, 95, 96, 97, 98, 99]
    """
    n = len(steps)
    kept = sorted(i for i, index in enumerate(step_values(steps, "index")) if index in keep)[:most]
    wanted = sorted(set(range(min(head, n))) | set(range(max(n - tail, 0), n)) | set(kept))
    rows: list[StepRecord | int] = []
    previous = -1
    for i in wanted:
        gap = i - previous - 1
        if gap >= 3:
            rows.append(gap)
        rows.extend(steps[i - gap if gap < 3 else i : i + 1])
        previous = i
    return rows


def seconds_text(seconds: float) -> str:
    """A duration for a table cell.

    >>> seconds_text(0.00042), seconds_text(2.5)
    ('0.42 ms', '2.50 s')
    """
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def averaged_text(trace: Trace) -> str:
    """The notice for a long run whose older settled steps were averaged ("" when none were).

    >>> print(averaged_text(Trace(averaged_from=4096, averaged_before=1_000_000)))  # doctest: +NORMALIZE_WHITESPACE
    steps 4,096 to 999,999: times and sizes are averaged over spans of steps (a long run keeps its first
    steps and its last 262,144 exact; findings and their evidence are whole)
    """
    if trace.averaged_before <= trace.averaged_from:
        return ""
    return (
        f"steps {trace.averaged_from:,} to {trace.averaged_before - 1:,}: times and sizes are averaged over spans "
        f"of steps (a long run keeps its first steps and its last {AVERAGE_AFTER:,} exact; findings and their "
        "evidence are whole)"
    )


def detail_text(trace: Trace, groups: int = 6) -> str:
    """At the default level, which steps were seen in full detail and why ("" when every step was).

    >>> from graphwatch.model import DetailSpan
    >>> spans = [DetailSpan(0, 3, "first steps"), DetailSpan(16, 17, "sampled"), DetailSpan(64, 65, "sampled")]
    >>> steps = [StepRecord(index=i, source="optimizer") for i in range(100)]
    >>> print(detail_text(Trace(options={"level": "default"}, steps=steps, full_detail=spans)))  # doctest: +NORMALIZE_WHITESPACE
    full detail in 5 steps of 100: 0-2 (first steps); 16, 64 (sampled); the other 95 were seen light (backward
    calls, optimizer steps and each step's totals; an error is explained in full on any step)
    """
    total = len(trace.steps)
    if trace.options.get("level") != "default" or not total:
        return ""
    by_reason: dict[str, list[str]] = {}
    full = 0
    for span in trace.full_detail:
        end = min(span.end, total)
        if end > span.first:
            full += end - span.first
            text = f"{span.first}" if end - span.first == 1 else f"{span.first}-{end - 1}"
            by_reason.setdefault(span.reason, []).append(text)
    if full >= total:
        return ""
    parts = [
        f"{', '.join(spans[:4])}{', ...' if len(spans) > 4 else ''} ({reason})"
        for reason, spans in list(by_reason.items())[:groups]
    ]
    if len(by_reason) > groups:
        parts.append(counted(len(by_reason) - groups, "more reason"))
    listed = "; ".join(parts) + "; " if parts else ""
    return (
        f"full detail in {counted(full, 'step')} of {total:,}: {listed}the other {total - full:,} were seen light "
        "(backward calls, optimizer steps and each step's totals; an error is explained in full on any step)"
    )


def counted_only_text(trace: Trace) -> str:
    """The notice for steps so large that part of them was counted, not tracked ("" when none was).

    >>> steps = [StepRecord(index=0, source="optimizer"), StepRecord(index=1, source="optimizer", saved_counted_only=5)]
    >>> counted_only_text(Trace(steps=steps))
    'step 1 saved 5 tensors past the budget of tracked tensors a step: counted, without their lifetimes, bytes or records'
    """
    saved = [(i, n) for i, n in enumerate(field_values(trace.steps, "saved_counted_only")) if n > 0]
    nodes = sum(n for n in field_values(trace.backwards, "nodes_counted_only") if n > 0)
    parts = []
    if saved:
        where = f"step {saved[0][0]}" if len(saved) == 1 else f"{counted(len(saved), 'step')} ({saved[0][0]}, ...)"
        parts.append(f"{where} saved {counted(sum(n for _, n in saved), 'tensor')}")
    if nodes:
        parts.append(f"backwards reached {counted(nodes, 'node')}")
    if not parts:
        return ""
    return f"{' and '.join(parts)} past the budget of tracked tensors a step: counted, without their lifetimes, bytes or records"


def ended_early_text(reason: str, limit: int = 100) -> str:
    """Why a run ended early, in one short line: its first sentence, cut at a word (the findings and the
    error itself say the rest).

    >>> ended_early_text("KeyboardInterrupt")
    'KeyboardInterrupt'
    >>> ended_early_text("RuntimeError: Trying to backward through the graph a second time (or directly access "
    ...                  "saved tensors after they have already been freed). Saved intermediate values", limit=60)
    'RuntimeError: Trying to backward through the graph a…'
    """
    first = reason.strip().splitlines()[0] if reason.strip() else reason
    sentence = first.split(". ")[0]
    if len(sentence) <= limit:
        return sentence
    cut = sentence[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:(")
    return cut + "…"


def early_end(trace: Trace) -> str:
    """Why the run ended early, in one short line: the error's type alone when a finding explains it (the
    error carries that explanation), else :func:`ended_early_text`.

    >>> early_end(Trace(ended_early="KeyboardInterrupt"))
    'KeyboardInterrupt'
    """
    reason = trace.ended_early or ""
    if any(explained_in_error(trace, finding) for finding in trace.findings):
        return reason.split(":")[0]
    return ended_early_text(reason)


def ending_text(trace: Trace) -> str | None:
    """How the run ended when it did not simply finish, in one line: ``the run ended early: ...``, or, for a
    script that ended itself with ``sys.exit(n)`` (its own decision, not an accident), just that.

    >>> ending_text(Trace(ended_early="SystemExit: 7")), ending_text(Trace(ended_early="KeyboardInterrupt"))
    ('the script ended itself with sys.exit(7)', 'the run ended early: KeyboardInterrupt')
    """
    reason = trace.ended_early
    if not reason:
        return None
    name, _, code = reason.partition(": ")
    if name == "SystemExit":
        return f"the script ended itself with sys.exit({code})"
    return f"the run ended early: {early_end(trace)}"


def explained_in_error(trace: Trace, finding: Finding) -> bool:
    """Whether the error that ended the run already carries this finding's whole explanation (a
    :class:`~graphwatch.BackwardTwiceError`): the summary then points at it instead of printing it twice.

    >>> explained_in_error(Trace(), Finding("retained-graph", "warning", 3, "m", "f"))
    False
    """
    return bool(trace.ended_early) and finding.severity == "error" and finding.message in (trace.ended_early or "")


def cited_sites(finding: Finding) -> list[str]:
    """The ``file:line`` places a finding cites, each once, in order (unknown places left out).

    >>> cited_sites(Finding("k", "warning", 0, "m", "f", {"sites": ["a.py:3", "<unknown>", "a.py:3"]}))
    ['a.py:3']
    """
    return [str(s) for s in dict.fromkeys(finding.evidence.get("sites") or []) if s != "<unknown>"]


def session_line(trace: Trace, state: str) -> str:
    """A session in one line (its ``repr``: a debugger's view): its state, steps and what was found.

    >>> session_line(Trace(findings=[Finding("retained-graph", "warning", 3, "m", "f")]), "ended")
    '<graphwatch.Session ended: 0 steps, 1 problem: retained-graph at step 3>'
    """
    found = problems(trace)
    notes = len(trace.findings) - len(found)
    said = f"{counted(len(found), 'problem')}: " + ", ".join(f"{f.kind} at step {f.step}" for f in found) if found else (
        "nothing watched" if trace.steps and nothing_watched(trace) else "no graph leaks"
    )
    said += f" ({counted(notes, 'note')})" if notes else ""
    return f"<graphwatch.Session {state}: {counted(len(trace.steps), 'step')}, {said}>"


def session_hint(name: str = "gw") -> str:
    """Where to read more about a session bound to ``name``.

    >>> session_hint("gw2")
    'gw2.summary(): the per-step table; gw2.report(DIR): the HTML report; gw2.findings: these findings'
    """
    return f"{name}.summary(): the per-step table; {name}.report(DIR): the HTML report; {name}.findings: these findings"


def session_text(trace: Trace, state: str, name: str = "gw") -> str:
    """A session as text (``print(gw)``, a notebook's text view): the verdict, each finding with its fix and
    patch, and where to read more (the session bound to ``name``).

    >>> print(session_text(Trace(findings=[Finding("retained-graph", "warning", 3, "held", "drop it")]), "ended"))
    graphwatch: 1 problem in 0 steps (session ended)
    [retained-graph] step 3: held
      fix: drop it
    gw.summary(): the per-step table; gw.report(DIR): the HTML report; gw.findings: these findings
    """
    text, _ = verdict([trace])
    lines = [f"{text} (session {state})"]
    ending = ending_text(trace)
    if ending:
        lines.append(ending)
    for finding in trace.findings:
        lines.append(str(finding))
        lines += patch_lines(finding)
    lines.append(session_hint(name))
    return "\n".join(lines)


def patch_lines(finding: Finding, cwd: str | None = None) -> list[str]:
    """A finding's patch as plain text lines (``print(gw)``, IPython's text view), with its check's line as the
    terminal summary shows it: checked, FAILED or unchecked.  A patch not to be copied (its check failed, it
    hides characters or writes outside ``cwd``: :func:`~graphwatch.rendering.patch_file.not_for_copying`) says
    why, and is shown with every hidden character marked; [] without a patch.

    >>> print("\\n".join(patch_lines(Finding("k", "warning", 0, "m", "f", patch="--- a.py\\n+++ a.py\\n"))))
      patch (patch -p0):
    --- a.py
    +++ a.py
      check: unchecked: `graphwatch run --check-fixes` re-runs it
    """
    if not finding.patch:
        return []
    warning = not_for_copying(finding.patch, cwd, finding.check)
    if warning is None:
        head, patch = "  patch (patch -p0):", finding.patch
    else:
        head, patch = f"  patch, not for copying: {warning}; it is shown as text, any hidden character marked:", visible(finding.patch)
    return [head, patch.rstrip("\n"), f"  {check_text(finding.check).plain}"]


def time_text(trace: Trace) -> str:
    """How long the session took, in wall-clock and in CPU time of the process, and how much of the wall clock
    was graphwatch's own code ("" for a trace that did not record it); when the process had a CPU for much
    less than the wall time, it says so: slow steps then are the machine's load (or waiting), not the code.

    >>> parts = {"around backwards": 0.05, "step ends": 0.12, "optimizer hooks": 0.01, OWN_ESTIMATED: 0.14}
    >>> print(time_text(Trace(seconds=4.2, cpu_seconds=1.6, own_seconds=parts)))  # doctest: +NORMALIZE_WHITESPACE
    time: 4.20 s wall clock, 1.60 s CPU (the process had a CPU for 38% of the wall time: a loaded machine, or
    waiting for I/O or a GPU); graphwatch itself: about 320.00 ms (8%): 140.00 ms in saved-tensor hooks
    (estimated), 120.00 ms at step ends, 50.00 ms around backwards, 10.00 ms in optimizer hooks
    """
    if not trace.seconds:
        return ""
    text = f"time: {seconds_text(trace.seconds)} wall clock, {seconds_text(trace.cpu_seconds)} CPU"
    if trace.seconds > BUSY_AFTER and trace.cpu_seconds < BUSY_SHARE * trace.seconds:
        text += (
            f" (the process had a CPU for {trace.cpu_seconds / trace.seconds:.0%} of the wall time: a loaded "
            "machine, or waiting for I/O or a GPU)"
        )
    own = trace.own_seconds
    total = sum(own.values())
    if not own:
        return text
    parts = sorted(own.items(), key=lambda part: -part[1])
    where = ", ".join(f"{seconds_text(s)} {_OWN_PARTS.get(name, f'in {name}')}" for name, s in parts)
    about = "about " if own.get(OWN_ESTIMATED) else ""
    return f"{text}; graphwatch itself: {about}{seconds_text(total)} ({total / trace.seconds:.0%}): {where}"


# The process had a CPU for less than this share of the wall time of a session longer than BUSY_AFTER
# seconds: the summary says so.
BUSY_SHARE, BUSY_AFTER = 0.6, 0.25
_OWN_PARTS = {"step ends": "at step ends", "around backwards": "around backwards"}
