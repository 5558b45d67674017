"""Coverage of a release's connector code on the host: the union of the lines the jobs ran.

The side measures (``kvbound/side/cover.py``: coverage.py in the worker, which also sends each
file's statements and the statements of code declared GPU-only), so the host needs no
coverage.py and no vLLM tree. ``Coverage`` is the union of a release's jobs (a session's, or
a campaign's shards'); ``document`` is the form the campaign document holds per release
(docs/trace.md "Coverage"):

    {relpath: {"statements": int, "executed": int, "missing": [[first, last], ...], "unreachable_here": int,
               "unreached": {"gpu-only": [...], "needs-external": [...], "not-on-release": [...],
                             "not-yet": [...]}}}

``missing`` is every statement no job ran, as inclusive line ranges over the statements (a
range never spans a statement that ran); ``unreached`` splits it: ``gpu-only`` and
``needs-external`` (code declared in the side's ``UNREACHED`` table, with its reason and vLLM
lines: what runs only with CUDA; what needs a library or service the CPU host lacks, the
object-store, peer-to-peer and KVCR tiers), ``not-on-release`` (code
the table declares unreachable on the release: a function nothing in it calls) and ``not-yet`` (the rest:
what a configuration or traffic kvbound does not run yet would reach). ``unreachable_here``
counts the missing statements of the declared classes: the file's statements reachable on a CPU
host are ``statements - unreachable_here`` (``percent_reachable``).
"""

from __future__ import annotations

GPU_ONLY, NEEDS_EXTERNAL, NOT_ON_RELEASE, NOT_YET = "gpu-only", "needs-external", "not-on-release", "not-yet"
UNREACHED_CLASSES = (GPU_ONLY, NEEDS_EXTERNAL, NOT_ON_RELEASE, NOT_YET)
DECLARED = (GPU_ONLY, NEEDS_EXTERNAL, NOT_ON_RELEASE)  # the classes the side's table declares


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
        self.files: dict = {}  # relpath -> {"statements": set, "executed": set, "declared": {why: set}}

    def add(self, job: dict | None) -> int:
        """A job's (or another union's) coverage; returns how many statements it ran that the
        union had not (its new lines)."""
        new = 0
        for rel, f in sorted((job or {}).items()):
            mine = self.files.setdefault(rel, {"statements": set(f["statements"]), "executed": set(),
                                               "declared": {w: set(ls) for w, ls in f.get("declared", {}).items()}})
            got = set(f["executed"]) - mine["executed"]
            new += len(got)
            mine["executed"] |= got
        return new

    def to_json(self) -> dict:
        """What a shard returns (``add`` takes it back): sorted line lists."""
        return {rel: {"statements": sorted(f["statements"]), "executed": sorted(f["executed"]),
                      "declared": {w: sorted(ls) for w, ls in sorted(f["declared"].items())}}
                for rel, f in sorted(self.files.items())}

    def document(self) -> dict:
        """The campaign document's form (the module docstring)."""
        out = {}
        for rel, f in sorted(self.files.items()):
            st = f["statements"]
            missing = st - f["executed"]
            unreached, rest = {}, set(missing)
            for why in DECLARED:
                lines = rest & f["declared"].get(why, set())
                unreached[why], rest = ranges(lines, st), rest - lines
            out[rel] = {"statements": len(st), "executed": len(f["executed"] & st),
                        "missing": ranges(missing, st), "unreachable_here": len(missing - rest),
                        "unreached": dict(unreached, **{NOT_YET: ranges(rest, st)})}
        return out


def percent(entry: dict) -> float:
    """Executed statements of one file's document entry, in percent (100 for a file without any)."""
    return 100.0 * entry["executed"] / entry["statements"] if entry["statements"] else 100.0


def reachable(entry: dict) -> int:
    """One file's document entry: its statements reachable on a CPU host (less the declared
    unreachable ones that did not run; a document from before ``unreachable_here``: all)."""
    return entry["statements"] - entry.get("unreachable_here", 0)


def percent_reachable(entry: dict) -> float:
    """Executed statements of one file's document entry, in percent of those reachable on a CPU host."""
    return 100.0 * entry["executed"] / reachable(entry) if reachable(entry) else 100.0


def render(coverage: dict) -> list:
    """Per release (column), a line per file that has statements: executed of statements, %,
    and, where the side declares some unreachable on this host, executed of those reachable."""
    lines = []
    for col, files in coverage.items():
        st = sum(f["statements"] for f in files.values())
        ex = sum(f["executed"] for f in files.values())
        here = sum(reachable(f) for f in files.values())
        lines += ["", f"== coverage of the connector code, {col}: {ex} of {st} statements"
                      f" ({100.0 * ex / max(st, 1):.0f}%); of the {here} reachable on this host,"
                      f" {100.0 * ex / max(here, 1):.0f}% =="]
        shown = {rel: f for rel, f in files.items() if f["statements"]}
        w = max((len(r) for r in shown), default=0)
        lines += [f"  {rel.ljust(w)}  {f['executed']:5d} / {f['statements']:<5d} {percent(f):5.1f}%"
                  + (f"   {f['executed']} / {reachable(f)} reachable here"
                     f" {percent_reachable(f):5.1f}%" if f.get("unreachable_here") else "")
                  for rel, f in shown.items()]
    return lines
