#!/usr/bin/env python3
"""Write the generated ABI header and JSON schemas from duckpipe/schema/.

python tools/gen_abi.py           # rewrite the files
python tools/gen_abi.py --check   # exit 1 and name the stale files
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # duckpipe, without an install

from codegen import ROOT, render_all  # tools/codegen/, beside this script


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    stale = []
    for rel, text in render_all().items():
        path = ROOT / rel
        if path.exists() and path.read_text() == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {rel}")
    if args.check and stale:
        print("stale generated files (run tools/gen_abi.py):", *map(str, stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
