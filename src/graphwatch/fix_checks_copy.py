"""The copy of the user's folder that ``--check-fixes`` patches and runs: what it may read and how much.

- **Which folder.** Never ``/``, a system folder (``/proc``, ``/sys``,
  ``/dev``) or a home folder (yours, any user's in the password database,
  ``/home/NAME``, or a folder holding ``.ssh`` or ``.gnupg``):
  :func:`folder_refusal` says to run from the project's folder instead.
- **Regular files only.** A file is copied when ``lstat`` and then ``fstat``
  of the opened file both say it is a regular file (a device, a FIFO, a
  socket is never opened for reading: ``/dev/zero`` reports size 0 and never
  ends).  A link to a file is followed only when its target lies inside the
  folder; links to folders are not followed.
- **Bounded by what is read.** Files are read in chunks and counted by the
  bytes actually read: a file over :data:`MAX_FILE_BYTES` is left out; a
  folder over :data:`MAX_COPY_BYTES` or :data:`MAX_FILES` (files and folders
  walked) is refused (:class:`FolderTooLarge`), and the walk stops there.
- **Secrets stay.** Files and folders that hold secrets by convention
  (:data:`SECRETS`: ``.env*``, ``.ssh``, ``.aws``, ``*.pem``, ``id_rsa*``,
  ``.netrc``, ...) are never read; virtual environments, version control and
  caches (:data:`LEFT_OUT`) are not copied either.  What was left out is said.

Example::

    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "train.py").write_text("x = 1\\n")
    >>> _ = (folder / ".env").write_text("TOKEN=secret\\n")
    >>> copy = pathlib.Path(tempfile.mkdtemp()) / "copy"
    >>> copy_folder(folder, copy), sorted(p.name for p in copy.iterdir())
    (['.env (holds secrets by convention)'], ['train.py'])
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .analysis.evidence import human_bytes

MAX_FILE_BYTES = 64 * 1024 * 1024  # a larger file is not copied (a data set, a checkpoint)
MAX_COPY_BYTES = 512 * 1024 * 1024  # the whole copy
MAX_FILES = 20_000  # files and folders walked
CHUNK_BYTES = 1024 * 1024
LEFT_OUT = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", "node_modules", ".ipynb_checkpoints", ".idea", ".vscode",
})  # fmt: skip
SECRETS = (
    ".env", ".env.*", ".envrc", ".ssh", ".aws", ".gnupg", ".azure", ".kube", ".docker", ".netrc", "_netrc", ".pgpass",
    ".pypirc", ".npmrc", ".git-credentials", ".htpasswd", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_dsa*",
    "id_ecdsa*", "id_ed25519*", "credentials.json", "service-account*.json",
)  # fmt: skip
HOME_MARKERS = (".ssh", ".gnupg")  # a folder holding one of these is someone's home
SYSTEM_ROOTS = ("/proc", "/sys", "/dev")


class FolderTooLarge(Exception):
    """The folder holds more than ``--check-fixes`` copies (:data:`MAX_COPY_BYTES`, :data:`MAX_FILES`)."""


class CheckStopped(Exception):
    """SIGTERM or Ctrl-C came during a check: it ends now, leaving nothing behind."""


def is_secret(name: str) -> bool:
    """Whether a file or folder of that name holds secrets by convention (:data:`SECRETS`).

    >>> is_secret(".env.local"), is_secret("id_rsa.pub"), is_secret("server.pem"), is_secret("environment.py")
    (True, True, True, False)
    """
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRETS)


def folder_refusal(root: Path, script: Path) -> str:
    """Why ``--check-fixes`` must not copy ``root`` (with the folder to run from instead), or ""."""
    instead = f"run graphwatch from your project's folder (e.g. cd {script.parent})"
    if root == Path(root.anchor) or any(root.is_relative_to(r) for r in SYSTEM_ROOTS):
        return f"--check-fixes copies the folder you run from, and {root} is a system folder; {instead}"
    if _is_home(root):
        return (f"--check-fixes copies the folder you run from, and {root} is a home folder (it would copy your "
                f"keys and settings); {instead}")  # fmt: skip
    return ""


def _is_home(folder: Path) -> bool:
    homes = {Path.home().resolve()}
    try:
        import pwd

        homes |= {Path(user.pw_dir).resolve() for user in pwd.getpwall() if user.pw_dir not in ("", "/")}
    except (ImportError, OSError):  # no password database (Windows)
        pass
    return (
        folder in homes
        or folder.parent == Path("/home")
        or any(os.path.isdir(folder / marker) for marker in HOME_MARKERS)
    )


def survey(root: Path, leave_out: Sequence[Path] = ()) -> str:
    """Why ``root`` is too large to copy (from the sizes ``lstat`` gives its regular files), or ""; cheap: it
    reads no file and stops at the limits."""
    total = 0
    try:
        for path, kind, _ in _walk(root, {p.resolve() for p in leave_out}):
            size = path.lstat().st_size if kind == "file" else 0
            total += size if size <= MAX_FILE_BYTES else 0
            if total > MAX_COPY_BYTES:
                raise FolderTooLarge(_too_large(root, f"over {human_bytes(MAX_COPY_BYTES)}"))
    except FolderTooLarge as exc:
        return str(exc)
    return ""


def copy_folder(
    root: Path, dest: Path, leave_out: Sequence[Path] = (), stop: Callable[[], bool] = lambda: False
) -> list[str]:
    """Copy ``root`` to ``dest`` as the module's docstring says; return what was left out.  Raises
    :class:`FolderTooLarge` at the limits and :class:`CheckStopped` once ``stop()``."""
    skipped: list[str] = []
    total = 0
    dest.mkdir(parents=True, exist_ok=True)
    for path, kind, said in _walk(root, {p.resolve() for p in leave_out}):
        if stop():
            raise CheckStopped
        if kind == "folder":
            (dest / path.relative_to(root)).mkdir(exist_ok=True)
            continue
        if kind == "file":
            read = _copy_file(path, dest / path.relative_to(root), root, MAX_COPY_BYTES - total)
            if isinstance(read, int):
                total += read
                continue
            said = f"{path.relative_to(root)} ({read})"
        skipped.append(said)
    return skipped


def _too_large(root: Path, what: str) -> str:
    return (f"the folder {root} holds {what} (--check-fixes copies at most {human_bytes(MAX_COPY_BYTES)} in "
            f"{MAX_FILES:,} files); run graphwatch from the folder of the script's project")  # fmt: skip


def _walk(root: Path, left: set[Path]) -> Iterator[tuple[Path, str, str]]:
    """Each entry of ``root`` in sorted order, as (path, "file" or "folder" to copy, or "skip", what to say
    of it), no link to a folder followed; raises :class:`FolderTooLarge` past :data:`MAX_FILES` entries."""
    seen = 0
    for folder, subfolders, names in os.walk(root):
        here = Path(folder)
        seen += len(subfolders) + len(names)
        if seen > MAX_FILES:
            raise FolderTooLarge(_too_large(root, f"over {MAX_FILES:,} files and folders"))
        kept = []
        for name in sorted(subfolders):
            path = here / name
            shown = f"{path.relative_to(root)}/"
            if path.resolve() in left:  # the report folder, the scratch folder: not the user's to hear of
                continue
            if is_secret(name):
                yield path, "skip", f"{shown} (holds secrets by convention)"
            elif path.is_symlink():
                yield path, "skip", f"{shown} (a link to a folder)"
            elif name in LEFT_OUT:
                yield path, "skip", shown
            else:
                kept.append(name)
                yield path, "folder", shown
        subfolders[:] = kept
        for name in sorted(names):
            path = here / name
            if is_secret(name):
                yield path, "skip", f"{path.relative_to(root)} (holds secrets by convention)"
            else:
                yield path, "file", ""


def _copy_file(path: Path, target: Path, root: Path, room: int) -> int | str:
    """Copy one regular file (a link: only to a file inside ``root``), reading at most :data:`MAX_FILE_BYTES`:
    the bytes read, or why it was not copied.  More than ``room`` bytes raises :class:`FolderTooLarge`."""
    try:
        real = path.resolve(strict=True)
        if not real.is_relative_to(root):
            return "a link out of the folder"
        if not stat.S_ISREG(real.lstat().st_mode):  # never open a device: opening some has effects
            return "not a regular file"
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(real, flags)
    except OSError:
        return "unreadable"
    with os.fdopen(fd, "rb") as source:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped for something else since the lstat
            return "not a regular file"
        if info.st_size > MAX_FILE_BYTES:
            return human_bytes(info.st_size)
        limit = min(MAX_FILE_BYTES, room)
        read = 0
        with open(target, "wb") as copy:
            while chunk := source.read(min(CHUNK_BYTES, limit + 1 - read)):
                read += len(chunk)
                if read > limit:
                    break
                copy.write(chunk)
        if read > limit:  # it grew (or its size lied): bounded by what was read
            target.unlink()
            if limit < MAX_FILE_BYTES:
                raise FolderTooLarge(_too_large(root, f"over {human_bytes(MAX_COPY_BYTES)}"))
            return f"over {human_bytes(MAX_FILE_BYTES)}"
        os.chmod(target, stat.S_IMODE(info.st_mode))
    return read
