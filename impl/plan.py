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

from kvbound.spec import Assertion, AssertName, GroupPlan, LoadPlan, Variant

from .batch import KIND_FULL, KIND_MAMBA, STATE_H, STATE_N, STATE_U, PlanBatch

assert (STATE_N, STATE_H, STATE_U) == (0, 1, 2), "the scan's bit tricks assume these codes"

CODE_OK = 0
# Codes in vLLM's per-group order; the spec's AssertName order is the same.
ASSERT_CODES = {name: i + 1 for i, name in enumerate(AssertName)}
ASSERT_NAMES = {c: n for n, c in ASSERT_CODES.items()}

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
    "end_chunk_idx": "num_chunks",
}
# Which values each assertion reports (the spec's Assertion.values keys).
ASSERTION_VALUES = {
    AssertName.TABLE_LENGTH: ("table_length", "num_gpu_blocks"),
    AssertName.BOUNDARY: ("num_locally_computed_tokens", "load_start_gpu_block_idx", "tokens_per_block",
                          "first_fresh_gpu_block_idx"),
    AssertName.ALIGNMENT: ("num_locally_computed_tokens", "tokens_per_block", "load_start_gpu_block_idx"),
    AssertName.WINDOW_BOUND: ("num_pending_gpu_blocks", "sliding_window_size_in_chunks", "blocks_per_chunk",
                              "load_start_gpu_block_idx"),
    AssertName.KEYS_LENGTH: ("num_offload_keys", "end_chunk_idx", "load_start_gpu_block_idx"),
}
# The per-cell outputs compared with the spec's GroupPlan fields of the same name.
GROUP_FIELDS = ("num_gpu_blocks", "first_fresh_gpu_block_idx", "load_start_gpu_block_idx",
                "num_pending_gpu_blocks", "start_chunk_idx", "end_chunk_idx")


# --- cells: the (request, group) pairs vLLM plans -------------------------------

@dataclass
class Cells:
    """The real (request, group) pairs of a batch, one entry each ([C] tensors).

    ``request``/``group`` say where a cell sits in the padded batch; cells are in
    request order and, within a request, in config order, so request r's cells are
    ``start[r] : start[r] + count[r]``. Request fields are expanded per cell once:
    a broadcast operand makes every element-wise op several times slower on CPU.
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
    P: torch.Tensor  # num_prompt_tokens
    kind: torch.Tensor
    window_tokens: torch.Tensor
    table_length: torch.Tensor
    sync_load: torch.Tensor  # [C] bool
    state: torch.Tensor  # [C, L] uint8 block states

    @property
    def size(self) -> int:
        return int(self.request.shape[0])


def _int_type(batch: PlanBatch) -> torch.dtype:
    """The narrowest integer type every intermediate fits: on CPU an int16 op runs ~3x
    faster than an int32 one."""
    R, G, L = batch.shape
    b_max, bpc_max = int(batch.tokens_per_block.max()), int(batch.blocks_per_chunk.max())
    w_max = int(batch.window_tokens.max())
    big = max(int((batch.num_locally_computed_tokens + batch.num_external_tokens).max()) + b_max * bpc_max,
              int(batch.num_prompt_tokens.max()), (w_max + 1) * bpc_max + 1, b_max * bpc_max + w_max,
              (L + 1) * b_max, G + 1)
    return torch.int16 if big < 2**15 - 2 else torch.int32 if big < 2**24 else torch.int64


def real_cells(batch: PlanBatch) -> Cells:
    """Step 0: keep the (request, group) pairs vLLM plans, drop padding and requests
    with nothing external (vLLM returns before planning them)."""
    R, G, L = batch.shape
    it = _int_type(batch)
    planned = batch.num_external_tokens > 0
    count = torch.where(planned, batch.num_groups, 0).to(torch.int64)
    start = torch.cumsum(count, 0) - count
    C = int(count.sum())
    request = torch.repeat_interleave(torch.arange(R, device=batch.device), count, output_size=C)
    group = torch.arange(C, device=batch.device) - start.index_select(0, request)
    flat = request * G + group

    def per_request(t):
        return t.index_select(0, request).to(it)

    def per_group(t):
        return t.reshape(R * G).index_select(0, flat).to(it)

    N = per_request(batch.num_locally_computed_tokens)
    return Cells(
        R=R, G=G, L=L, request=request, group=group, start=start, count=count, planned=planned,
        N=N, T=N + per_request(batch.num_external_tokens),
        b=per_group(batch.tokens_per_block), bpc=per_request(batch.blocks_per_chunk),
        P=per_request(batch.num_prompt_tokens),
        kind=batch.kind.reshape(R * G).index_select(0, flat),
        window_tokens=per_group(batch.window_tokens), table_length=per_group(batch.table_length),
        sync_load=batch.sync_load.index_select(0, request),
        state=batch.state.reshape(R * G, L).index_select(0, flat),
    )


# Integer division through float32: IEEE division is correctly rounded, so for
# 0 <= a < 2**24 and b >= 1 the floor/ceil of the quotient is exact (an integer
# quotient is exact; a non-integer one is at least 1/b from the next integer, more
# than its rounding error). torch's integer division has no vector kernel on CPU
# and costs ~10x more. ``_int_type`` picks int64, and exact division, past 2**24.
def _floordiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.int64:
        return torch.div(a, b, rounding_mode="floor")
    return torch.div(a.to(torch.float32), b.to(torch.float32)).floor_().to(a.dtype)


def _cdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cdiv of non-negative ``a`` by positive ``b``, as vLLM's ``cdiv``."""
    if a.dtype == torch.int64:
        return torch.div(a + b - 1, b, rounding_mode="floor")
    return torch.div(a.to(torch.float32), b.to(torch.float32)).ceil_().to(a.dtype)


# --- the scan over packed block states ------------------------------------------

_WORD = 56  # slots per packed word: 7 octets, so a sentinel bit 56 still converts to float64 exactly
_WORD_MASK = (1 << _WORD) - 1
_BYTES_TO_BITS = 0x0102040810204080  # x * this >> 56: the low bits of 8 bytes (0/1 each) as 8 bits


def pack_slots(bits: torch.Tensor) -> torch.Tensor:
    """[C, L] uint8 0/1 -> [W, C] int64 words, W = ceil(L/56), bit i of word w = slot 56w + i.

    The slot axis is read once as bytes and the rest works on 1/8 of the elements;
    this is what makes the scan cheap next to the spec's Python loop. Words lead
    so the minimum over them is plane-wise; tables up to 56 blocks take one word.
    """
    C, L = bits.shape
    if L % 8:
        bits = torch.cat([bits, bits.new_zeros((C, -L % 8))], dim=-1)
    octets = bits.contiguous().view(torch.int64)  # [C, L/8]: 8 slots per int64, one per byte
    octets = octets * _BYTES_TO_BITS  # wraps mod 2**64: wanted; in place below (no big temporaries)
    octets.bitwise_right_shift_(56).bitwise_and_(0xFF)
    octets = octets.t()  # [octet, C]
    per_word = _WORD // 8
    words = octets[0::per_word].clone()
    for j in range(1, per_word):  # the octets of a word, not a loop over blocks
        part = octets[j::per_word]
        words[: part.shape[0]] |= part << (8 * j)
    return words


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
    words[:, sync] = pack_slots((cells.state.index_select(0, sync) + 1) >> 1)
    return words


# --- the steps of vLLM's per-group loop, over all cells ---------------------------

@dataclass
class Geometry:
    """What every variant computes alike, once per batch ([C] each)."""

    k: torch.Tensor  # num_gpu_blocks = cdiv(T, b)
    f: torch.Tensor  # first_fresh_gpu_block_idx = cdiv(N, b)
    table_short: torch.Tensor  # len(group_blocks) < k: even python -O indexes past the table
    misaligned: torch.Tensor  # N % b != 0 (f * b != N)
    window: torch.Tensor  # sliding_window_size_in_chunks; -1 for full attention
    window_limit: torch.Tensor  # pending above this fails window_bound
    num_chunks: torch.Tensor  # end_chunk_idx = cdiv(T, tokens_per_chunk)
    num_offload_keys: torch.Tensor  # one key per chunk of prompt hashes
    keep_fresh: torch.Tensor | None = None  # the fixed scan's word masks (slots >= f)


def group_geometry(cells: Cells) -> Geometry:
    """k, f and the per-group bounds the asserts compare against."""
    b, bpc = cells.b, cells.bpc
    k, f = _cdiv(cells.T, b), _cdiv(cells.N, b)
    tpc = b * bpc
    windowed = cells.kind != KIND_FULL
    # vLLM's get_sliding_window_size_in_chunks: cdiv(window, tpc); Mamba "a single state"
    window = torch.where(cells.kind == KIND_MAMBA, 1, _cdiv(cells.window_tokens, tpc))
    window = torch.where(windowed, window, -1)
    big = torch.iinfo(k.dtype).max
    return Geometry(
        k=k, f=f,
        table_short=cells.table_length < k,
        misaligned=f * b != cells.N,
        window=window,
        window_limit=torch.where(windowed, window * bpc + 1, big),
        num_chunks=_cdiv(k, bpc),  # cdiv(cdiv(T, b), bpc) == cdiv(T, b * bpc)
        # (P // tokens_per_hash) // (tpc // tokens_per_hash) == P // tpc (tpc is a multiple of it)
        num_offload_keys=_floordiv(cells.P, tpc),
    )


def load_start(cells: Cells, geo: Geometry, variant: Variant, words: torch.Tensor) -> torch.Tensor:
    """load_start_gpu_block_idx: the first wanted slot in [scan_from, k), else k.
    Legacy scans from 0, the fix from the first fresh block f."""
    keep = None
    if variant is not Variant.LEGACY:
        if geo.keep_fresh is None:
            geo.keep_fresh = keep_from(geo.f, words.shape[0])
        keep = geo.keep_fresh
    return torch.minimum(first_set_slot(words, keep, cells.L).to(geo.k.dtype), geo.k)


def offload_key_chunks(cells: Cells, geo: Geometry, start: torch.Tensor, pending: torch.Tensor):
    """The chunk range [start_chunk, end_chunk) whose keys the group loads; empty when
    nothing is pending. vLLM slices ``offload_keys[start:end]``: a short key list just
    yields fewer keys (python -O)."""
    start_chunk = _floordiv(start, cells.bpc)
    end = torch.maximum(start_chunk, torch.minimum(geo.num_chunks, geo.num_offload_keys))
    # where(c, x, y) as y + c * (x - y): torch's CPU where is many times slower
    return start_chunk, start_chunk + (pending > 0) * (end - start_chunk)


def assert_codes(cells: Cells, geo: Geometry, variant: Variant, asserts: bool,
                 start: torch.Tensor, pending: torch.Tensor) -> torch.Tensor:
    """The first assert each group hits in vLLM's order (table length, the scan's
    assert, window bound, keys length), 0 if none. ``asserts=False`` is python -O:
    only the table length, which would index past the table, still stops the plan."""
    code = geo.table_short * ASSERT_CODES[AssertName.TABLE_LENGTH]
    if not asserts:
        return code.to(torch.uint8)
    if variant is Variant.LEGACY:
        scan_fail, scan_code = cells.N > start * cells.b, ASSERT_CODES[AssertName.BOUNDARY]
    else:
        scan_fail, scan_code = geo.misaligned, ASSERT_CODES[AssertName.ALIGNMENT]
    # later in vLLM's order = lower priority: each is written only where no earlier one fired
    for fired, c in ((scan_fail, scan_code),
                     (pending > geo.window_limit, ASSERT_CODES[AssertName.WINDOW_BOUND]),
                     ((pending > 0) & (geo.num_offload_keys < geo.num_chunks), ASSERT_CODES[AssertName.KEYS_LENGTH])):
        code = code + ((code == 0) & fired) * c
    return code.to(torch.uint8)


def first_failing_group(cells: Cells, code: torch.Tensor) -> torch.Tensor:
    """[R] the first group in config order whose assert fires (vLLM stops there); -1: none."""
    g = cells.group + (code == 0) * cells.G  # a group that passes sorts after every real one
    first = torch.full((cells.R,), cells.G, dtype=torch.int64, device=g.device)
    first.scatter_reduce_(0, cells.request, g, reduce="amin")
    return torch.where(first >= cells.G, -1, first)


# --- the plan -------------------------------------------------------------------

@dataclass
class BatchPlan:
    """Outputs per cell ([C], see ``Cells``) unless noted.

    ``code`` is the assert this group would hit if vLLM reached it (0 none); the
    request's outcome is ``failing_group`` [R] (-1: none), the first group in config
    order with a code. ``dense(name)`` lays a per-cell output out as [R, G] (zeros
    where nothing is planned); ``dst_block_ids`` gathers the destination blocks.
    """

    variant: Variant
    asserts: bool
    cells: Cells
    num_gpu_blocks: torch.Tensor
    first_fresh_gpu_block_idx: torch.Tensor
    load_start_gpu_block_idx: torch.Tensor
    num_pending_gpu_blocks: torch.Tensor
    start_chunk_idx: torch.Tensor
    end_chunk_idx: torch.Tensor
    num_chunks: torch.Tensor
    num_offload_keys: torch.Tensor
    window_in_chunks: torch.Tensor  # -1 for full attention (no window)
    code: torch.Tensor
    failing_group: torch.Tensor  # [R]

    # inputs echoed for the assertion values
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
    def planned(self) -> torch.Tensor:
        return self.cells.planned

    @property
    def ok(self) -> torch.Tensor:
        return self.failing_group < 0

    @property
    def request_code(self) -> torch.Tensor:
        """[R] the code of the failing group, 0 when the request plans fine."""
        out = torch.zeros(self.cells.R, dtype=torch.int64, device=self.code.device)
        bad = (~self.ok).nonzero().flatten()
        at = self.cells.start.index_select(0, bad) + self.failing_group.index_select(0, bad)
        return out.index_copy_(0, bad, self.code.to(torch.int64).index_select(0, at))

    @property
    def reached(self) -> torch.Tensor:
        """[C] the groups vLLM plans before the failing one (a LoadPlan's ``groups``)."""
        upto = torch.where(self.ok, self.cells.G, self.failing_group).index_select(0, self.cells.request)
        return self.cells.group < upto

    @property
    def dst_cells(self) -> torch.Tensor:
        """[C] cells whose destination blocks vLLM hands on: reached, in a request that plans fine."""
        return self.reached & self.ok.index_select(0, self.cells.request)

    def dst_block_ids(self, block_id: torch.Tensor, of: torch.Tensor | None = None):
        """The destination block ids [start, k) of the cells ``of`` selects (default
        ``dst_cells``), flat in cell order, and how many each cell has ([C]). Gathered
        from the ragged ranges alone: no [C, L] mask is built."""
        of = self.dst_cells if of is None else of
        n = torch.where(of, self.num_pending_gpu_blocks.to(torch.int64), 0)
        total = int(n.sum())
        cell = torch.repeat_interleave(torch.arange(n.shape[0], device=n.device), n, output_size=total)
        offset = torch.cumsum(n, 0) - n
        slot = torch.arange(total, device=n.device) - offset.index_select(0, cell) \
            + self.load_start_gpu_block_idx.to(torch.int64).index_select(0, cell)
        L = self.cells.L
        flat = (self.cells.request * self.cells.G + self.cells.group).index_select(0, cell) * L + slot
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


def plan_cells(cells: Cells, geo: Geometry, variant: Variant, asserts: bool, words: torch.Tensor) -> BatchPlan:
    """One variant: vLLM's per-group loop as one pass of steps over every cell."""
    start = load_start(cells, geo, variant, words)
    pending = geo.k - start
    start_chunk, end_chunk = offload_key_chunks(cells, geo, start, pending)
    code = assert_codes(cells, geo, variant, asserts, start, pending)
    return BatchPlan(
        variant=variant, asserts=asserts, cells=cells,
        num_gpu_blocks=geo.k, first_fresh_gpu_block_idx=geo.f,
        load_start_gpu_block_idx=start, num_pending_gpu_blocks=pending,
        start_chunk_idx=start_chunk, end_chunk_idx=end_chunk,
        num_chunks=geo.num_chunks, num_offload_keys=geo.num_offload_keys, window_in_chunks=geo.window,
        code=code, failing_group=first_failing_group(cells, code),
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
    unhashed = pack_slots(cells.state >> 1)
    return {v: plan_cells(cells, geo, v, asserts, scan_words(cells, v, unhashed)) for v in variants}


def plan_batch(batch: PlanBatch, variant: Variant | str, asserts: bool = True, check: bool = True) -> BatchPlan:
    """One variant of ``plan_variants``."""
    variant = Variant(variant)
    return plan_variants(batch, (variant,), asserts, check)[variant]


def to_load_plans(batch: PlanBatch, out: BatchPlan, rows=None) -> list[LoadPlan]:
    """The impl's outputs as spec ``LoadPlan``s, to compare, draw or print as JSON.

    The assertion message is the impl's own (it says which numbers it saw); compare
    plans with ``plan_fields``, which leaves messages out.
    """
    rows = range(batch.shape[0]) if rows is None else list(rows)
    cells = out.cells
    col = {name: getattr(out, name).cpu().tolist() for name in GROUP_FIELDS + ("code",)}
    vals = {key: out.value(key).cpu().tolist() for key in ASSERTION_VALUE_FIELDS}
    start, count = cells.start.cpu().tolist(), cells.count.cpu().tolist()
    failing = out.failing_group.cpu().tolist()
    ids, n = out.dst_block_ids(batch.block_id, out.reached)
    ids, n = ids.cpu().tolist(), n.cpu().tolist()
    id_at = [0]
    for x in n:
        id_at.append(id_at[-1] + x)
    plans = []
    for r in rows:
        if not count[r]:
            plans.append(LoadPlan(out.variant, (), None, out.asserts))
            continue
        s = start[r]
        upto = count[r] if failing[r] < 0 else failing[r]
        groups = tuple(
            GroupPlan(
                group_index=g,
                **{f: col[f][s + g] for f in GROUP_FIELDS},
                dst_block_ids=tuple(ids[id_at[s + g]:id_at[s + g + 1]]),
            )
            for g in range(upto)
        )
        assertion = None
        if failing[r] >= 0:
            g = failing[r]
            name = ASSERT_NAMES[col["code"][s + g]]
            values = {key: vals[key][s + g] for key in ASSERTION_VALUES[name]}
            shown = ", ".join(f"{k}={v}" for k, v in values.items())
            assertion = Assertion(name, g, f"(batched impl) {name.value}: {shown}", values)
        plans.append(LoadPlan(out.variant, groups, assertion, out.asserts))
    return plans


def plan_fields(plan: LoadPlan) -> tuple:
    """What two plans must share to agree: outcome, the failing group and its numbers,
    and every planned group's fields (which fix dst_block_ids, group_sizes,
    block_indices and keys). Messages are prose and left out."""
    a = plan.assertion
    head = None if a is None else (a.name, a.group_index, tuple(sorted(a.values.items())))
    return head, plan.groups
