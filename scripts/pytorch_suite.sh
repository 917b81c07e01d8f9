#!/usr/bin/env bash
# PyTorch's own autograd tests, run bare and with every test inside graphwatch.watch(level=...), compared:
# prints, per level, the tests passing bare, how many of them pass inside a session, the proven
# impossibilities, and every other test whose outcome differs; exits 1 when there is one.
#
#   bash scripts/pytorch_suite.sh [--tests DIR] [--write-doc] [LEVEL ...]
#
# LEVEL: default, light, precise (all three when none is named). DIR holds PyTorch's test files (default:
# ../shared/pytorch-tests beside this repository; it is read-only reference material and is copied to a
# temporary folder to run); where it is absent, one line says so and the exit code is 0. --write-doc puts
# the table into docs/pytorch-suite.md. `bash scripts/test.sh` runs the same comparison at the default and
# light levels (tests/test_pytorch_suite.py).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GRAPHWATCH_SETUP_BROWSER=0 bash "$root/scripts/setup.sh" >&2
exec "$root/.venv/bin/python" "$root/scripts/pytorch_suite/suite.py" "$@"
