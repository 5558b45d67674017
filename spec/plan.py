"""The executable reference of ``update_state_after_alloc``'s load plan.

One function, one ``Variant`` switch at the only place the releases differ (the
scan and the assert after it). Asserts come back as values so every layer can
compare outcomes; ``asserts=False`` models ``python -O``.
"""

from __future__ import annotations

from .asserts import ROW
from .case import Case
from .vocab import (
    AssertName,
    Assertion,
    BlockState,
    GroupPlan,
    LoadPlan,
    ReleaseFeatures,
    Variant,
    cdiv,
)
from .versions import release_features, unsupported_reason, variant_features


def load_start_gpu_block_idx(blocks, scan_from: int, num_gpu_blocks: int, match_hashed: bool) -> int:
    """First i in [scan_from, num_gpu_blocks) with a non-null block that is unhashed
    (or any non-null block when ``match_hashed``, the 0.33 sync-load rule); else k."""
    # states are exactly NULL / HASHED / UNHASHED: "non-null and unhashed" is UNHASHED
    wanted = (BlockState.UNHASHED, BlockState.HASHED) if match_hashed else (BlockState.UNHASHED,)
    for i in range(scan_from, num_gpu_blocks):
        if blocks[i].state in wanted:
            return i
    return num_gpu_blocks


def scan_from(variant: Variant, num_locally_computed_tokens: int, tokens_per_block: int) -> int:
    """Legacy scans from 0; the fix from the first fresh block cdiv(N, b)."""
    if variant is Variant.LEGACY:
        return 0
    return cdiv(num_locally_computed_tokens, tokens_per_block)


def variant_load_start(blocks, variant: Variant, N: int, b: int, k: int, sync_load: bool) -> int:
    """The load start ``variant``'s scan picks in one group's table (len(blocks) >= k):
    the one place the releases' scans differ."""
    return load_start_gpu_block_idx(
        blocks, scan_from(variant, N, b), k, match_hashed=variant is Variant.FIXED_SYNC and sync_load,
    )


def partial_tail_key_tokens(case: Case, group_index: int, release: ReleaseFeatures) -> int:
    """The token position whose hash keys group ``group_index``'s partial-tail block:
    the boundary, plus the group's EAGLE proof margin from 0.33 on
    (``_partial_tail_key_tokens``). The key is ``request.block_hashes[key_tokens //
    tokens_per_hash - 1]`` with the group's id (``_make_boundary_key``)."""
    margin = case.eagle_proof_margin(group_index) if release.eagle_partial_tails else 0
    return case.partial_tail_boundary + margin


def boundary_key(case: Case, group_index: int, release: ReleaseFeatures) -> tuple:
    """A group's partial-tail key as the plan output spells it: ``(group_idx, "boundary", key_tokens)``."""
    return (group_index, "boundary", partial_tail_key_tokens(case, group_index, release))


def plan_load(
    case: Case, variant: Variant | str, asserts: bool = True, release: ReleaseFeatures | None = None
) -> LoadPlan:
    """``update_state_after_alloc`` of ``release`` (default: the variant's last release,
    ``versions.REPRESENTATIVE``) with ``variant``'s scan."""
    variant = Variant(variant)
    if release is None:
        release = variant_features(variant)
    if case.uses_v2_features:  # only a v2 feature can be one a release lacks
        why = unsupported_reason(case, release)
        if why is not None:
            return LoadPlan(variant, (), None, asserts, unsupported=why)
    N = case.num_locally_computed_tokens
    if case.num_external_tokens == 0:
        return LoadPlan(variant, (), None, asserts)  # vLLM returns before planning
    T = case.num_cached_tokens
    bpc = case.blocks_per_chunk
    boundary = case.partial_tail_boundary
    tail = boundary is not None
    planned: list[GroupPlan] = []

    def fail(name: AssertName, gi: int | None, message: str, **values: int) -> LoadPlan:
        assert tuple(values) == ROW[name].values, f"{name.value} must report spec/asserts.py's {ROW[name].values}"
        return LoadPlan(variant, tuple(planned), Assertion(name, gi, message, values), asserts)

    if asserts and tail and boundary != T:
        return fail(
            AssertName.PARTIAL_TAIL, None,
            f"partial_tail_boundary={boundary} != num_cached_tokens={T}",
            partial_tail_boundary=boundary, num_cached_tokens=T,
        )
    for gi in case.offloaded_group_indices:
        group = case.groups[gi]
        cfg = group.config
        b = cfg.tokens_per_block
        tpc = cfg.tokens_per_chunk(bpc)
        blocks = group.blocks
        k = cdiv(T, b)
        f = cdiv(N, b)
        if len(blocks) < k:
            # Even under ``python -O`` the scan would index past the table.
            return fail(
                AssertName.TABLE_LENGTH, gi,
                f"len(group_blocks)={len(blocks)} < num_gpu_blocks={k}",
                table_length=len(blocks), num_gpu_blocks=k,
            )
        start = variant_load_start(blocks, variant, N, b, k, case.sync_load)
        if asserts and variant is Variant.LEGACY and not N <= start * b:
            return fail(
                AssertName.BOUNDARY, gi,
                f"num_locally_computed_tokens={N} > num_locally_computed_gpu_blocks={start}"
                f" * tokens_per_block={b}",
                num_locally_computed_tokens=N, load_start_gpu_block_idx=start,
                tokens_per_block=b, first_fresh_gpu_block_idx=f,
            )
        if asserts and variant is not Variant.LEGACY and N % b != 0:
            return fail(
                AssertName.ALIGNMENT, gi,
                f"num_locally_computed_tokens={N} % tokens_per_block={b} = {N % b} != 0",
                num_locally_computed_tokens=N, tokens_per_block=b,
                load_start_gpu_block_idx=start,
            )
        pending = k - start
        window = cfg.sliding_window_size_in_chunks(bpc, release.window_counts_retained)
        slack = release.window_slack
        if asserts and window is not None and slack is not None and pending > window * bpc + slack:
            return fail(
                AssertName.WINDOW_BOUND, gi,
                f"num_pending_gpu_blocks={pending} > sliding_window_size_in_chunks={window}"
                f" * blocks_per_chunk={bpc} + {slack}",
                num_pending_gpu_blocks=pending, sliding_window_size_in_chunks=window,
                blocks_per_chunk=bpc, load_start_gpu_block_idx=start,
            )
        num_chunks = cdiv(T, tpc)
        end_chunk_idx = num_chunks - tail  # a partial tail's last chunk is its boundary key
        start_chunk = end_chunk = start // bpc
        key_tokens = None
        if pending or release.keys_every_group:
            have = case.num_offload_keys(gi)
            if asserts and have < end_chunk_idx:
                return fail(
                    AssertName.KEYS_LENGTH, gi,
                    f"len(offload_keys)={have} < end_chunk_idx={end_chunk_idx}",
                    num_offload_keys=have, end_chunk_idx=end_chunk_idx,
                    load_start_gpu_block_idx=start,
                )
        if pending:
            # vLLM slices offload_keys[start:end]: a short list just yields fewer keys.
            end_chunk = max(start_chunk, min(end_chunk_idx, have))
            if tail:
                key_tokens = partial_tail_key_tokens(case, gi, release)
        planned.append(
            GroupPlan(
                group_index=gi,
                num_gpu_blocks=k,
                first_fresh_gpu_block_idx=f,
                load_start_gpu_block_idx=start,
                num_pending_gpu_blocks=pending,
                dst_block_ids=tuple(b_.block_id for b_ in blocks[start:k]),
                start_chunk_idx=start_chunk,
                end_chunk_idx=end_chunk,
                boundary_key_tokens=key_tokens,
            )
        )
    return LoadPlan(variant, tuple(planned), None, asserts)


def plan_for_version(case: Case, version: str, asserts: bool = True) -> LoadPlan:
    """The spec's plan of ``case`` as vLLM ``version`` computes it (its row of ``versions.RELEASES``)."""
    feats = release_features(version)
    return plan_load(case, feats.variant, asserts, feats)
