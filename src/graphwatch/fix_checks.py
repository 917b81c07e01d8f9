"""``graphwatch run --check-fixes``: apply each finding's patch to a copy of the script's folder and run it again.

For each patch (findings that share one are checked once): the folder the
run started in (the script's own folder when the script lies outside it) is
copied to a scratch folder (:mod:`graphwatch.fix_checks_copy` says what is
copied and what never is: regular files only, within bounds, no secrets); the
patch is applied there with ``patch -p0``, as the report tells the user to;
the script runs again, in a new process of its own session (forked off a
process started before the script ran, else a cold Python:
:mod:`graphwatch.warm_start`), under ``graphwatch run --stop-after N`` for
the steps the finding needs (:func:`~graphwatch.analysis.patch_checks.steps_to_run`), with the same
arguments; and :func:`~graphwatch.analysis.patch_checks.judge` compares the two
traces.  The user's own files are only read: arguments and environment
variables naming a path outside the copied folder stop the check unless
allowed (:mod:`graphwatch.fix_checks_paths`).  The patched run and every
process it started are killed at its timeout (:func:`check_timeout`) and when
it ends; ``stop()`` (SIGTERM, Ctrl-C) ends a check within
:data:`POLL_SECONDS`, and the scratch folder is removed whatever happens
(one left by a process killed outright is removed by the next check).  When two
or more patches hold, one more run checks them all applied together, as
``--patch-out`` writes them (:func:`check_together`).

Example::

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "train.py").write_text("x = 1\\n")
    >>> scratch = pathlib.Path(tempfile.mkdtemp())
    >>> copy_folder(folder, scratch / "copy"), (scratch / "copy" / "train.py").read_text()
    ([], 'x = 1\\n')
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .analysis.patch_checks import LineMap, judge, steps_to_run, together
from .errors import TraceFormatError, UsageError
from .fix_checks_copy import CheckStopped, FolderTooLarge, copy_folder, folder_refusal, survey
from .fix_checks_paths import moved_args, outside_arguments, outside_environment
from .model import Finding, PatchCheck, Trace, load_trace
from .warm_start import PatchedProcess, start_run

MIN_TIMEOUT = 300.0  # seconds a patched run may take at least
TIMEOUT_VARIABLE = "GRAPHWATCH_CHECK_TIMEOUT"  # seconds a patched run may take, instead (for tests)
POLL_SECONDS = 0.05
SCRATCH_PREFIX = "graphwatch-check-"
STDERR_TAIL_BYTES = 64 * 1024


def check_timeout(elapsed: float) -> float:
    """Seconds a patched run may take: five times the original run, at least :data:`MIN_TIMEOUT`; or the
    number in ``$GRAPHWATCH_CHECK_TIMEOUT`` (meant for tests).

    >>> check_timeout(100.0) if "GRAPHWATCH_CHECK_TIMEOUT" not in os.environ else 500.0
    500.0
    """
    try:
        chosen = float(os.environ.get(TIMEOUT_VARIABLE, ""))
    except ValueError:
        chosen = 0.0
    return chosen if chosen > 0 else max(MIN_TIMEOUT, 5 * elapsed)


def copied_folder(script: Path, cwd: Path) -> Path:
    """The folder the check copies: ``cwd``, or the script's folder when the script lies outside it."""
    cwd, script = cwd.resolve(), script.resolve()
    return cwd if script.is_relative_to(cwd) else script.parent


def refusal(
    script: Path, cwd: Path, args: Sequence[str], env: Mapping[str, str], allowed: Sequence[Path] = (),
    report: Path | None = None,
) -> str:  # fmt: skip
    """Why ``--check-fixes`` must not run for ``script`` started from ``cwd`` with ``args`` and ``env`` (the
    folder it would copy, or paths outside it the patched run could write), or ""; checked before the script
    runs."""
    root = copied_folder(script, cwd)
    return folder_refusal(root, script) or survey(root, [report] if report is not None else []) or _outside(
        root, cwd.resolve(), args, env, [Path(a).expanduser().resolve() for a in allowed]
    )


def check_fixes(
    trace: Trace, script: Path, args: Sequence[str], *, report: Path | None = None, timeout: float = MIN_TIMEOUT,
    say: Callable[[str], None] | None = None, allowed: Sequence[Path] = (), stop: Callable[[], bool] = lambda: False,
    on_verdict: Callable[[], None] = lambda: None,
) -> int:  # fmt: skip
    """Check every patch of ``trace``'s findings (``script`` ran with ``args``); set each finding's ``check``.

    ``report``: the report folder (not copied when it lies in the script's folder).  ``say``: where to
    print a line per check.  ``allowed``: paths outside the folder the patched run may name.
    ``on_verdict()`` runs after each verdict (to write the report again).  Raises :class:`CheckStopped` once
    ``stop()``.  Returns how many patches were checked and held.
    """
    by_patch: dict[str, list[Finding]] = {}
    for finding in trace.findings:
        if finding.patch:
            by_patch.setdefault(finding.patch, []).append(finding)
    passed = 0
    remove_stale_scratch()
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        for number, (patch, targets) in enumerate(by_patch.items(), 1):
            steps = steps_to_run(trace, targets)
            if say is not None:
                where = ", ".join((targets[0].evidence.get("sites") or [])[:1])
                say(f"checking the patch of {targets[0].kind}{f' at {where}' if where else ''} ({number} of "
                    f"{len(by_patch)}): a copy of the folder, patched, runs {steps} steps")  # fmt: skip
            check = check_patch(trace, script, args, patch, targets, steps=steps, report=report, timeout=timeout,
                                allowed=allowed, stop=stop, scratch=scratch)  # fmt: skip
            for finding in targets:
                finding.check = check
            on_verdict()
            passed += check.checked
            if say is not None:
                say("  patch checked" if check.checked else "  patch check FAILED (the summary says what failed)")
        passed -= check_together(trace, script, args, report=report, timeout=timeout, say=say, allowed=allowed,
                                 stop=stop, scratch=scratch, on_verdict=on_verdict)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return passed


def check_together(
    trace: Trace, script: Path, args: Sequence[str], *, report: Path | None, timeout: float,
    say: Callable[[str], None] | None, allowed: Sequence[Path], stop: Callable[[], bool], scratch: Path,
    on_verdict: Callable[[], None],
) -> int:  # fmt: skip
    """Check the patches whose own check held all applied together, as ``--patch-out`` writes them (one more
    run, only when there are two or more); each of their checks gets the verdict.  Returns how many of those
    patches failed together."""
    from .rendering.patch_file import combined_patch

    held = [f for f in trace.findings if f.patch and f.check is not None and f.check.checked]
    checks = list({id(f.check): f.check for f in held if f.check is not None}.values())
    joint_patch = combined_patch(held, str(trace.options.get("cwd") or script.parent))
    if len(checks) < 2 or any(line.startswith("# in ") for line in joint_patch.splitlines()):
        return 0  # one patch was checked as it is; patches of files in other folders apply one folder at a time
    steps = steps_to_run(trace, held)
    if say is not None:
        say(f"checking the {len(checks)} patches together, as --patch-out writes them: a copy of the folder, "
            f"patched, runs {steps} steps")  # fmt: skip
    joint = check_patch(trace, script, args, joint_patch, held, steps=steps, report=report, timeout=timeout,
                        allowed=allowed, stop=stop, scratch=scratch)  # fmt: skip
    for check in checks:
        together(check, joint, len(checks) - 1)
    on_verdict()
    if say is not None:
        say("  patches checked together" if joint.checked else "  patches together FAILED (the summary says what failed)")
    return 0 if joint.checked else len(checks)


def check_patch(
    trace: Trace, script: Path, args: Sequence[str], patch: str, targets: Sequence[Finding], *, steps: int,
    report: Path | None = None, timeout: float = MIN_TIMEOUT, allowed: Sequence[Path] = (),
    stop: Callable[[], bool] = lambda: False, scratch: Path | None = None,
) -> PatchCheck:  # fmt: skip
    """Apply ``patch`` to a copy of ``script``'s folder (in a folder made in ``scratch``), run ``steps`` steps
    of it and judge it against ``trace``.  Raises :class:`CheckStopped` once ``stop()``."""
    cwd = Path(str(trace.options.get("cwd") or script.parent)).resolve()
    script = script.resolve()
    root = copied_folder(script, cwd)
    base, files = _patch_files(patch, cwd)
    refused = folder_refusal(root, script) or _patch_outside(root, base, files) or _outside(
        root, cwd, args, os.environ, [Path(a).expanduser().resolve() for a in allowed]
    )
    if refused:
        return PatchCheck(checked=False, failed=[f"not checked: {refused}"])
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=scratch) as temp:
        copy = Path(temp) / root.name
        try:
            skipped = copy_folder(root, copy, [Path(temp), *([report] if report is not None else [])], stop)
        except FolderTooLarge as exc:
            return PatchCheck(checked=False, failed=[f"not checked: {exc}"])
        moved = copy / base.relative_to(root)
        failure = apply_patch(patch, moved)
        if failure is not None:
            return PatchCheck(checked=False, failed=[f"the patch does not apply: {failure}"], skipped=skipped)
        lines = LineMap.between({
            _cited(name, base, cwd): ((base / name).read_text(), (moved / name).read_text()) for name in files
        })  # fmt: skip
        level = str(trace.options.get("level") or "default")
        run_in = copy / cwd.relative_to(root) if cwd.is_relative_to(root) else copy
        patched, failure = rerun(copy / script.relative_to(root), moved_args(args, root, copy), run_in, steps,
                                 level, Path(temp) / "report", timeout, stop)  # fmt: skip
        if patched is not None and _ran_originals(patched, root, Path(temp)):
            failure, patched = f"the patched run imported the script's files from {root}, not the patched copy", None
        elif patched is not None:
            _cite_as_original(patched, copy, root)
        return judge(trace, patched, targets, steps=steps, lines=lines, failure=failure, skipped=skipped)


def remove_stale_scratch() -> None:
    """Remove the scratch folders of checks whose process is gone (killed outright: SIGKILL, a crash)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name[len(SCRATCH_PREFIX) :].partition("-")[0]
        try:
            if not pid.isdigit() or folder.is_symlink() or folder.lstat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # alive (someone else's), or unreadable
            continue


def _patch_files(patch: str, cwd: Path) -> tuple[Path, list[str]]:
    """The folder ``patch -p0`` runs in (a ``# in DIR: patch -p0`` first line, else the run's folder) and the
    files the patch edits, as it names them."""
    lines = patch.splitlines()
    base = cwd
    if lines and lines[0].startswith("# in ") and lines[0].endswith(": patch -p0"):
        base = Path(lines[0][len("# in ") : -len(": patch -p0")])
    files = [line[4:].split("\t")[0].strip() for line in lines if line.startswith("+++ ")]
    return base.resolve(), files


def _patch_outside(root: Path, base: Path, files: Sequence[str]) -> str:
    """Why the patch edits files outside the copy, or ""."""
    if not base.is_relative_to(root):
        return f"the patch edits files in {base}, outside the folder the check copies ({root})"
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"the patch names {name}, which is not a path inside {base}"
    return ""


def _outside(root: Path, cwd: Path, args: Sequence[str], env: Mapping[str, str], allowed: Sequence[Path]) -> str:
    """Why the patched run could write outside the copy of ``root`` (arguments and environment variables
    naming paths outside it, not ``allowed``), or ""."""
    arguments = outside_arguments(args, cwd if cwd.is_relative_to(root) else root, root, allowed)
    variables = outside_environment(env, root, allowed)
    if not arguments and not variables:
        return ""
    named = [f"the argument{'s' if len(arguments) > 1 else ''} {' '.join(arguments)}"] if arguments else []
    named += [f"the environment variable{'s' if len(variables) > 1 else ''} {', '.join(variables)}"] if variables else []
    return (f"{' and '.join(named)} name{'s' if len(arguments) + len(variables) == 1 else ''} a path outside the "
            f"folder the check copies ({root}), where the patched run could write; run from a folder that holds "
            "it, or allow it with --check-allow-path PATH")  # fmt: skip


def _cited(name: str, base: Path, cwd: Path) -> str:
    """How the traces cite the patched file ``name`` (relative to the run's folder, else absolute)."""
    path = base / name
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def apply_patch(patch: str, folder: Path) -> str | None:
    """Apply ``patch`` in ``folder`` with ``patch -p0`` (else ``git apply``); None, or why it did not apply."""
    text = "\n".join(line for line in patch.splitlines() if not line.startswith("# in ")) + "\n"
    if shutil.which("patch"):
        command = ["patch", "-p0", "--batch", "--forward", "--no-backup-if-mismatch", "--reject-file=-"]
    elif shutil.which("git"):
        command = ["git", "apply", "-p0", "--unsafe-paths", "-"]
    else:
        return "neither `patch` nor `git` is installed"
    done = subprocess.run(command, cwd=folder, input=text, capture_output=True, text=True)
    if done.returncode:
        said = (done.stdout + done.stderr).strip().splitlines()
        return said[-1] if said else f"{command[0]} exited with {done.returncode}"
    return None


# ------------------------------------------------------------------ the patched run
def rerun(
    script: Path, args: Sequence[str], cwd: Path, steps: int, level: str, report: Path, timeout: float,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[Trace | None, str]:  # fmt: skip
    """Run ``script`` under ``graphwatch run --trace-only --stop-after steps`` (``report`` gets its trace.json,
    no HTML and no pictures) in a new process of its own session (forked off the zygote, or a cold start:
    :mod:`graphwatch.warm_start`); (its trace, "") or (None, why).  Every
    process of that session is killed when it ends or at ``timeout``; raises :class:`CheckStopped` (the
    processes killed) once ``stop()``."""
    package = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")])))
    command = ["run", "--quiet", "--no-progress", "--trace-only", "--stop-after", str(steps), "--level", level,
               "--out", str(report), str(script), *args]  # fmt: skip
    errors = report.parent / "patched-run-stderr.txt"
    with open(errors, "wb") as stderr:  # a file, not a pipe: a process the script left running may hold it
        process = start_run(command, cwd, env, stderr.fileno())
    try:
        ended = _wait(process, timeout, stop)
    finally:
        process.end()
    if not ended:
        return None, f"it did not end within {timeout:.0f} s"
    try:
        return load_trace(report / "trace.json"), ""
    except (TraceFormatError, UsageError):
        said = [line for line in _tail(errors).splitlines() if line.strip()]
        code = "unknown (its zygote died)" if process.returncode is None else process.returncode
        return None, f"exit code {code}" + (f", {said[-1].strip()}" if said else "")


def _wait(process: PatchedProcess, timeout: float, stop: Callable[[], bool]) -> bool:
    """Wait for ``process`` to end (its process group stays its own until :meth:`~PatchedProcess.end`); False
    at ``timeout``; :class:`CheckStopped` once ``stop()``."""
    deadline = time.monotonic() + timeout
    while not process.has_ended():
        if stop():
            raise CheckStopped
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)
    return True


def _tail(path: Path) -> str:
    """The last :data:`STDERR_TAIL_BYTES` of ``path``, as text."""
    with open(path, "rb") as file:
        file.seek(max(0, path.stat().st_size - STDERR_TAIL_BYTES))
        return file.read().decode("utf-8", "replace")


def _cite_as_original(patched: Trace, copy: Path, root: Path) -> None:
    """Name the copy's files as the original run named them, in its sites and its findings' cited lines: an
    absolute path into ``copy`` becomes the same path in ``root`` (relative names are the same in both runs)."""

    def original(file: str) -> str:
        return str(root / Path(file).relative_to(copy)) if os.path.isabs(file) and Path(file).is_relative_to(copy) else file

    for site in patched.sites:
        site.file = original(site.file)
    for finding in patched.findings:
        cited = finding.evidence.get("sites")
        if isinstance(cited, list):
            finding.evidence["sites"] = [":".join((original(s.rpartition(":")[0]), s.rpartition(":")[2])) if ":" in s else s
                                         for s in map(str, cited)]  # fmt: skip


def _ran_originals(patched: Trace, root: Path, scratch: Path) -> bool:
    """Whether the patched run cited the user's own files (absolute paths into ``root``, not into the
    ``scratch`` copy): it imported them from there (an installed package of the folder), so the patch was
    not what ran."""
    return any(
        os.path.isabs(site.file) and Path(site.file).is_relative_to(root) and not Path(site.file).is_relative_to(scratch)
        for site in patched.sites
    )
