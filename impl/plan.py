"""``update_state_after_alloc``'s load plan for a whole batch at once, in torch.

Every (request, group) is planned in parallel; the only sequential thing in vLLM,
"the first group in config order whose assert fires", is a masked minimum over the
group axis. The scan "first i in [scan_from, k) with a non-null unhashed block" is
a masked minimum over the slot axis. No Python loop over requests, groups or
blocks, and no input a ``Case`` allows can make it raise: an assert vLLM would hit
comes back as a code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbound.spec import Assertion, AssertName, GroupPlan, LoadPlan, Variant

from .batch import KIND_FULL, KIND_MAMBA, STATE_H, STATE_N, STATE_U, PlanBatch

assert (STATE_N, STATE_H, STATE_U) == (0, 1, 2), "pack_slots' bit tricks assume these codes"

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


@dataclass
class BatchPlan:
    """Outputs, per (request, group) [R, G] unless noted.

    ``code`` is the assert this group would hit if vLLM reached it (0 none);
    the request's outcome is ``failing_group`` [R] (-1: none), the first group in
    config order with a code. Padded groups and requests with nothing external
    (``planned`` [R] false: vLLM returns before planning) hold zeros. The
    destination mask [R, G, L] is ``dst_mask``, built on demand from [start, k).
    """

    variant: Variant
    asserts: bool
    num_slots: int
    planned: torch.Tensor
    valid: torch.Tensor
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
    failing_group: torch.Tensor
    # inputs echoed for the assertion values
    table_length: torch.Tensor
    tokens_per_block: torch.Tensor
    num_locally_computed_tokens: torch.Tensor
    blocks_per_chunk: torch.Tensor

    @property
    def ok(self) -> torch.Tensor:
        return self.failing_group < 0

    @property
    def request_code(self) -> torch.Tensor:
        """[R] the code of the failing group, 0 when the request plans fine."""
        g = self.failing_group.clamp(min=0).unsqueeze(1)
        return torch.where(self.ok, 0, self.code.gather(1, g).squeeze(1).to(torch.int64))

    @property
    def reached(self) -> torch.Tensor:
        """[R, G] the groups vLLM plans before the failing one (a LoadPlan's ``groups``)."""
        G = self.code.shape[1]
        upto = torch.where(self.ok, G, self.failing_group).unsqueeze(1)
        return self.valid & self.planned.unsqueeze(1) & (torch.arange(G, device=upto.device) < upto)

    @property
    def dst_mask(self) -> torch.Tensor:
        """[R, G, L] the destination slots [start, k) of every group whose own code is 0.

        Built on demand: the plan itself is the range, and most callers (the
        differential, the benchmark's plan rate) never need the L-wide mask.
        """
        slot = torch.arange(self.num_slots, device=self.code.device)
        start = self.load_start_gpu_block_idx.unsqueeze(-1)
        good = (self.code == 0) & self.valid & self.planned.unsqueeze(1)
        return (slot >= start) & (slot < start + self.num_pending_gpu_blocks.unsqueeze(-1)) & good.unsqueeze(-1)

    def value(self, key: str) -> torch.Tensor:
        """[R, G] the tensor behind an Assertion values key (request fields broadcast)."""
        t = getattr(self, ASSERTION_VALUE_FIELDS[key])
        return t.unsqueeze(1).expand_as(self.code) if t.dim() == 1 else t


def _cdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a + b - 1, b, rounding_mode="floor")  # a >= 0, b >= 1 throughout


_WORD = 56  # slots per packed word: 7 octets, so a sentinel bit 56 still converts to float64 exactly
_WORD_MASK = (1 << _WORD) - 1
_BYTES_TO_BITS = 0x0102040810204080  # x * this >> 56: the low bits of 8 bytes (0/1 each) as 8 bits


def pack_slots(bits: torch.Tensor) -> torch.Tensor:
    """[R, G, L] uint8 0/1 -> [W, R, G] int64 words, W = ceil(L/56), bit i of word w = slot 56w + i.

    The slot axis is read once as bytes and the rest works on 1/8 of the elements;
    this is what makes the scan cheap next to the spec's Python loop. Words lead
    so the minimum over them is plane-wise; tables up to 56 blocks take one word.
    """
    R, G, L = bits.shape
    if L % 8:
        bits = torch.cat([bits, bits.new_zeros((R, G, -L % 8))], dim=-1)
    octets = bits.contiguous().view(torch.uint8).view(R, G, -1, 8).view(torch.int64).squeeze(-1)
    octets = octets * _BYTES_TO_BITS  # wraps mod 2**64: wanted; in place below (no big temporaries)
    octets.bitwise_right_shift_(56).bitwise_and_(0xFF)
    octets = octets.permute(2, 0, 1)  # [octet, R, G]
    per_word = _WORD // 8
    words = octets[0::per_word].clone()
    for j in range(1, per_word):  # the octets of a word, not a loop over blocks
        part = octets[j::per_word]
        words[: part.shape[0]] |= part << (8 * j)
    return words


def keep_from(scan_from: torch.Tensor, num_words: int) -> torch.Tensor:
    """[W, R, G] masks that clear, word by word, the bits of slots below ``scan_from``."""
    base = torch.arange(0, num_words * _WORD, _WORD, device=scan_from.device).view(num_words, 1, 1)
    below = (scan_from.to(torch.int64) - base).clamp_(0, _WORD)
    return torch.bitwise_left_shift(_WORD_MASK, below).bitwise_and_(_WORD_MASK)


def first_set_slot(words: torch.Tensor, keep: torch.Tensor | None, none: int) -> torch.Tensor:
    """[R, G] int32: the first slot whose bit is set in ``words`` [W, R, G] (after ``keep``
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
    base = torch.arange(0, W * _WORD, _WORD, device=words.device, dtype=torch.int32).view(W, 1, 1)
    return (pos + base).amin(0)  # int32: torch's int64 amin is many times slower


@dataclass
class _Shared:
    """What every variant computes alike, done once per batch. ``k`` and ``f`` are
    0 off the active (request, group)s, which zeroes every per-variant output there
    without masking each one."""

    R: int
    G: int
    L: int
    N: torch.Tensor
    b: torch.Tensor
    bpc: torch.Tensor
    k: torch.Tensor
    f: torch.Tensor
    planned: torch.Tensor
    valid: torch.Tensor
    active: torch.Tensor
    table_ok: torch.Tensor
    window: torch.Tensor
    window_limit: torch.Tensor
    num_chunks: torch.Tensor
    have: torch.Tensor
    table_length: torch.Tensor
    misaligned: torch.Tensor
    _keep: torch.Tensor | None = None

    def keep_fresh(self, num_words: int) -> torch.Tensor:
        """The fixed scan's masks (slots >= f), shared by fixed and fixed-sync."""
        if self._keep is None:
            self._keep = keep_from(self.f, num_words)
        return self._keep


def _shared(batch: PlanBatch) -> _Shared:
    R, G, L = batch.shape
    dev = batch.device
    # The narrowest integer type every intermediate fits: on CPU an int16 op runs ~3x
    # faster than int32, and request fields are expanded to [R, G] once because a
    # broadcast [R, 1] operand makes every op several times slower.
    b_max, bpc_max = int(batch.tokens_per_block.max()), int(batch.blocks_per_chunk.max())
    w_max = int(batch.window_tokens.max())
    big = max(int((batch.num_locally_computed_tokens + batch.num_external_tokens).max()) + b_max,
              int(batch.num_prompt_tokens.max()), (w_max + 1) * bpc_max + 1, b_max * bpc_max + w_max,
              (L + 1) * b_max, G + 1)
    it = torch.int16 if big < 2**15 - 2 else torch.int32 if big < 2**31 - 2 else torch.int64

    def per_group(t):
        return t.to(it).unsqueeze(1).expand(R, G).contiguous()

    N = per_group(batch.num_locally_computed_tokens)
    T = N + per_group(batch.num_external_tokens)
    bpc = per_group(batch.blocks_per_chunk)
    tph = per_group(batch.tokens_per_hash)
    P = per_group(batch.num_prompt_tokens)
    b = batch.tokens_per_block.to(it)
    kind = batch.kind
    table_length = batch.table_length.to(it)
    planned = batch.num_external_tokens > 0
    valid = torch.arange(G, device=dev) < batch.num_groups.unsqueeze(1)
    active = valid & planned.unsqueeze(1)
    k = _cdiv(T, b)
    tpc = b * bpc
    window = torch.where(kind == KIND_MAMBA, 1, _cdiv(batch.window_tokens.to(it), tpc))
    windowed = active & (kind != KIND_FULL)
    hashes_per_chunk = torch.div(tpc, tph, rounding_mode="floor").clamp(min=1)  # clamp: padded groups only
    on = active.to(it)  # multiplying by a 0/1 mask: much faster than torch.where on CPU
    limit = window * bpc + 1
    return _Shared(
        R=R, G=G, L=L, N=N, b=b, bpc=bpc,
        k=k * on, f=_cdiv(N, b) * on,
        planned=planned, valid=valid, active=active,
        table_ok=table_length >= k,
        window=torch.where(windowed, window, -1),
        # pending above this fails window_bound; full attention has no bound
        window_limit=torch.where(windowed, limit, torch.iinfo(it).max),
        num_chunks=_cdiv(T, tpc) * on,
        have=torch.div(torch.div(P, tph, rounding_mode="floor"), hashes_per_chunk, rounding_mode="floor") * on,
        table_length=table_length,
        misaligned=N % b != 0,
    )


def _plan_one(sh: _Shared, variant: Variant, asserts: bool, words: torch.Tensor) -> BatchPlan:
    """One variant given the packed eligible slots; all [R, G] arithmetic."""
    keep = None if variant is Variant.LEGACY else sh.keep_fresh(words.shape[0])
    start = torch.minimum(first_set_slot(words, keep, sh.L).to(sh.k.dtype), sh.k)
    pending = sh.k - start
    start_chunk = torch.div(start, sh.bpc, rounding_mode="floor")
    # vLLM slices offload_keys[start:end]: a short list just yields fewer keys (python -O).
    loads = pending > 0
    # where(c, x, y) as y + c * (x - y): torch's CPU where is many times slower
    end_chunk = start_chunk + loads * (torch.maximum(start_chunk, torch.minimum(sh.num_chunks, sh.have)) - start_chunk)
    code = torch.zeros_like(start)
    if asserts:  # lowest priority first; each later one overrides: vLLM's order per group
        if variant is Variant.LEGACY:
            scan_fail, scan_code = sh.N > start * sh.b, ASSERT_CODES[AssertName.BOUNDARY]
        else:
            scan_fail, scan_code = sh.misaligned, ASSERT_CODES[AssertName.ALIGNMENT]
        code = (loads & (sh.have < sh.num_chunks)) * ASSERT_CODES[AssertName.KEYS_LENGTH]
        code = code + (pending > sh.window_limit) * (ASSERT_CODES[AssertName.WINDOW_BOUND] - code)
        code = code + scan_fail * (scan_code - code)
    code = code + (sh.table_ok == 0) * (ASSERT_CODES[AssertName.TABLE_LENGTH] - code)
    code = (code * sh.active).to(torch.uint8)
    group = torch.arange(sh.G, device=code.device, dtype=torch.int32)
    first_bad = (group + (code == 0) * (sh.G - group)).amin(-1).to(torch.int64)  # int32 amin: fast
    return BatchPlan(
        variant=variant,
        asserts=asserts,
        num_slots=sh.L,
        planned=sh.planned,
        valid=sh.valid,
        num_gpu_blocks=sh.k,
        first_fresh_gpu_block_idx=sh.f,
        load_start_gpu_block_idx=start,
        num_pending_gpu_blocks=pending,
        start_chunk_idx=start_chunk,
        end_chunk_idx=end_chunk,
        num_chunks=sh.num_chunks,
        num_offload_keys=sh.have,
        window_in_chunks=sh.window,
        code=code,
        failing_group=first_bad - (first_bad == sh.G) * (sh.G + 1),  # -1: none
        table_length=sh.table_length,
        tokens_per_block=sh.b,
        num_locally_computed_tokens=sh.N[:, 0],
        blocks_per_chunk=sh.bpc[:, 0],
    )


def plan_variants(batch: PlanBatch, variants=tuple(Variant), asserts: bool = True, check: bool = True) -> dict:
    """The spec's ``plan_load`` for every request of ``batch``, for each variant.

    ``asserts=False`` models ``python -O`` as the spec does (only the table length,
    which would index past the table, still stops the plan). ``check`` runs the
    value checks first; a caller that built the batch with ``batch_from_cases``
    may skip them. Variants share the packed table and the per-group arithmetic.
    """
    variants = [Variant(v) for v in variants]
    if check:
        batch.check_values()
    sh = _shared(batch)
    # The scan looks for a non-null block that is unhashed, or for a 0.33 sync load
    # any non-null block (position match).
    # states are N=0, H=1, U=2: "unhashed" is bit 1, "non-null" is (state + 1) >> 1
    unhashed = pack_slots(batch.state >> 1)
    out = {}
    for v in variants:
        words = unhashed
        sync_rows = batch.sync_load.nonzero().flatten() if v is Variant.FIXED_SYNC else None
        if sync_rows is not None and len(sync_rows):
            # only sync-load requests match by position: pack their non-null bits alone
            words = unhashed.clone()
            words[:, sync_rows] = pack_slots((batch.state.index_select(0, sync_rows) + 1) >> 1)
        out[v] = _plan_one(sh, v, asserts, words)
    return out


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
    idx = torch.as_tensor(list(rows), dtype=torch.int64, device=batch.device)
    col = {
        name: getattr(out, name).index_select(0, idx).cpu().tolist()
        for name in ("num_gpu_blocks", "first_fresh_gpu_block_idx", "load_start_gpu_block_idx",
                     "num_pending_gpu_blocks", "start_chunk_idx", "end_chunk_idx", "code")
    }
    vals = {key: out.value(key).index_select(0, idx).cpu().tolist() for key in ASSERTION_VALUE_FIELDS}
    planned = out.planned.index_select(0, idx).cpu().tolist()
    failing = out.failing_group.index_select(0, idx).cpu().tolist()
    num_groups = batch.num_groups.index_select(0, idx).cpu().tolist()
    ids = torch.where(out.dst_mask, batch.block_id, -1).index_select(0, idx).cpu().tolist()
    plans = []
    for j, _ in enumerate(rows):
        if not planned[j]:
            plans.append(LoadPlan(out.variant, (), None, out.asserts))
            continue
        upto = num_groups[j] if failing[j] < 0 else failing[j]
        groups = tuple(
            GroupPlan(
                group_index=g,
                num_gpu_blocks=col["num_gpu_blocks"][j][g],
                first_fresh_gpu_block_idx=col["first_fresh_gpu_block_idx"][j][g],
                load_start_gpu_block_idx=col["load_start_gpu_block_idx"][j][g],
                num_pending_gpu_blocks=col["num_pending_gpu_blocks"][j][g],
                dst_block_ids=tuple(i for i in ids[j][g] if i >= 0),
                start_chunk_idx=col["start_chunk_idx"][j][g],
                end_chunk_idx=col["end_chunk_idx"][j][g],
            )
            for g in range(upto)
        )
        assertion = None
        if failing[j] >= 0:
            g = failing[j]
            name = ASSERT_NAMES[col["code"][j][g]]
            values = {key: vals[key][j][g] for key in ASSERTION_VALUES[name]}
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
