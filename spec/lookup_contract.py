"""The lookup's contract, apart from any release's code (docs/lookup.md states it with
the vLLM lines each clause is read from).

A lookup of a request (``num_computed_tokens`` N) against the tier's answers may
return a hit of B - N tokens (B the hit boundary). Each group judges B on its own chunk
grid (and B at least the smallest group's chunk past N: under it the lookup's last group
step returns 0): a group *supports* B when the chunks of that group a load up to B reads (its chunks
from N's chunk through the one holding token B - 1, the load's ``cdiv(B, tokens_per_chunk)``)
are answered HIT: full attention every one of them; a sliding window (chunked local
alike) only its last window of them; a recurrent (Mamba) group only its state chunk, the
last, and only for a B on its grid (the chunk's key holds the state at the chunk's end); an
EAGLE/MTP drafter group also the chunk after them (its proof chunk: the trailing
chunk is volatile and popped). So a B inside a chunk the tier holds ready is supported
(two groups of 12- and 16-token chunks meet at 80, inside group 0's chunk 6), its first
chunk included (a sliding window of 16-token chunks ends the hit at 32, inside a ready
64-token full-attention chunk: the load reads it whole). The release's documented
give-aways bound the B it must find (``contract_cap``: the last prompt token with any
windowed group, the Mamba alignment, the request's load caps; ``demanded``: no hit under
one chunk of any group); they never make a B it returns unsupported.

- no false hit: every group supports the returned boundary (a partial tail: every
  group's boundary key is HIT);
- no lost hit: the hit is not below the largest supported boundary;
- no needless deferral: a deferral is allowed only when waiting can give more: some
  key answered HIT_PENDING or RETRY would, were it HIT, support a boundary larger than any
  supported now (demanded or not)
  (or, with nothing supported, a partial tail was pending), or a chunk the hit loads
  is being loaded by another request, or the request has transfers in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lookup import load_window_size_in_chunks, round_down
from .lookup_case import Answer, LookupCase
from .vocab import ReleaseFeatures, cdiv

READY = frozenset({Answer.HIT})
MAYBE = frozenset({Answer.HIT, Answer.HIT_PENDING, Answer.RETRY})


def answer_of(case: LookupCase, name: str) -> Answer:
    """The tier's last answer for a key in the call (a key not asked: its probe)."""
    got = case.tier.get(name)
    return Answer(got[-1]) if got else Answer.MISS


def contract_cap(case: LookupCase) -> int:
    """The largest boundary the design allows (docs/lookup.md, "give-aways")."""
    N = case.num_computed_tokens
    cap = case.num_tokens
    if case.max_num_new_tokens is not None:
        cap = min(cap, N + case.max_num_new_tokens)
    if case.max_load_tokens is not None:
        cap = min(cap, N + case.max_load_tokens)
    if any(g.window is not None for g in case.groups):
        cap -= 1  # the last prompt token is recomputed for its logprobs
        if case.mamba_align_size:
            cap = round_down(cap, case.mamba_align_size)
    return cap


def needed_chunks(case: LookupCase, ci: int, B: int, feats: ReleaseFeatures) -> list | None:
    """Chunk indices group ``ci`` needs for boundary B, or None when it cannot support B."""
    g = case.groups[ci]
    tpc = g.tokens_per_chunk
    N = case.num_computed_tokens
    # B on this group's grid or inside one of its chunks: the load reads that whole chunk. A
    # recurrent state chunk holds the state at the chunk's end, so a Mamba group takes its grid
    # only (the connector rounds the hit to it: 0.33.0 offloading/scheduler.py:137-155); so does
    # every group under a request's load limit: the connector rounds that hit down to the chunk
    # grid (0.31.0 offloading/scheduler.py:815-818; 0.33.0 :916-919)
    on_grid_only = g.kind == "mamba" or case.max_load_tokens is not None
    # under the smallest group's chunk no release returns a hit: the lookup's last group step
    # returns 0 below its own chunk (0.29.0 offloading/scheduler.py:751-753, :808-810)
    if B - N < min(x.tokens_per_chunk for x in case.groups):
        return None
    if B > g.num_keys * tpc or (on_grid_only and B % tpc):
        return None
    start, end = N // tpc, cdiv(B, tpc)
    if g.window is None:
        chunks = list(range(start, end))
    else:
        w = load_window_size_in_chunks(g, B, feats) if feats.lookup_load_window else g.window
        chunks = list(range(max(start, end - w), end))
    if g.eagle and feats.lookup_eagle:
        if end >= g.num_keys:
            return None
        chunks.append(end)
    return chunks


def demanded(case: LookupCase, B: int) -> bool:
    """Whether the release must find boundary B when the tier supports it: not a hit under
    one chunk of any group (each group's step of the lookup returns 0 below its chunk,
    0.29.0 offloading/scheduler.py:751-753,808-810; 0.33.0 :994). A B it returns there is
    still judged by ``supports``: a later group of smaller chunks can tighten the hit below
    an earlier group's chunk after that group's check (DeepSeek V4's shape, docs/lookup.md)."""
    N = case.num_computed_tokens
    return all(B - N >= g.tokens_per_chunk for g in case.groups)


def supports(case: LookupCase, B: int, feats: ReleaseFeatures, ok) -> bool:
    for ci, g in enumerate(case.groups):
        chunks = needed_chunks(case, ci, B, feats)
        if chunks is None:
            return False
        if any(answer_of(case, f"{g.group_idx}:{c}") not in ok for c in chunks):
            return False
    return True


def candidate_boundaries(case: LookupCase, cap: int) -> list[int]:
    """The boundaries ``best_boundary`` tries, largest first: the cap and every point of any
    group's chunk grid in (N, cap). Between two neighbours every group's chunks are the same
    (each group's ``cdiv(B, tokens_per_chunk)`` is constant there) and a larger B widens no
    window (``load_window_size_in_chunks`` pads less), so the largest supported boundary is
    one of these (``tests/test_lookup.py`` holds it equal to a scan of every token)."""
    N = case.num_computed_tokens
    grid = {B for g in case.groups for B in range(round_down(cap, g.tokens_per_chunk), N, -g.tokens_per_chunk)}
    return sorted(grid | ({cap} if cap > N else set()), reverse=True)


def best_boundary(case: LookupCase, feats: ReleaseFeatures, ok=READY, demand: bool = True) -> int:
    """The largest boundary every group supports with keys answered in ``ok`` (``demand``: of
    those the release must find, ``demanded``); N if none.
    Only the cap and the points of the groups' chunk grids are tried (``candidate_boundaries``):
    the answer of a scan of every token from the cap down, at one try per grid point instead
    of one per token (the trace's host spent most of its time there: docs/benchmarks.md,
    "Where a campaign's time goes")."""
    cap = contract_cap(case)
    for B in candidate_boundaries(case, cap):
        if (not demand or demanded(case, B)) and supports(case, B, feats, ok):
            return B
    return case.num_computed_tokens


@dataclass
class Breach:
    clause: str  # false_hit | lost_hit | needless_deferral
    message: str
    tokens: int = 0


def check_lookup(case: LookupCase, feats: ReleaseFeatures, hit: int | None,
                 partial_tail_boundary: int | None) -> list[Breach]:
    N = case.num_computed_tokens
    out: list[Breach] = []
    if case.skip_reading:
        return out
    if hit is not None:
        best = best_boundary(case, feats, READY)  # what the release must find (a deferral is judged below)
        B = N + hit
        if hit and partial_tail_boundary is None and not supports(case, B, feats, READY):
            missing = []
            for ci, g in enumerate(case.groups):
                for c in needed_chunks(case, ci, B, feats) or ["(under the smallest chunk, past its"
                                                               " keys or off a recurrent state's grid)"]:
                    name = f"{g.group_idx}:{c}"
                    if isinstance(c, str) or answer_of(case, name) is not Answer.HIT:
                        missing.append(name if not isinstance(c, str) else f"{g.group_idx} {c}")
            out.append(Breach("false_hit", f"hit {hit} tokens (boundary {B}) but the tier does not hold"
                              f" ready: {', '.join(missing[:8])}", hit))
        if hit and partial_tail_boundary is not None:
            bad = [f"{g.group_idx}:b:{B + case.eagle_proof_margins.get(g.group_idx, 0)}" for g in case.groups
                   if answer_of(case, _canon(case, g, B + (case.eagle_proof_margins.get(g.group_idx, 0)
                                                           if feats.eagle_partial_tails else 0)))
                   is not Answer.HIT]
            if bad:
                out.append(Breach("false_hit", f"partial-tail hit at boundary {B} but its boundary keys"
                                  f" are not ready: {', '.join(bad)}", hit))
        if best > B and not (partial_tail_boundary is not None and B >= best):
            out.append(Breach("lost_hit", f"hit {hit} tokens (boundary {B}); the tier holds ready every"
                              f" chunk a hit of {best - N} tokens (boundary {best}) needs", best - B))
        return out
    if case.transfer_jobs and feats.lookup_defers_on_transfers:
        return out
    # what the release may return now and what waiting may give, demanded or not: a boundary
    # under an earlier group's chunk, tightened by a later group of smaller chunks, included
    ready = best_boundary(case, feats, READY, demand=False)
    if best_boundary(case, feats, MAYBE, demand=False) > ready:
        return out
    if _loading(case, ready, feats):
        return out
    if ready == N and any(Answer(a[-1]) in (Answer.HIT_PENDING, Answer.RETRY)
                          for name, a in case.tier.items() if ":b:" in name and a):
        return out  # nothing complete to load: a pending partial tail may still give one
    pend = sorted(name for name, a in case.tier.items() if a and Answer(a[-1]) in (Answer.HIT_PENDING, Answer.RETRY))
    out.append(Breach("needless_deferral", f"deferred, yet no pending key can make the hit larger:"
                      f" {ready - N} tokens (boundary {ready}) are ready now; pending {', '.join(pend[:8]) or 'none'}",
                      ready - N))
    return out


def _canon(case: LookupCase, g, T: int) -> str:
    if T % g.tokens_per_chunk == 0:
        return f"{g.group_idx}:{T // g.tokens_per_chunk - 1}"
    return f"{g.group_idx}:b:{T}"


def _loading(case: LookupCase, B: int, feats: ReleaseFeatures) -> bool:
    if not case.being_loaded or B <= case.num_computed_tokens:
        return bool(case.being_loaded) and B <= case.num_computed_tokens and False
    for ci, g in enumerate(case.groups):
        chunks = needed_chunks(case, ci, B, feats) or []
        if any(f"{g.group_idx}:{c}" in case.being_loaded for c in chunks):
            return True
    return False


def ideal_hit(case: LookupCase, feats: ReleaseFeatures) -> int:
    return best_boundary(case, feats) - case.num_computed_tokens


__all__ = ["Breach", "check_lookup", "best_boundary", "contract_cap", "demanded", "needed_chunks", "ideal_hit", "cdiv"]
