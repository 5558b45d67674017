"""The KV-cache layouts ``kvbound trace`` runs, as real models configure them.

A layout is plain JSON handed to the worker: its groups (kind, tokens_per_block,
window), ``blocks_per_chunk`` and, for hybrids, ``prefix_match_unit`` (vLLM's
tokens_per_hash when it is below the block size). ``ENGINE`` sizes the engine:
GPU blocks (small, so traffic evicts and preempts), the CPU tier's capacity in
chunks (vLLM's own LRU tier), batch limits and the fake transfer engine's delays.
"""

from __future__ import annotations

FA, SWA, CL, MAMBA = "full_attention", "sliding_window", "chunked_local", "mamba"


def _g(kind, b, **kw):
    return dict(kind=kind, tokens_per_block=b, **kw)


LAYOUTS = {
    # One full-attention group (a dense Llama).
    "full": {"groups": [_g(FA, 16)], "blocks_per_chunk": 1},
    # Full attention + sliding window (Gemma/Mistral style), window 128 tokens.
    "swa": {"groups": [_g(FA, 16), _g(SWA, 16, sliding_window=128)], "blocks_per_chunk": 1},
    # Full attention + chunked local attention (Llama 4 style), chunk 128 tokens.
    "chunked": {"groups": [_g(FA, 16), _g(CL, 16, attention_chunk_size=128)], "blocks_per_chunk": 1},
    # Hybrid Mamba align: attention and Mamba share a 64-token page, hashed every
    # 16 tokens (tokens_per_hash < block size: partial tails on 0.33).
    "mamba": {"groups": [_g(FA, 64), _g(MAMBA, 64)], "blocks_per_chunk": 1, "prefix_match_unit": 16},
    # The same hybrid hashed per block (tokens_per_hash = block size): what releases
    # before 0.28 can offload (their store path needs whole-block hashes).
    "mamba-block": {"groups": [_g(FA, 64), _g(MAMBA, 64)], "blocks_per_chunk": 1},
    # Hybrid Mamba with a realistic page: 528 tokens per block (a Mamba2 state page
    # matched by the attention block size), hashed every 16 tokens.
    "mamba528": {"groups": [_g(FA, 528), _g(MAMBA, 528)], "blocks_per_chunk": 1, "prefix_match_unit": 16},
    # 0.33 sync loads (a per-step byte budget: hits that fit load within the step,
    # into blocks hashed at allocation): sliding-window and Mamba hybrids.
    "swa-sync": {"groups": [_g(FA, 16), _g(SWA, 16, sliding_window=128)], "blocks_per_chunk": 1},
    "mamba-sync": {"groups": [_g(FA, 64), _g(MAMBA, 64)], "blocks_per_chunk": 1, "prefix_match_unit": 16},
    "mamba-block-sync": {"groups": [_g(FA, 64), _g(MAMBA, 64)], "blocks_per_chunk": 1},
    # 0.33+: an EAGLE drafter's attention layers in their own group (vLLM's planner
    # sets KVCacheGroupSpec.is_eagle_group; the connector then drops the group's
    # volatile trailing chunk and, with partial tails, keys it at a proof margin).
    # Sync scheduling: the fake drafter proposes num_speculative_tokens per step.
    "eagle": {"groups": [_g(FA, 16), _g(FA, 16, eagle=True)], "blocks_per_chunk": 1,
              "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # A hybrid Mamba model with an MTP-style attention drafter (Qwen3-Next shape):
    # tokens_per_hash 16 < block 64, so partial tails carry EAGLE proof margins.
    "mamba-eagle": {"groups": [_g(FA, 64), _g(MAMBA, 64), _g(FA, 64, eagle=True)], "blocks_per_chunk": 1,
                    "prefix_match_unit": 16, "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # Speculative decoding on but no group tagged as the drafter's (a KV-sharing drafter,
    # or a runner that does not tag draft layers): the connector then treats every group
    # as non-draft (0.33 offloading/scheduler.py:218-232, the fix of #52735) while the
    # core coordinator drops the last block of every group (kv_cache_coordinator.py:133-134).
    "mamba-eagle-untagged": {"groups": [_g(FA, 64), _g(MAMBA, 64)], "blocks_per_chunk": 1,
                             "prefix_match_unit": 16,
                             "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # The scripted tier (ENGINE pending_p/retry_p/evict_p): vLLM's CPU tier loaded through
    # the spec factory's out-of-tree path, answering HIT_PENDING/RETRY and evicting
    # chunks a lookup just confirmed (fakes.install_scripted_tier).
    "full-scripted": {"groups": [_g(FA, 16)], "blocks_per_chunk": 1},
    "mamba-eagle-scripted": {"groups": [_g(FA, 64), _g(MAMBA, 64), _g(FA, 64, eagle=True)],
                             "blocks_per_chunk": 1, "prefix_match_unit": 16,
                             "speculative": {"method": "eagle", "num_speculative_tokens": 2}},
    # The scripted tier beside a sliding window of 4 chunks (the lookup's sliding-window
    # scan meets HIT_PENDING/RETRY answers right of gaps the evictions leave).
    "swa-scripted": {"groups": [_g(FA, 16), _g(SWA, 16, sliding_window=64)], "blocks_per_chunk": 1},
    # The scripted tier whose writes sometimes never complete (stall_p): a key stays
    # HIT_PENDING for as long as the engine runs.
    "full-stalled": {"groups": [_g(FA, 16)], "blocks_per_chunk": 1},
    # offload_prompt_only=False (kv_connector_extra_config, read by OffloadingSpec,
    # v1/kv_offload/base.py): decoded tokens are offloaded too, up to the finished
    # request's token horizon (0.26-0.29: num_tokens; 0.30+: clamped to num_tokens - 1).
    "full-store-all": {"groups": [_g(FA, 16)], "blocks_per_chunk": 1},
    "swa-store-all": {"groups": [_g(FA, 16), _g(SWA, 16, sliding_window=128)], "blocks_per_chunk": 1},
    # A sliding-window hybrid with a multi-module MTP drafter (3 modules, 3 speculative
    # tokens): the planner makes the window retain num_speculative_tokens - 1 = 2 tokens more
    # (engine._tag_retained_tokens), so the window's skipped blocks, the load's window bound
    # and the premise window-skipped-null meet extra_retained_tokens on real tables.
    "swa-mtp": {"groups": [_g(FA, 16), _g(SWA, 16, sliding_window=64)], "blocks_per_chunk": 1,
                "speculative": {"method": "mtp", "num_speculative_tokens": 3}},
    # Two GPU blocks per offloaded chunk.
    "bpc2": {"groups": [_g(FA, 16), _g(SWA, 16, sliding_window=64)], "blocks_per_chunk": 2},
}

# How big each engine is, per layout: GPU blocks (incl. the null block), CPU chunks,
# batch limits, the longest prompt and the fake transfer engine.
_BASE = dict(num_gpu_blocks=72, cpu_chunks=256, max_num_seqs=8, max_num_batched_tokens=256,
             max_delay=2, fail_p=0.0, max_model_len=8192, abort_p=0.04)
ENGINE = {
    "full": dict(_BASE),
    "swa": dict(_BASE),
    "chunked": dict(_BASE),
    "mamba": dict(_BASE, num_gpu_blocks=40, max_num_batched_tokens=512),
    "mamba-block": dict(_BASE, num_gpu_blocks=40, max_num_batched_tokens=512),
    "mamba528": dict(_BASE, num_gpu_blocks=24, max_num_batched_tokens=2048, max_model_len=16384),
    "bpc2": dict(_BASE),
    "swa-mtp": dict(_BASE),
    "full-store-all": dict(_BASE, offload_prompt_only=False, aligned_decode_p=0.3),
    "swa-store-all": dict(_BASE, offload_prompt_only=False, aligned_decode_p=0.3),
    "eagle": dict(_BASE),
    "full-scripted": dict(_BASE, pending_p=0.05, retry_p=0.02, evict_p=0.1),
    "mamba-eagle-scripted": dict(_BASE, num_gpu_blocks=52, max_num_batched_tokens=512,
                                 pending_p=0.05, retry_p=0.02, evict_p=0.1),
    "swa-scripted": dict(_BASE, pending_p=0.1, retry_p=0.02, evict_p=0.15),
    "full-stalled": dict(_BASE, stall_p=0.05),
    "mamba-eagle-untagged": dict(_BASE, num_gpu_blocks=40, max_num_batched_tokens=512),
    "mamba-eagle": dict(_BASE, num_gpu_blocks=52, max_num_batched_tokens=512),
    "swa-sync": dict(_BASE, sync_load_budget_bytes=1 << 16),
    "mamba-block-sync": dict(_BASE, num_gpu_blocks=40, max_num_batched_tokens=512,
                             sync_load_budget_bytes=1 << 18),
    "mamba-sync": dict(_BASE, num_gpu_blocks=40, max_num_batched_tokens=512, sync_load_budget_bytes=1 << 18),
}


def block_sizes(layout: dict) -> list[int]:
    return [g["tokens_per_block"] for g in layout["groups"]]


def max_prompt_tokens(layout: dict, engine: dict) -> int:
    """A prompt that fits the GPU pool with room to spare (else it never schedules)."""
    b = max(block_sizes(layout))
    n_groups = len(layout["groups"])
    return max(b, (engine["num_gpu_blocks"] - 1) // n_groups * b // 2)


# What each layout needs of a release's engine, by name; NEED says which column of the one
# release table (spec.versions.RELEASES) holds it and why a release without it cannot run
# the layout (the vLLM lines). A layout with no entry needs only the offloading connector.
NEED = {
    "mamba_external_kv": ("mamba_external_kv", "the scheduler refuses connector tokens for Mamba groups"
                          " (0.22.1 v1/core/sched/scheduler.py:286 `assert num_external_computed_tokens == 0`,"
                          " \"External KV connector is not verified yet\"; gone in 0.23)"),
    "schedule_end_hook": ("schedule_end_hook", "the scripted tier evicts at OffloadingManager.on_schedule_end,"
                          " which arrived in 0.23 (0.23.0 v1/kv_offload/base.py:260)"),
    "offload_prompt_only": ("offload_prompt_only", "offloading decoded tokens needs the extra config"
                            " offload_prompt_only, which arrived in 0.23 (0.23.0 v1/kv_offload/base.py:397;"
                            " earlier releases offload prompts only)"),
    "prefix_match_unit": ("prefix_match_unit", "hashing every 16 tokens below the block size needs"
                          " CacheConfig.prefix_match_unit (0.26.0 vllm/config/cache.py:56; earlier"
                          " CacheConfigs refuse the keyword)"),
    "chunked_local_offload": ("chunked_local_offload", "the connector offloads only full-attention,"
                              " sliding-window and Mamba groups (0.27.0 offloading/scheduler.py:118"
                              " `assert isinstance(kv_cache_spec, FullAttentionSpec)`; chunked local"
                              " attention arrived in 0.28.0 offloading/scheduler.py:116)"),
    "single_attention_hybrid": ("single_attention_hybrid", "an EAGLE group with the target's attention"
                                " spec leaves one attention group, which HybridKVCacheCoordinator refuses"
                                " (0.28.0 v1/core/kv_cache_coordinator.py:682 \"requires at least two"
                                " attention groups\"; gone in 0.29)"),
    "extra_retained_tokens": ("extra_retained_tokens", "a window that retains tokens for an MTP drafter needs"
                              " SlidingWindowSpec.extra_retained_tokens, which arrived in 0.28 (0.28.0"
                              " v1/kv_cache_interface.py; earlier specs refuse the keyword)"),
    "sync_loads": ("sync_loads", "sync loads (kv_connector_extra_config sync_load_budget_bytes) arrived in"
                   " 0.33 (0.33.0 offloading/scheduler.py:168,323)"),
}
_MAMBA = ("mamba_external_kv",)
_MAMBA16 = _MAMBA + ("prefix_match_unit",)
NEEDS = {
    "full": (), "swa": (), "bpc2": (), "swa-mtp": ("extra_retained_tokens",),
    "chunked": ("chunked_local_offload",),
    "mamba": _MAMBA16, "mamba-block": _MAMBA, "mamba528": _MAMBA16,
    "swa-sync": ("sync_loads",), "mamba-sync": _MAMBA16 + ("sync_loads",),
    "mamba-block-sync": _MAMBA + ("sync_loads",),
    "eagle": ("single_attention_hybrid",),
    "mamba-eagle": _MAMBA16, "mamba-eagle-untagged": _MAMBA16,
    "full-scripted": ("schedule_end_hook",), "swa-scripted": ("schedule_end_hook",),
    "full-stalled": ("schedule_end_hook",),
    "full-store-all": ("offload_prompt_only",), "swa-store-all": ("offload_prompt_only",),
    "mamba-eagle-scripted": _MAMBA16 + ("schedule_end_hook",),
}


def layout_support(layout_name: str, version: str) -> str | None:
    """None when vLLM ``version`` can run ``layout_name``; else one line saying why not,
    with the vLLM lines (read from the release table's row for ``version``)."""
    from kvbound.spec import release_features

    feats = release_features(version)
    missing = [NEED[need][1] for need in NEEDS.get(layout_name, ()) if not getattr(feats, NEED[need][0])]
    if not missing:
        return None
    return f"vllm {version} cannot run layout {layout_name}: " + "; ".join(missing)
