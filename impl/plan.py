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
from kvbound.spec.asserts import ASSERT_CODE, ASSERT_OF_CODE, ASSERTS

from kvbound.spec import KIND_MAMBA, KIND_SLIDING, STATE_H, STATE_N, STATE_U

from .batch import PLANE_NONNULL, PLANE_UNHASHED, SLOT_WORD, PlanBatch, cdiv, floordiv

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


# step 0, the cells (impl/cells.py); called through this module's names, where impl/mutants.py plants
from .cells import Cells, Geometry, group_geometry, real_cells, unsupported


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
