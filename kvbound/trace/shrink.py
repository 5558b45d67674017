"""Delta debugging over a segment's requests: the fewest requests that still give
the same finding (same kind; for a vLLM exception, the same assert)."""

from __future__ import annotations

from .runner import Finding, TraceWorker, rerun


def shrink(w: TraceWorker, finding: Finding, budget: int = 200, progress=None) -> tuple[list, int]:
    """(minimal requests, reruns used). ddmin (Zeller): drop chunks, then single requests."""
    release = finding.release
    want = finding.key()
    runs = [0]

    def fails(reqs) -> bool:
        if runs[0] >= budget:
            return False
        runs[0] += 1
        return any(f.key() == want for f in rerun(w, release, finding, reqs))

    reqs = list(finding.segment["requests"])
    n = 2
    while len(reqs) >= 2 and runs[0] < budget:
        size = max(1, len(reqs) // n)
        chunks = [reqs[i:i + size] for i in range(0, len(reqs), size)]
        reduced = False
        for i in range(len(chunks)):  # try each complement
            rest = [r for j, c in enumerate(chunks) if j != i for r in c]
            if rest and fails(rest):
                reqs = rest
                n = max(n - 1, 2)
                reduced = True
                if progress:
                    progress(len(reqs), runs[0])
                break
        if not reduced:
            if n >= len(reqs):
                break
            n = min(len(reqs), 2 * n)
    return reqs, runs[0]
