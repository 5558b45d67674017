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

from .batch import KIND_FULL, KIND_MAMBA, STATE_H, STATE_U, PlanBatch

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
    config order with a code. ``dst_mask`` [R, G, L] marks slots [start, k) of groups
    whose own code is 0. Padded groups and requests with nothing external
    (``planned`` [R] false: vLLM returns before planning) hold zeros.
    """

    variant: Variant
    asserts: bool
    planned: torch.Tensor
    valid: torch.Tensor
    num_gpu_blocks: torch.Tensor
    first_fresh_gpu_block_idx: torch.Tensor
    load_start_gpu_block_idx: torch.Tensor
    num_pending_gpu_blocks: torch.Tensor
    dst_mask: torch.Tensor
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

    def value(self, key: str) -> torch.Tensor:
        """[R, G] the tensor behind an Assertion values key (request fields broadcast)."""
        t = getattr(self, ASSERTION_VALUE_FIELDS[key])
        return t.unsqueeze(1).expand_as(self.code) if t.dim() == 1 else t


def _cdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a + b - 1, b, rounding_mode="floor")  # a >= 0, b >= 1 throughout


def plan_batch(batch: PlanBatch, variant: Variant | str, asserts: bool = True, check: bool = True) -> BatchPlan:
    """The spec's ``plan_load`` for every request of ``batch`` under ``variant``.

    ``asserts=False`` models ``python -O`` as the spec does (only the table length,
    which would index past the table, still stops the plan). ``check`` runs the
    value checks first; a caller that built the batch with ``batch_from_cases``
    may skip them.
    """
    variant = Variant(variant)
    if check:
        batch.check_values()
    R, G, L = batch.shape
    dev = batch.device
    i64 = torch.int64
    N = batch.num_locally_computed_tokens.to(i64).unsqueeze(1)
    T = N + batch.num_external_tokens.to(i64).unsqueeze(1)
    bpc = batch.blocks_per_chunk.to(i64).unsqueeze(1)
    tph = batch.tokens_per_hash.to(i64).unsqueeze(1)
    P = batch.num_prompt_tokens.to(i64).unsqueeze(1)
    b = batch.tokens_per_block.to(i64)
    table_length = batch.table_length.to(i64)
    kind = batch.kind

    planned = batch.num_external_tokens > 0
    valid = torch.arange(G, device=dev) < batch.num_groups.to(i64).unsqueeze(1)
    active = valid & planned.unsqueeze(1)
    k = _cdiv(T, b)
    f = _cdiv(N, b)

    # The scan: first slot >= scan_from holding a non-null block that is unhashed
    # (or, for a 0.33 sync load, any non-null block); k when there is none.
    eligible = batch.state == STATE_U
    if variant is Variant.FIXED_SYNC:
        eligible = eligible | (batch.state == STATE_H) & batch.sync_load.view(R, 1, 1)
    slot = torch.arange(L, device=dev, dtype=torch.int32 if L < 2**31 else i64)
    if variant is not Variant.LEGACY:
        eligible = eligible & (slot >= f.unsqueeze(-1))
    first = torch.where(eligible, slot, L).amin(-1).to(i64) if L else torch.zeros_like(k)
    start = torch.minimum(first, k)

    table_ok = table_length >= k
    if variant is Variant.LEGACY:
        scan_fail, scan_code = N > start * b, ASSERT_CODES[AssertName.BOUNDARY]
    else:
        scan_fail, scan_code = N % b != 0, ASSERT_CODES[AssertName.ALIGNMENT]
    pending = k - start
    tpc = b * bpc
    window = torch.where(kind == KIND_MAMBA, 1, _cdiv(batch.window_tokens.to(i64), tpc))
    window = torch.where(kind == KIND_FULL, -1, window)
    window_fail = (kind != KIND_FULL) & (pending > window * bpc + 1)
    num_chunks = _cdiv(T, tpc)
    have = torch.div(torch.div(P, tph, rounding_mode="floor"), torch.div(tpc, tph, rounding_mode="floor").clamp(min=1),
                     rounding_mode="floor")  # clamp: padded groups only; real ones have tph | tpc
    keys_fail = (pending > 0) & (have < num_chunks)
    start_chunk = torch.div(start, bpc, rounding_mode="floor")
    # vLLM slices offload_keys[start:end]: a short list just yields fewer keys (python -O).
    end_chunk = torch.where(pending > 0, torch.maximum(start_chunk, torch.minimum(num_chunks, have)), start_chunk)

    code = torch.zeros((R, G), dtype=torch.uint8, device=dev)
    if asserts:  # lowest priority first; each later where overrides: vLLM's order per group
        code = torch.where(keys_fail, ASSERT_CODES[AssertName.KEYS_LENGTH], code)
        code = torch.where(window_fail, ASSERT_CODES[AssertName.WINDOW_BOUND], code)
        code = torch.where(scan_fail, scan_code, code)
    code = torch.where(table_ok, code, ASSERT_CODES[AssertName.TABLE_LENGTH])
    code = torch.where(active, code, 0).to(torch.uint8)
    first_bad = torch.where(code != 0, torch.arange(G, device=dev), G).amin(-1)
    failing_group = torch.where(first_bad < G, first_bad, -1)

    def z(t):
        return torch.where(active, t, 0)

    good = active & (code == 0)
    dst_mask = (slot >= start.unsqueeze(-1)) & (slot < k.unsqueeze(-1)) & good.unsqueeze(-1)
    return BatchPlan(
        variant=variant,
        asserts=asserts,
        planned=planned,
        valid=valid,
        num_gpu_blocks=z(k),
        first_fresh_gpu_block_idx=z(f),
        load_start_gpu_block_idx=z(start),
        num_pending_gpu_blocks=z(pending),
        dst_mask=dst_mask,
        start_chunk_idx=z(start_chunk),
        end_chunk_idx=z(end_chunk),
        num_chunks=z(num_chunks),
        num_offload_keys=z(have.expand_as(k)),
        window_in_chunks=z(window),
        code=code,
        failing_group=failing_group,
        table_length=table_length,
        tokens_per_block=b,
        num_locally_computed_tokens=N.squeeze(1),
        blocks_per_chunk=bpc.squeeze(1),
    )


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
    ok_rows = {}
    for key in ASSERTION_VALUE_FIELDS:
        ok_rows[key] = out.value(key).index_select(0, idx).cpu().tolist()
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
            values = {key: ok_rows[key][j][g] for key in ASSERTION_VALUES[name]}
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
