"""The README's one-line install into an environment that already has torch: the torch there stays, and
the ``graphwatch`` command runs from that environment."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import graphwatch

REPO = Path(graphwatch.__file__).resolve().parent.parent
TORCH_PIN = next(line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("torch=="))


def test_pip_install_into_an_environment_with_torch_keeps_its_torch_and_gives_the_command(tmp_path: Path) -> None:
    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python, bin_dir = env / "bin" / "python", env / "bin"

    def pip(*args: str) -> None:
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr

    pip(TORCH_PIN)  # the user's own torch, installed first
    pip(str(REPO))  # the README's line
    versions = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    assert versions.startswith(TORCH_PIN.removeprefix("torch=="))
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * x).sum().backward()\n")
    run = subprocess.run([str(bin_dir / "graphwatch"), "run", "--out", str(tmp_path / "out"), str(script)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "no graph leaks" in run.stderr and (tmp_path / "out" / "index.html").is_file()
