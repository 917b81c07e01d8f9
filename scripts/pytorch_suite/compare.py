"""Compare two outcome files of ``graphwatch_everywhere``: which tests behave differently watched.

``python compare.py bare.json watched.json`` prints the tests that pass bare
and do not pass watched (and the reverse), and exits 1 when there are any.
"""

from __future__ import annotations

import json
import sys


def main(bare_path: str, watched_path: str) -> int:
    with open(bare_path) as f:
        bare = json.load(f)
    with open(watched_path) as f:
        watched = json.load(f)
    passed = {test for test, result in bare.items() if result["outcome"] == "passed"}
    broken = sorted(t for t in passed if watched.get(t, {}).get("outcome") != "passed")
    mended = sorted(t for t, r in watched.items() if r["outcome"] == "passed" and t in bare and t not in passed)
    print(f"{len(passed)} tests pass without graphwatch; {len(passed) - len(broken)} of them pass inside a session")
    for test in broken:
        result = watched.get(test, {"outcome": "missing", "detail": ""})
        print(f"  DIFFERENT {test}: {result['outcome']}: {result['detail']}")
    for test in mended:
        print(f"  passes only inside a session: {test}")
    return 1 if broken or mended else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
