"""``graphwatch run --check-fixes``: apply each finding's patch to a copy of the script's folder and run it again.

For each patch (findings that share one are checked once): the folder the
run started in (the script's own folder when the script lies outside it) is
copied to a scratch folder, within bounds (:data:`MAX_FILE_BYTES` a file,
:data:`MAX_COPY_BYTES` and :data:`MAX_FILES` in all; virtual environments,
version control, caches and the report folder are left out, and so are links
to folders: what was not copied is said); the patch is applied there with
``patch -p0``, as the report tells the user to; the script runs again, in a
new process, under ``graphwatch run --stop-after N`` for the steps the finding
needs (:func:`~graphwatch.analysis.patch_checks.steps_to_run`), with the same
arguments; and :func:`~graphwatch.analysis.patch_checks.judge` compares the
two traces.  The user's own files are only read.  An argument that names an
existing path outside the copied folder is not run at all (the script could
write there): the check says so instead.

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
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .analysis.evidence import human_bytes
from .analysis.patch_checks import LineMap, judge, steps_to_run
from .errors import TraceFormatError
from .model import Finding, PatchCheck, Trace, load_trace

MAX_FILE_BYTES = 64 * 1024 * 1024  # a larger file is not copied (a data set, a checkpoint)
MAX_COPY_BYTES = 512 * 1024 * 1024  # the whole copy
MAX_FILES = 20_000
MIN_TIMEOUT = 300.0  # seconds a patched run may take at least
LEFT_OUT = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", "node_modules", ".ipynb_checkpoints", ".idea", ".vscode",
})  # fmt: skip


def check_fixes(
    trace: Trace, script: Path, args: Sequence[str], *, report: Path | None = None, timeout: float = MIN_TIMEOUT,
    say: Callable[[str], None] | None = None,
) -> int:  # fmt: skip
    """Check every patch of ``trace``'s findings (``script`` ran with ``args``); set each finding's ``check``.

    ``report``: the report folder (not copied when it lies in the script's folder).  ``say``: where to
    print a line per check.  Returns how many patches were checked and held.
    """
    by_patch: dict[str, list[Finding]] = {}
    for finding in trace.findings:
        if finding.patch:
            by_patch.setdefault(finding.patch, []).append(finding)
    passed = 0
    for number, (patch, targets) in enumerate(by_patch.items(), 1):
        steps = steps_to_run(trace, targets)
        if say is not None:
            where = ", ".join((targets[0].evidence.get("sites") or [])[:1])
            say(f"checking the patch of {targets[0].kind}{f' at {where}' if where else ''} ({number} of "
                f"{len(by_patch)}): a copy of the folder, patched, runs {steps} steps")  # fmt: skip
        check = check_patch(trace, script, args, patch, targets, steps=steps, report=report, timeout=timeout)
        for finding in targets:
            finding.check = check
        passed += check.checked
        if say is not None:
            say("  patch checked" if check.checked else "  patch check FAILED (the summary says what failed)")
    return passed


def check_patch(
    trace: Trace, script: Path, args: Sequence[str], patch: str, targets: Sequence[Finding], *, steps: int,
    report: Path | None = None, timeout: float = MIN_TIMEOUT,
) -> PatchCheck:  # fmt: skip
    """Apply ``patch`` to a copy of ``script``'s folder, run ``steps`` steps of it and judge it against ``trace``."""
    cwd = Path(str(trace.options.get("cwd") or script.parent)).resolve()
    script = script.resolve()
    root = cwd if script.is_relative_to(cwd) else script.parent
    base, files = _patch_files(patch, cwd)
    refused = _outside(root, cwd, base, files, args)
    if refused:
        return PatchCheck(checked=False, failed=[f"not checked: {refused}"])
    with tempfile.TemporaryDirectory(prefix="graphwatch-check-") as temp:
        copy = Path(temp) / root.name
        skipped = copy_folder(root, copy, leave_out=[Path(temp), *([report] if report is not None else [])])
        moved = copy / base.relative_to(root)
        failure = apply_patch(patch, moved)
        if failure is not None:
            return PatchCheck(checked=False, failed=[f"the patch does not apply: {failure}"], skipped=skipped)
        lines = LineMap.between({
            _cited(name, base, cwd): ((base / name).read_text(), (moved / name).read_text()) for name in files
        })  # fmt: skip
        level = str(trace.options.get("level") or "default")
        run_in = copy / cwd.relative_to(root) if cwd.is_relative_to(root) else copy
        patched, failure = rerun(copy / script.relative_to(root), _moved_args(args, root, copy), run_in, steps,
                                 level, Path(temp) / "report", timeout)  # fmt: skip
        if patched is not None and _ran_originals(patched, root, Path(temp)):
            failure, patched = f"the patched run imported the script's files from {root}, not the patched copy", None
        elif patched is not None:
            _cite_as_original(patched, copy, root)
        return judge(trace, patched, targets, steps=steps, lines=lines, failure=failure, skipped=skipped)


# ------------------------------------------------------------------ the copy
def copy_folder(root: Path, dest: Path, leave_out: Sequence[Path] = ()) -> list[str]:
    """Copy ``root`` to ``dest`` within the bounds of the module's docstring; return what was left out."""
    skipped: list[str] = []
    total = count = 0
    left = {p.resolve() for p in leave_out}
    for folder, subfolders, names in os.walk(root):
        here = Path(folder)
        kept = []
        for name in sorted(subfolders):
            path = here / name
            if path.resolve() in left:  # the report folder, the scratch folder: not the user's to hear of
                continue
            if name in LEFT_OUT or path.is_symlink():
                skipped.append(f"{path.relative_to(root)}/" + (" (a link to a folder)" if path.is_symlink() else ""))
            else:
                kept.append(name)
        subfolders[:] = kept
        target = dest / here.relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(names):
            path = here / name
            try:
                size = path.stat().st_size  # (a link: the size of what it names; the copy holds the content)
            except OSError:
                skipped.append(f"{path.relative_to(root)} (unreadable)")
                continue
            if size > MAX_FILE_BYTES or total + size > MAX_COPY_BYTES or count >= MAX_FILES:
                skipped.append(f"{path.relative_to(root)} ({human_bytes(size)})")
                continue
            try:
                shutil.copyfile(path, target / name)
                shutil.copymode(path, target / name)
            except (OSError, shutil.SpecialFileError):  # a pipe, a socket, a file that went away
                skipped.append(f"{path.relative_to(root)} (not a regular file)")
                continue
            total, count = total + size, count + 1
    return skipped


def _patch_files(patch: str, cwd: Path) -> tuple[Path, list[str]]:
    """The folder ``patch -p0`` runs in (a ``# in DIR: patch -p0`` first line, else the run's folder) and the
    files the patch edits, as it names them."""
    lines = patch.splitlines()
    base = cwd
    if lines and lines[0].startswith("# in ") and lines[0].endswith(": patch -p0"):
        base = Path(lines[0][len("# in ") : -len(": patch -p0")])
    files = [line[4:].split("\t")[0].strip() for line in lines if line.startswith("+++ ")]
    return base.resolve(), files


def _outside(root: Path, cwd: Path, base: Path, files: Sequence[str], args: Sequence[str]) -> str:
    """Why the check must not run (the patch or an argument names a path outside the copy), or ""."""
    if not base.is_relative_to(root):
        return f"the patch edits files in {base}, outside the folder the check copies ({root})"
    for name in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"the patch names {name}, which is not a path inside {base}"
    for arg in args:
        value = arg.split("=", 1)[-1]
        if os.sep not in value and value not in (".", ".."):
            continue
        path = Path(os.path.normpath(cwd / value))
        if path.exists() and not path.resolve().is_relative_to(root):
            return (f"the argument {arg} names {path}, outside the folder the check copies ({root}); the patched "
                    "run could write there")  # fmt: skip
    return ""


def _moved_args(args: Sequence[str], root: Path, copy: Path) -> list[str]:
    """The arguments, with absolute paths inside ``root`` made paths inside the copy."""
    moved = []
    for arg in args:
        head, equals, value = arg.rpartition("=") if "=" in arg else ("", "", arg)
        if os.path.isabs(value) and Path(value).resolve().is_relative_to(root):
            value = str(copy / Path(value).resolve().relative_to(root))
        moved.append(f"{head}{equals}{value}")
    return moved


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
    script: Path, args: Sequence[str], cwd: Path, steps: int, level: str, report: Path, timeout: float
) -> tuple[Trace | None, str]:
    """Run ``script`` under ``graphwatch run --stop-after steps`` in a new process; (its trace, "") or (None, why)."""
    package = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "graphwatch", "run", "--quiet", "--no-progress", "--stop-after", str(steps),
               "--level", level, "--out", str(report), str(script), *args]  # fmt: skip
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"it did not end within {timeout:.0f} s"
    try:
        return load_trace(report / "trace.json"), ""
    except TraceFormatError:
        said = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return None, f"exit code {done.returncode}" + (f", {said[-1].strip()}" if said else "")


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
