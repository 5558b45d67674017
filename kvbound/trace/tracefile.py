"""Trace files: one finding with the requests that reproduce it (shrunk), the
layout and engine they ran on, and the captured call, as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvbound.records import current_kind

from .runner import Finding

FORMAT = "kvbound-trace/1"


def save(finding: Finding, directory: Path, shrunk_from: int | None = None, reruns: int | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    what = finding.kind
    if finding.file_part() is not None:  # two shapes of one kind (Finding.key), two files
        what += "-" + finding.file_part()
    slug = re.sub(r"[^a-z0-9]+", "-", f"{finding.release}-{finding.layout}-{what}".lower()).strip("-")
    n = len(finding.segment["requests"])
    path = directory / f"{slug}-{n}req.json"
    doc = {"format": FORMAT, **finding.to_json(), "shrunk_from": shrunk_from, "shrink_reruns": reruns}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load(path: str | Path) -> Finding:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not a readable trace file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{p}: format: must be {FORMAT!r}")
    for k in ("kind", "release", "layout", "segment"):
        if k not in doc:
            raise ValueError(f"{p}: {k}: missing")
    try:
        return Finding(current_kind(doc["kind"]), doc["release"], doc["layout"], doc.get("detail") or {}, doc["segment"],
                       doc.get("case"))
    except ValueError as e:
        raise ValueError(f"{p}: kind: {e}") from None
