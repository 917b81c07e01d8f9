#!/usr/bin/env bash
# The main job: sets up (scripts/setup.sh), then runs graphwatch's bundled bug examples, prints
# the summary and writes an HTML report to ./graphwatch-demo (or the folder given first).
#   bash scripts/demo.sh [OUT_DIR] [more options for `graphwatch demo`]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/setup.sh"
out="${1:-graphwatch-demo}"
[ "$#" -gt 0 ] && shift
exec "$here/../.venv/bin/graphwatch" demo --out "$out" "$@"
