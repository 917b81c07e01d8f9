"""The README's one-line install into an environment that already has torch: the torch there stays, and
the ``graphwatch`` command runs from that environment; the distribution's name is ``torch-graphwatch``.

The environments are made without a pip of their own (``ensurepip`` costs seconds): the test environment's pip
installs into them with ``--python``, the same install pip makes from inside.  Start-up matters in every test
here, so each command runs in a fresh interpreter (not a fork of tests/warm_python.py, which has graphwatch
imported already)."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import graphwatch

REPO = Path(graphwatch.__file__).resolve().parents[2]
TORCH_PIN = next(line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("torch=="))


def new_environment(folder: Path) -> tuple[Path, Path]:
    """A fresh virtual environment without pip; returns its Python and its site-packages folder."""
    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return python, Path(site)


def pip_install(python: Path, *args: str) -> None:
    """``pip install -q ARGS`` into the environment of ``python``."""
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *args],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def the_test_environments_torch(folder: Path) -> Path:
    """A folder that holds the test environment's torch and what torch requires (their packages and
    ``dist-info``, symlinked) and nothing else: a ``.pth`` line naming it makes an environment "with torch"
    without unpacking its 190 MB wheel.  pip sees that torch as installed; were it to replace it, it would not
    uninstall outside the environment (the symlinks' targets are safe) and the new torch in site-packages would
    come first."""
    folder.mkdir()
    wanted, seen = ["torch"], set()
    while wanted:
        distribution = importlib.metadata.distribution(wanted.pop())
        if distribution.name in seen:
            continue
        seen.add(distribution.name)
        for top in {file.parts[0] for file in distribution.files or () if file.parts[0] not in ("..", "__pycache__")}:
            (folder / top).symlink_to(Path(str(distribution.locate_file(top))))
        wanted += [re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0] for requirement in distribution.requires or ()
                   if "extra ==" not in requirement]  # fmt: skip
    return folder


def test_pip_install_into_an_environment_with_torch_keeps_its_torch_and_gives_the_command(tmp_path: Path) -> None:
    python, site = new_environment(tmp_path / "env")
    (site / "users_torch.pth").write_text(f"{the_test_environments_torch(tmp_path / 'torch')}\n")  # the user's torch
    pip_install(python, str(REPO))  # the README's line
    versions = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    assert versions.startswith(TORCH_PIN.removeprefix("torch=="))
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * x).sum().backward()\n")
    run = subprocess.run([str(python.parent / "graphwatch"), "run", "--out", str(tmp_path / "out"), str(script)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "no graph leaks" in run.stderr and (tmp_path / "out" / "index.html").is_file()


def test_the_distribution_installs_by_its_name_torch_graphwatch_and_gives_the_graphwatch_command(tmp_path: Path) -> None:
    """``pip install torch-graphwatch`` (``graphwatch`` on PyPI is another project): installed by that name from
    a local wheel folder, offline (``--no-index --no-deps``; the wheel built with ``--no-build-isolation`` by the
    test's own setuptools from a copy of what the build reads), it gives the ``graphwatch`` command and
    ``import graphwatch`` from the new environment.  The dependencies (torch, rich, ...) are the test
    environment's, seen through a ``.pth`` file."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert [w.name.split("-")[0] for w in wheels.glob("*.whl")] == ["torch_graphwatch"]
    python, site = new_environment(tmp_path / "env")
    pip_install(python, "--no-index", "--no-deps", "--find-links", str(wheels), "torch-graphwatch[lightning]")
    # (after the install: pip would take the test environment's editable install for this one)
    (site / "test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    imported = subprocess.run(
        [str(python), "-c", "import graphwatch, importlib.metadata as md; "
         "print(graphwatch.__file__); print(md.version('torch-graphwatch'))"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    module, version = imported.stdout.split()
    assert Path(module).is_relative_to(site) and version == graphwatch.__version__
    command = subprocess.run([str(python.parent / "graphwatch"), "--version"], capture_output=True, text=True)
    assert command.returncode == 0 and command.stdout.startswith(f"graphwatch {graphwatch.__version__}"), command.stderr


def test_a_script_beside_the_clone_imports_the_installed_package_not_the_clones_folder(tmp_path: Path) -> None:
    """A clone named ``graphwatch`` with ``train.py`` written beside it: the script's folder comes first on
    ``sys.path`` and holds a folder named ``graphwatch`` (the clone, no ``__init__.py``), which must not win
    over the installed package as an empty namespace package (the src layout puts only the package on the path)."""
    (tmp_path / "graphwatch").symlink_to(REPO, target_is_directory=True)  # the clone, as a user would name it
    script = tmp_path / "train.py"
    script.write_text("import graphwatch\nprint(graphwatch.__file__)\nwith graphwatch.watch(summary=False):\n    pass\n")
    ran = subprocess.run([sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert Path(ran.stdout.strip()).resolve() == Path(graphwatch.__file__).resolve()
    command = subprocess.run([sys.executable, "-m", "graphwatch", "--version"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert command.returncode == 0 and command.stdout.startswith(f"graphwatch {graphwatch.__version__}"), command.stderr
