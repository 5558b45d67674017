"""``update_state_after_alloc``'s load plan for a whole batch at once, in torch.

The padded batch is first compacted to its *cells*: the (request, group) pairs vLLM
actually plans (every real group of every request with external tokens), in request
then config order. Each step of vLLM's per-group loop is then one function over all
cells at once:

    num_gpu_blocks / first_fresh_gpu_block_idx     k = cdiv(T, b), f = cdiv(N, b)
    table_length assert                            len(group_blocks) >= k
    load_start_gpu_block_idx                       the variant's scan over [scan_from, k)
    boundary / alignment assert                    the variant's assert after the scan
    num_pending_gpu_blocks, window_bound assert    k - start <= window * bpc + 1
    offload keys, keys_length assert               chunks [start // bpc, cdiv(T, tpc))
    the first failing group                        a per-request minimum in config order

No Python loop over requests, groups or blocks, and no input a ``Case`` allows can
make it raise: an assert vLLM would hit comes back as a code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbound.spec import Assertion, AssertName, GroupPlan, LoadPlan, ReleaseFeatures, Variant, variant_features
from kvbound.spec.asserts import ASSERT_CODE, ASSERT_OF_CODE, ASSERTS, NO_ASSERT

from kvbound.spec import KIND_FULL, KIND_MAMBA, KIND_SLIDING, STATE_H, STATE_N, STATE_U

from .batch import (MAMBA_MODE_CODES, PLANE_NONNULL, PLANE_UNHASHED, SLOT_WORD, PlanBatch, cdiv, floordiv, pack_slots,
                    unpack_states)

assert (STATE_N, STATE_H, STATE_U) == (0, 1, 2), "the scan's bit tricks assume these codes"

# Outcome codes, names and reported values: spec/asserts.py's table (vLLM's per-group order).
CODE_UNSUPPORTED = len(ASSERT_CODE) + 1  # request outcome "unsupported": the release lacks a v2 feature

# An Assertion's ``values`` key -> the BatchPlan field that holds it, so the impl's
# numbers at the failing group can be compared with the spec's one for one.
ASSERTION_VALUE_FIELDS = {
    "table_length": "table_length",
    "num_gpu_blocks": "num_gpu_blocks",
    "num_locally_computed_tokens": "num_locally_computed_tokens",
    "load_start_gpu_block_idx": "load_start_gpu_block_idx",
    "tokens_per_block": "tokens_per_block",
    "first_fresh_gpu_block_idx": "first_fresh_gpu_block_idx",
    "num_pending_gpu_blocks": "num_pending_gpu_blocks",
    "sliding_window_size_in_chunks": "window_in_chunks",
    "blocks_per_chunk": "blocks_per_chunk",
    "num_offload_keys": "num_offload_keys",
    "end_chunk_idx": "end_chunk_limit",
    "partial_tail_boundary": "partial_tail_boundary",
    "num_cached_tokens": "num_cached_tokens",
}
# Which values each assertion reports (the spec's Assertion.values keys).
ASSERTION_VALUES = {row.name: row.values for row in ASSERTS}
# The per-cell outputs compared with the spec's GroupPlan fields of the same name.
GROUP_FIELDS = ("group_index", "num_gpu_blocks", "first_fresh_gpu_block_idx", "load_start_gpu_block_idx",
                "num_pending_gpu_blocks", "start_chunk_idx", "end_chunk_idx", "boundary_key_tokens")
NO_KEY = -1  # boundary_key_tokens of a group with no partial-tail key (None)


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


# --- the scan over packed block states ------------------------------------------

_WORD = SLOT_WORD
_WORD_MASK = (1 << _WORD) - 1


def keep_from(scan_from: torch.Tensor, num_words: int) -> torch.Tensor:
    """[W, C] masks that clear, word by word, the bits of slots below ``scan_from``."""
    base = torch.arange(0, num_words * _WORD, _WORD, device=scan_from.device).view(num_words, 1)
    below = (scan_from.to(torch.int64) - base).clamp_(0, _WORD)
    return torch.bitwise_left_shift(_WORD_MASK, below).bitwise_and_(_WORD_MASK)


def first_set_slot(words: torch.Tensor, keep: torch.Tensor | None, none: int) -> torch.Tensor:
    """[C] int32: the first slot whose bit is set in ``words`` [W, C] (after ``keep``
    clears the slots below the scan start); >= ``none`` if there is none. Arithmetic only:
    torch's CPU ``where`` on bool masks is many times slower."""
    W = words.shape[0]
    if keep is not None:
        words = words & keep
    words = words | (1 << _WORD)  # a sentinel bit: an empty word reads as "slot 56"
    lowest = words & -words  # 2**e, e <= 56: exact in float64; e is its exponent field
    e = ((lowest.to(torch.float64).view(torch.int64) >> 52) - 1023).to(torch.int32)
    pos = e + ((e + 8) >> 6) * none  # e == 56 (empty) -> beyond every slot
    if W == 1:
        return pos[0]
    base = torch.arange(0, W * _WORD, _WORD, device=words.device, dtype=torch.int32).view(W, 1)
    return (pos + base).amin(0)  # int32: torch's int64 amin is many times slower


def scan_words(cells: Cells, variant: Variant, unhashed: torch.Tensor) -> torch.Tensor:
    """The packed slots the variant's scan looks for: non-null unhashed blocks, or for a
    0.33 sync load any non-null block (position match). States are N=0, H=1, U=2:
    "unhashed" is bit 1, "non-null" is (state + 1) >> 1."""
    if variant is not Variant.FIXED_SYNC:
        return unhashed
    sync = cells.sync_load.nonzero().flatten()
    if not len(sync):
        return unhashed
    words = unhashed.clone()
    words[:, sync] = cells.plane(PLANE_NONNULL, sync)
    return words


# --- the steps of vLLM's per-group loop, over all cells ---------------------------

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


def window_in_chunks(cells: Cells, geo: Geometry, release: ReleaseFeatures) -> torch.Tensor:
    """sliding_window_size_in_chunks (vLLM's ``get_sliding_window_size_in_chunks``):
    cdiv(window, tpc); from 0.31 a sliding window's retained tokens count,
    max(cdiv(w, tpc), cdiv(w - 1 + extra_retained_tokens, tpc)); Mamba "a single
    state"; -1 for full attention (no window)."""
    counts = bool(release.window_counts_retained and cells.extra_retained is not None)
    if counts not in geo._windows:
        window = torch.where(cells.kind == KIND_MAMBA, 1, cdiv(cells.window_tokens, geo.tpc))
        if counts:
            retained = cdiv((cells.window_tokens - 1 + cells.extra_retained).clamp(min=0), geo.tpc)
            use = (cells.kind == KIND_SLIDING) & (cells.extra_retained > 0)
            window = torch.where(use, torch.maximum(window, retained), window)
        geo._windows[counts] = torch.where(geo.windowed, window, -1)
    return geo._windows[counts]


def load_start(cells: Cells, geo: Geometry, variant: Variant, words: torch.Tensor) -> torch.Tensor:
    """load_start_gpu_block_idx: the first wanted slot in [scan_from, k), else k.
    Legacy scans from 0, the fix from the first fresh block f."""
    keep = None
    if variant is not Variant.LEGACY:
        if geo.keep_fresh is None:
            geo.keep_fresh = keep_from(geo.f, words.shape[0])
        keep = geo.keep_fresh
    return torch.minimum(first_set_slot(words, keep, cells.L).to(geo.k.dtype), geo.k)


def pending_blocks(geo: Geometry, start: torch.Tensor) -> torch.Tensor:
    """num_pending_gpu_blocks = k - load_start_gpu_block_idx: the group's size in the plan."""
    return geo.k - start


def offload_key_chunks(cells: Cells, geo: Geometry, start: torch.Tensor, pending: torch.Tensor):
    """The chunk range [start_chunk, end_chunk) whose keys the group loads, and a
    partial tail's boundary key (the token position its hash is read at, NO_KEY for
    none); empty when nothing is pending. vLLM slices ``offload_keys[start:end]``:
    a short key list just yields fewer keys (python -O)."""
    start_chunk = floordiv(start, cells.bpc)
    end = torch.maximum(start_chunk, torch.minimum(geo.end_chunk_limit, geo.num_offload_keys))
    loads = pending > 0
    # where(c, x, y) as y + c * (x - y): torch's CPU where is many times slower
    end_chunk = start_chunk + loads * (end - start_chunk)
    if cells.tail is None:
        return start_chunk, end_chunk, None
    return start_chunk, end_chunk, torch.where(loads & (cells.tail > 0), cells.boundary_key, NO_KEY)


def assert_codes(cells: Cells, geo: Geometry, variant: Variant, release: ReleaseFeatures, asserts: bool,
                 start: torch.Tensor, pending: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """The first assert each group hits in vLLM's order (table length, the scan's
    assert, window bound, keys length), 0 if none. ``asserts=False`` is python -O:
    only the table length, which would index past the table, still stops the plan."""
    code = geo.table_short * ASSERT_CODE[AssertName.TABLE_LENGTH]
    if not asserts:
        return code.to(torch.uint8)
    if variant is Variant.LEGACY:
        scan_fail, scan_code = cells.N > start * cells.b, ASSERT_CODE[AssertName.BOUNDARY]
    else:
        scan_fail, scan_code = geo.misaligned, ASSERT_CODE[AssertName.ALIGNMENT]
    checks = [(scan_fail, scan_code)]
    if release.window_slack is not None:  # 0.20 has no window assert
        over = geo.windowed & (pending > window * cells.bpc + release.window_slack)
        checks.append((over, ASSERT_CODE[AssertName.WINDOW_BOUND]))
    keyed = (pending > 0) | release.keys_every_group  # up to 0.27 every group's keys are checked
    checks.append((keyed & (geo.num_offload_keys < geo.end_chunk_limit), ASSERT_CODE[AssertName.KEYS_LENGTH]))
    # later in vLLM's order = lower priority: each is written only where no earlier one fired
    for fired, c in checks:
        code = code + ((code == 0) & fired) * c
    return code.to(torch.uint8)


def first_failing_group(cells: Cells, code: torch.Tensor) -> torch.Tensor:
    """[R] the first group in config order whose assert fires (vLLM stops there); -1: none."""
    g = cells.group + (code == 0) * cells.G  # a group that passes sorts after every real one
    first = torch.full((cells.R,), cells.G, dtype=torch.int64, device=g.device)
    first.scatter_reduce_(0, cells.request, g, reduce="amin")
    return torch.where(first >= cells.G, -1, first)


def request_outcome(cells: Cells, release: ReleaseFeatures, asserts: bool) -> torch.Tensor | None:
    """[R] what stops a request before its groups, in vLLM's order: the release cannot
    have made the call (CODE_UNSUPPORTED), or the ``partial_tail`` assert
    (partial_tail_boundary == num_cached_tokens); 0 for neither, None when no request
    uses a v2 field."""
    req = cells.requests
    if req is None:
        return None
    code = (req.tail & (req.boundary != req.T)).to(torch.uint8) * ASSERT_CODE[AssertName.PARTIAL_TAIL]
    if not asserts:
        code.zero_()
    bad = unsupported(req, release)
    return torch.where(bad, CODE_UNSUPPORTED, code).to(torch.uint8)


# --- the plan -------------------------------------------------------------------

@dataclass
class BatchPlan:
    """Outputs per cell ([C], see ``Cells``) unless noted.

    ``code`` is the assert this group would hit if vLLM reached it (0 none). A request
    stops before its groups on ``stop`` [R] (CODE_UNSUPPORTED or the partial_tail
    assert's code; None: no request uses a v2 field), else at ``failing_group`` [R]
    (-1: none), the first group in config order with a code. ``dense(name)`` lays a
    per-cell output out as [R, G] (zeros off the cells); ``dst_block_ids`` gathers the
    destination blocks.
    """

    variant: Variant
    asserts: bool
    release: ReleaseFeatures
    cells: Cells
    num_gpu_blocks: torch.Tensor
    first_fresh_gpu_block_idx: torch.Tensor
    load_start_gpu_block_idx: torch.Tensor
    num_pending_gpu_blocks: torch.Tensor
    start_chunk_idx: torch.Tensor
    end_chunk_idx: torch.Tensor
    end_chunk_limit: torch.Tensor
    num_offload_keys: torch.Tensor
    window_in_chunks: torch.Tensor  # -1 for full attention (no window)
    boundary_key: torch.Tensor | None  # NO_KEY or the partial tail's key position (None: no tails)
    code: torch.Tensor
    failing_group: torch.Tensor  # [R]
    stop: torch.Tensor | None  # [R]

    # inputs echoed for the assertion values and the group fields
    @property
    def group_index(self):
        return self.cells.group

    @property
    def boundary_key_tokens(self):
        return self.boundary_key if self.boundary_key is not None else torch.full_like(self.code, NO_KEY, dtype=torch.int16)

    @property
    def table_length(self):
        return self.cells.table_length

    @property
    def tokens_per_block(self):
        return self.cells.b

    @property
    def num_locally_computed_tokens(self):
        return self.cells.N

    @property
    def blocks_per_chunk(self):
        return self.cells.bpc

    @property
    def partial_tail_boundary(self):
        req = self.cells.requests
        return req.boundary.index_select(0, self.cells.request) if req is not None else torch.full_like(self.cells.N, -1)

    @property
    def num_cached_tokens(self):
        return self.cells.T

    @property
    def planned(self) -> torch.Tensor:
        return self.cells.planned

    @property
    def stopped(self) -> torch.Tensor:
        """[R] stopped before any group (unsupported, or the partial_tail assert)."""
        return torch.zeros_like(self.cells.planned) if self.stop is None else self.stop > 0

    @property
    def unsupported(self) -> torch.Tensor:
        return torch.zeros_like(self.cells.planned) if self.stop is None else self.stop == CODE_UNSUPPORTED

    @property
    def ok(self) -> torch.Tensor:
        return (self.failing_group < 0) & ~self.stopped

    @property
    def request_code(self) -> torch.Tensor:
        """[R] the request's outcome code: 0 ok, an assert's code, or CODE_UNSUPPORTED."""
        out = torch.zeros(self.cells.R, dtype=torch.int64, device=self.code.device)
        bad = (self.failing_group >= 0).nonzero().flatten()
        at = self.cells.start.index_select(0, bad) + self.failing_group.index_select(0, bad)
        out.index_copy_(0, bad, self.code.to(torch.int64).index_select(0, at))
        if self.stop is not None:
            out = torch.where(self.stopped, self.stop.to(torch.int64), out)
        return out

    @property
    def reached(self) -> torch.Tensor:
        """[C] the groups vLLM plans before the failing one (a LoadPlan's ``groups``)."""
        upto = torch.where(self.failing_group < 0, self.cells.G, self.failing_group)
        if self.stop is not None:
            upto = torch.where(self.stopped, 0, upto)
        return self.cells.group < upto.index_select(0, self.cells.request)

    @property
    def dst_cells(self) -> torch.Tensor:
        """[C] cells whose destination blocks vLLM hands on: reached, in a request that plans fine."""
        return self.reached & self.ok.index_select(0, self.cells.request)

    def dst_block_ids(self, block_id: torch.Tensor, of: torch.Tensor | None = None):
        """The destination block ids [start, k) of the cells ``of`` selects (default
        ``dst_cells``), flat in cell order, and how many each cell has ([C]). Gathered
        from the ragged ranges alone: no [C, L] mask is built."""
        of = self.dst_cells if of is None else of
        n = torch.where(of, self.num_pending_gpu_blocks.to(torch.int64), 0).clamp(min=0)  # (mutants: < 0)
        total = int(n.sum())
        cell = torch.repeat_interleave(torch.arange(n.shape[0], device=n.device), n, output_size=total)
        offset = torch.cumsum(n, 0) - n
        slot = torch.arange(total, device=n.device) - offset.index_select(0, cell) \
            + self.load_start_gpu_block_idx.to(torch.int64).index_select(0, cell)
        L = self.cells.L
        flat = self.cells.table_flat.index_select(0, cell) * L + slot.clamp(max=L - 1)  # (mutants: past k)
        return block_id.reshape(-1).index_select(0, flat), n

    @property
    def dst_mask(self) -> torch.Tensor:
        """[R, G, L] the destination slots [start, k) of every group whose own code is 0
        (built on demand; the comparison uses ``dst_block_ids``)."""
        c = self.cells
        slot = torch.arange(c.L, device=self.code.device)
        start = self.load_start_gpu_block_idx.unsqueeze(-1)
        good = (self.code == 0).unsqueeze(-1)
        mask = (slot >= start) & (slot < start + self.num_pending_gpu_blocks.unsqueeze(-1)) & good
        out = torch.zeros((c.R * c.G, c.L), dtype=torch.bool, device=mask.device)
        out[c.request * c.G + c.group] = mask
        return out.view(c.R, c.G, c.L)

    def dense(self, name: str) -> torch.Tensor:
        """[R, G] a per-cell output laid out over the padded batch, 0 off the cells."""
        t = getattr(self, name)
        c = self.cells
        out = torch.zeros(c.R * c.G, dtype=t.dtype, device=t.device)
        out[c.request * c.G + c.group] = t
        return out.view(c.R, c.G)

    def value(self, key: str) -> torch.Tensor:
        """[C] the tensor behind an Assertion values key."""
        return getattr(self, ASSERTION_VALUE_FIELDS[key])


def plan_cells(cells: Cells, geo: Geometry, variant: Variant, asserts: bool, words: torch.Tensor,
               release: ReleaseFeatures | None = None) -> BatchPlan:
    """One variant (and release, default the variant's last: the spec's default):
    vLLM's per-group loop as one pass of steps over every cell."""
    release = release or variant_features(variant)
    start = load_start(cells, geo, variant, words)
    pending = pending_blocks(geo, start)
    window = window_in_chunks(cells, geo, release)
    start_chunk, end_chunk, boundary_key = offload_key_chunks(cells, geo, start, pending)
    code = assert_codes(cells, geo, variant, release, asserts, start, pending, window)
    stop = request_outcome(cells, release, asserts)
    failing = first_failing_group(cells, code)
    if stop is not None:  # a request stopped before its groups has no failing group
        failing = torch.where(stop > 0, -1, failing)
    return BatchPlan(
        variant=variant, asserts=asserts, release=release, cells=cells,
        num_gpu_blocks=geo.k, first_fresh_gpu_block_idx=geo.f,
        load_start_gpu_block_idx=start, num_pending_gpu_blocks=pending,
        start_chunk_idx=start_chunk, end_chunk_idx=end_chunk, end_chunk_limit=geo.end_chunk_limit,
        num_offload_keys=geo.num_offload_keys, window_in_chunks=window, boundary_key=boundary_key,
        code=code, failing_group=failing, stop=stop,
    )


def plan_variants(batch: PlanBatch, variants=tuple(Variant), asserts: bool = True, check: bool = True) -> dict:
    """The spec's ``plan_load`` for every request of ``batch``, for each variant.

    ``asserts=False`` models ``python -O`` as the spec does. ``check`` runs the value
    checks first; a caller that built the batch itself (``batch_from_cases``, the
    generators) may skip them. Variants share the cells, the geometry and the packed
    table.
    """
    variants = [Variant(v) for v in variants]
    if check:
        batch.check_values()
    cells = real_cells(batch)
    geo = group_geometry(cells)
    unhashed = cells.plane(PLANE_UNHASHED)
    return {v: plan_cells(cells, geo, v, asserts, scan_words(cells, v, unhashed)) for v in variants}


def plan_batch(batch: PlanBatch, variant: Variant | str, asserts: bool = True, check: bool = True) -> BatchPlan:
    """One variant of ``plan_variants``."""
    variant = Variant(variant)
    return plan_variants(batch, (variant,), asserts, check)[variant]


def to_load_plans(batch: PlanBatch, out: BatchPlan, rows=None) -> list[LoadPlan]:
    """The impl's outputs as spec ``LoadPlan``s, to compare, draw or print as JSON.

    Messages and reasons are the impl's own (they say which numbers it saw); compare
    plans with ``plan_fields``, which leaves them out.
    """
    rows = range(batch.shape[0]) if rows is None else list(rows)
    cells = out.cells
    col = {name: getattr(out, name).cpu().tolist() for name in GROUP_FIELDS + ("code",)}
    vals = {key: out.value(key).cpu().tolist() for key in ASSERTION_VALUE_FIELDS}
    start, count = cells.start.cpu().tolist(), cells.count.cpu().tolist()
    failing = out.failing_group.cpu().tolist()
    stop = out.stop.cpu().tolist() if out.stop is not None else [0] * cells.R
    req = cells.requests
    boundary = req.boundary.cpu().tolist() if req is not None else None
    T = (batch.num_locally_computed_tokens + batch.num_external_tokens).cpu().tolist()
    ids, n = out.dst_block_ids(batch.block_id, out.reached)
    ids, n = ids.cpu().tolist(), n.cpu().tolist()
    id_at = [0]
    for x in n:
        id_at.append(id_at[-1] + x)
    plans = []
    for r in rows:
        if stop[r] == CODE_UNSUPPORTED:
            plans.append(LoadPlan(out.variant, (), None, out.asserts,
                                  unsupported=f"(batched impl) vLLM {out.release.release} lacks a feature this case uses"))
            continue
        if stop[r]:
            values = {"partial_tail_boundary": boundary[r], "num_cached_tokens": T[r]}
            plans.append(LoadPlan(out.variant, (), Assertion(AssertName.PARTIAL_TAIL, None,
                                  f"(batched impl) partial_tail: {values}", values), out.asserts))
            continue
        if not count[r]:
            plans.append(LoadPlan(out.variant, (), None, out.asserts))
            continue
        s = start[r]
        cell_range = range(s, s + count[r])
        upto = [c for c in cell_range if failing[r] < 0 or col["group_index"][c] < failing[r]]
        groups = tuple(
            GroupPlan(
                **{f: col[f][c] for f in GROUP_FIELDS if f != "boundary_key_tokens"},
                dst_block_ids=tuple(ids[id_at[c]:id_at[c + 1]]),
                boundary_key_tokens=None if col["boundary_key_tokens"][c] == NO_KEY else col["boundary_key_tokens"][c],
            )
            for c in upto
        )
        assertion = None
        if failing[r] >= 0:
            c = s + len(upto)
            name = ASSERT_OF_CODE[col["code"][c]]
            values = {key: vals[key][c] for key in ASSERTION_VALUES[name]}
            shown = ", ".join(f"{k}={v}" for k, v in values.items())
            assertion = Assertion(name, failing[r], f"(batched impl) {name.value}: {shown}", values)
        plans.append(LoadPlan(out.variant, groups, assertion, out.asserts))
    return plans


def plan_fields(plan: LoadPlan) -> tuple:
    """What two plans must share to agree: outcome (ok, the assertion, or unsupported),
    the failing group and its numbers, and every planned group's fields (which fix
    dst_block_ids, group_sizes, block_indices and keys). Messages and reasons are prose
    and left out."""
    a = plan.assertion
    head = None if a is None else (a.name, a.group_index, tuple(sorted(a.values.items())))
    return head, plan.groups, plan.unsupported is not None
