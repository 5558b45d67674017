"""The one vocabulary every layer speaks: group kinds, blocks, tables, cases, plans.

Names mirror vLLM's ``OffloadingConnectorScheduler`` so the model reads beside
the code. Everything here is plain data; the behaviour lives in ``plan.py``.
"""

from __future__ import annotations

import math
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


class BlockState(str, Enum):
    NULL = "N"  # the shared null sentinel, block_id 0, ``is_null``
    HASHED = "H"  # non-null, ``block_hash`` set (full and cached)
    UNHASHED = "U"  # non-null, ``block_hash is None``


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


@dataclass(frozen=True)
class GroupConfig:
    """One KV-cache group as the connector sees it (``GroupOffloadConfig``)."""

    kind: GroupKind
    tokens_per_block: int
    sliding_window: int | None = None  # sliding_window only
    attention_chunk_size: int | None = None  # chunked_local only

    def tokens_per_chunk(self, blocks_per_chunk: int) -> int:
        return self.tokens_per_block * blocks_per_chunk

    def sliding_window_size_in_chunks(self, blocks_per_chunk: int) -> int | None:
        """As vLLM's ``get_sliding_window_size_in_chunks``.

        0.33 takes ``max(cdiv(w, tpc), cdiv(w - 1 + extra_retained_tokens, tpc))``;
        with ``extra_retained_tokens`` at its default 0 that equals ``cdiv(w, tpc)``.
        """
        tpc = self.tokens_per_chunk(blocks_per_chunk)
        if self.kind is GroupKind.SLIDING_WINDOW:
            return cdiv(self.sliding_window, tpc)
        if self.kind is GroupKind.CHUNKED_LOCAL:
            return cdiv(self.attention_chunk_size, tpc)
        if self.kind is GroupKind.MAMBA:
            return 1  # "Mamba depends on a single state"
        return None


@dataclass(frozen=True)
class Group:
    config: GroupConfig
    blocks: BlockTable


@dataclass(frozen=True)
class Case:
    """One call of ``update_state_after_alloc``: the request, its config and tables.

    Construction validates (``cases.validate_case``): a ``Case`` that exists is a
    well-formed input, though it may be adversarial (unaligned N, short tables).
    """

    name: str
    blocks_per_chunk: int
    tokens_per_hash: int
    num_prompt_tokens: int
    num_locally_computed_tokens: int
    num_external_tokens: int
    groups: tuple  # tuple[Group, ...], in config (group_idx) order
    sync_load: bool = False

    def __post_init__(self) -> None:
        from .cases import validate_case  # cases imports vocab; keep one rule set

        object.__setattr__(self, "groups", tuple(self.groups))
        validate_case(self)

    @property
    def num_cached_tokens(self) -> int:
        return self.num_locally_computed_tokens + self.num_external_tokens

    def num_offload_keys(self, group_index: int) -> int:
        """Keys a group has at admission: one per ``hashes_per_chunk`` block hashes."""
        tpc = self.groups[group_index].config.tokens_per_chunk(self.blocks_per_chunk)
        hashes_per_chunk = tpc // self.tokens_per_hash
        return (self.num_prompt_tokens // self.tokens_per_hash) // hashes_per_chunk


class Variant(str, Enum):
    """One per vLLM behaviour of the load-start scan."""

    LEGACY = "legacy"  # 0.20 - 0.29: scan from 0, assert N <= start*b
    FIXED = "fixed"  # 0.30 - 0.32: scan from cdiv(N, b), assert N % b == 0
    FIXED_SYNC = "fixed-sync"  # 0.33+: as fixed; sync loads match by position


@dataclass(frozen=True)
class ReleaseAsserts:
    """Assert details that moved between releases independently of the scan.

    The default is 0.28+ (what ``legacy`` 0.29, ``fixed`` and ``fixed-sync`` do);
    ``versions.release_asserts`` gives older releases theirs (read from each wheel).
    """

    window_slack: int | None = 1  # pending <= window*bpc + slack; 0.21-0.26: 0; 0.20: no window assert
    keys_every_group: bool = False  # 0.20-0.27: keys checked for every group, pending or not


LATEST_ASSERTS = ReleaseAsserts()


class AssertName(str, Enum):
    TABLE_LENGTH = "table_length"  # len(group_blocks) >= num_gpu_blocks
    BOUNDARY = "boundary"  # N <= start * tokens_per_block (legacy)
    ALIGNMENT = "alignment"  # N % tokens_per_block == 0 (fixed)
    WINDOW_BOUND = "window_bound"  # pending <= window_in_chunks * bpc + 1
    KEYS_LENGTH = "keys_length"  # len(offload_keys) >= end_chunk_idx


@dataclass(frozen=True)
class Assertion:
    """Which vLLM assert fires, where, and the numbers it compared."""

    name: AssertName
    group_index: int
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

    @property
    def ok(self) -> bool:
        return self.assertion is None

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
        """(group_index, chunk_index) in the order vLLM passes them to ``prepare_load``."""
        if not self.ok:
            return ()
        return tuple(
            (g.group_index, c) for g in self.groups for c in range(g.start_chunk_idx, g.end_chunk_idx)
        )

    def to_json(self, name: str) -> dict:
        """The ``kvbound plan`` line: the fields ``GPULoadStoreSpec`` and ``prepare_load`` see."""
        return {
            "name": name,
            "outcome": "ok" if self.ok else "assertion_error",
            "assertion": None if self.ok else self.assertion.name.value,
            "dst_block_ids": list(self.dst_block_ids),
            "group_sizes": list(self.group_sizes),
            "block_indices": list(self.block_indices),
            "keys": [list(k) for k in self.keys],
        }


def lcm_all(values) -> int:
    out = 1
    for v in values:
        out = math.lcm(out, v)
    return out
