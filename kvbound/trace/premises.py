"""What kvbound's proofs assume about the tables vLLM's allocator hands
``update_state_after_alloc``, as named predicates checked on every captured call.

Interim home: the proofs' own premise objects (``proofs/premises.py``, issue 11) will
replace these; the ids are the same so a finding keeps its name. Each predicate
lists the vLLM lines it was read from (0.33.0 tree; 0.29.0 where it differs) and
returns ``None`` when it holds, else what is wrong.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from kvbound.spec import BlockState, Case, GroupKind, cdiv

STM = "v1/core/single_type_kv_cache_manager.py"


class Premise(NamedTuple):
    id: str
    statement: str
    kinds: frozenset
    sources: tuple
    check: Callable  # (Case, group index) -> None | str


class Violation(NamedTuple):
    premise: str
    group_index: int
    detail: str


def _n(case: Case, gi: int):
    g = case.groups[gi]
    b = g.config.tokens_per_block
    N, T = case.num_locally_computed_tokens, case.num_cached_tokens
    return g, b, N, T, cdiv(N, b), cdiv(T, b)


def _table_length(case, gi):
    g, b, N, T, f, k = _n(case, gi)
    return None if len(g.blocks) >= k else f"len(blocks)={len(g.blocks)} < k=cdiv(T={T}, b={b})={k}"


def _aligned(case, gi):
    g, b, N, *_ = _n(case, gi)
    return None if N % b == 0 else f"N={N} is not a multiple of tokens_per_block={b}"


def _fresh_after_nulls(case, gi):
    g, b, N, T, f, k = _n(case, gi)
    blocks = g.blocks[:k]
    fresh = (BlockState.UNHASHED, BlockState.HASHED) if case.sync_load else (BlockState.UNHASHED,)
    j = next((i for i in range(f, len(blocks)) if not blocks[i].is_null), len(blocks))
    if j >= len(blocks) and k > f:
        return f"no non-null block in [f={f}, k={k}): nothing to load into"
    for i in range(j, len(blocks)):
        if blocks[i].state not in fresh:
            return f"blocks[{i}] is {blocks[i].token}: [f={f}, j={j}) null then [j, k={k}) fresh expected"
    return None


def _computed_hashed(case, gi):
    g, b, N, T, f, k = _n(case, gi)
    for i in range(min(f, len(g.blocks))):
        if not g.blocks[i].is_hashed:
            return f"blocks[{i}] is {g.blocks[i].token} below f={f}: a full-attention prefix hit is hashed blocks"
    return None


def _no_unhashed_below_f(case, gi):
    g, b, N, T, f, k = _n(case, gi)
    for i in range(min(f, len(g.blocks))):
        if g.blocks[i].state is BlockState.UNHASHED:
            return f"blocks[{i}] is {g.blocks[i].token} (non-null, unhashed) below f={f}"
    return None


def _mamba_one_block(case, gi):
    g, b, N, T, f, k = _n(case, gi)
    for i in range(f, min(k - 1, len(g.blocks))):
        if not g.blocks[i].is_null:
            return f"blocks[{i}] is {g.blocks[i].token} in [f={f}, k-1={k - 1}): align mode keeps one state block, at k-1"
    return None


def _keys_cover(case, gi):
    g, b, N, T, f, k = _n(case, gi)
    tpc = g.config.tokens_per_chunk(case.blocks_per_chunk)
    have, want = case.num_offload_keys(gi), cdiv(T, tpc)
    return None if have >= want else f"{have} offload keys < cdiv(T={T}, tokens_per_chunk={tpc})={want}"


ALL = frozenset(GroupKind)
PREMISES = (
    Premise("table-length", "every group's table reaches k = cdiv(N + M, b)", ALL,
            (f"0.33.0 {STM}:370 allocate_new_blocks (a slot for every token of N + M)",), _table_length),
    Premise("aligned", "N, the local hit, is a multiple of each group's tokens_per_block", ALL,
            ("0.33.0 v1/core/kv_cache_utils.py:816 resolve_kv_cache_block_sizes (hits align to the"
             " scheduler block, the LCM of the groups' block sizes)",), _aligned),
    Premise("fresh-after-nulls", "blocks [f, k) are nulls then fresh non-null unhashed blocks"
            " (a 0.33 sync load's may be hashed)", ALL,
            (f"0.33.0 {STM}:370 allocate_new_blocks (new blocks come unhashed from get_new_blocks)",
             f"0.33.0 {STM}:1148 / :1381 get_num_skipped_tokens (window nulls are padding below)"),
            _fresh_after_nulls),
    Premise("computed-hashed", "a full-attention group's blocks below f are hashed", frozenset({GroupKind.FULL_ATTENTION}),
            (f"0.33.0 {STM}:743 FullAttentionManager.find_longest_cache_hit (hits are cached blocks)",),
            _computed_hashed),
    Premise("no-unhashed-below-f", "no non-null unhashed block lies below f (the legacy scan's assumption;"
            " the PR's [H][H][·][U] breaks it for Mamba)",
            frozenset({GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL}),
            (f"0.33.0 {STM}:1148 SlidingWindowManager.get_num_skipped_tokens",
             f"0.33.0 {STM}:1381 ChunkedLocalAttentionManager.get_num_skipped_tokens"), _no_unhashed_below_f),
    Premise("mamba-one-block", "a Mamba align group holds no non-null block in [f, k-1)", frozenset({GroupKind.MAMBA}),
            (f"0.33.0 {STM}:1797 MambaManager.allocate_new_blocks (align mode)",
             f"0.33.0 {STM}:1971 MambaManager.get_num_skipped_tokens = N - 1"), _mamba_one_block),
    Premise("keys-cover", "the request has an offload key for every chunk up to T", ALL,
            ("0.33.0 distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py get_num_new_matched_tokens"
             " (the lookup walks the request's keys)",), _keys_cover),
)
BY_ID = {p.id: p for p in PREMISES}


def evaluate(case: Case) -> list[Violation]:
    """Every premise that fails on some group of ``case`` (nothing for M = 0: vLLM
    returns before planning)."""
    if case.num_external_tokens == 0:
        return []
    out = []
    for gi, g in enumerate(case.groups):
        for p in PREMISES:
            if p.check is not None and g.config.kind in p.kinds:
                why = p.check(case, gi)
                if why is not None:
                    out.append(Violation(p.id, gi, why))
    return out
