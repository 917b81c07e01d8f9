#!/usr/bin/env bash
# graphwatch set-up, shared by scripts/demo.sh and scripts/test.sh.  Idempotent: a second run
# checks and installs nothing.  Works from any directory.
#
#   bash scripts/setup.sh [--browser]
#
# 1. picks a Python >= 3.10 (python3.11 first: the CPU torch file on disk is built for 3.11;
#    GRAPHWATCH_PYTHON=/path/to/python overrides) and makes .venv in the repo root if missing;
# 2. installs torch from the pin in constraints.txt FIRST, only if torch is missing or has
#    another version (a bare `torch` requirement would pull a CUDA build of several GB);
# 3. pip install -c constraints.txt -e ".[test]" (the distribution torch-graphwatch), only when
#    pyproject.toml or constraints.txt changed since the last good install (hash stamp in .venv) or
#    this checkout isn't installed (an install under the old name, graphwatch, is replaced);
# 4. installs Debian's graphviz (for `dot`) when `dot` is missing and we are root with apt-get;
#    otherwise a one-line notice: reports come out without SVG pictures;
# 5. with --browser or GRAPHWATCH_SETUP_BROWSER=1: installs Debian's chromium when
#    /usr/bin/chromium is missing (browser tests skip with a notice when it can't be had).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { printf 'setup: %s\n' "$*"; }
notice() { printf 'setup: notice: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

browser="${GRAPHWATCH_SETUP_BROWSER:-0}"
for arg in "$@"; do
    case "$arg" in
        --browser) browser=1 ;;
        -h | --help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$arg' (usage: bash scripts/setup.sh [--browser])" ;;
    esac
done
case "$browser" in 1 | true | yes) browser=1 ;; *) browser=0 ;; esac

[ -f pyproject.toml ] && [ -f constraints.txt ] \
    || die "pyproject.toml or constraints.txt missing in $root: run this from a graphwatch checkout"

# Output of installers goes to a log; it is shown (tail) only when a step fails.
log="$(mktemp "${TMPDIR:-/tmp}/graphwatch-setup.XXXXXX.log")"
trap 'rm -f "$log"' EXIT
run_logged() {  # run_logged "what it does" cmd args...
    local what="$1"; shift
    if ! "$@" >>"$log" 2>&1; then
        printf 'setup: error: %s failed. Last lines of its output:\n' "$what" >&2
        tail -n 25 "$log" | sed 's/^/    /' >&2
        cp "$log" "$root/.setup-failed.log" 2>/dev/null \
            && printf 'setup: full log: %s\n' "$root/.setup-failed.log" >&2
        exit 1
    fi
}

# ---------------------------------------------------------------- Python and the venv
py_ok='import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'
pick_python() {
    local cand seen=""
    if [ -n "${GRAPHWATCH_PYTHON:-}" ]; then
        "$GRAPHWATCH_PYTHON" -c "$py_ok" 2>/dev/null \
            || die "GRAPHWATCH_PYTHON=$GRAPHWATCH_PYTHON is not a working Python >= 3.10: point it at one (e.g. python3.11) or unset it."
        printf '%s\n' "$GRAPHWATCH_PYTHON"; return 0
    fi
    for cand in python3.11 python3; do
        command -v "$cand" >/dev/null 2>&1 || continue
        # a pyenv shim can exist for a version that is not installed: ask it to run.
        local ver
        ver="$("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" || continue
        if "$cand" -c "$py_ok" 2>/dev/null; then
            printf '%s\n' "$cand"; return 0
        fi
        seen="$seen $cand=$ver"
    done
    if [ -n "$seen" ]; then
        die "graphwatch needs Python >= 3.10, found only:$seen. Install Python 3.11 (e.g. 'apt-get install python3.11 python3.11-venv' or 'pyenv install 3.11') or point GRAPHWATCH_PYTHON at a Python >= 3.10."
    fi
    die "no Python found (tried python3.11, python3). Install Python 3.11 or set GRAPHWATCH_PYTHON=/path/to/python3.x."
}

venv="$root/.venv"
py="$venv/bin/python"
if ! "$py" -c "$py_ok" >/dev/null 2>&1; then
    if [ -e "$venv" ]; then
        [ -f "$venv/pyvenv.cfg" ] || die "$venv exists but is not a virtual environment: move it away and run again."
        notice "$venv is broken or too old (needs Python >= 3.10): making it again."
        rm -rf "$venv"
    fi
    base_py="$(pick_python)"
    "$base_py" -c 'import venv, ensurepip' 2>/dev/null \
        || die "$base_py cannot make virtual environments (no venv/ensurepip). On Debian: apt-get install python3-venv (or python3.X-venv for your version)."
    say "creating .venv with $base_py ($("$base_py" -c 'import sys; print(sys.version.split()[0])'))"
    run_logged "creating the virtual environment" "$base_py" -m venv "$venv"
fi
pip=("$py" -m pip --disable-pip-version-check)

# ---------------------------------------------------------------- torch from the pin, first
want_torch="$(sed -n 's/^[[:space:]]*torch[[:space:]]*==[[:space:]]*\([^[:space:];#]*\).*/\1/p' constraints.txt | head -n 1)"
[ -n "$want_torch" ] || die "constraints.txt has no 'torch==X.Y.Z' pin; add one (e.g. torch==2.13.0)."
# The installed distribution's version (fast; `import torch` would cost ~3 s on every run).
have_torch="$("$py" -I -c '
import importlib.metadata as md, importlib.util as iu
assert iu.find_spec("torch") is not None
print(md.version("torch").split("+")[0])' 2>/dev/null || true)"
if [ "$have_torch" != "$want_torch" ]; then
    if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
        notice "the venv's Python is not 3.11: torch==$want_torch may come from PyPI as a large (CUDA) download."
    fi
    say "installing torch==$want_torch${have_torch:+ (found $have_torch)}"
    run_logged "installing torch==$want_torch" "${pip[@]}" install -q -c constraints.txt "torch==$want_torch"
fi

# ---------------------------------------------------------------- graphwatch itself (editable)
stamp="$venv/.graphwatch-setup-stamp"
want_hash="$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)"
have_hash="$(cat "$stamp" 2>/dev/null || true)"
# The distribution is torch-graphwatch (`graphwatch` on PyPI is another project); the import name and
# the command are graphwatch.  "Installed" = an editable install of THIS checkout, found without
# importing the package (its code may be mid-change; reinstalling would not mend an ImportError in it).
dist="torch-graphwatch"
installed_here() {  # installed_here [DISTRIBUTION]
    "$py" -I - "$root" "${1:-$dist}" <<'PY' >/dev/null 2>&1
import importlib.metadata as md, importlib.util as iu, json, os, sys
from urllib.parse import unquote, urlparse
root = os.path.realpath(sys.argv[1])
info = json.loads(md.distribution(sys.argv[2]).read_text("direct_url.json") or "{}")
assert info.get("dir_info", {}).get("editable"), "not editable"
assert os.path.realpath(unquote(urlparse(info["url"]).path)) == root, "another checkout"
if os.path.exists(os.path.join(root, "src", "graphwatch", "__init__.py")):
    spec = iu.find_spec("graphwatch")
    assert spec and spec.origin and os.path.realpath(spec.origin).startswith(root + os.sep)
PY
}
if [ "$have_hash" != "$want_hash" ] || ! installed_here; then
    say "installing $dist (editable) with its test extras"
    rm -f "$stamp"
    if installed_here graphwatch; then  # this checkout installed under its old distribution name: replace it
        run_logged "pip uninstall graphwatch (the old name of this checkout's install)" "${pip[@]}" uninstall -q -y graphwatch
    fi
    run_logged "pip install -c constraints.txt -e .[test]" \
        "${pip[@]}" install -q -c constraints.txt -e ".[test]"
    installed_here || die "$dist was installed but this checkout is not what the venv finds; remove .venv and run again."
    printf '%s\n' "$want_hash" >"$stamp"
fi

# ---------------------------------------------------------------- system packages (optional)
can_apt=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then can_apt=1; fi
apt_updated=0
apt_install() {  # apt_install pkg...: returns non-zero on failure, never exits
    export DEBIAN_FRONTEND=noninteractive
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq >>"$log" 2>&1 || return 1
        apt_updated=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1
}

if ! command -v dot >/dev/null 2>&1; then
    if [ "$can_apt" = 1 ]; then
        say "installing Debian's graphviz (for 'dot')"
        apt_install graphviz || notice "apt-get install graphviz failed: $(tail -n 1 "$log")"
    fi
    if ! command -v dot >/dev/null 2>&1; then
        notice "Graphviz 'dot' not found: reports will come out without SVG pictures (install Graphviz, e.g. 'apt-get install graphviz', to get them)."
    fi
fi

if [ "$browser" = 1 ] && [ ! -x /usr/bin/chromium ]; then
    if [ "$can_apt" = 1 ]; then
        say "installing Debian's chromium (for the browser tests)"
        apt_install chromium || notice "apt-get install chromium failed: $(tail -n 1 "$log")"
    fi
    if [ ! -x /usr/bin/chromium ]; then
        notice "/usr/bin/chromium not available: browser tests will be skipped (install Debian's chromium as root to run them)."
    fi
fi

rm -f "$root/.setup-failed.log"
