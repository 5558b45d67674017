"""``kvbound report``: one self-contained HTML page from the JSON of prove, diff and conform."""

from __future__ import annotations

import sys
from pathlib import Path

from kvbound.report import build_report


def register(sub):
    p = sub.add_parser(
        "report",
        help="write one self-contained HTML page: obligations, witnesses drawn, diff and conformance",
        description="Render the JSON written by `kvbound prove --json`, `kvbound diff --json` and "
        "`kvbound conform --json` (each optional) as one HTML page with the witnesses and disagreements "
        "drawn as block tables. The page needs no network to view. A malformed input file becomes a "
        "red box naming the file and field; the page is still written and the exit code is 2.",
    )
    p.add_argument("--prove", metavar="FILE", help="JSON from `kvbound prove --json FILE`")
    p.add_argument("--diff", metavar="FILE", help="JSON from `kvbound diff --json FILE`")
    p.add_argument("--conform", metavar="FILE", help="JSON from `kvbound conform --json FILE`")
    p.add_argument("--case", metavar="CASE", action="append", default=[],
                   help="also draw this case file or directory (repeatable)")
    p.add_argument("--title", default="kvbound report")
    p.add_argument("--html", metavar="OUT", required=True, help="where to write the page")
    return p


def run(args) -> int:
    html, sections = build_report(prove=args.prove, diff=args.diff, conform=args.conform,
                                  cases=args.case, title=args.title)
    out = Path(args.html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    bad = [s for s in sections if s.error]
    for s in bad:
        print(f"kvbound report: {s.title}: {s.error}", file=sys.stderr)
    print(f"wrote {out}: " + "; ".join(
        f"{s.title}: {'UNREADABLE' if s.error else s.summary}" for s in sections))
    return 2 if bad else 0
