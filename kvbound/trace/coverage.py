"""Coverage of a release's connector code on the host: the union of the lines the jobs ran.

The side measures (``kvbound/side/cover.py``: coverage.py in the worker, which also sends each
file's statements and the statements of code declared GPU-only), so the host needs no
coverage.py and no vLLM tree. ``Coverage`` is the union of a release's jobs (a session's, or
a campaign's shards'); ``document`` is the form the campaign document holds per release
(docs/trace.md "Coverage"):

    {relpath: {"statements": int, "executed": int, "missing": [[first, last], ...],
               "unreached": {"gpu-only": [...], "not-on-release": [...], "not-yet": [...]}}}

``missing`` is every statement no job ran, as inclusive line ranges over the statements (a
range never spans a statement that ran); ``unreached`` splits it: ``gpu-only`` (code declared
in the side's ``UNREACHED`` table, with its reason and vLLM lines), ``not-on-release`` (code
the table declares unreachable on the release; none is declared today) and ``not-yet`` (the rest:
what a configuration or traffic kvbound does not run yet would reach).
"""

from __future__ import annotations

GPU_ONLY, NOT_ON_RELEASE, NOT_YET = "gpu-only", "not-on-release", "not-yet"
UNREACHED_CLASSES = (GPU_ONLY, NOT_ON_RELEASE, NOT_YET)


def ranges(lines, statements) -> list:
    """``lines`` (a subset of ``statements``) as inclusive [first, last] runs of consecutive
    statements: a run ends where a statement outside ``lines`` comes."""
    order = sorted(statements)
    wanted = set(lines)
    out: list = []
    prev_in = False
    for ln in order:
        if ln in wanted:
            if prev_in:
                out[-1][1] = ln
            else:
                out.append([ln, ln])
        prev_in = ln in wanted
    return out


class Coverage:
    """The union of the lines jobs of one release ran, per file (relpath to the release tree)."""

    def __init__(self):
        self.files: dict = {}  # relpath -> {"statements": set, "executed": set, "gpu_only": set}

    def add(self, job: dict | None) -> int:
        """A job's (or another union's) coverage; returns how many statements it ran that the
        union had not (its new lines)."""
        new = 0
        for rel, f in sorted((job or {}).items()):
            mine = self.files.setdefault(rel, {"statements": set(f["statements"]), "executed": set(),
                                               "gpu_only": set(f.get("gpu_only", ()))})
            got = set(f["executed"]) - mine["executed"]
            new += len(got)
            mine["executed"] |= got
        return new

    def to_json(self) -> dict:
        """What a shard returns (``add`` takes it back): sorted line lists."""
        return {rel: {k: sorted(v) for k, v in f.items()} for rel, f in sorted(self.files.items())}

    def document(self) -> dict:
        """The campaign document's form (the module docstring)."""
        out = {}
        for rel, f in sorted(self.files.items()):
            st = f["statements"]
            missing = st - f["executed"]
            gpu = missing & f["gpu_only"]
            out[rel] = {"statements": len(st), "executed": len(f["executed"] & st),
                        "missing": ranges(missing, st),
                        "unreached": {GPU_ONLY: ranges(gpu, st), NOT_ON_RELEASE: [],
                                      NOT_YET: ranges(missing - gpu, st)}}
        return out


def percent(entry: dict) -> float:
    """Executed statements of one file's document entry, in percent (100 for a file without any)."""
    return 100.0 * entry["executed"] / entry["statements"] if entry["statements"] else 100.0


def render(coverage: dict) -> list:
    """Per release (column), a line per file that has statements: executed of statements, %."""
    lines = []
    for col, files in coverage.items():
        st = sum(f["statements"] for f in files.values())
        ex = sum(f["executed"] for f in files.values())
        lines += ["", f"== coverage of the connector code, {col}: {ex} of {st} statements"
                      f" ({100.0 * ex / max(st, 1):.0f}%) =="]
        shown = {rel: f for rel, f in files.items() if f["statements"]}
        w = max((len(r) for r in shown), default=0)
        lines += [f"  {rel.ljust(w)}  {f['executed']:5d} / {f['statements']:<5d} {percent(f):5.1f}%"
                  for rel, f in shown.items()]
    return lines
