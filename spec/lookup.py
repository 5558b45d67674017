"""The executable reference of the offload lookup: ``get_num_new_matched_tokens``.

One function per step of vLLM's algorithm (``offloading/scheduler.py`` of each
release; docs/lookup.md cites the lines), with the releases' differences read from the
one release table (``versions.RELEASES``, the ``lookup_*`` columns):

- ``get_num_new_matched_tokens``: defer while the request has transfers in flight
  (0.24+), 0 when the request skips the prefix cache, else ``lookup``;
- ``lookup`` = ``lookup_complete_chunks`` then the partial-tail search
  (``partial_tail_search_028`` 0.28-0.32, ``partial_tail_search_033`` 0.33+ with its
  bridge chunk and EAGLE proof keys);
- ``lookup_complete_chunks``: the convergence loop over full-attention groups then
  sliding-window / recurrent groups, the EAGLE/MTP widening and the tail pop
  (``eagle_query_max``), the cross-group rounding (each group caps the hit at its own
  chunk grid), the Mamba alignment cap, and the ``_chunks_being_loaded`` deferral;
- ``maximal_prefix_lookup`` (full attention; ``maximal_prefix_bound`` as a proposed patch
  makes it, ``versions.PATCHES``), ``sliding_window_lookup`` (sliding window, chunked
  local, Mamba: window 1).

Inputs are a ``LookupCase``: the request's sizes, the groups as the connector
configured them, and the tier's answers per offload key (HIT, HIT_PENDING, RETRY,
MISS; a key asked twice in one call may be answered twice). Output: the hit in tokens
or ``None`` (deferred), the recorded ``partial_tail_boundary`` and the keys asked, in
order. The case, its keys' names and its JSON form are ``lookup_case.py``'s.
"""

from __future__ import annotations

from .lookup_case import Answer, LookupCase, LookupGroup, LookupResult, canonical_key, key_name
from .vocab import ReleaseFeatures, cdiv


def round_down(x: int, m: int) -> int:
    return x // m * m


class Tier:
    """The tier's answers as the case recorded them: the n-th ask of a key gets the
    n-th answer (the last one again after that); a key the case has no answer for is
    a MISS."""

    def __init__(self, answers: dict, case: LookupCase | None = None):
        self.answers = answers
        self.case = case
        self.asked: dict = {}
        self.queries: list = []

    def lookup(self, key) -> Answer:
        name = key_name(canonical_key(self.case, key) if self.case is not None else key)
        self.queries.append(name)
        got = self.answers.get(name) or (Answer.MISS,)
        n = self.asked.get(name, 0)
        self.asked[name] = n + 1
        return Answer(got[min(n, len(got) - 1)])


# -- the per-group scans -------------------------------------------------------------------
def _prefix_scan(tier: Tier, keys) -> tuple[int, int, bool]:
    """One scan of ``_maximal_prefix_lookup``'s keys from the start to the first MISS: the chunks
    that count as hits (HIT and HIT_PENDING), the chunks before the first MISS (RETRY too), and
    whether any answer defers (HIT_PENDING or RETRY; 0.21-0.24 have no RETRY)."""
    counted = reached = 0
    defer = False
    for key in keys:
        r = tier.lookup(key)
        if r is Answer.MISS:
            break
        reached += 1
        if r is not Answer.RETRY:
            counted += 1
        defer |= r is not Answer.HIT
    return counted, reached, defer


def maximal_prefix_lookup(tier: Tier, keys, feats: ReleaseFeatures) -> int | None:
    """``_maximal_prefix_lookup``: consecutive hits from the start; HIT_PENDING counts and
    defers, RETRY defers (0.25+: without counting; the scan goes on so the tier can start its
    async lookups), MISS stops."""
    counted, _, defer = _prefix_scan(tier, keys)
    return None if defer else counted


def maximal_prefix_bound(tier: Tier, keys) -> tuple[int, bool]:
    """``_maximal_prefix_lookup`` as the lookup-deferral patch makes it (``versions.PATCHES``,
    column ``lookup_deferral_keeps_bound``): the chunks up to the first miss, HIT, HIT_PENDING
    and RETRY alike (what waiting can give at most), and whether any of them defers."""
    _, reached, defer = _prefix_scan(tier, keys)
    return reached, defer


def sliding_window_lookup(tier: Tier, keys, window: int, feats: ReleaseFeatures,
                          initial_window: int | None = None) -> int | None:
    """``_sliding_window_lookup``: from the right end, the end index of the first run of
    ``window`` consecutive hits (the first run may need ``initial_window``, 0.30+), or
    the run at the left end; ``None`` if the tier deferred.

    0.21-0.24: a pending key breaks the run and defers. 0.25-0.29: HIT_PENDING extends
    the run and defers, whatever lies between it and the run found. 0.30+: a gap (MISS
    or RETRY) clears the pending flag of the incomplete run to its right
    (``lookup_swa_gap_clears_pending``)."""
    defer = False
    pending_in_window = False
    consecutive = 0
    required = (initial_window or window) if feats.lookup_load_window else window
    for idx in range(len(keys) - 1, -1, -1):
        r = tier.lookup(keys[idx])
        if not feats.lookup_result_enum:  # True / None / False
            if r is Answer.HIT_PENDING:
                defer = True
                consecutive = 0
            elif r is Answer.HIT:
                consecutive += 1
                if consecutive == window:
                    return None if defer else idx + window
            else:
                consecutive = 0
            continue
        if r is Answer.HIT:
            consecutive += 1
        elif r is Answer.HIT_PENDING:
            consecutive += 1
            if feats.lookup_swa_gap_clears_pending:
                pending_in_window = True
            else:
                defer = True
        elif r is Answer.RETRY:
            defer = True
            consecutive = 0
            pending_in_window = False
            required = window
        else:
            consecutive = 0
            pending_in_window = False
            required = window
        if consecutive == required:
            return None if defer or pending_in_window else idx + required
    return None if defer or pending_in_window else consecutive


def load_window_size_in_chunks(group: LookupGroup, num_tokens: int, feats: ReleaseFeatures) -> int | None:
    """``GroupOffloadConfig.load_window_size_in_chunks`` (0.30+): a sliding window's
    chunks widened to the window that allocation keeps when the hit's right edge is not
    on the chunk grid (0.31+ counts ``extra_retained_tokens``)."""
    window = group.window
    if group.kind == "sliding_window":
        tpc = group.tokens_per_chunk
        pad = -num_tokens % tpc
        extra = group.extra_retained_tokens if feats.window_counts_retained else 0
        window = max(window, cdiv(group.sliding_window - 1 + extra + pad, tpc))
    return window


def eagle_query_max(group: LookupGroup, max_hit: int, unverified: bool, feats: ReleaseFeatures) -> int:
    """EAGLE/MTP widening: an unverified drafter group asks one chunk past the hit (the
    volatile trailing chunk it then pops). 0.24-0.29 widen sliding-window groups only;
    0.30+ every group (the fix of vLLM #52735)."""
    if unverified and (feats.lookup_eagle_widens_every_group or group.window is not None):
        return min(max_hit + group.tokens_per_chunk, group.num_keys * group.tokens_per_chunk)
    return max_hit


def initial_max_hit(case: LookupCase, feats: ReleaseFeatures) -> int:
    """The hit's first upper bound: the request's tokens, the caller's and the
    request's load caps (0.30+ / 0.31+), minus the last prompt token when any group
    is windowed (it is recomputed for its logprobs), rounded down to the Mamba
    alignment (0.24+)."""
    N = case.num_computed_tokens
    m = case.num_tokens
    if case.max_num_new_tokens is not None:
        m = min(m, N + case.max_num_new_tokens)
    if case.max_load_tokens is not None:
        m = min(m, N + case.max_load_tokens)
    if case.sliding_window_groups:
        m -= 1
        if case.mamba_align_size is not None:
            m = round_down(m, case.mamba_align_size)
    return m


def chunks_being_loaded_defer(case: LookupCase, hit: int, feats: ReleaseFeatures) -> bool:
    """Whether a chunk the hit loads is being loaded by another request (the lookup
    then defers): per group the hit's chunks, a window group's last window only."""
    if not case.being_loaded:
        return False
    N = case.num_computed_tokens
    for ci, g in enumerate(case.groups):
        start = N // g.tokens_per_chunk
        end = cdiv(N + hit, g.tokens_per_chunk)
        keys = [(g.group_idx, c) for c in range(start, min(end, g.num_keys))]
        w = load_window_size_in_chunks(g, N + hit, feats) if feats.lookup_load_window else g.window
        if w is not None:
            keys = keys[-w:] if w else []
        if any(key_name(k) in case.being_loaded for k in keys):
            return True
    return False


def lookup_complete_chunks(case: LookupCase, tier: Tier, feats: ReleaseFeatures, out: LookupResult) -> int | None:
    """``_lookup_complete_chunks`` (0.21-0.27: ``_lookup``)."""
    N = case.num_computed_tokens
    max_hit = initial_max_hit(case, feats)
    num_hit = 0
    defer = False
    lookup_groups = case.lookup_groups
    eagle_verified: set = set()
    while lookup_groups:
        looked_up_window = False
        todo, lookup_groups = lookup_groups, ()
        for ci in todo:
            g = case.groups[ci]
            tpc = g.tokens_per_chunk
            unverified = feats.lookup_eagle and g.eagle and ci not in eagle_verified
            max_hit = min(max_hit, g.num_keys * tpc)
            if case.max_load_tokens is not None:
                max_hit = round_down(max_hit, tpc)
            if max_hit - N < tpc:
                return 0
            query_max = eagle_query_max(g, max_hit, unverified, feats)
            num_chunks = min(cdiv(query_max, tpc), g.num_keys)
            start = N // tpc
            keys = [(g.group_idx, c) for c in range(start, num_chunks)]
            group_defers = False  # a group that defers yet bounds the hit (lookup_deferral_keeps_bound)
            if g.window is None and feats.lookup_deferral_keeps_bound:
                hits, group_defers = maximal_prefix_bound(tier, keys)
                out.hit_end[ci] = start + (0 if group_defers else hits)
            elif g.window is None:
                hits = maximal_prefix_lookup(tier, keys, feats)
                out.hit_end[ci] = start + (hits or 0)
            else:
                required = g.window + int(unverified)
                initial = None
                if feats.lookup_load_window:
                    end = min(max_hit, (num_chunks - int(unverified)) * tpc)
                    initial = load_window_size_in_chunks(g, end, feats) + int(unverified)
                hits = sliding_window_lookup(tier, keys, required, feats, initial)
            if hits == 0:
                return 0
            if hits is None:
                defer = True
            else:
                defer |= group_defers
                if unverified:
                    hits -= 1
                    if not group_defers:  # a pending proof chunk proves nothing yet (the patch's row)
                        eagle_verified.add(ci)
                max_hit = min(max_hit, tpc * (start + hits))
            new_hit = max_hit - N
            if new_hit < tpc:
                return 0
            if new_hit < num_hit:
                if not g.eagle:
                    eagle_verified.clear()
                if defer:
                    defer = False
                    lookup_groups = case.lookup_groups
                elif looked_up_window and not lookup_groups:
                    lookup_groups = case.sliding_window_groups
            looked_up_window |= g.window is not None
            num_hit = new_hit
    if defer:
        return None
    if chunks_being_loaded_defer(case, num_hit, feats):
        return None
    return num_hit


def boundary_key(case: LookupCase, group: LookupGroup, boundary: int, feats: ReleaseFeatures) -> tuple:
    """``_make_boundary_key`` at ``_partial_tail_key_tokens``: the boundary, plus the
    group's EAGLE proof margin (0.33+)."""
    margin = case.eagle_proof_margins.get(group.group_idx, 0) if feats.eagle_partial_tails else 0
    return group.group_idx, "b", boundary + margin


def partial_tail_search_028(case: LookupCase, tier: Tier, feats: ReleaseFeatures, complete_hit: int,
                            out: LookupResult) -> int | None:
    """0.28-0.32 ``_lookup`` after the complete chunks: the longest boundary (a multiple of
    tokens_per_hash) inside the block after the complete hit, below the last prompt
    token and within the request's caps, whose boundary key every group answers HIT."""
    N = case.num_computed_tokens
    complete_boundary = N + complete_hit
    tph = case.tokens_per_hash
    block_end = complete_boundary + case.partial_tail_block_size
    max_boundary = min(case.num_prompt_tokens - 1, block_end - 1)
    if case.max_num_new_tokens is not None:
        max_boundary = min(max_boundary, N + case.max_num_new_tokens)
    if case.max_load_tokens is not None:  # before the hash grid (0.31.0 :980-985, 0.32.0 :983-988)
        max_boundary = min(max_boundary, N + case.max_load_tokens)
    max_boundary = round_down(max_boundary, tph)
    if max_boundary <= complete_boundary:
        return complete_hit
    pending = False
    for boundary in range(max_boundary, complete_boundary, -tph):
        b_pending = b_missed = False
        for g in case.groups:
            r = tier.lookup(boundary_key(case, g, boundary, feats))
            if r is Answer.MISS:
                b_missed = True
                break
            if r is not Answer.HIT:
                b_pending = True
        pending |= b_pending
        if not b_missed and not b_pending:
            out.partial_tail_boundary = boundary
            return boundary - N
    if pending and complete_hit == 0:
        return None
    return complete_hit


def lookup_partial_tail(case: LookupCase, tier: Tier, feats: ReleaseFeatures, boundary: int,
                        bridge_pending: bool) -> tuple[bool, bool]:
    """0.33 ``_lookup_partial_tail``: (every boundary key ready, something pending)."""
    pending = bridge_pending
    for g in case.groups:
        r = tier.lookup(boundary_key(case, g, boundary, feats))
        if r is Answer.MISS:
            return False, pending
        pending |= r is not Answer.HIT
    if pending:
        return False, True
    return True, False


def partial_tail_search_033(case: LookupCase, tier: Tier, feats: ReleaseFeatures, complete_hit: int,
                            out: LookupResult) -> int | None:
    """0.33 ``_lookup`` after the complete chunks: the search spans a second block when a
    group carries an EAGLE proof margin; a boundary past the complete hit's block also
    loads that block's complete chunk (the bridge), looked up once where the complete
    lookup did not confirm it."""
    N = case.num_computed_tokens
    complete_boundary = N + complete_hit
    tph = case.tokens_per_hash
    max_margin = max(case.eagle_proof_margins.values(), default=0)
    blocks = 2 if max_margin else 1
    block_end = complete_boundary + blocks * case.partial_tail_block_size
    max_boundary = min(case.num_prompt_tokens - 1, block_end - 1)
    if max_margin:
        max_boundary = min(max_boundary, case.num_block_hashes * tph - max_margin)
    if case.max_num_new_tokens is not None:
        max_boundary = min(max_boundary, N + case.max_num_new_tokens)
    if case.max_load_tokens is not None:
        max_boundary = min(max_boundary, N + case.max_load_tokens)
    max_boundary = round_down(max_boundary, tph)
    if max_boundary <= complete_boundary:
        return complete_hit
    bs = case.partial_tail_block_size
    bridge_idx = complete_boundary // bs
    bridge_boundary = (bridge_idx + 1) * bs
    pending = False
    if max_boundary >= bridge_boundary:
        unconfirmed = []
        for ci, g in enumerate(case.groups):
            if g.requires_cow_source:
                continue
            key = (g.group_idx, bridge_idx)
            pending |= key_name(key) in case.being_loaded
            if out.hit_end.get(ci, 0) <= bridge_idx:
                unconfirmed.append(key)
        for key in unconfirmed:
            r = tier.lookup(key)
            if r is Answer.MISS:
                max_boundary = bridge_boundary - tph
                break
            pending |= r is not Answer.HIT
    bridge_pending = pending
    for boundary in range(max_boundary, complete_boundary, -tph):
        hit, b_pending = lookup_partial_tail(case, tier, feats, boundary,
                                             boundary >= bridge_boundary and bridge_pending)
        if hit:
            out.partial_tail_boundary = boundary
            return boundary - N
        pending |= b_pending
    if pending and complete_hit == 0:
        return None
    return complete_hit


def lookup(case: LookupCase, tier: Tier, feats: ReleaseFeatures, out: LookupResult) -> int | None:
    """``_lookup``: complete chunks, then (0.28+, where the config supports partial tails)
    the partial-tail search."""
    complete = lookup_complete_chunks(case, tier, feats, out)
    out.partial_tail_boundary = None
    if complete is None or not (feats.partial_tails and case.partial_tail_block_size):
        return complete
    if feats.lookup_partial_tail_bridge:
        return partial_tail_search_033(case, tier, feats, complete, out)
    return partial_tail_search_028(case, tier, feats, complete, out)


def unsupported_lookup_reason(case: LookupCase, feats: ReleaseFeatures) -> str | None:
    r = f"vLLM {feats.release}"
    if any(g.eagle for g in case.groups) and not feats.lookup_eagle:
        return f"{r} has no EAGLE groups (is_eagle_group arrived in 0.24)"
    if case.partial_tail_block_size and not feats.partial_tails:
        return f"{r} has no partial tails (they arrived in 0.28)"
    if case.max_load_tokens is not None and not feats.max_load_tokens:
        return f"{r} has no max_load_tokens (kv_transfer_params max_load_tokens arrived in 0.31)"
    if not feats.lookup_result_enum and any(
            Answer(a) is Answer.RETRY for v in case.tier.values() for a in v):
        return f"{r}'s tiers answer True/None/False: no RETRY (LookupResult arrived in 0.25)"
    return None


def get_num_new_matched_tokens(case: LookupCase, feats: ReleaseFeatures) -> LookupResult:
    """``get_num_new_matched_tokens``'s first element (and the boundary it records)."""
    why = unsupported_lookup_reason(case, feats)
    if why is not None:
        return LookupResult(None, unsupported=why)
    out = LookupResult(None)
    if feats.lookup_defers_on_transfers and (case.transfer_jobs or case.skip_reading):
        out.partial_tail_boundary = case.prior_partial_tail_boundary  # not reset: _lookup never ran
        if not case.transfer_jobs:
            out.hit = 0
        return out
    tier = Tier(case.tier, case)
    out.hit = lookup(case, tier, feats, out)
    out.queries = tier.queries
    return out


def lookup_for_version(case: LookupCase, version: str) -> LookupResult:
    from .versions import release_features

    return get_num_new_matched_tokens(case, release_features(version))
