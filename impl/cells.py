"""The cells of a batched load plan: the (request, group) pairs vLLM's per-group loop
plans, what vLLM decides per request before that loop (``supports_partial_tail``,
the EAGLE proof margins, the v2 features a release lacks), and the geometry every
variant shares (k, f, the chunk bounds).

``impl/plan.py`` runs the loop's steps over these cells; ``real_cells`` is its step 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbound.spec import KIND_FULL, KIND_MAMBA, ReleaseFeatures

from .batch import MAMBA_MODE_CODES, PLANE_UNHASHED, PlanBatch, cdiv, floordiv, pack_slots, unpack_states


# --- requests: what vLLM decides before the per-group loop ------------------------

@dataclass
class Requests:
    """Request-level inputs and derivations ([R]) of the case format v2 contract;
    ``None`` for a batch that uses no v2 field (every v1 case), which skips it all."""

    tail: torch.Tensor  # a partial_tail_boundary is set
    boundary: torch.Tensor  # partial_tail_boundary (-1: None)
    T: torch.Tensor  # num_cached_tokens
    subset: torch.Tensor  # some KV-cache group is not offloaded
    retained: torch.Tensor  # some group retains extra window tokens
    eagle: torch.Tensor  # some offloaded group is an EAGLE group
    supports_partial_tail: torch.Tensor  # vLLM 0.33's SchedulerOffloadConfig.supports_partial_tail
    margin: torch.Tensor  # [R, G] each group's EAGLE proof margin (0.33 _eagle_proof_margins)


def request_features(batch: PlanBatch) -> Requests | None:
    """``supports_partial_tail`` and the EAGLE proof margins, derived from the config as
    vLLM derives them at scheduler start (over the offloaded groups): one block per
    chunk, one block size, an align-mode Mamba group with tokens_per_block >
    tokens_per_hash, no windowed group but such a Mamba group, no DCP; an offloaded
    EAGLE group that is not a CoW source keys its tail one hash unit (fine-grained
    lookup: alignment below the block size, a full-attention or Mamba group) or one
    block past the boundary."""
    if not batch.uses_v2:
        return None
    R, G, _ = batch.shape
    valid = torch.arange(G, device=batch.device) < batch.num_groups.unsqueeze(1)
    off = valid & batch.offloaded
    b, kind = batch.tokens_per_block.to(torch.int64), batch.kind
    tph = batch.tokens_per_hash.to(torch.int64).unsqueeze(1)
    align_mode = (batch.mamba_cache_mode == MAMBA_MODE_CODES[None]) | (batch.mamba_cache_mode == MAMBA_MODE_CODES["align"])
    cow = (kind == KIND_MAMBA) & align_mode  # vLLM's requires_cow_source
    big = torch.iinfo(torch.int64).max
    one_size = torch.where(off, b, big).amin(1) == torch.where(off, b, 0).amax(1)
    spt = ((batch.blocks_per_chunk == 1) & one_size & (off & cow & (b > tph)).any(1)
           & ~(off & (kind != KIND_FULL) & ~cow).any(1) & (batch.decode_context_parallel_size == 1))
    first_off = off.to(torch.int8).argmax(1, keepdim=True)  # first offloaded group
    block = torch.where(spt, b.gather(1, first_off).squeeze(1), 0).unsqueeze(1)  # _partial_tail_block_size
    align = batch.cache_hit_alignment_tokens.to(torch.int64).unsqueeze(1)
    fine = (align >= 0) & (align < block) & ((kind == KIND_FULL) | (kind == KIND_MAMBA))
    margin = torch.where(fine & (block > tph), tph, block)
    margin = torch.where(off & batch.is_eagle_group & ~cow & spt.unsqueeze(1), margin, 0)
    return Requests(
        tail=batch.partial_tail_boundary >= 0, boundary=batch.partial_tail_boundary.to(torch.int64),
        T=(batch.num_locally_computed_tokens + batch.num_external_tokens).to(torch.int64),
        subset=(valid & ~batch.offloaded).any(1),
        retained=(valid & (batch.extra_retained_tokens > 0)).any(1),
        eagle=(off & batch.is_eagle_group).any(1),
        supports_partial_tail=spt, margin=margin,
    )


def unsupported(req: Requests | None, release: ReleaseFeatures) -> torch.Tensor | None:
    """[R] the requests this release could not have made the call for (a v2 feature it
    lacks: group subsets before 0.30, retained tokens before 0.28, partial tails before
    0.28, a partial tail with an EAGLE group before 0.33); None when there are none."""
    if req is None:
        return None
    out = torch.zeros_like(req.tail)
    if not release.group_subsets:
        out |= req.subset
    if not release.extra_retained_tokens:
        out |= req.retained
    if not release.partial_tails:
        out |= req.tail
    elif not release.eagle_partial_tails:
        out |= req.tail & ~(req.supports_partial_tail & ~req.eagle)
    return out


# --- cells: the (request, group) pairs vLLM plans -------------------------------

@dataclass
class Cells:
    """The (request, group) pairs vLLM plans, one entry each ([C] tensors): every
    offloaded group of every request with external tokens.

    ``request``/``group`` say where a cell sits in the padded batch (``group`` is the
    group's ``group_idx``); cells are in request order and, within a request, in
    config order, so request r's cells are ``start[r] : start[r] + count[r]``. Request
    fields are expanded per cell once: a broadcast operand makes every element-wise op
    several times slower on CPU.
    """

    R: int
    G: int
    L: int
    request: torch.Tensor  # [C] int64
    group: torch.Tensor  # [C] int64
    start: torch.Tensor  # [R] int64: first cell of each request
    count: torch.Tensor  # [R] int64: cells of each request (0: nothing planned)
    planned: torch.Tensor  # [R] bool: num_external_tokens > 0
    N: torch.Tensor  # num_locally_computed_tokens
    T: torch.Tensor  # num_cached_tokens = N + num_external_tokens
    b: torch.Tensor  # tokens_per_block
    bpc: torch.Tensor  # blocks_per_chunk
    num_tokens: torch.Tensor  # the request's tokens: its offload keys cover all of them
    kind: torch.Tensor
    window_tokens: torch.Tensor
    table_length: torch.Tensor
    sync_load: torch.Tensor  # [C] bool
    state: torch.Tensor | None  # [C, L] uint8 block states (None when the batch came packed: see ``states``)
    requests: Requests | None = None
    tail: torch.Tensor | None = None  # [C] 0/1: the request has a partial tail (None: no v2 field anywhere)
    boundary_key: torch.Tensor | None = None  # [C] boundary + the group's EAGLE proof margin
    extra_retained: torch.Tensor | None = None  # [C] extra_retained_tokens
    table_flat: torch.Tensor | None = None  # [C] request * G + the blocks.blocks index whose table the cell reads
    words: torch.Tensor | None = None  # [C, 2, W] the batch's slot_words of each cell, when it has them

    @property
    def size(self) -> int:
        return int(self.request.shape[0])

    def plane(self, plane: int, of: torch.Tensor | None = None) -> torch.Tensor:
        """[W, C'] packed bits of the cells ``of`` (default all): PLANE_UNHASHED (U blocks)
        or PLANE_NONNULL; from the batch's packed words, else packed here."""
        if self.words is not None:
            w = self.words[:, plane] if of is None else self.words.index_select(0, of)[:, plane]
            return w.t().contiguous()
        state = self.state if of is None else self.state.index_select(0, of)
        return pack_slots(state >> 1 if plane == PLANE_UNHASHED else (state + 1) >> 1)

    def states(self) -> torch.Tensor:
        """[C, L] uint8 block states (unpacked on demand when the batch came packed)."""
        return self.state if self.state is not None else unpack_states(self.words, self.L)


def cell_blocks(batch: PlanBatch, flat: torch.Tensor) -> tuple:
    """(state, words) of the tables ``flat`` (request * G + group) selects: the packed
    words alone when the batch has them (16 bytes a group instead of L), else the bytes."""
    R, G, L = batch.shape
    if batch.slot_words is not None:
        return None, batch.slot_words.reshape(R * G, -1).index_select(0, flat).view(-1, 2, batch.slot_words.shape[-1])
    return _gather_rows(batch.state.reshape(R * G, L), flat), None


def _int_type(batch: PlanBatch) -> torch.dtype:
    """The narrowest integer type every intermediate fits: on CPU an int16 op runs ~3x
    faster than an int32 one."""
    R, G, L = batch.shape
    b_max, bpc_max = int(batch.tokens_per_block.max()), int(batch.blocks_per_chunk.max())
    w_max = int(batch.window_tokens.max()) + int(batch.extra_retained_tokens.max())
    big = max(int((batch.num_locally_computed_tokens + batch.num_external_tokens).max()) + b_max * bpc_max,
              int(batch.num_tokens.max()), int(batch.partial_tail_boundary.max()) + b_max + 64,
              (w_max + 1) * bpc_max + 1, b_max * bpc_max + w_max, (L + 1) * b_max, G + 1)
    return torch.int16 if big < 2**15 - 2 else torch.int32 if big < 2**24 else torch.int64


def _gather_rows(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t[rows]`` for a [n, L] uint8 table, moved 8 slots per int64 when L allows
    (index_select copies a row of 6 int64 faster than one of 48 bytes)."""
    if t.shape[1] % 8 == 0 and t.is_contiguous():
        return t.view(torch.int64).index_select(0, rows).view(torch.uint8)
    return t.index_select(0, rows)


def real_cells(batch: PlanBatch) -> Cells:
    """Step 0: keep the (request, group) pairs vLLM plans: drop padding, groups the
    connector does not offload, and requests with nothing external (vLLM returns
    before planning them)."""
    R, G, L = batch.shape
    it = _int_type(batch)
    req = request_features(batch)
    planned = batch.num_external_tokens > 0
    gidx = torch.arange(G, device=batch.device)
    if req is None:  # every group offloaded: request r's cells are its groups 0 .. num_groups - 1
        count = torch.where(planned, batch.num_groups, 0).to(torch.int64)
        start = torch.cumsum(count, 0) - count
        C = int(count.sum())
        request = torch.repeat_interleave(torch.arange(R, device=batch.device), count, output_size=C)
        group = torch.arange(C, device=batch.device) - start.index_select(0, request)
        flat = request * G + group
    else:
        keep = (gidx < batch.num_groups.unsqueeze(1)) & batch.offloaded & planned.unsqueeze(1)
        flat = keep.reshape(-1).nonzero().flatten()
        request, group = torch.div(flat, G, rounding_mode="floor"), flat % G
        count = keep.sum(1).to(torch.int64)
        start = torch.cumsum(count, 0) - count

    def per_request(t):
        return t.index_select(0, request).to(it)

    def per_group(t):
        return t.reshape(R * G).index_select(0, flat).to(it)

    N = per_request(batch.num_locally_computed_tokens)
    state, words = cell_blocks(batch, flat)
    cells = Cells(
        R=R, G=G, L=L, request=request, group=group, start=start, count=count, planned=planned,
        N=N, T=N + per_request(batch.num_external_tokens),
        b=per_group(batch.tokens_per_block), bpc=per_request(batch.blocks_per_chunk),
        num_tokens=per_request(batch.num_tokens),
        kind=batch.kind.reshape(R * G).index_select(0, flat),
        window_tokens=per_group(batch.window_tokens), table_length=per_group(batch.table_length),
        sync_load=batch.sync_load.index_select(0, request),
        state=state, words=words,
        requests=req, table_flat=flat,
    )
    if req is not None:
        cells.tail = req.tail.index_select(0, request).to(it)
        cells.boundary_key = (req.boundary.index_select(0, request) + per_group(req.margin)).to(it)
        cells.extra_retained = per_group(batch.extra_retained_tokens)
    return cells


# --- the geometry every variant shares ---------------------------------------------

@dataclass
class Geometry:
    """What every variant computes alike, once per batch ([C] each)."""

    k: torch.Tensor  # num_gpu_blocks = cdiv(T, b)
    f: torch.Tensor  # first_fresh_gpu_block_idx = cdiv(N, b)
    table_short: torch.Tensor  # len(group_blocks) < k: even python -O indexes past the table
    misaligned: torch.Tensor  # N % b != 0 (f * b != N)
    windowed: torch.Tensor  # every kind but full attention has a window in chunks
    tpc: torch.Tensor  # tokens_per_chunk = b * blocks_per_chunk
    num_chunks: torch.Tensor  # cdiv(T, tokens_per_chunk)
    end_chunk_limit: torch.Tensor  # the keys' end_chunk_idx: num_chunks, less a partial tail's last chunk
    num_offload_keys: torch.Tensor  # one key per chunk of hashes of all num_tokens
    keep_fresh: torch.Tensor | None = None  # the fixed scan's word masks (slots >= f)
    _windows: dict | None = None  # window_counts_retained -> sliding_window_size_in_chunks


def group_geometry(cells: Cells) -> Geometry:
    """k, f and the per-group bounds the asserts compare against."""
    b, bpc = cells.b, cells.bpc
    k, f = cdiv(cells.T, b), cdiv(cells.N, b)
    tpc = b * bpc
    num_chunks = cdiv(k, bpc)  # cdiv(cdiv(T, b), bpc) == cdiv(T, b * bpc)
    return Geometry(
        k=k, f=f,
        table_short=cells.table_length < k,
        misaligned=f * b != cells.N,
        windowed=cells.kind != KIND_FULL,
        tpc=tpc,
        num_chunks=num_chunks,
        end_chunk_limit=num_chunks if cells.tail is None else num_chunks - cells.tail,
        # (num_tokens // tokens_per_hash) // (tpc // tokens_per_hash) == num_tokens // tpc
        num_offload_keys=floordiv(cells.num_tokens, tpc),
        _windows={},
    )
