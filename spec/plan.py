"""The executable reference of ``update_state_after_alloc``'s load plan.

One function, one ``Variant`` switch at the only place the releases differ (the
scan and the assert after it). Asserts come back as values so every layer can
compare outcomes; ``asserts=False`` models ``python -O``.
"""

from __future__ import annotations

from .vocab import (
    AssertName,
    Assertion,
    BlockState,
    Case,
    GroupPlan,
    LATEST_ASSERTS,
    LoadPlan,
    ReleaseAsserts,
    Variant,
    cdiv,
)


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


def plan_load(
    case: Case, variant: Variant | str, asserts: bool = True, release: ReleaseAsserts = LATEST_ASSERTS
) -> LoadPlan:
    variant = Variant(variant)
    N = case.num_locally_computed_tokens
    if case.num_external_tokens == 0:
        return LoadPlan(variant, (), None, asserts)  # vLLM returns before planning
    T = case.num_cached_tokens
    bpc = case.blocks_per_chunk
    planned: list[GroupPlan] = []

    def fail(name: AssertName, gi: int, message: str, **values: int) -> LoadPlan:
        return LoadPlan(variant, tuple(planned), Assertion(name, gi, message, values), asserts)

    for gi, group in enumerate(case.groups):
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
        window = cfg.sliding_window_size_in_chunks(bpc)
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
        start_chunk = end_chunk = start // bpc
        if pending or release.keys_every_group:
            have = case.num_offload_keys(gi)
            if asserts and have < num_chunks:
                return fail(
                    AssertName.KEYS_LENGTH, gi,
                    f"len(offload_keys)={have} < end_chunk_idx={num_chunks}",
                    num_offload_keys=have, end_chunk_idx=num_chunks,
                    load_start_gpu_block_idx=start,
                )
        if pending:
            # vLLM slices offload_keys[start:end]: a short list just yields fewer keys.
            end_chunk = max(start_chunk, min(num_chunks, have))
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
            )
        )
    return LoadPlan(variant, tuple(planned), None, asserts)
