"""``kvbound catalogue``: regenerate docs/invariants.md from the obligation objects."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from kvbound.catalogue import DOC, generate


def register(sub):
    p = sub.add_parser(
        "catalogue",
        help="regenerate the invariant catalogue (docs/invariants.md) from the proof obligations",
        description="Run every proof obligation (a few seconds, seeds pinned) and write the catalogue: "
        "per obligation its statement in words and mathematics, the premise it rests on, the verdict "
        "and, for a refutation, the witness drawn as block tables. --check compares instead of writing.",
    )
    p.add_argument("--out", metavar="FILE", default=str(DOC), help=f"default: {DOC}")
    p.add_argument("--check", action="store_true", help="exit 1 (with a diff) when FILE is not current")
    return p


def run(args) -> int:
    text = generate()
    out = Path(args.out)
    if args.check:
        old = out.read_text() if out.exists() else ""
        if old == text:
            print(f"{out} is current")
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                   f"{out} (committed)", "generated", n=1))
        print(f"\n{out} is stale: run `kvbound catalogue` and commit it", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    n = text.count("\n## `")
    print(f"wrote {out}: {n} obligations")
    return 0
