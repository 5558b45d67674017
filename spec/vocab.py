"""The one vocabulary every layer speaks: group kinds, blocks, tables, plans (a case: ``case.py``).

Names mirror vLLM's ``OffloadingConnectorScheduler`` so the model reads beside
the code. Everything here is plain data; the behaviour lives in ``plan.py``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping


def cdiv(a: int, b: int) -> int:
    """Ceiling division as vLLM's ``vllm.utils.math_utils.cdiv`` (``-(a // -b)``)."""
    return -(a // -b)


class GroupKind(str, Enum):
    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MAMBA = "mamba"

    @property
    def is_windowed(self) -> bool:
        """vLLM gives every kind but full attention a ``sliding_window_size_in_chunks``."""
        return self is not GroupKind.FULL_ATTENTION

    @property
    def is_recurrent(self) -> bool:
        return self is GroupKind.MAMBA

    @property
    def supports_fine_grained_hash_lookup(self) -> bool:
        """The class attribute of the kind's vLLM manager (0.33
        ``single_type_kv_cache_manager.py``: FullAttentionManager :740 and
        MambaManager :1429 True; SlidingWindow and ChunkedLocal inherit False :54)."""
        return self in (GroupKind.FULL_ATTENTION, GroupKind.MAMBA)


MAMBA_CACHE_MODES = ("align", "all", "none")  # vLLM's ``MambaSpec.mamba_cache_mode``


def eagle_proof_margin(block_size: int, hash_block_size: int, fine_grained_lookup: bool) -> int:
    """As vLLM 0.33's ``kv_cache_utils.eagle_proof_margin``: the tokens an EAGLE group
    matches past a cache hit before dropping them (one hash unit for fine-grained
    lookups, else one cache block)."""
    if fine_grained_lookup and block_size > hash_block_size:
        return hash_block_size
    return block_size


class BlockState(str, Enum):
    NULL = "N"  # the shared null sentinel, block_id 0, ``is_null``
    HASHED = "H"  # non-null, ``block_hash`` set (full and cached)
    UNHASHED = "U"  # non-null, ``block_hash is None``


# The integer codes every encoding of a table uses (the Z3 encoding, the torch batches): the
# order of the enums is the code.
STATE_CODES = {s: i for i, s in enumerate(BlockState)}  # N=0, H=1, U=2
KIND_CODES = {k: i for i, k in enumerate(GroupKind)}  # full_attention=0, sliding_window, chunked_local, mamba=3
KIND_OF_CODE = {c: k for k, c in KIND_CODES.items()}
STATE_N, STATE_H, STATE_U = (STATE_CODES[s] for s in (BlockState.NULL, BlockState.HASHED, BlockState.UNHASHED))
KIND_FULL, KIND_SLIDING, KIND_CHUNKED, KIND_MAMBA = (
    KIND_CODES[k] for k in (GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL, GroupKind.MAMBA)
)

NULL_BLOCK_ID = 0


@dataclass(frozen=True)
class Block:
    state: BlockState
    block_id: int = NULL_BLOCK_ID

    @property
    def is_null(self) -> bool:
        return self.state is BlockState.NULL

    @property
    def is_hashed(self) -> bool:
        return self.state is BlockState.HASHED

    @property
    def token(self) -> str:
        """The case-file spelling: ``N``, ``H7``, ``U8``."""
        return "N" if self.is_null else f"{self.state.value}{self.block_id}"


NULL = Block(BlockState.NULL)


def H(block_id: int) -> Block:
    return Block(BlockState.HASHED, block_id)


def U(block_id: int) -> Block:
    return Block(BlockState.UNHASHED, block_id)


BlockTable = tuple  # tuple[Block, ...]: one group's ``blocks.blocks[group_idx]``


def get_num_skipped_tokens(kind: GroupKind, num_computed_tokens, *, sliding_window=None, extra_retained_tokens=0,
                           attention_chunk_size=None, maximum=max, floordiv=operator.floordiv):
    """vLLM's ``get_num_skipped_tokens(num_computed_tokens)`` of the kind's single-type manager: the
    tokens before the ones attention (or the state) still needs, whose blocks the allocator pads
    with the null block. 0.33.0 ``v1/core/single_type_kv_cache_manager.py``: the base (full
    attention) 0 (:722-733); SlidingWindowManager ``max(0, n - sliding_window + 1 -
    extra_retained_tokens)`` (:1148-1183; 0.26.0 :1031-1057 has no extra_retained_tokens, which
    0.28.0 adds, :1063-1098); ChunkedLocalAttentionManager ``(n // attention_chunk_size) *
    attention_chunk_size`` (:1381-1425); MambaManager ``n - 1`` (:1971-1976).

    The one definition: ``maximum(a, 0)`` and ``floordiv`` are Python's on ints (the default), the
    proofs pass ``terms.MAX``/``terms.FLOORDIV`` to build Z3 terms, impl torch's to draw tensors."""
    if kind is GroupKind.SLIDING_WINDOW:
        return maximum(num_computed_tokens - sliding_window + 1 - extra_retained_tokens, 0)
    if kind is GroupKind.CHUNKED_LOCAL:
        return floordiv(num_computed_tokens, attention_chunk_size) * attention_chunk_size
    if kind is GroupKind.MAMBA:
        return num_computed_tokens - 1
    return 0


@dataclass(frozen=True)
class GroupConfig:
    """One KV-cache group (``kv_cache_groups[group_idx]``) as the connector sees it
    (``GroupOffloadConfig``). Case format v2 adds the last four fields; their
    defaults are what every v1 case meant."""

    kind: GroupKind
    tokens_per_block: int
    sliding_window: int | None = None  # sliding_window only
    attention_chunk_size: int | None = None  # chunked_local only
    extra_retained_tokens: int = 0  # sliding_window only: ``SlidingWindowSpec.extra_retained_tokens`` (MTP)
    is_eagle_group: bool = False  # ``KVCacheGroupSpec.is_eagle_group``: holds EAGLE/MTP drafter layers
    mamba_cache_mode: str | None = None  # mamba only: "align" (None means "align"), "all", "none"
    offloaded: bool = True  # False: a KV-cache group the connector does not offload

    def tokens_per_chunk(self, blocks_per_chunk: int) -> int:
        return self.tokens_per_block * blocks_per_chunk

    @property
    def requires_cow_source(self) -> bool:
        """vLLM's ``requires_cow_source``: a Mamba group in cache mode "align"."""
        return self.kind is GroupKind.MAMBA and (self.mamba_cache_mode or "align") == "align"

    def sliding_window_size_in_chunks(self, blocks_per_chunk: int, count_retained: bool = True) -> int | None:
        """As vLLM's ``get_sliding_window_size_in_chunks`` (what the window assert uses).

        From 0.31 a sliding window takes ``max(cdiv(w, tpc), cdiv(w - 1 + extra_retained_tokens, tpc))``;
        ``count_retained=False`` is 0.20-0.30's ``cdiv(w, tpc)``. With
        ``extra_retained_tokens`` at its default 0 both are ``cdiv(w, tpc)``.
        """
        tpc = self.tokens_per_chunk(blocks_per_chunk)
        if self.kind is GroupKind.SLIDING_WINDOW:
            w = self.sliding_window
            if count_retained and self.extra_retained_tokens:
                return max(cdiv(w, tpc), cdiv(w - 1 + self.extra_retained_tokens, tpc))
            return cdiv(w, tpc)
        if self.kind is GroupKind.CHUNKED_LOCAL:
            return cdiv(self.attention_chunk_size, tpc)
        if self.kind is GroupKind.MAMBA:
            return 1  # "Mamba depends on a single state"
        return None


@dataclass(frozen=True)
class Group:
    config: GroupConfig
    blocks: BlockTable


class Variant(str, Enum):
    """One per vLLM behaviour of the load-start scan."""

    LEGACY = "legacy"  # 0.20 - 0.29: scan from 0, assert N <= start*b
    FIXED = "fixed"  # 0.30 - 0.32: scan from cdiv(N, b), assert N % b == 0
    FIXED_SYNC = "fixed-sync"  # 0.33+: as fixed; sync loads match by position


@dataclass(frozen=True)
class ReleaseFeatures:
    """What one vLLM release does in ``update_state_after_alloc``, as data: its scan
    variant, the asserts that moved between releases, and which case-format-v2
    features it has. The defaults are 0.33.0; ``versions.RELEASES`` is the one
    table of every release (each fact with its file:line there)."""

    variant: Variant = Variant.FIXED_SYNC
    window_slack: int | None = 1  # pending <= window*bpc + slack; 0.21-0.26: 0; 0.20: no window assert
    keys_every_group: bool = False  # 0.20-0.27: keys checked for every group, pending or not
    partial_tails: bool = True  # 0.28+: RequestOffloadState.partial_tail_boundary and its assert
    eagle_partial_tails: bool = True  # 0.33+: EAGLE groups allowed, keyed at boundary + proof margin
    extra_retained_tokens: bool = True  # 0.28+: SlidingWindowSpec has the field
    window_counts_retained: bool = True  # 0.31+: the window in chunks counts extra_retained_tokens
    group_subsets: bool = True  # 0.30+: configs carry group_idx, tables are blocks.blocks[group_idx]
    sync_loads: bool = True  # 0.33+: the offloading connector may load synchronously (load_kv_async False)
    allocator: str | None = "0.32.0"  # the KV-cache allocator code it runs (MambaManager align mode), by the
    # first release of that code; None before 0.28 (not modelled). Derived from the allocator_* columns,
    # which say what that code does (proofs/allocator.py reads them):
    allocator_relocation: str | None = "below-checkpoint"  # a running request's speculative blocks are
    # relocated: "skipped" (idx < skipped blocks; 0.28-0.29), "no-checkpoint" (only without a checkpoint;
    # 0.30-0.31), "below-checkpoint" (idx < skipped - checkpoint; 0.32+); None: not modelled (before 0.28)
    allocator_checkpoints: bool = True  # 0.29+: a prefill checkpoint block (_needs_internal_checkpoint)
    allocator_checkpoint_keeps_count: bool = False  # 0.30 only: a checkpoint step keeps the uncapped count
    allocator_spec_blocks_with_checkpoint: bool = False  # 0.30-0.31: a checkpoint step adds num_speculative_blocks
    allocator_early_return_needs_no_checkpoint: bool = True  # 0.30+: allocate_new_blocks returns [] only without one
    allocator_new_blocks_clamped: bool = True  # 0.30+: num_new_blocks = max(num_required_blocks - len(req_blocks), 0)
    allocator_cap_is_min: bool = True  # 0.31+: min(num_new_blocks, physical_block_cap); before, the cap
    # What an engine of the release can be built with (kvbound trace's layouts need them):
    mamba_external_kv: bool = True  # 0.23+: the scheduler takes external (connector) tokens for Mamba
    schedule_end_hook: bool = True  # 0.23+: OffloadingManager.on_schedule_end
    offload_prompt_only: bool = True  # 0.23+: kv_connector_extra_config offload_prompt_only (False: decodes too)
    prefix_match_unit: bool = True  # 0.26+: CacheConfig.prefix_match_unit (tokens_per_hash < block)
    chunked_local_offload: bool = True  # 0.28+: the connector offloads ChunkedLocalAttentionSpec groups
    single_attention_hybrid: bool = True  # 0.29+: a hybrid coordinator with one attention spec (FA + EAGLE FA)
    multi_connector: bool = True  # 0.21+: MultiConnector (SupportsHMA) with an out-of-tree child connector
    tiering_fs: bool = True  # 0.30+: shadow KV follows the file-system tier's copies (jobs name their chunks)
    tier_async_lookup: bool = True  # 0.24+: the file tier's lookups answered on a thread
    request_level_tier: bool = True  # 0.23+: a secondary tier may ask for request-level offload (OffloadPolicy)
    tiering_backpressure: bool = True  # 0.31+: a secondary tier's backpressure detector (tiering/backpressure.py)
    hisparse: bool = True  # 0.30+: HiSparse beside the OffloadingConnector (a MultiConnector; _max_loadable_tokens)
    hisparse_mla_only: bool = True  # 0.31+: HiSparse laid out for sparse-MLA layers alone
    tiering_spec: bool = True  # 0.22.1+: TieringOffloadingSpec with its file-system and example tiers
    mamba_cache_all: bool = False  # 0.21-0.31: CacheConfig.mamba_cache_mode "all" (gone in 0.32)
    transfer_failures: bool = False  # no release yet: the worker asserts every transfer succeeded
    connector_reset_cache: bool = True  # 0.22+: OffloadingConnector.reset_cache (reset_prefix_cache(reset_connector))
    load_tier_filter: bool = True  # 0.27+: kv_transfer_params kv_load_tiers (a request's tier filter)
    max_load_tokens: bool = True  # 0.31+: kv_transfer_params max_load_tokens (a request's load limit)
    max_offload_tokens: bool = True  # 0.23+: kv_transfer_params max_offload_tokens (a request's offload limit)
    retention_interval: bool = True  # 0.30+: the connector reads CacheConfig.prefix_cache_retention_interval
    # the lookup (get_num_new_matched_tokens; spec/lookup.py, docs/lookup.md):
    lookup_eagle: bool = True  # 0.24+: is_eagle_group pops its trailing chunk; Mamba alignment cap
    lookup_defers_on_transfers: bool = True  # 0.24+: defer while transfer_jobs; skip_reading_prefix_cache
    lookup_result_enum: bool = True  # 0.25+: LookupResult HIT/HIT_PENDING/RETRY/MISS (before: True/None/False)
    lookup_swa_gap_clears_pending: bool = True  # 0.30+: a gap clears the pending flag right of it
    lookup_eagle_widens_every_group: bool = True  # 0.30+: EAGLE widening for every group (#52735)
    lookup_load_window: bool = True  # 0.30+: load_window_size_in_chunks widens the first window
    lookup_partial_tail_bridge: bool = True  # 0.33+: the bridge chunk; two blocks with a proof margin
    lookup_deferral_keeps_bound: bool = False  # no release: a deferring full-attention group still bounds
    # the hit by its chunks up to the first miss (versions.PATCHES, the lookup-deferral patch)
    # the store (_build_store_jobs; spec/store.py):
    next_stored_chunk_idx: bool = True  # 0.26+: RequestGroupState.next_stored_chunk_idx (the store spec's model)
    store_aborted_at_computed: bool = True  # 0.27+: an aborted request stores up to num_computed_tokens
    store_caps_at_allocated: bool = True  # 0.27+: storable_chunks <= allocated chunks (0.26: an assert)
    store_finished_clamp: bool = True  # 0.30+: a finished request stores up to max(prompt, num_tokens - 1)
    store_caps_at_keyed: bool = True  # 0.30+: storable_chunks <= keyed chunks (len(offload_keys))
    store_skips_cow_source: bool = True  # 0.29+: a copy-on-write source group (Mamba align) offers no chunk
    store_drafter_tail_at_finish: bool = True  # 0.30+: a finished request's drafter group stores its trailing chunk
    untagged_groups_non_draft: bool = True  # 0.30+: speculative decoding with no tagged group: no group is a drafter's
    release: str = "0.33.0"  # the release these facts were read from (for reasons)


# The v1 names (the asserts were ReleaseFeatures' first fields), kept behind a DeprecationWarning.
_V1_NAMES = {"ReleaseAsserts": ("ReleaseFeatures", lambda: ReleaseFeatures),
             "LATEST_ASSERTS": ("ReleaseFeatures()", lambda: ReleaseFeatures())}


def __getattr__(name):
    if name in _V1_NAMES:
        import warnings

        new, value = _V1_NAMES[name]
        warnings.warn(f"kvbound.spec.{name} is the v1 name of {new}", DeprecationWarning, stacklevel=2)
        return value()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class AssertName(str, Enum):
    TABLE_LENGTH = "table_length"  # len(group_blocks) >= num_gpu_blocks
    BOUNDARY = "boundary"  # N <= start * tokens_per_block (legacy)
    ALIGNMENT = "alignment"  # N % tokens_per_block == 0 (fixed)
    WINDOW_BOUND = "window_bound"  # pending <= window_in_chunks * bpc + 1
    KEYS_LENGTH = "keys_length"  # len(offload_keys) >= end_chunk_idx
    PARTIAL_TAIL = "partial_tail"  # partial_tail_boundary == num_cached_tokens (request-level)


@dataclass(frozen=True)
class Assertion:
    """Which vLLM assert fires, where, and the numbers it compared. ``group_index`` is
    the group's ``group_idx``; None for the request-level ``partial_tail`` assert."""

    name: AssertName
    group_index: int | None
    message: str
    values: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupPlan:
    group_index: int
    num_gpu_blocks: int  # k = cdiv(T, b)
    first_fresh_gpu_block_idx: int  # f = cdiv(N, b)
    load_start_gpu_block_idx: int
    num_pending_gpu_blocks: int
    dst_block_ids: tuple
    start_chunk_idx: int  # keys are chunks [start_chunk_idx, end_chunk_idx)
    end_chunk_idx: int  # of this group; empty when nothing is pending
    boundary_key_tokens: int | None = None  # a partial tail: then the key of this token position

    @property
    def keys(self) -> tuple:
        """This group's keys in ``prepare_load`` order: chunk keys ``(group_idx, chunk_idx)``,
        then a partial tail's boundary key ``(group_idx, "boundary", key_tokens)``."""
        out = tuple((self.group_index, c) for c in range(self.start_chunk_idx, self.end_chunk_idx))
        if self.boundary_key_tokens is not None:
            out += ((self.group_index, "boundary", self.boundary_key_tokens),)
        return out


# The fields of a plan as ``LoadPlan.to_json`` (``kvbound plan``) writes them: what a load is
# (LOAD_FIELDS), and with the outcome and the assert, every field a comparison reads.
LOAD_FIELDS = ("dst_block_ids", "group_sizes", "block_indices", "keys")
PLAN_FIELDS = ("outcome", "assertion", *LOAD_FIELDS)


@dataclass(frozen=True)
class LoadPlan:
    """What ``update_state_after_alloc`` hands on, or the assert it dies on.

    On an assertion the flat fields are empty, as in vLLM (no ``GPULoadStoreSpec``
    and no ``prepare_load`` is reached); ``groups`` keeps the groups planned before
    the failing one and ``assertion`` carries the failing group's numbers.
    """

    variant: Variant
    groups: tuple  # tuple[GroupPlan, ...]
    assertion: Assertion | None = None
    asserts_checked: bool = True
    unsupported: str | None = None  # the release lacks a feature the case needs: why

    @property
    def ok(self) -> bool:
        return self.assertion is None and self.unsupported is None

    @property
    def outcome(self) -> str:
        """``ok``, ``assertion_error`` or ``unsupported``."""
        if self.unsupported is not None:
            return "unsupported"
        return "ok" if self.assertion is None else "assertion_error"

    @property
    def dst_block_ids(self) -> tuple:
        return () if not self.ok else tuple(b for g in self.groups for b in g.dst_block_ids)

    @property
    def group_sizes(self) -> tuple:
        return () if not self.ok else tuple(g.num_pending_gpu_blocks for g in self.groups)

    @property
    def block_indices(self) -> tuple:
        return () if not self.ok else tuple(g.load_start_gpu_block_idx for g in self.groups)

    @property
    def keys(self) -> tuple:
        """In the order vLLM passes them to ``prepare_load``: ``(group_idx, chunk_idx)``
        per chunk key, ``(group_idx, "boundary", key_tokens)`` per partial-tail key."""
        if not self.ok:
            return ()
        return tuple(k for g in self.groups for k in g.keys)

    def to_json(self, name: str) -> dict:
        """The ``kvbound plan`` line: the fields ``GPULoadStoreSpec`` and ``prepare_load`` see
        (plus ``reason`` when the outcome is ``unsupported``)."""
        out = {
            "name": name,
            "outcome": self.outcome,
            "assertion": None if self.assertion is None else self.assertion.name.value,
            "dst_block_ids": list(self.dst_block_ids),
            "group_sizes": list(self.group_sizes),
            "block_indices": list(self.block_indices),
            "keys": [list(k) for k in self.keys],
        }
        if self.unsupported is not None:
            out["reason"] = self.unsupported
        return out


def lcm_all(values) -> int:
    out = 1
    for v in values:
        out = math.lcm(out, v)
    return out
