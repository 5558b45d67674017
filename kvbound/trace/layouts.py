"""The KV-cache layouts ``kvbound trace`` runs, as real models configure them: one
``Layout`` record each.

A layout is its groups (kind, tokens_per_block, window), ``blocks_per_chunk`` and, for
hybrids, ``prefix_match_unit`` (vLLM's tokens_per_hash when it is below the block size)
or a speculative config; its engine settings (``ENGINE_PARAMS``: GPU blocks, small so
traffic evicts and preempts, the CPU tier's capacity in chunks, batch limits, the fake
transfer engine's delays, the scripted tier); and what it needs of a release (``Need``,
a column of the release table). The worker gets ``job_layout()`` and ``params()`` as
plain JSON. The ``--engine`` keys and their help derive from ``ENGINE_PARAMS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbound.side import tier_pressure

FA, SWA, CL, MAMBA = "full_attention", "sliding_window", "chunked_local", "mamba"


def _flag(v: str) -> bool:
    if v.lower() not in ("true", "false", "1", "0"):
        raise ValueError(v)
    return v.lower() in ("true", "1")


_flag.__name__ = "true/false"


def _policy(v: str) -> str:
    if v not in ("lru", "arc"):  # the CPU tier's cache policies (0.33.0 v1/kv_offload/cpu/policies/)
        raise ValueError(v)
    return v


_policy.__name__ = "lru/arc"


def _retention(v: str):
    if v == "dense":  # CacheConfig.prefix_cache_retention_interval None: checkpoints retained densely
        return v
    return int(v)


_retention.__name__ = "non-negative int or dense"


def _backpressure(v: str):
    if v == "off":  # no detector: the tier takes every store (0.33.0 v1/kv_offload/tiering/manager.py:554-556)
        return None
    if v not in tier_pressure.POLICIES:  # tiering/backpressure.py ThrottledDropPolicy, DropStorePolicy
        raise ValueError(v)
    return v


_backpressure.__name__ = "/".join(("off", *tier_pressure.POLICIES))


def _model_len(v: str) -> int:
    if int(v) < 64:  # room for the traffic's documents (workload.workload: within 2 blocks of the cap)
        raise ValueError(v)
    return int(v)


_model_len.__name__ = "whole number of at least 64 tokens"
# the --engine help groups
_ENGINE, _TIER, _SHADOW = "engine", "script the offload tier", "shadow KV and the store path's traffic"
_TRAFFIC = "shape the traffic"
_FAULTS = "faults: failed transfers, refused stores, late completions"


@dataclass(frozen=True)
class EngineParam:
    name: str
    parse: object  # str -> value (int, float, _flag)
    base: object = None  # every layout's value; None: absent unless a layout sets it
    flag: str | None = None  # the --engine group it is overridable in; None: not overridable


ENGINE_PARAMS = (
    EngineParam("num_gpu_blocks", int, 72, _ENGINE),  # the null block included
    EngineParam("cpu_chunks", int, 256, _ENGINE),  # vLLM's own LRU tier's capacity
    EngineParam("max_num_seqs", int, 8, _ENGINE),
    EngineParam("max_num_batched_tokens", int, 256, _ENGINE),
    EngineParam("max_delay", int, 2, _ENGINE),  # steps the fake transfer engine holds a job
    EngineParam("fail_p", float, 0.0, _FAULTS),  # a load job finishes TransferResult(success=False)
    EngineParam("max_model_len", _model_len, 8192, _ENGINE),  # prompts and outputs drawn within it (workload.workload)
    EngineParam("abort_p", float, 0.04, _ENGINE),
    EngineParam("pending_p", float, None, _TIER),
    EngineParam("retry_p", float, None, _TIER),
    EngineParam("evict_p", float, None, _TIER),
    EngineParam("stall_p", float, None, _FAULTS),  # the scripted tier's writes that never complete
    EngineParam("shadow", _flag, None, _SHADOW),  # on unless set false
    EngineParam("offload_prompt_only", _flag, None, _SHADOW),
    EngineParam("aligned_decode_p", float, None, _SHADOW),
    EngineParam("sync_load_budget_bytes", int),  # 0.33 sync loads
    EngineParam("pd_p", float, None, _ENGINE),  # composition multi-pd: the share of requests the P/D consumer serves
    EngineParam("pd_delay", int, None, _ENGINE),  # ... and the most steps one of its loads takes (default 3)
    EngineParam("pd_hma", _flag, None, _ENGINE),  # ... and whether it declares SupportsHMA (default true)
    EngineParam("prefix_burst_p", float, None, _TRAFFIC),  # workload.workload: shared-prefix bursts
    EngineParam("store_fail_p", float, None, _FAULTS),  # a store job finishes TransferResult(success=False)
    EngineParam("tier_lose_p", float, None, _FAULTS),  # the secondary tier loses a key a promotion reads
    EngineParam("tier_torn_p", float, None, _FAULTS),  # the file-system tier's file a promotion reads is cut short
    EngineParam("tier_store_fail_p", float, None, _FAULTS),  # the file-system tier's store jobs fail (ENOSPC)
    EngineParam("tier_lookup_late_p", float, None, _FAULTS),  # the file-system tier's lookup answers, late_steps late
    EngineParam("tier_backpressure", _backpressure, None, _TIER),  # the file tier's detector and its policy
    EngineParam("tier_store_slow_p", float, None, _FAULTS),  # the file tier's stores measured slow (congested)
    EngineParam("refuse_p", float, None, _FAULTS),  # the scripted tier's prepare_store answers None
    EngineParam("late_p", float, None, _FAULTS),  # a job's completion arrives late_steps steps late
    EngineParam("late_steps", int, None, _FAULTS),  # (default 16: past a preemption and re-admission)
    EngineParam("eviction_policy", _policy, None, _TIER),  # the CPU tier's cache policy: lru (default), arc
    EngineParam("store_threshold", int, None, _TIER),  # offers of a chunk before the CPU tier stores it
    EngineParam("log_stats", _flag, None, _ENGINE),  # the scheduler's stats (Scheduler(log_stats=True))
    EngineParam("retention_interval", _retention, None, _ENGINE),  # CacheConfig.prefix_cache_retention_interval
    EngineParam("reset_p", float, None, _TRAFFIC),  # per step: reset_prefix_cache(reset_connector=True)
    EngineParam("load_tiers_p", float, None, _TRAFFIC),  # requests with kv_transfer_params kv_load_tiers
    EngineParam("load_limit_p", float, None, _TRAFFIC),  # requests with kv_transfer_params max_load_tokens
    EngineParam("offload_limit_p", float, None, _TRAFFIC),  # requests with kv_transfer_params max_offload_tokens
    EngineParam("prompt_logprobs_p", float, None, _TRAFFIC),  # requests asking prompt logprobs (skip reading)
    EngineParam("kv_events", _flag, None, _ENGINE),  # KV cache events on: the tier's checked (side/kv_events.py)
    EngineParam("request_tier_p", float, None, _TIER),  # the share of requests a request-level tier asks for
    EngineParam("tier_start_fail", _flag, None, _FAULTS),  # the engine first started with a tier that cannot start
    EngineParam("hisparse_host_blocks", int, None),  # composition multi-hisparse: the host pool's source pages
    EngineParam("prompt_cap", int, None),  # the longest prompt drawn (default: half the pool; never past
    # max_model_len - 1), one request in ten near it; a layout's alone (its config must pass vLLM's start check)
    EngineParam("tier_stop_fail", _flag, None, _FAULTS),  # the engine first started and stopped with a tier that
    # cannot stop
)
BASE = {p.name: p.base for p in ENGINE_PARAMS if p.base is not None}
OVERRIDES = {p.name: p for p in ENGINE_PARAMS if p.flag}


def engine_help() -> str:
    groups: dict = {}
    for p in OVERRIDES.values():
        groups.setdefault(p.flag, []).append(p.name)
    parts = [", ".join(groups.pop(_ENGINE))] + [f"{', '.join(names)}: {what}" for what, names in groups.items()]
    return ("override an engine setting of every layout (" + "; ".join(parts) + "; see docs/trace.md),"
            " e.g. --engine abort_p=0")


def parse_override(item: str) -> tuple:
    """One ``--engine K=V``: (key, value), or a UsageError naming the key and its type."""
    from kvbound.errors import UsageError

    k, sep, v = item.partition("=")
    if not sep or k not in OVERRIDES:
        raise UsageError(f"--engine {item!r}: expected K=V with K one of {', '.join(OVERRIDES)}")
    try:
        return k, OVERRIDES[k].parse(v)
    except ValueError:
        raise UsageError(f"--engine {item!r}: {k} must be a {OVERRIDES[k].parse.__name__}") from None


@dataclass(frozen=True)
class Need:
    """A column of the one release table (spec.versions.RELEASES) a layout needs, and why
    a release without it cannot run the layout (the vLLM lines)."""

    column: str
    why: str


MAMBA_EXTERNAL_KV = Need("mamba_external_kv", "the scheduler refuses connector tokens for Mamba groups"
                         " (0.22.1 v1/core/sched/scheduler.py:286 `assert num_external_computed_tokens == 0`,"
                         " \"External KV connector is not verified yet\"; gone in 0.23)")
SCHEDULE_END_HOOK = Need("schedule_end_hook", "the scripted tier evicts at OffloadingManager.on_schedule_end,"
                         " which arrived in 0.23 (0.23.0 v1/kv_offload/base.py:260)")
OFFLOAD_PROMPT_ONLY = Need("offload_prompt_only", "offloading the prompt only needs the extra config"
                           " offload_prompt_only, which arrived in 0.23 (0.23.0 v1/kv_offload/base.py:397,"
                           " the clamp offloading/scheduler.py:745-748); earlier releases offload decoded"
                           " tokens too (0.21.0 offloading/scheduler.py:633, 0.22.1 :685: no prompt clamp)")
PREFIX_MATCH_UNIT = Need("prefix_match_unit", "hashing every 16 tokens below the block size needs"
                         " CacheConfig.prefix_match_unit (0.26.0 vllm/config/cache.py:56; earlier"
                         " CacheConfigs refuse the keyword)")
CHUNKED_LOCAL_OFFLOAD = Need("chunked_local_offload", "the connector offloads only full-attention,"
                             " sliding-window and Mamba groups (0.27.0 offloading/scheduler.py:118"
                             " `assert isinstance(kv_cache_spec, FullAttentionSpec)`; chunked local"
                             " attention arrived in 0.28.0 offloading/scheduler.py:116)")
SINGLE_ATTENTION_HYBRID = Need("single_attention_hybrid", "an EAGLE group with the target's attention"
                               " spec leaves one attention group, which HybridKVCacheCoordinator refuses"
                               " (0.28.0 v1/core/kv_cache_coordinator.py:682 \"requires at least two"
                               " attention groups\"; gone in 0.29)")
EXTRA_RETAINED_TOKENS = Need("extra_retained_tokens", "a window that retains tokens for an MTP drafter needs"
                             " SlidingWindowSpec.extra_retained_tokens, which arrived in 0.28 (0.28.0"
                             " v1/kv_cache_interface.py; earlier specs refuse the keyword)")
SYNC_LOADS = Need("sync_loads", "sync loads (kv_connector_extra_config sync_load_budget_bytes) arrived in"
                  " 0.33 (0.33.0 offloading/scheduler.py:168,323)")
MAMBA_CACHE_ALL = Need("mamba_cache_all", "CacheConfig.mamba_cache_mode \"all\" (a Mamba state cached at every"
                       " block boundary) is gone from 0.32 (0.32.0 vllm/config/cache.py:63 MambaCacheMode ="
                       " Literal[\"align\", \"none\"])")
HISPARSE = Need("hisparse", "HiSparse beside the OffloadingConnector (a MultiConnector of HiSparseConnector and"
                " the connector, which bounds each load by the groups it does not offload) arrived in 0.30 (0.30.0"
                " offloading_connector.py:168-185 _max_loadable_tokens, v1/hisparse/layout.py)")
HISPARSE_MLA_ONLY = Need("hisparse_mla_only", "vLLM's builder lays HiSparse out for sparse-MLA layers alone from 0.31"
                         " (0.31.0 v1/hisparse/layout.py:70; 0.30.0 :64 needs another attention layer beside:"
                         " layout hisparse-swa)")
MULTI_CONNECTOR = Need("multi_connector", "the OffloadingConnector inside vLLM's MultiConnector beside an"
                       " out-of-tree HMA connector needs MultiConnector(SupportsHMA) and kv_connector_module_path"
                       " (0.21.0 kv_connector/v1/multi_connector.py:128, vllm/config/kv_transfer.py:63)")
TIERING_SPEC = Need("tiering_spec", "vLLM's TieringOffloadingSpec, with its file-system and example tiers, arrived in"
                    " 0.22.1 (0.22.1 v1/kv_offload/tiering/spec.py, tiering/factory.py:56-57)")
TIERING_FS = Need("tiering_fs", "shadow KV follows a file-system tier's copies by the primary chunk ids its"
                  " jobs carry, TransferJob(keys, chunk_ids), which arrived in 0.30 (0.30.0"
                  " v1/kv_offload/tiering/base.py:60-67); with shadow off (<point>@shadow=false) the spec runs"
                  " from 0.22.1")
TIER_ASYNC_LOOKUP = Need("tier_async_lookup", "tier_lookup_late_p holds the answers of the file tier's lookup"
                         " thread, which arrived in 0.24 (0.24.0 v1/kv_offload/tiering/fs/manager.py:45,133;"
                         " before, a lookup is answered at once, 0.23.0 tiering/fs/manager.py:118-122)")
REQUEST_LEVEL_TIER = Need("request_level_tier", "a secondary tier's request-level offload (OffloadPolicy.REQUEST_LEVEL)"
                          " arrived in 0.23 (0.23.0 v1/kv_offload/base.py, tiering/manager.py:433-444; 0.22.1 has none)")
TIERING_BACKPRESSURE = Need("tiering_backpressure", "a secondary tier's backpressure detector arrived in 0.31"
                           " (0.31.0 v1/kv_offload/tiering/backpressure.py, configured per tier in"
                           " tiering/factory.py:73-90)")
TRANSFER_FAILURES = Need("transfer_failures", "a failed transfer job (TransferResult success=False) trips the"
                         " worker's `assert transfer_result.success`, \"we currently do not support job failures\""
                         " (0.33.0 offloading/worker.py:299-301; 0.21.0 :327), and the scheduler never calls"
                         " complete_store(success=False) (0.33.0 offloading/scheduler.py:2291): no release takes"
                         " failed loads or stores")
CONNECTOR_RESET_CACHE = Need("connector_reset_cache", "reset_prefix_cache(reset_connector=True) resets the connector"
                             " through OffloadingConnector.reset_cache, which arrived in 0.22 (0.22.1"
                             " kv_connector/v1/offloading_connector.py:177-180; 0.21.0 has none)")
LOAD_TIER_FILTER = Need("load_tier_filter", "a request's tier filter (kv_transfer_params kv_load_tiers) arrived in"
                        " 0.27 (0.27.0 offloading/scheduler.py:61,387 _parse_tier_filter)")
RETENTION_INTERVAL = Need("retention_interval", "the connector reads CacheConfig.prefix_cache_retention_interval from"
                          " 0.30 (0.30.0 offloading/scheduler.py:176; the field arrived in 0.29.0"
                          " vllm/config/cache.py:156)")
MAX_LOAD_TOKENS = Need("max_load_tokens", "a request's load limit (kv_transfer_params max_load_tokens) arrived in"
                       " 0.31 (0.31.0 offloading/scheduler.py:367,391-393; 0.30.0 has none)")
MAX_OFFLOAD_TOKENS = Need("max_offload_tokens", "a request's offload limit (kv_transfer_params max_offload_tokens)"
                          " arrived in 0.23 (0.23.0 offloading/scheduler.py:183,197-207; 0.22.1 has none)")
# What a fault setting needs of a release when it is on (a layout's or an --engine value): the scripted
# tier wraps OffloadingManager.on_schedule_end; a failed transfer needs a connector that takes it.
SCRIPT_KEYS = ("pending_p", "retry_p", "evict_p", "stall_p", "refuse_p")  # the scripted tier's (side/engine.py)
PARAM_NEEDS = {"fail_p": TRANSFER_FAILURES, "store_fail_p": TRANSFER_FAILURES,
               **{k: SCHEDULE_END_HOOK for k in SCRIPT_KEYS},
               "reset_p": CONNECTOR_RESET_CACHE, "load_tiers_p": LOAD_TIER_FILTER,
               "retention_interval": RETENTION_INTERVAL, "load_limit_p": MAX_LOAD_TOKENS,
               "offload_limit_p": MAX_OFFLOAD_TOKENS,
               "tier_backpressure": TIERING_BACKPRESSURE, "tier_store_slow_p": TIERING_BACKPRESSURE,
               "request_tier_p": REQUEST_LEVEL_TIER, "tier_lookup_late_p": TIER_ASYNC_LOOKUP}
# What shadow KV needs of a release beside a layout's own needs, per offload spec (engine setting
# shadow: on unless set false; space.support adds it while shadow is on)
SHADOW_NEEDS = {"tiering-fs": TIERING_FS}
# ... and the offload specs and compositions shadow KV cannot follow on any release: why, in one line
# (space.support)
SHADOWLESS = {"multi-hisparse": "shadow KV cannot follow HiSparse's host-resident source group, whose pages the"
                                " HiSparse coordinator moves between its host pool and the GPU's resident and hot"
                                " pages (0.33.0 v1/hisparse/coordinator.py); run it with shadow=false",
              "tiering-example": "shadow KV cannot follow the example tier, which keeps a flag per key and moves no"
                                 " bytes (0.33.0 v1/kv_offload/tiering/example/manager.py:124-179: a store sets"
                                 " chunks[key] = True, a promotion completes with nothing read); run it with"
                                 " shadow=false"}
_MAMBA = (MAMBA_EXTERNAL_KV,)
_MAMBA16 = _MAMBA + (PREFIX_MATCH_UNIT,)


@dataclass(frozen=True)
class Layout:
    name: str
    doc: str
    groups: tuple  # ({kind, tokens_per_block, ...}, ...)
    engine: dict = field(default_factory=dict)  # its settings beyond BASE
    needs: tuple = ()  # (Need, ...); none: the offloading connector only
    blocks_per_chunk: int = 1
    prefix_match_unit: int | None = None
    speculative: dict | None = None
    mamba_cache_mode: str | None = None  # CacheConfig.mamba_cache_mode of a Mamba layout; None: "align"
    composition: str | None = None  # None: the OffloadingConnector alone; "multi-pd": in a MultiConnector
    # after a P/D consumer (side/pd_connector.py); "multi-hisparse": after HiSparseConnector (side/hisparse.py)
    offload_spec: str | None = None  # None: CPUOffloadingSpec; "tiering-fs": TieringOffloadingSpec with its
    # file-system tier on a temporary directory; "tiering-example": with its in-memory example tier
    scheduler: str | None = None  # None: the run's (--scheduler; a campaign alternates sync and async per
    # segment); "sync" or "async": every segment of the point

    def __post_init__(self):
        unknown = set(self.engine) - {p.name for p in ENGINE_PARAMS}
        if unknown:
            raise ValueError(f"layout {self.name}: engine settings {sorted(unknown)} are not ENGINE_PARAMS")

    def job_layout(self) -> dict:
        """What the worker builds the engine's KV cache from."""
        d = {"groups": [dict(g) for g in self.groups], "blocks_per_chunk": self.blocks_per_chunk}
        if self.prefix_match_unit is not None:
            d["prefix_match_unit"] = self.prefix_match_unit
        if self.speculative is not None:
            d["speculative"] = dict(self.speculative)
        if self.mamba_cache_mode is not None:
            d["mamba_cache_mode"] = self.mamba_cache_mode
        if self.composition is not None:
            d["composition"] = self.composition
        if self.offload_spec is not None:
            d["offload_spec"] = self.offload_spec
        return dict(d, name=self.name)

    def params(self) -> dict:
        """The engine's settings: BASE, then the layout's own."""
        return dict(BASE, **self.engine)


def _g(kind, b, **kw):
    return dict(kind=kind, tokens_per_block=b, **kw)


_EAGLE2 = {"method": "eagle", "num_speculative_tokens": 2}
_SCRIPTED = dict(pending_p=0.05, retry_p=0.02, evict_p=0.1)
_MAMBA_ENGINE = dict(num_gpu_blocks=40, max_num_batched_tokens=512)
# host pool: 96 pages of 16 tokens; max_model_len what vLLM's start check takes for 72 GPU blocks (hisparse-swa on
# 0.31.0 - 0.33.0: 448, 512 refused; 0.30.0's check counts neither resident nor hot pages and takes up to 1,600), and
# prompts up to it
_HISPARSE_LEN = 448
_HISPARSE = dict(shadow=False, hisparse_host_blocks=96, max_model_len=_HISPARSE_LEN, prompt_cap=_HISPARSE_LEN - 1)
_STORE_ALL = dict(offload_prompt_only=False, aligned_decode_p=0.3)
# the faults every supporting release takes: refused stores, late completions, evictions of confirmed
# chunks (stalled writes are full-stalled's: a request waiting on one for ever is stuck by design)
_FAULTY = dict(refuse_p=0.1, late_p=0.15, late_steps=16, evict_p=0.05)

_ROWS = (
    Layout("full", "One full-attention group (a dense Llama).", (_g(FA, 16),)),
    Layout("swa", "Full attention + sliding window (Gemma/Mistral style), window 128 tokens.",
           (_g(FA, 16), _g(SWA, 16, sliding_window=128))),
    Layout("chunked", "Full attention + chunked local attention (Llama 4 style), chunk 128 tokens.",
           (_g(FA, 16), _g(CL, 16, attention_chunk_size=128)), needs=(CHUNKED_LOCAL_OFFLOAD,)),
    Layout("mamba", "Hybrid Mamba align: attention and Mamba share a 64-token page, hashed every 16 tokens"
           " (tokens_per_hash < block size: partial tails on 0.33).",
           (_g(FA, 64), _g(MAMBA, 64)), _MAMBA_ENGINE, _MAMBA16, prefix_match_unit=16),
    Layout("mamba-block", "The same hybrid hashed per block (tokens_per_hash = block size): what releases"
           " before 0.28 can offload (their store path needs whole-block hashes).",
           (_g(FA, 64), _g(MAMBA, 64)), _MAMBA_ENGINE, _MAMBA),
    Layout("mamba528", "Hybrid Mamba with a realistic page: 528 tokens per block (a Mamba2 state page matched"
           " by the attention block size), hashed every 16 tokens.",
           (_g(FA, 528), _g(MAMBA, 528)), dict(num_gpu_blocks=24, max_num_batched_tokens=2048, max_model_len=16384),
           _MAMBA16, prefix_match_unit=16),
    Layout("swa-sync", "0.33 sync loads (a per-step byte budget: hits that fit load within the step, into"
           " blocks hashed at allocation) beside a sliding window.",
           (_g(FA, 16), _g(SWA, 16, sliding_window=128)), dict(sync_load_budget_bytes=1 << 16), (SYNC_LOADS,)),
    Layout("mamba-sync", "0.33 sync loads on the Mamba hybrid hashed every 16 tokens.",
           (_g(FA, 64), _g(MAMBA, 64)), dict(_MAMBA_ENGINE, sync_load_budget_bytes=1 << 18),
           _MAMBA16 + (SYNC_LOADS,), prefix_match_unit=16),
    Layout("mamba-block-sync", "0.33 sync loads on the Mamba hybrid hashed per block.",
           (_g(FA, 64), _g(MAMBA, 64)), dict(_MAMBA_ENGINE, sync_load_budget_bytes=1 << 18), _MAMBA + (SYNC_LOADS,)),
    Layout("eagle", "0.33+: an EAGLE drafter's attention layers in their own group (vLLM's planner sets"
           " KVCacheGroupSpec.is_eagle_group; the connector then drops the group's volatile trailing chunk"
           " and, with partial tails, keys it at a proof margin). Sync scheduling: the fake drafter proposes"
           " num_speculative_tokens per step.",
           (_g(FA, 16), _g(FA, 16, eagle=True)), needs=(SINGLE_ATTENTION_HYBRID,), speculative=_EAGLE2),
    Layout("mamba-eagle", "A hybrid Mamba model with an MTP-style attention drafter (Qwen3-Next shape):"
           " tokens_per_hash 16 < block 64, so partial tails carry EAGLE proof margins.",
           (_g(FA, 64), _g(MAMBA, 64), _g(FA, 64, eagle=True)), dict(num_gpu_blocks=52, max_num_batched_tokens=512),
           _MAMBA16, prefix_match_unit=16, speculative=_EAGLE2),
    Layout("mamba-eagle-untagged", "Speculative decoding on but no group tagged as the drafter's (a KV-sharing"
           " drafter, or a runner that does not tag draft layers): the connector then treats every group as"
           " non-draft (0.33 offloading/scheduler.py:218-232, the fix of #52735) while the core coordinator"
           " drops the last block of every group (kv_cache_coordinator.py:133-134).",
           (_g(FA, 64), _g(MAMBA, 64)), _MAMBA_ENGINE, _MAMBA16, prefix_match_unit=16, speculative=_EAGLE2),
    Layout("full-scripted", "The scripted tier: vLLM's CPU tier loaded through the spec factory's out-of-tree"
           " path, answering HIT_PENDING/RETRY and evicting chunks a lookup just confirmed"
           " (fakes.install_scripted_tier).", (_g(FA, 16),), _SCRIPTED, (SCHEDULE_END_HOOK,)),
    Layout("mamba-eagle-scripted", "The scripted tier under a hybrid Mamba model with an EAGLE drafter.",
           (_g(FA, 64), _g(MAMBA, 64), _g(FA, 64, eagle=True)),
           dict(num_gpu_blocks=52, max_num_batched_tokens=512, **_SCRIPTED), _MAMBA16 + (SCHEDULE_END_HOOK,),
           prefix_match_unit=16, speculative=_EAGLE2),
    Layout("swa-scripted", "The scripted tier beside a sliding window of 4 chunks (the lookup's sliding-window"
           " scan meets HIT_PENDING/RETRY answers right of gaps the evictions leave).",
           (_g(FA, 16), _g(SWA, 16, sliding_window=64)), dict(pending_p=0.1, retry_p=0.02, evict_p=0.15),
           (SCHEDULE_END_HOOK,)),
    Layout("full-stalled", "The scripted tier whose writes sometimes never complete (stall_p): a key stays"
           " HIT_PENDING for as long as the engine runs.", (_g(FA, 16),), dict(stall_p=0.05),
           (SCHEDULE_END_HOOK,)),
    Layout("full-store-all", "offload_prompt_only=False (kv_connector_extra_config, read by OffloadingSpec,"
           " v1/kv_offload/base.py): decoded tokens are offloaded too, up to the finished request's token"
           " horizon (0.26-0.29: num_tokens; 0.30+: clamped to num_tokens - 1).",
           (_g(FA, 16),), _STORE_ALL),
    Layout("swa-store-all", "The same store-all policy beside a sliding window.",
           (_g(FA, 16), _g(SWA, 16, sliding_window=128)), _STORE_ALL),
    Layout("swa-mtp", "A sliding-window hybrid with a multi-module MTP drafter (3 modules, 3 speculative"
           " tokens): the planner makes the window retain num_speculative_tokens - 1 = 2 tokens more"
           " (engine._tag_retained_tokens), so the window's skipped blocks, the load's window bound and the"
           " premise window-skipped-null meet extra_retained_tokens on real tables.",
           (_g(FA, 16), _g(SWA, 16, sliding_window=64)), needs=(EXTRA_RETAINED_TOKENS,),
           speculative={"method": "mtp", "num_speculative_tokens": 3}),
    Layout("mamba-all", "The Mamba hybrid hashed per block in CacheConfig.mamba_cache_mode \"all\": every block of"
           " the Mamba group caches the state at its end (0.29.0 v1/kv_cache_interface.py:884-887), so a hit may"
           " end at any block and the connector offloads every state block (no copy-on-write source; 0.29.0"
           " offloading/scheduler.py:162-165,263-266).",
           (_g(FA, 64), _g(MAMBA, 64)), _MAMBA_ENGINE, _MAMBA + (MAMBA_CACHE_ALL,), mamba_cache_mode="all"),
    Layout("full-multi-pd", "Composition: the OffloadingConnector inside vLLM's MultiConnector after a P/D consumer"
           " (pd_connector.py) that serves 30% of requests their whole prompt asynchronously, 1-3 steps, as a decode"
           " node pulls a prefill node's KV; the rest fall through to the offload tier, and both connectors see"
           " every request's blocks and stores.", (_g(FA, 16),), dict(pd_p=0.3), (MULTI_CONNECTOR,),
           composition="multi-pd"),
    Layout("swa-multi-pd", "The same composition beside a sliding window of 4 chunks.",
           (_g(FA, 16), _g(SWA, 16, sliding_window=64)), dict(pd_p=0.3), (MULTI_CONNECTOR,), composition="multi-pd"),
    Layout("hisparse", "A sparse-MLA model under HiSparse (DeepSeek V3.2 style): its MLA cache host-resident in a"
           " pool of 96 pages, its indexer on the GPU; the OffloadingConnector beside HiSparseConnector in vLLM's"
           " MultiConnector offloads the indexer alone and bounds each load by the source pages the host still"
           " holds (offloading_connector.py _max_loadable_tokens). vLLM's own builder lays the groups out"
           " (side/hisparse.py): the MLA cache, the indexer, then HiSparse's resident and hot pages, which no"
           " connector offloads. Shadow KV off: it cannot follow the host pool.",
           (_g(FA, 16, hisparse="source"), _g(FA, 16, hisparse="indexer")), _HISPARSE, (HISPARSE, HISPARSE_MLA_ONLY),
           composition="multi-hisparse"),
    Layout("hisparse-swa", "The same with a sliding-window layer beside (window 64 tokens; its group after HiSparse's"
           " four): vLLM's builder lays it out as it does every layer not sparse MLA, the connector leaves it to"
           " the GPU prefix cache (it offloads the indexer alone), so it bounds loads too; 0.30.0's builder takes"
           " HiSparse only with such a layer. The synchronous scheduler (--no-async-scheduling) only: with async"
           " scheduling vLLM budgets two batches in flight and its start check refuses max_model_len 448 on 72"
           " blocks (0.33.0: estimated 352; config/vllm.py:587-609).",
           (_g(FA, 16, hisparse="source"), _g(FA, 16, hisparse="indexer"), _g(SWA, 16, sliding_window=64)),
           _HISPARSE, (HISPARSE,), composition="multi-hisparse", scheduler="sync"),
    Layout("full-tiering-fs", "Offload spec and tier: vLLM's TieringOffloadingSpec (a CPU primary tier of 32 chunks)"
           " with its real file-system secondary tier on a temporary directory: stores cascade to files, lookups of"
           " keys the primary evicted answer RETRY while the tier promotes them back (tiering/manager.py:590-740).",
           (_g(FA, 16),), dict(cpu_chunks=32), (TIERING_SPEC,), offload_spec="tiering-fs"),
    Layout("swa-mixed", "DeepSeek V4's shape: full attention on 64-token blocks beside a sliding window of 64 tokens"
           " on 16-token blocks. The groups share one pool of pages, so a block a window frees is reallocated to full"
           " attention in another block size; the connector keys each group on its own chunk grid and skips window"
           " chunks no hit can reach within a full-attention chunk (its alignment segments, 0.22.1-0.29.0), and a"
           " window of 16-token chunks may end the hit inside full attention's first chunk.",
           (_g(FA, 64), _g(SWA, 16, sliding_window=64))),
    Layout("bpc2", "Two GPU blocks per offloaded chunk.", (_g(FA, 16), _g(SWA, 16, sliding_window=64)),
           blocks_per_chunk=2),
    Layout("full-faults", "The faults a release takes (docs/trace.md \"Faults\"): the scripted tier refuses"
           " one prepare_store in ten (None), one job in seven completes 16 steps late (past a preemption and"
           " re-admission: a pool of 28 blocks preempts), confirmed chunks are evicted.", (_g(FA, 16),),
           dict(_FAULTY, num_gpu_blocks=28)),
    Layout("mamba-faults", "The same faults on the Mamba hybrid hashed every 16 tokens.",
           (_g(FA, 64), _g(MAMBA, 64)), dict(_MAMBA_ENGINE, **_FAULTY), _MAMBA16, prefix_match_unit=16),
)
LAYOUTS = {lay.name: lay for lay in _ROWS}


def block_sizes(layout: dict) -> list[int]:
    return [g["tokens_per_block"] for g in layout["groups"]]


def max_prompt_tokens(layout: dict, engine: dict) -> int:
    """A prompt that fits the GPU pool with room to spare (else it never schedules); engine setting
    ``prompt_cap`` where the layout's config passes vLLM's own check that one request of
    ``max_model_len`` fits the pool (the HiSparse layouts: side/hisparse.py ``kv_cache_config``)."""
    if engine.get("prompt_cap"):
        cap = engine["prompt_cap"]
    else:
        b = max(block_sizes(layout))
        cap = max(b, (engine["num_gpu_blocks"] - 1) // len(layout["groups"]) * b // 2)
    return min(cap, engine["max_model_len"] - 1)  # vLLM refuses a prompt of max_model_len tokens


def cost_family(layout: Layout) -> str:
    """The layout's costliest group kind, the row of the plan's table it is costed by
    (``kvbound.options.PlanOptions.seconds_per_request``): Mamba, then a window, then full."""
    kinds = {g["kind"] for g in layout.groups}
    return next(k for k in (MAMBA, SWA, CL, FA) if k in kinds or k == FA)
