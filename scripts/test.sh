#!/usr/bin/env bash
# Runs the whole graphwatch test suite (or what you name: bash scripts/test.sh tests/test_x.py -k y).
# Sets up first (scripts/setup.sh, with the browser for the HTML-report tests; opt out with
# GRAPHWATCH_SETUP_BROWSER=0). Paths you pass are relative to the repo root. pytest's exit code
# is this script's exit code.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
GRAPHWATCH_SETUP_BROWSER="${GRAPHWATCH_SETUP_BROWSER:-1}" bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
