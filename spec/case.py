"""A ``Case``, one call of ``update_state_after_alloc``, and the rules every case obeys.

``Case`` validates on construction (``validate_case``), so a ``Case`` that exists is a
well-formed input; every error names the case, the field and the rule. The JSON form of
a case is ``cases.py``.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass

from kvbound.errors import CaseError

from .vocab import MAMBA_CACHE_MODES, Block, GroupKind, eagle_proof_margin

_WINDOW_FIELD = {GroupKind.SLIDING_WINDOW: "sliding_window", GroupKind.CHUNKED_LOCAL: "attention_chunk_size"}

_TRUSTED = ContextVar("kvbound_case_trusted", default=False)  # set only inside ``Case.trusted``


@dataclass(frozen=True)
class Case:
    """One call of ``update_state_after_alloc``: the request, its config and tables.

    Construction validates (``validate_case``, below): a ``Case`` that exists is a
    well-formed input, though it may be adversarial (unaligned N, short tables).
    """

    name: str
    blocks_per_chunk: int
    tokens_per_hash: int
    num_prompt_tokens: int
    num_locally_computed_tokens: int
    num_external_tokens: int
    groups: tuple  # tuple[Group, ...]: every KV-cache group, in group_idx (``blocks.blocks``) order
    sync_load: bool = False
    # case format v2 (defaults: what a v1 case meant)
    num_tokens: int | None = None  # ``request.num_tokens`` at the call; None means num_prompt_tokens
    partial_tail_boundary: int | None = None  # ``RequestOffloadState.partial_tail_boundary``
    cache_hit_alignment_tokens: int | None = None  # ``KVCacheConfig.cache_hit_alignment_tokens``
    decode_context_parallel_size: int = 1  # ``parallel_config.decode_context_parallel_size``

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))
        if self.num_tokens is None:
            object.__setattr__(self, "num_tokens", self.num_prompt_tokens)
        groups = self.groups
        # derived once (not fields: equality and hashing ignore them)
        object.__setattr__(self, "_offloaded", tuple(
            i for i, g in enumerate(groups) if getattr(getattr(g, "config", None), "offloaded", True) is not False
        ))
        if not _TRUSTED.get():
            validate_case(self)
        object.__setattr__(self, "uses_v2_features", bool(
            self.partial_tail_boundary is not None
            or len(self._offloaded) != len(groups)
            or any(g.config.extra_retained_tokens for g in groups)
        ))

    @classmethod
    def trusted(cls, **fields) -> "Case":
        """``Case(**fields)`` without re-running ``validate_case``, for values already known
        to satisfy it: rows a generator built by the rules (its tests put them through the
        validating constructor) or cases validated before. The derived fields are set as
        ever. Anything read from a file or a user goes through ``Case(...)``."""
        token = _TRUSTED.set(True)
        try:
            return cls(**fields)
        finally:
            _TRUSTED.reset(token)

    @property
    def num_cached_tokens(self) -> int:
        return self.num_locally_computed_tokens + self.num_external_tokens

    @property
    def offloaded_group_indices(self) -> tuple:
        """The ``group_idx`` of every offloaded group, in order (vLLM's ``kv_group_configs``)."""
        return self._offloaded

    def num_offload_keys(self, group_index: int) -> int:
        """Keys a group has at the call: one per ``hashes_per_chunk`` hashes of
        ``request.block_hashes``, which cover all ``num_tokens`` (not only the prompt)."""
        tpc = self.groups[group_index].config.tokens_per_chunk(self.blocks_per_chunk)
        hashes_per_chunk = tpc // self.tokens_per_hash
        return (self.num_tokens // self.tokens_per_hash) // hashes_per_chunk

    def partial_tail_refusal(self, eagle_groups_allowed: bool = True) -> str | None:
        """Why vLLM's ``SchedulerOffloadConfig.supports_partial_tail`` is False for this
        config (None when it holds), derived as vLLM derives it over the offloaded
        groups: 0.33 ``scheduler.py:276-293``; 0.28-0.32 add "no EAGLE group"
        (0.29 ``scheduler.py:288``), i.e. ``eagle_groups_allowed=False``."""
        cfgs = [self.groups[i].config for i in self.offloaded_group_indices]
        if self.blocks_per_chunk != 1:
            return f"blocks_per_chunk is {self.blocks_per_chunk}; partial tails need 1"
        sizes = sorted({c.tokens_per_block for c in cfgs})
        if len(sizes) != 1:
            return f"offloaded groups have tokens_per_block {sizes}; partial tails need one block size"
        if not any(c.requires_cow_source and c.tokens_per_block > self.tokens_per_hash for c in cfgs):
            return ("no offloaded mamba group in cache mode \"align\" with tokens_per_block > "
                    f"tokens_per_hash {self.tokens_per_hash}")
        for i in self.offloaded_group_indices:
            c = self.groups[i].config
            if c.kind.is_windowed and not c.requires_cow_source:
                what = c.kind.value if c.kind is not GroupKind.MAMBA else f"mamba ({c.mamba_cache_mode})"
                return f"group {i} is {what}; partial tails allow no windowed group but an align-mode mamba"
        if not eagle_groups_allowed:
            eagle = [i for i in self.offloaded_group_indices if self.groups[i].config.is_eagle_group]
            if eagle:
                return f"group {eagle[0]} is an EAGLE group; partial tails before vLLM 0.33 allow none"
        if self.decode_context_parallel_size != 1:
            return f"decode_context_parallel_size is {self.decode_context_parallel_size}; partial tails need 1"
        return None

    @property
    def supports_partial_tail(self) -> bool:
        """vLLM 0.33's ``supports_partial_tail`` (the most permissive release)."""
        return self.partial_tail_refusal() is None

    @property
    def partial_tail_block_size(self) -> int:
        """``_partial_tail_block_size``: the first offloaded group's block size where
        partial tails are supported, else 0 (0.33 ``scheduler.py:597-601``)."""
        if not self.supports_partial_tail:
            return 0
        return self.groups[self.offloaded_group_indices[0]].config.tokens_per_block

    def eagle_proof_margin(self, group_index: int) -> int:
        """vLLM 0.33's ``_eagle_proof_margins.get(group_idx, 0)`` (``scheduler.py:604-621``):
        an offloaded EAGLE group that is not a CoW source, on a config that supports
        partial tails, keys its partial tail this many tokens past the boundary."""
        cfg = self.groups[group_index].config
        if not (cfg.offloaded and cfg.is_eagle_group and not cfg.requires_cow_source and self.supports_partial_tail):
            return 0
        block_size = self.partial_tail_block_size
        alignment = self.cache_hit_alignment_tokens
        partial_hash_hits = alignment is not None and alignment < block_size
        return eagle_proof_margin(
            block_size, self.tokens_per_hash, partial_hash_hits and cfg.kind.supports_fine_grained_hash_lookup
        )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _need_int(case: str, field: str, v: object, minimum: int) -> int:
    if not _is_int(v):
        raise CaseError(case, field, f"must be an integer, got {json.dumps(v)}")
    if v < minimum:
        what = "positive" if minimum == 1 else "non-negative"
        raise CaseError(case, field, f"must be {what} (>= {minimum}), got {v}")
    return v


def validate_case(case: Case) -> None:
    """The semantic rules; ``Case.__post_init__`` runs them, so they hold for every ``Case``."""
    name = case.name
    if not isinstance(name, str) or not name:
        raise CaseError(str(name), "name", "must be a non-empty string")
    _need_int(name, "blocks_per_chunk", case.blocks_per_chunk, 1)
    _need_int(name, "tokens_per_hash", case.tokens_per_hash, 1)
    _need_int(name, "num_prompt_tokens", case.num_prompt_tokens, 0)
    _need_int(name, "num_locally_computed_tokens", case.num_locally_computed_tokens, 0)
    _need_int(name, "num_external_tokens", case.num_external_tokens, 0)
    if not isinstance(case.sync_load, bool):
        raise CaseError(name, "sync_load", f"must be true or false, got {json.dumps(case.sync_load)}")
    _need_int(name, "num_tokens", case.num_tokens, 0)
    if case.num_tokens < case.num_prompt_tokens:
        raise CaseError(
            name, "num_tokens",
            f"must be >= num_prompt_tokens {case.num_prompt_tokens} (prompt plus the output tokens"
            f" generated so far), got {case.num_tokens}",
        )
    if case.cache_hit_alignment_tokens is not None:
        _need_int(name, "cache_hit_alignment_tokens", case.cache_hit_alignment_tokens, 1)
    _need_int(name, "decode_context_parallel_size", case.decode_context_parallel_size, 1)
    if not case.groups:
        raise CaseError(name, "groups", "must hold at least one KV-cache group")
    seen: dict[int, str] = {}
    for gi, group in enumerate(case.groups):
        where = f"groups[{gi}]"
        cfg = group.config
        if not isinstance(cfg.kind, GroupKind):
            raise CaseError(name, f"{where}.kind", f"must be a GroupKind, got {cfg.kind!r}")
        b = _need_int(name, f"{where}.tokens_per_block", cfg.tokens_per_block, 1)
        for kind, fld in _WINDOW_FIELD.items():
            value = getattr(cfg, fld)
            if cfg.kind is kind:
                if value is None:
                    raise CaseError(name, f"{where}.{fld}", f"is required for kind {kind.value!r}")
                _need_int(name, f"{where}.{fld}", value, 1)
            elif value is not None:
                raise CaseError(
                    name, f"{where}.{fld}",
                    f"only a {kind.value!r} group has {fld}; this group is {cfg.kind.value!r}",
                )
        if not _is_int(cfg.extra_retained_tokens) or cfg.extra_retained_tokens < 0:
            _need_int(name, f"{where}.extra_retained_tokens", cfg.extra_retained_tokens, 0)
        if cfg.extra_retained_tokens and cfg.kind is not GroupKind.SLIDING_WINDOW:
            raise CaseError(
                name, f"{where}.extra_retained_tokens",
                f"only a 'sliding_window' group has extra_retained_tokens; this group is {cfg.kind.value!r}",
            )
        for fld in ("is_eagle_group", "offloaded"):
            if not isinstance(getattr(cfg, fld), bool):
                raise CaseError(name, f"{where}.{fld}", f"must be true or false, got {json.dumps(getattr(cfg, fld))}")
        if cfg.mamba_cache_mode is not None:
            if cfg.kind is not GroupKind.MAMBA:
                raise CaseError(
                    name, f"{where}.mamba_cache_mode",
                    f"only a 'mamba' group has mamba_cache_mode; this group is {cfg.kind.value!r}",
                )
            if cfg.mamba_cache_mode not in MAMBA_CACHE_MODES:
                raise CaseError(
                    name, f"{where}.mamba_cache_mode",
                    f"must be one of {', '.join(MAMBA_CACHE_MODES)} (vLLM's MambaSpec.mamba_cache_mode),"
                    f" got {json.dumps(cfg.mamba_cache_mode)}",
                )
        tpc = b * case.blocks_per_chunk
        if tpc % case.tokens_per_hash:
            raise CaseError(
                name, f"{where}.tokens_per_block",
                f"tokens_per_chunk = tokens_per_block {b} * blocks_per_chunk {case.blocks_per_chunk}"
                f" = {tpc} must be a multiple of tokens_per_hash {case.tokens_per_hash}"
                " (vLLM keys a chunk by its last block hash)",
            )
        for i, blk in enumerate(group.blocks):
            if not isinstance(blk, Block):
                raise CaseError(name, f"{where}.blocks[{i}]", f"must be a Block, got {blk!r}")
            if blk.is_null:
                if blk.block_id != 0:
                    raise CaseError(name, f"{where}.blocks[{i}]", "the null block has block_id 0")
                continue
            if blk.block_id < 1:
                raise CaseError(name, f"{where}.blocks[{i}]", "a non-null block needs block_id >= 1")
            here = f"{where}.blocks[{i}]"
            if blk.block_id in seen:
                raise CaseError(
                    name, here,
                    f"block id {blk.block_id} is already used at {seen[blk.block_id]};"
                    " a non-null GPU block belongs to one place in one request",
                )
            seen[blk.block_id] = here
    if not case.offloaded_group_indices:
        raise CaseError(name, "groups", "at least one group must be offloaded (vLLM: \"KV offloading found no eligible cache groups\")")
    if case.partial_tail_boundary is not None:
        _validate_partial_tail(case)


def _validate_partial_tail(case: Case) -> None:
    """What vLLM's lookup guarantees of a boundary it records (0.28-0.33 ``_lookup``):
    a config where ``supports_partial_tail`` holds, a multiple of tokens_per_hash in
    [tokens_per_hash, num_prompt_tokens - 1], and (0.33, EAGLE groups) a hash of the
    request at boundary + proof margin."""
    name, boundary, tph = case.name, case.partial_tail_boundary, case.tokens_per_hash
    fld = "partial_tail_boundary"
    _need_int(name, fld, boundary, 1)
    why = case.partial_tail_refusal()
    if why is not None:
        raise CaseError(name, fld, f"vLLM records a partial tail only where supports_partial_tail holds; here {why}")
    if boundary % tph:
        raise CaseError(name, fld, f"{boundary} is not a multiple of tokens_per_hash {tph} (vLLM's lookup rounds the boundary down to it)")
    if boundary > case.num_prompt_tokens - 1:
        raise CaseError(
            name, fld,
            f"{boundary} > num_prompt_tokens - 1 = {case.num_prompt_tokens - 1} (vLLM's lookup never records a"
            " boundary at or past the prompt's end)",
        )
    hashed = (case.num_tokens // tph) * tph
    for gi in case.offloaded_group_indices:
        margin = case.eagle_proof_margin(gi)
        if boundary + margin > hashed:
            raise CaseError(
                name, fld,
                f"{boundary} + EAGLE proof margin {margin} of group {gi} = {boundary + margin} > the {hashed} tokens"
                f" the request has hashes for (num_tokens {case.num_tokens}); vLLM's lookup needs that hash",
            )
