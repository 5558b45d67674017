"""Trace files: one finding with the requests that reproduce it (shrunk), the layout and
engine they ran on, and the captured call, as JSON (``kvbound.records.TraceFileRecord``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvbound.errors import ReportInputError
from kvbound.records import TraceFileRecord

from .runner import Finding


def save(finding: Finding, directory: Path, shrunk_from: int | None = None, reruns: int | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    what = finding.kind
    if finding.file_part() is not None:  # two shapes of one kind (Finding.key), two files
        what += "-" + finding.file_part()
    slug = re.sub(r"[^a-z0-9]+", "-", f"{finding.release}-{finding.layout}-{what}".lower()).strip("-")
    n = len(finding.segment["requests"])
    path = directory / f"{slug}-{n}req.json"
    rec = TraceFileRecord(finding.kind, finding.finding_class, finding.safety, finding.release, finding.layout,
                          finding.detail, finding.case, finding.segment, shrunk_from, reruns)
    path.write_text(json.dumps(rec.to_json(), indent=1) + "\n")
    return path


def load(path: str | Path) -> Finding:
    """The finding a trace file holds; a ValueError (one line naming the file and the
    field) for a file that is none."""
    p = Path(path)
    try:
        rec = TraceFileRecord.from_json(json.loads(p.read_text()), str(p))
        return Finding(rec.kind, rec.release, rec.layout, rec.detail, rec.segment, rec.case)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not a readable trace file ({e})") from None
    except ReportInputError:
        raise
    except ValueError as e:  # a kind the findings table lacks
        raise ValueError(f"{p}.kind: {e}") from None
