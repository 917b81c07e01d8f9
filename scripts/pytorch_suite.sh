#!/usr/bin/env bash
# PyTorch's own autograd tests, run bare and then with every test inside graphwatch.watch():
# prints each test whose outcome differs and exits 1 when one does.
#
#   bash scripts/pytorch_suite.sh PYTORCH_CHECKOUT [LEVEL]
#
# PYTORCH_CHECKOUT is a folder holding PyTorch's test/ tree (a clone of github.com/pytorch/pytorch at a
# commit close to the installed torch; its test files are not in the torch wheel). LEVEL is a graphwatch
# level (default: default). GRAPHWATCH_SUITE_FILES overrides the test files (paths under PYTORCH_CHECKOUT).
# See docs/pytorch-suite.md for the last result.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 1 || ! -d "$1/test" ]]; then
    echo "usage: bash scripts/pytorch_suite.sh PYTORCH_CHECKOUT [LEVEL]: PYTORCH_CHECKOUT must hold PyTorch's test/" \
         "folder (git clone --depth 1 https://github.com/pytorch/pytorch)" >&2
    exit 2
fi
checkout="$(cd "$1" && pwd)"
level="${2:-default}"
files="${GRAPHWATCH_SUITE_FILES:-test/test_autograd.py test/autograd/test_node_lifecycle.py}"
GRAPHWATCH_SETUP_BROWSER=0 bash "$root/scripts/setup.sh" >&2
python="$root/.venv/bin/python"
"$python" -c "import expecttest" 2>/dev/null || "$python" -m pip install -q -c "$root/constraints.txt" expecttest >&2
results="$(mktemp -d)"
run() {  # run LEVEL OUTCOMES: one pass over the files
    (cd "$checkout/test" && PYTHONPATH="$root/scripts/pytorch_suite${PYTHONPATH:+:$PYTHONPATH}" \
        GRAPHWATCH_SUITE_LEVEL="$1" GRAPHWATCH_SUITE_OUTCOMES="$2" \
        "$python" -m pytest -q -p no:cacheprovider -p graphwatch_everywhere -p no:graphwatch \
        $(for f in $files; do echo "$checkout/$f"; done) >"$2.log" 2>&1 || true)
}
echo "pytorch suite: bare run" >&2
run "" "$results/bare.json"
echo "pytorch suite: every test inside graphwatch.watch(level=\"$level\")" >&2
run "$level" "$results/watched.json"
"$python" "$root/scripts/pytorch_suite/compare.py" "$results/bare.json" "$results/watched.json"
