"""Which paths outside the copied folder a ``--check-fixes`` rerun could write to: its arguments, its environment.

The patched run gets the script's own arguments and this process's
environment.  Its writes must stay in the copy, so the check does not run
when either names a path outside the copied folder, unless the user allowed
that path (``graphwatch run --check-allow-path PATH``, repeatable; a path
allows everything under it).

An **argument** is refused when it holds, anywhere, a path outside the
folder: the whole argument, what follows an ``=`` (``--out=/x``), a ``,`` or
a ``:`` (``a.txt,/x``), or a one-letter option glued to its value
(``-o/x``), when that starts with ``/`` or ``~`` (absolute, whether it exists
or not: ``--prefix /x/exp1`` makes the script write ``/x/exp1_ckpt.txt``), or
is a relative path with a ``/`` that leads out (``../x``).  URLs
(``https://...``) and ``/dev/null``, ``/dev/stdout``, ``/dev/stderr`` are not
paths to guard.

An **environment variable** is refused when its value is an absolute or
``~`` path, or a list of them joined by ``:``, with one outside the folder
that a script could be meant to write: not under a system folder
(:data:`SYSTEM_FOLDERS`, Python's own prefixes), not a hidden file or folder
(``~/.cache``, ``~/.pyenv``: a tool's configuration or cache), and the
variable is not one the system or a toolchain sets (:data:`STANDARD_VARIABLES`,
or a name starting with one of :data:`STANDARD_PREFIXES`) nor a cache's (a
name holding ``CACHE``: ``TORCHINDUCTOR_CACHE_DIR``, ``HF_HUB_CACHE``; caches
are shared between runs by design).  So
``OUT_DIR=/data/runs`` is refused; ``PATH``, ``HOME``, ``TMPDIR``,
``SSL_CERT_FILE=/etc/...`` are not.

Example::

    >>> from pathlib import Path
    >>> outside_arguments(["--lr", "0.1", "-o/x/log.txt", "--save=runs/a"], Path("/p"), Path("/p"), [])
    ['-o/x/log.txt']
    >>> outside_environment({"OUT_DIR": "/x/runs", "PATH": "/usr/bin:/x/bin", "SEED": "3"}, Path("/p"), [])
    ['OUT_DIR=/x/runs']
    >>> moved_args(["--out=/p/runs", "/x"], Path("/p"), Path("/tmp/copy"))
    ['--out=/tmp/copy/runs', '/x']
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

HARMLESS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
SYSTEM_FOLDERS = (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc", "/sys", "/dev", "/run",
    "/var/lib", "/var/cache", "/var/run", "/nix", "/snap", "/boot", "/System", "/Library", "/Applications",
)  # fmt: skip
STANDARD_VARIABLES = frozenset({
    "PATH", "HOME", "PWD", "OLDPWD", "SHELL", "USER", "LOGNAME", "MAIL", "TERM", "TMPDIR", "TEMP", "TMP", "EDITOR",
    "VISUAL", "PAGER", "BROWSER", "DISPLAY", "XAUTHORITY", "HISTFILE", "INPUTRC", "MANPATH", "INFOPATH", "VIRTUAL_ENV",
    "PKG_CONFIG_PATH", "CPATH", "LIBRARY_PATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "CC", "CXX", "JAVA_HOME",
    "GOPATH", "GOROOT", "CARGO_HOME", "RUSTUP_HOME", "NVM_DIR", "PYENV_ROOT", "CUDA_HOME", "CUDA_PATH", "_",
})  # fmt: skip
STANDARD_PREFIXES = ("PYTHON", "LD_", "DYLD_", "LC_", "XDG_", "SSH_", "GPG_", "DBUS_", "CONDA", "TERM", "SSL_", "PIP_")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_SHORT_OPTION = re.compile(r"-[A-Za-z](?=[/~.])")


def path_spans(arg: str) -> Iterator[tuple[int, int]]:
    """Where ``arg`` may hold a path: the whole, after ``=``, ``,`` or ``:``, after a glued one-letter option.

    >>> [("-o/x,y=/z"[a:b]) for a, b in path_spans("-o/x,y=/z")]
    ['/x', 'y=/z', '/z']
    """
    urls = [m.span() for m in _URL.finditer(arg)]
    starts = {0} | {i + 1 for i, c in enumerate(arg) if c in "=,:"}
    glued = _SHORT_OPTION.match(arg)
    if glued:
        starts = (starts - {0}) | {glued.end()}
    for start in sorted(starts):
        if any(a <= start < b for a, b in urls) or start >= len(arg):
            continue
        end = min((i for i in range(start, len(arg)) if arg[i] in ",:"), default=len(arg))
        yield start, end


def _as_path(text: str, cwd: Path) -> Path | None:
    """``text`` as the path it names, or None when it is no path to guard (no ``/``, a URL's part)."""
    if text.startswith("~"):
        return Path(os.path.normpath(Path(text).expanduser()))
    if "/" not in text and text not in (".", ".."):
        return None
    return Path(os.path.normpath(cwd / text))


def _allowed(path: Path, root: Path, allowed: Sequence[Path]) -> bool:
    if str(path) in HARMLESS:
        return True
    real = path.resolve()
    return real.is_relative_to(root) or any(real.is_relative_to(a) or path.is_relative_to(a) for a in allowed)


def outside_arguments(args: Sequence[str], cwd: Path, root: Path, allowed: Sequence[Path]) -> list[str]:
    """The arguments that name a path outside ``root`` (relative ones read from ``cwd``) not under ``allowed``."""
    refused = []
    for arg in args:
        for start, end in path_spans(arg):
            path = _as_path(arg[start:end], cwd)
            if path is not None and not _allowed(path, root, allowed):
                refused.append(arg)
                break
    return refused


def outside_environment(env: Mapping[str, str], root: Path, allowed: Sequence[Path]) -> list[str]:
    """``NAME=VALUE`` of each variable of ``env`` that names a path outside ``root`` a script could write
    (the module's rule)."""
    system = (*SYSTEM_FOLDERS, sys.prefix, sys.base_prefix, sys.exec_prefix)
    refused = []
    for name, value in sorted(env.items()):
        if name in STANDARD_VARIABLES or name.startswith(STANDARD_PREFIXES) or "CACHE" in name.upper():
            continue
        for item in value.split(os.pathsep):
            if not item.startswith(("/", "~")):
                continue
            path = Path(os.path.normpath(Path(item).expanduser()))
            if any(path.is_relative_to(folder) for folder in system) or any(p.startswith(".") for p in path.parts):
                continue
            if not _allowed(path, root, allowed):
                refused.append(f"{name}={value}")
                break
    return refused


def moved_args(args: Sequence[str], root: Path, copy: Path) -> list[str]:
    """The arguments, with each absolute path inside ``root`` (wherever :func:`path_spans` finds one) made the
    same path inside ``copy``."""
    moved = []
    for arg in args:
        pieces, last = [], 0
        for start, end in path_spans(arg):
            text = arg[start:end]
            if start >= last and os.path.isabs(text) and Path(text).resolve().is_relative_to(root):
                pieces += [arg[last:start], str(copy / Path(text).resolve().relative_to(root))]
                last = end
        moved.append("".join(pieces) + arg[last:])
    return moved
