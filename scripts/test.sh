#!/usr/bin/env bash
# Runs the whole graphwatch test suite (or what you name: bash scripts/test.sh tests/test_x.py -k y).
# Sets up first (scripts/setup.sh, with the browser for the HTML-report tests; opt out with
# GRAPHWATCH_SETUP_BROWSER=0), then lints (ruff) and type-checks (mypy, strict on the public API;
# configured in pyproject.toml): either failing stops here with its exit code. Paths you pass are
# relative to the repo root. pytest's exit code is this script's exit code.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
GRAPHWATCH_SETUP_BROWSER="${GRAPHWATCH_SETUP_BROWSER:-1}" bash scripts/setup.sh
echo "test: ruff check" >&2
.venv/bin/ruff check --quiet .
echo "test: mypy" >&2
# mypy's cache lives in the user's cache folder, shared by every clone on this machine (as the C++ builds of
# PyTorch's tests are): a fresh clone's first check reads it (about 4 s) where it would analyse torch's stubs
# again (about 70 s). mypy keeps it right: a module whose source, options or mypy differ is checked again.
# Where that folder cannot be written, the checkout's own .mypy_cache.
mypy_cache="${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/graphwatch/mypy"
{ mkdir -p "$mypy_cache" && [ -w "$mypy_cache" ]; } 2>/dev/null || mypy_cache=.mypy_cache
.venv/bin/mypy --no-error-summary --cache-dir "$mypy_cache"
# graphwatch's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set, every process the tests start would
# compile the package's sources again (about half a second each), where they can read these instead.
.venv/bin/python -m compileall -q src tests
# On every core (pytest-xdist; GRAPHWATCH_TEST_WORKERS=0 runs in this process, as `-n 0` after your arguments),
# with one torch intra-op thread per process (yours if OMP_NUM_THREADS is set): the workers and the processes
# the tests start already fill the cores, where torch's own threads would only spin waiting for one. Tests marked
# with one `xdist_group` run on one worker (`--dist loadgroup`), so that the runs they share are made once.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -n "${GRAPHWATCH_TEST_WORKERS:-auto}" --dist loadgroup "$@"
