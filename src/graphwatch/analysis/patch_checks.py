"""The verdict on a finding's patch: the original run's trace against the patched run's (``--check-fixes``).

Pure functions of two traces.  :func:`steps_to_run` says how many steps the
patched run needs to show the finding again if the patch did not fix it;
:func:`judge` makes the :class:`~graphwatch.model.PatchCheck`:

- the finding is gone: no finding of the patched run is the same (its kind,
  its holder, and its own line, the first it cites, once the patch's line
  shifts are undone by a :class:`LineMap`), and no growth is still explained
  by it (a growth the original run's other findings explain is theirs);
- no new error (the patched run ends where it was stopped, or at the script's
  end, or with the error the original ended with when that was not the
  finding's) and no new finding (each finding of the patched run is one the
  original run had);
- every parameter that got a gradient in the steps both runs ran still gets
  one and is stepped by the same optimizer (by name where both runs name it,
  else by optimizer, group, index and shape); when the original run died with
  an error, also each optimizer it never saw step must step in the patched run
  and give every parameter it owns a gradient: a detach in the wrong place
  (a GAN's generator step) stops a whole network from learning.

Example::

    >>> from graphwatch.model import Finding, Trace
    >>> finding = Finding("graph-kept-alive", "warning", 3, "m", "f", {"sites": ["train.py:27"]})
    >>> steps_to_run(Trace(), [finding])
    5
    >>> lines = LineMap.between({"train.py": ("a\\nb\\n", "a\\nx = 1\\nb\\n")})
    >>> sorted(lines.before("train.py", 3)), sorted(lines.before("train.py", 2))
    ([2], [2])
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model import Finding, OptimizerRecord, ParameterRecord, PatchCheck, Trace
from .detectors import FINDING_KINDS
from .evidence import counted

MIN_STEPS = 3  # the step that showed the finding and the one after it, at least
AFTER_AN_ERROR = 5  # steps after the one an error ended: every optimizer of the loop gets to step
STOPPED = "stopped at the end of step"  # how a run stopped by --stop-after ends (capture.steps.step_limit)


def steps_to_run(original: Trace, targets: Sequence[Finding]) -> int:
    """How many steps the patched run needs: up to the step after the last one the findings cite, past
    the step an error ended the original run in, and at least :data:`MIN_STEPS`."""
    seen = [f.step for f in targets] + [int(s) for f in targets for s in f.evidence.get("steps") or []]
    needed = max([MIN_STEPS, *(s + 2 for s in seen)])
    if _error(original) is not None:
        needed = max(needed, max(len(original.steps) - 1, 0) + AFTER_AN_ERROR)
    return needed


@dataclass
class LineMap:
    """Lines of the patched files back to the lines they were: an unchanged line to itself, a line the patch
    added or changed to the lines that hunk replaced (an insertion: to the line it was put before)."""

    changed: dict[str, list[tuple[str, int, int, int, int]]] = field(default_factory=dict)  # file -> opcodes

    @classmethod
    def between(cls, files: Mapping[str, tuple[str, str]]) -> LineMap:
        """``files``: the cited file name -> (its text before the patch, after it)."""
        changed: dict[str, list[tuple[str, int, int, int, int]]] = {}
        for name, (before, after) in files.items():
            matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
            changed[name] = list(matcher.get_opcodes())
        return cls(changed)

    def before(self, file: str, line: int) -> set[int]:
        """The original line numbers of ``line`` of the patched ``file`` (itself for a file the patch left)."""
        index = line - 1
        for tag, i1, i2, j1, j2 in self.changed.get(file, ()):
            if j1 <= index < j2:
                return {i1 + index - j1 + 1} if tag == "equal" else set(range(i1 + 1, i2 + 1)) or {i1 + 1}
        return {line}

    def sites_before(self, sites: Iterable[str]) -> set[str]:
        """``file:line`` strings of the patched run as the original run would cite them."""
        found = set()
        for site in sites:
            file, _, line = str(site).rpartition(":")
            if file and line.isdigit():
                found |= {f"{file}:{n}" for n in self.before(file, int(line))}
            else:
                found.add(str(site))
        return found


def judge(
    original: Trace, patched: Trace | None, targets: Sequence[Finding], *, steps: int, lines: LineMap,
    failure: str = "", skipped: Sequence[str] = (),
) -> PatchCheck:  # fmt: skip
    """The check of the patch that ``targets`` share, from the patched run's trace (None: it wrote none,
    ``failure`` says why).  ``steps``: how many the patched run was asked to run."""
    check = PatchCheck(checked=False, held=["the patch applies"], skipped=list(skipped))
    if patched is None:
        check.failed.append(f"the patched run wrote no trace: {failure}" if failure else "the patched run wrote no trace")
        return check
    ran = min(len(patched.steps), steps) if _stopped(patched) else len(patched.steps)
    check.steps = ran
    left, new = _findings(original, patched, targets, lines)
    showed = max(f.step for f in targets) if targets else 0
    if left:
        check.failed.append("the finding is still there: " + "; ".join(_named(f) for f in left))
    elif _error(patched) is not None and ran <= showed:
        check.failed.append(f"cannot tell whether the finding is gone: the patched run ended before step {showed}, "
                            "where it showed")  # fmt: skip
    else:
        check.held.append("the finding is gone")
    _errors(original, patched, targets, check)
    if new:
        check.failed.append("the patched run has a new finding: " + "; ".join(_named(f) for f in new))
    else:
        check.held.append("no new finding")
    _training(original, patched, ran, check)
    check.checked = not check.failed
    return check


# ------------------------------------------------------------------ errors and findings
def _error(trace: Trace) -> str | None:
    """The error that ended the run (its first line), or None when it ended as a script ends or was stopped."""
    reason = (trace.ended_early or "").strip()
    if not reason or reason.startswith(STOPPED) or reason in ("SystemExit: 0", "SystemExit"):
        return None
    return reason.splitlines()[0]


def _stopped(trace: Trace) -> bool:
    return (trace.ended_early or "").startswith(STOPPED)


def _errors(original: Trace, patched: Trace, targets: Sequence[Finding], check: PatchCheck) -> None:
    error, before = _error(patched), _error(original)
    ends = f"it stopped after {counted(check.steps, 'step')}" if _stopped(patched) else "it ran to the script's end"
    if error is None:
        check.held.append(f"the patched run raised no error ({ends})")
    elif error == before and not any(f.severity == "error" for f in targets):
        check.held.append(f"no new error (it ends with the error the run ended with before: {error})")
    elif error == before:
        check.failed.append(f"the patched run still ends with the error: {error}")
    else:
        check.failed.append(f"the patched run raised a new error: {error}")


def _problems(trace: Trace) -> list[Finding]:
    return [f for f in trace.findings if f.kind in FINDING_KINDS]


def _same(before: Finding, after: Finding, lines: LineMap) -> bool:
    """Whether the patched run's finding ``after`` is the original run's ``before``, judged by its root cause:
    the same kind, the same holder (when both name one), and the same own line (the first it cites, where its
    fix goes), once the patch's line shifts are undone; or one of the holders ``before`` names as one root
    cause with its own (:func:`_owned`).  A line both merely pass through (a model's forward
    that made the graph two holders keep) does not make them one finding.  A growth is a consequence: the same
    as ``before`` when the findings that explain it are among those that explained ``before``."""
    if before.kind != after.kind:
        return False
    cited, citing = before.evidence.get("sites") or [], after.evidence.get("sites") or []
    if not (cited and citing):
        return not (cited or citing)
    if before.kind == "memory-growth":
        return lines.sites_before(citing) <= set(cited)
    holder, own = after.evidence.get("holder"), lines.sites_before(citing[:1])
    return any(line in own and (None in (holder, kept) or holder == kept) for kept, line in _owned(before))


def _owned(finding: Finding) -> list[tuple[str | None, str]]:
    """(holder, its own line) of ``finding``: its holder and first line; a kept-alive finding's holders fed from
    it or by the same ``return`` (one root cause: :mod:`.leaks`) with theirs, too."""
    ev = finding.evidence
    fed = [ev["fed"]] if ev.get("fed") else []
    return [(ev.get("holder"), ev["sites"][0])] + [(h["holder"], h["at"]) for h in fed + list(ev.get("also") or [])]


def _findings(original: Trace, patched: Trace, targets: Sequence[Finding], lines: LineMap) -> tuple[list, list]:
    """(the patched run's findings that are the targets, or a growth still explained by a target's own line;
    those the original run did not have)."""
    own = {f.evidence["sites"][0] for f in targets if f.evidence.get("sites")}
    left = [f for f in _problems(patched) if any(_same(t, f, lines) for t in targets)
            or (f.kind == "memory-growth" and own & lines.sites_before(f.evidence.get("sites") or []))]  # fmt: skip
    others = [f for f in _problems(original) if f not in targets]
    return left, [f for f in _problems(patched) if f not in left and not any(_same(o, f, lines) for o in others)]


def together(alone: PatchCheck, joint: PatchCheck, others: int) -> None:
    """Add to ``alone`` (a patch's own check, which held) the verdict of the check of all the run's patches
    applied together, as ``--patch-out`` writes them (``others``: how many other patches it held): a patch
    that breaks training with the others is not the fix to apply either."""
    how = f"with the run's {others} other patch{'es' * (others != 1)} applied too, as --patch-out writes them"
    if joint.checked:
        alone.held.append(f"checked {how}")
        return
    alone.failed.append(f"{how}: " + "; ".join(joint.failed))
    alone.checked = False


def _named(finding: Finding) -> str:
    sites = ", ".join((finding.evidence.get("sites") or [])[:2])
    return f"{finding.kind} in step {finding.step}" + (f" at {sites}" if sites else "")


# ------------------------------------------------------------------ what trains
def _training(original: Trace, patched: Trace, ran: int, check: PatchCheck) -> None:
    before_opt = {o.index: o for o in original.optimizers}
    after_opt = {o.index: o for o in patched.optimizers}
    by_name = {p.name: p for p in patched.parameters if p.name}
    by_key = {p.key: p for p in patched.parameters}
    trained = [p for p in original.parameters if p.first_grad_step is not None and p.first_grad_step < ran]
    problems: dict[str, list[str]] = {}  # what went wrong -> the parameters it went wrong for
    for param in trained:
        was = before_opt.get(param.optimizer)
        now = by_name.get(param.name) if param.name in by_name else by_key.get(param.key)
        by = after_opt.get(now.optimizer) if now is not None else None
        if now is None or by is None:
            problems.setdefault(f"no longer stepped by {_label(was)}", []).append(param.label)
        elif not _same_optimizer(was, by):
            problems.setdefault(f"stepped by {by.label}, not by {_label(was)} as before", []).append(param.label)
        elif not now.trained or (now.first_grad_step or 0) >= ran:
            problems.setdefault(f"got no gradient in the patched run, stepped by {by.label}", []).append(param.label)
    check.failed += [_listed(names, what) for what, names in problems.items()]
    if trained and not problems:
        check.held.append(f"the {counted(len(trained), 'parameter')} that got gradients before still get them, "
                          "stepped by the same optimizers")  # fmt: skip
    if _error(original) is not None:
        _every_optimizer_trains(original, patched, ran, check)


def _every_optimizer_trains(original: Trace, patched: Trace, ran: int, check: PatchCheck) -> None:
    """The original run died: each optimizer it never saw step must step and give all it owns a gradient."""
    stepped = [o for o in original.optimizers if o.steps]
    fresh = [o for o in patched.optimizers if not any(_same_optimizer(o, s) for s in stepped)]
    failed = len(check.failed)
    for optimizer in fresh:
        if not optimizer.steps:
            check.failed.append(f"{optimizer.label} never stepped in the {counted(ran, 'step')} of the patched run")
            continue
        untrained = [p.label for p in parameters_of(patched, optimizer.index) if not p.trained]
        if untrained:
            check.failed.append(_listed(untrained, f"owned by {optimizer.label}, got no gradient in "
                                                   f"{counted(ran, 'step')} of the patched run"))  # fmt: skip
    if fresh and len(check.failed) == failed:
        names, one = ", ".join(o.label for o in fresh), len(fresh) == 1
        check.held.append(f"{names}, which never stepped before the error, now "
                          + ("steps and gives every parameter it owns" if one else "step and give every parameter they own")
                          + " a gradient")  # fmt: skip


def _same_optimizer(a: OptimizerRecord | None, b: OptimizerRecord | None) -> bool:
    if a is None or b is None or a.kind != b.kind:
        return False
    return a.name == b.name if a.name and b.name else a.index == b.index


def _label(optimizer: OptimizerRecord | None) -> str:
    return optimizer.label if optimizer is not None else "its optimizer"


def _listed(names: Sequence[str], what: str, limit: int = 3) -> str:
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"{shown} ({counted(len(names), 'parameter')}): {what}" if len(names) > 1 else f"{shown}: {what}"


def parameters_of(trace: Trace, optimizer: int) -> list[ParameterRecord]:
    """The parameters ``trace`` recorded for the optimizer of that index.

    >>> parameters_of(Trace(), 0)
    []
    """
    return [p for p in trace.parameters if p.optimizer == optimizer]
