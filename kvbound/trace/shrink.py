"""Delta debugging over a segment: the fewest requests (and the smallest GPU pool)
that still give the same finding (the same key: its kind and, where the findings table
names one, its shape; for a vLLM exception, the same assert)."""

from __future__ import annotations

from kvbound.options import ShrinkOptions

from .runner import Finding, TraceWorker, rerun


def shrink(w: TraceWorker, finding: Finding, options: ShrinkOptions, progress=None) -> tuple[list, int]:
    """(minimal requests, reruns used). ddmin (Zeller) over requests; then a smaller GPU
    pool (fewer requests then suffice to evict) and ddmin again. The smaller pool, when
    one is found, is written into ``finding.segment["params"]`` (the finding's own copy of the
    segment: the findings of one segment share its dict, and shrinking one must not change the
    pool another starts from). At most ``options.budget`` reruns."""
    budget = options.budget
    release = finding.release
    want = finding.key()
    runs = [0]
    seg = finding.segment = dict(finding.segment)

    def fails(reqs, params=None) -> bool:
        if runs[0] >= budget:
            return False
        runs[0] += 1
        f = Finding(finding.kind, release, finding.layout, finding.detail,
                    dict(seg, params=params or seg["params"]), finding.case)
        return any(g.key() == want for g in rerun(w, release, f, reqs))

    reqs = list(seg["requests"])
    if reqs and fails(_from_zero(reqs)):  # idle steps before the first arrival cost rerun time
        reqs = _from_zero(reqs)
    reqs = _ddmin(reqs, fails, runs, budget, progress)
    nb = seg["params"].get("num_gpu_blocks")
    while nb and nb > options.min_gpu_blocks and runs[0] < budget and len(reqs) > 1:
        smaller = dict(seg["params"], num_gpu_blocks=nb - max(2, nb // 8))
        if not fails(reqs, smaller):
            break
        seg["params"], nb = smaller, smaller["num_gpu_blocks"]
        reqs = _ddmin(reqs, fails, runs, budget, progress)
    return reqs, runs[0]


def _ddmin(reqs, fails, runs, budget, progress):
    n = 2
    while len(reqs) >= 2 and runs[0] < budget:
        size = max(1, len(reqs) // n)
        chunks = [reqs[i:i + size] for i in range(0, len(reqs), size)]
        for i in range(len(chunks)):  # try each complement
            rest = [r for j, c in enumerate(chunks) if j != i for r in c]
            if rest and fails(rest):
                reqs = rest
                n = max(n - 1, 2)
                if progress:
                    progress(len(reqs), runs[0])
                break
        else:
            if n >= len(reqs):
                break
            n = min(len(reqs), 2 * n)
    return reqs


def _from_zero(reqs):
    t0 = min(r["arrive"] for r in reqs)
    return [dict(r, arrive=r["arrive"] - t0) for r in reqs]
