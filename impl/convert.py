"""Cases to a ``PlanBatch`` and back: the converters, both ways.

``batch_from_cases`` pads cases into one batch (the blocks go in with one scatter);
``cases_from_batch`` turns rows back into spec ``Case``s, to run the spec on them or save
them as case files. The padded tensor form itself is ``batch.py``'s.
"""

from __future__ import annotations

import gc

import torch

from kvbound.errors import BatchError
from kvbound.spec import KIND_CODES, KIND_OF_CODE, STATE_CODES, Block, BlockState, Case, Group, GroupConfig, GroupKind

from .batch import MAMBA_MODE_CODES, PlanBatch, pack_states, resolve_device

_STATES = tuple(BlockState)
_MAMBA_MODES = {c: m for m, c in MAMBA_MODE_CODES.items()}


def batch_from_cases(cases, device=None, slots: int | None = None, groups: int | None = None) -> PlanBatch:
    """Pad ``cases`` into one batch; the blocks go in with one scatter, not a per-slot loop."""
    cases = list(cases)
    if not cases:
        raise BatchError("cases", "need at least one case to build a batch")
    dev = resolve_device(device)
    R = len(cases)
    G = max(len(c.groups) for c in cases)
    L = max((len(g.blocks) for c in cases for g in c.groups), default=0)
    G, L = max(G, groups or 0), max(L, slots or 0, 1)
    L += -L % 8  # whole octets: plan_batch then packs the slots without a copy
    lengths, kinds, tpb, win, extra, eagle, mode, off = [], [], [], [], [], [], [], []
    states, ids = [], []
    for c in cases:
        for g in c.groups:
            cfg = g.config
            lengths.append(len(g.blocks))
            kinds.append(KIND_CODES[cfg.kind])
            tpb.append(cfg.tokens_per_block)
            win.append(cfg.sliding_window or cfg.attention_chunk_size or 0)
            extra.append(cfg.extra_retained_tokens)
            eagle.append(cfg.is_eagle_group)
            mode.append(MAMBA_MODE_CODES[cfg.mamba_cache_mode])
            off.append(cfg.offloaded)
            states += [STATE_CODES[b.state] for b in g.blocks]
            ids += [b.block_id for b in g.blocks]
        pad = G - len(c.groups)
        lengths += [0] * pad
        kinds += [0] * pad
        tpb += [1] * pad
        win += [0] * pad
        extra += [0] * pad
        eagle += [False] * pad
        mode += [0] * pad
        off += [True] * pad
    table_length = torch.tensor(lengths, dtype=torch.int64).view(R, G)
    # slot (r, g, i) of block number j: flat index (r*G + g)*L + i
    rg = torch.repeat_interleave(torch.arange(R * G), table_length.view(-1))
    offsets = torch.cumsum(table_length.view(-1), 0) - table_length.view(-1)
    flat = rg * L + (torch.arange(len(states)) - offsets[rg])
    id_dtype = torch.int32 if max(ids, default=0) < 2**31 else torch.int64
    state = torch.zeros(R * G * L, dtype=torch.uint8)
    block_id = torch.zeros(R * G * L, dtype=id_dtype)
    state[flat] = torch.tensor(states, dtype=torch.uint8)
    block_id[flat] = torch.tensor(ids, dtype=id_dtype)

    def req(attr, none=-1):
        return torch.tensor([none if getattr(c, attr) is None else getattr(c, attr) for c in cases],
                            dtype=torch.int64, device=dev)

    def per_group(values, dtype):
        return torch.tensor(values, dtype=dtype).view(R, G).to(dev)

    state = state.view(R, G, L).to(dev)
    return PlanBatch(
        state=state,
        slot_words=pack_states(state),
        block_id=block_id.view(R, G, L).to(dev),
        table_length=table_length.to(dev),
        num_groups=torch.tensor([len(c.groups) for c in cases], dtype=torch.int64, device=dev),
        kind=torch.tensor(kinds, dtype=torch.uint8).view(R, G).to(dev),
        tokens_per_block=torch.tensor(tpb, dtype=torch.int64).view(R, G).to(dev),
        window_tokens=torch.tensor(win, dtype=torch.int64).view(R, G).to(dev),
        blocks_per_chunk=req("blocks_per_chunk"),
        tokens_per_hash=req("tokens_per_hash"),
        num_prompt_tokens=req("num_prompt_tokens"),
        num_locally_computed_tokens=req("num_locally_computed_tokens"),
        num_external_tokens=req("num_external_tokens"),
        sync_load=torch.tensor([c.sync_load for c in cases], dtype=torch.bool, device=dev),
        num_tokens=req("num_tokens"),
        partial_tail_boundary=req("partial_tail_boundary"),
        cache_hit_alignment_tokens=req("cache_hit_alignment_tokens"),
        decode_context_parallel_size=req("decode_context_parallel_size"),
        extra_retained_tokens=per_group(extra, torch.int64),
        is_eagle_group=per_group(eagle, torch.bool),
        mamba_cache_mode=per_group(mode, torch.uint8),
        offloaded=per_group(off, torch.bool),
        names=[c.name for c in cases],
    )


class _BlockCache(dict):
    """block id * 4 + state code -> Block: blocks are immutable, so rows share them
    (and ``map(_BLOCKS.__getitem__, codes)`` runs without a Python frame per block)."""

    def __missing__(self, code: int) -> Block:
        blk = self[code] = Block(_STATES[code & 3], code >> 2)
        return blk


_BLOCKS = _BlockCache()
_CONFIGS: dict = {}  # (kind code, tokens_per_block, window, extra, eagle, mode, offloaded) -> GroupConfig


def _config(kind_code: int, b: int, w: int, extra: int = 0, eagle: bool = False, mode: int = 0,
            offloaded: bool = True) -> GroupConfig:
    key = (kind_code, b, w, extra, eagle, mode, offloaded)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        kind = KIND_OF_CODE[kind_code]
        cfg = _CONFIGS[key] = GroupConfig(
            kind, b,
            sliding_window=w if kind is GroupKind.SLIDING_WINDOW else None,
            attention_chunk_size=w if kind is GroupKind.CHUNKED_LOCAL else None,
            extra_retained_tokens=extra, is_eagle_group=bool(eagle), mamba_cache_mode=_MAMBA_MODES[mode],
            offloaded=bool(offloaded),
        )
    return cfg


def _v2_case_fields(t: dict, j: int) -> dict:
    tail, align = t["partial_tail_boundary"][j], t["cache_hit_alignment_tokens"][j]
    return dict(num_tokens=t["num_tokens"][j], partial_tail_boundary=None if tail < 0 else tail,
                cache_hit_alignment_tokens=None if align < 0 else align,
                decode_context_parallel_size=t["decode_context_parallel_size"][j])


def cases_from_batch(batch: PlanBatch, rows=None, validate: bool = True) -> list[Case]:
    """Back to spec ``Case``s, e.g. to run the spec or save case files. ``validate``
    checks the tensors and has ``Case`` validate every case; ``validate=False`` is for
    trusted rows (``Case.trusted``: generator rows, validated cases); it halves the spec
    side's cost in a million-case run."""
    if validate:
        batch.check_values()
    R = batch.shape[0]
    rows = list(range(R)) if rows is None else list(rows)
    idx = torch.as_tensor(rows, dtype=torch.int64, device=batch.device)
    t = {k: v.index_select(0, idx).cpu().tolist() for k, v in batch.tensors().items() if v.dim() < 3}
    # only the slots inside each table, as one flat list of block id * 4 + state
    length = batch.table_length.index_select(0, idx)
    inside = torch.arange(batch.shape[2], device=batch.device) < length.unsqueeze(-1)
    codes = (batch.block_id.index_select(0, idx).to(torch.int64) * 4 + batch.state.index_select(0, idx))[inside]
    blocks_flat = list(map(_BLOCKS.__getitem__, codes.cpu().tolist()))
    gc_was = gc.isenabled()
    gc.disable()  # many small objects, none cyclic: the collector would only rescan them
    try:
        return _build_cases(batch, rows, t, blocks_flat, Case if validate else Case.trusted)
    finally:
        if gc_was:
            gc.enable()


def _build_cases(batch, rows, t, blocks_flat, make_case) -> list:
    out = []
    at = 0
    for j, r in enumerate(rows):
        groups = []
        lengths = t["table_length"][j]
        for g in range(t["num_groups"][j]):
            n = lengths[g]
            groups.append(Group(_config(t["kind"][j][g], t["tokens_per_block"][j][g], t["window_tokens"][j][g],
                                        t["extra_retained_tokens"][j][g], t["is_eagle_group"][j][g],
                                        t["mamba_cache_mode"][j][g], t["offloaded"][j][g]),
                                tuple(blocks_flat[at:at + n])))
            at += n
        at += sum(lengths[t["num_groups"][j]:])  # padded groups hold no slots, but count them if they did
        out.append(make_case(
            name=batch.names[r] if batch.names else f"batch-{r}",
            blocks_per_chunk=t["blocks_per_chunk"][j],
            tokens_per_hash=t["tokens_per_hash"][j],
            num_prompt_tokens=t["num_prompt_tokens"][j],
            num_locally_computed_tokens=t["num_locally_computed_tokens"][j],
            num_external_tokens=t["num_external_tokens"][j],
            groups=tuple(groups),
            sync_load=bool(t["sync_load"][j]),
            **_v2_case_fields(t, j),
        ))
    return out
