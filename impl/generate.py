"""The generator families drawn directly as padded tensors (torch, on any device).

``kvbound.spec.strategies`` builds one ``Case`` at a time in Python (about 2,400 a
second here); a million-case differential run needs the cases as tensors anyway, so
this module draws the same families, by the same rules, for a whole batch at once:

    config   group count and kinds, block sizes (one size when Mamba is present or
             with p=0.4, else from a palette), blocks_per_chunk, tokens_per_hash
             (one of the three largest powers of two dividing gcd(sizes) * bpc),
             windows (sliding: b*[1..4] - {0,0,1}; chunked: b*{1,2,4})
    tokens   N a multiple of lcm(block sizes), T on a chunk boundary of every group,
             M = T - N >= the largest chunk, within MAX_TABLE blocks
    tables   vLLM's allocator (``allocator_table``): skipped blocks null, computed
             blocks hashed, fresh blocks unhashed (hashed on a sync load), Mamba
             ``·*(k-1) F`` plus 0-2 scratch blocks; the PR's recurrent shape
             ``[H]..[U]..[·]..[F]`` (``recurrent_state_table``) for recurrent_state
    adversarial  one of ``ADVERSARIAL_MUTATIONS`` on one group, as ``_adversarial``

The draws come from a ``torch.Generator``, not ``random.Random``: the same seed gives
the same batch on the same device (CPU and CUDA streams differ), but not the cases
``random_cases(seed)`` gives. Block ids are dense in (group, slot) order with gaps
of 1-3, as ``_Ids`` hands them out, except that a mutation's new blocks take their
place in that order instead of the next free id. A ``Case`` is built only for the
rows that need one (``GeneratedBatch.cases``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbound.spec import Case, GroupKind, get_num_skipped_tokens
from kvbound.spec.strategies import ADVERSARIAL_MUTATIONS, FAMILIES, MAX_TABLE

from kvbound.spec import KIND_CHUNKED, KIND_CODES, KIND_FULL, KIND_MAMBA, KIND_SLIDING, STATE_H, STATE_N, STATE_U

from .batch import PlanBatch, cdiv, pack_states, resolve_device
from .convert import cases_from_batch

FAMILY_CODES = {f: i for i, f in enumerate(FAMILIES)}
_REALISTIC, _RECURRENT, _ADVERSARIAL = (FAMILY_CODES[f] for f in ("realistic", "recurrent_state", "adversarial"))
MUTATION_CODES = {m: i for i, m in enumerate(ADVERSARIAL_MUTATIONS)}
_SIZES = (4, 8, 16, 32)
_PALETTES = ((4, 8, 16), (8, 16, 32), (12, 16), (4, 16), (16, 32, 64))
_BPC = (1, 1, 2, 4)
SCRATCH = 2  # speculative scratch blocks after a Mamba state block (allocator_table)
MAX_SLOTS = MAX_TABLE + 8  # room for scratch blocks and random_table's k + 2


@dataclass
class GeneratedBatch:
    """A generated ``PlanBatch`` and where each row came from: its family code
    (``FAMILIES`` order), its mutation code (-1 unless adversarial) and its case
    index, so a row is named ``<family>-<seed>-<index>[-<mutation>]``."""

    batch: PlanBatch
    family: torch.Tensor  # [R] int64
    mutation: torch.Tensor  # [R] int64
    seed: int
    first: int

    def name(self, row: int) -> str:
        fam = FAMILIES[int(self.family[row])]
        mut = int(self.mutation[row])
        return f"{fam}-t{self.seed}-{self.first + row}" + (f"-{ADVERSARIAL_MUTATIONS[mut]}" if mut >= 0 else "")

    def names(self) -> list:
        return [self.name(r) for r in range(self.batch.shape[0])]

    def cases(self, rows=None, validate: bool = True) -> list[Case]:
        """``Case`` views of ``rows`` (all by default), named; ``validate=False`` trusts
        the generator (``cases_from_batch``)."""
        rows = list(range(self.batch.shape[0])) if rows is None else list(rows)
        self.batch.names = self.names()
        return cases_from_batch(self.batch, rows, validate)

    def family_counts(self) -> dict:
        counts = torch.bincount(self.family.cpu(), minlength=len(FAMILIES)).tolist()
        return {f: n for f, n in zip(FAMILIES, counts) if n}


class _Rng:
    """Vectorised draws from one ``torch.Generator``."""

    def __init__(self, seed: int, device):
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def uniform(self, shape) -> torch.Tensor:
        return torch.rand(shape, generator=self.gen, device=self.device, dtype=torch.float64)

    def integer(self, lo, hi, shape=None) -> torch.Tensor:
        """Uniform integers in [lo, hi] (tensors broadcast; hi >= lo)."""
        lo = torch.as_tensor(lo, device=self.device)
        hi = torch.as_tensor(hi, device=self.device)
        shape = shape if shape is not None else torch.broadcast_shapes(lo.shape, hi.shape)
        return lo + (self.uniform(shape) * (hi - lo + 1)).floor().to(torch.int64)

    def choice(self, values, shape) -> torch.Tensor:
        table = torch.as_tensor(values, device=self.device, dtype=torch.int64)
        return table[self.integer(0, len(values) - 1, shape)]

    def boolean(self, p, shape) -> torch.Tensor:
        return self.uniform(shape) < p


def _reduce_groups(t: torch.Tensor, valid: torch.Tensor, op, neutral: int) -> torch.Tensor:
    out = torch.full_like(t[:, 0], neutral)
    for g in range(t.shape[1]):  # a loop over the (at most max_groups) group columns, not over requests
        out = torch.where(valid[:, g], op(out, t[:, g]), out)
    return out


def num_skipped_tokens(sliding, chunked, T, window):
    """The tokens vLLM's manager skips at T (the spec's ``get_num_skipped_tokens``, evaluated on
    tensors): ``window`` is a sliding group's ``sliding_window`` and a chunked group's
    ``attention_chunk_size``; no other kind is skipped here (a Mamba table is drawn on its own).
    These families retain no tokens (``extra_retained_tokens`` 0: only the ``retained_window``
    family, which this generator does not draw, has any)."""
    swa = get_num_skipped_tokens(GroupKind.SLIDING_WINDOW, T, sliding_window=window, maximum=torch.clamp_min)
    local = get_num_skipped_tokens(GroupKind.CHUNKED_LOCAL, T, attention_chunk_size=window.clamp(min=1))
    return torch.where(sliding, swa, torch.where(chunked, local, 0))


def generate_batch(n: int, seed: int = 0, family: str | None = None, device=None, max_groups: int = 8,
                   first: int = 0) -> GeneratedBatch:
    """``n`` cases of ``family`` (``None``: the families in turn, as ``random_cases``) as one
    padded batch on ``device``. ``first`` is the index of the first case: the batch is
    drawn from ``seed`` and ``first`` together, so a long run in chunks is reproducible
    chunk by chunk."""
    if family is not None and family not in FAMILY_CODES:
        raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)}")
    dev = resolve_device(device)
    rng = _Rng(seed * 1_000_003 + first, dev)
    R, G, L = n, max_groups, MAX_SLOTS
    i64 = torch.int64
    index = torch.arange(first, first + n, device=dev)
    fam = (index % len(FAMILIES)) if family is None else torch.full((R,), FAMILY_CODES[family], device=dev)
    recurrent, adversarial = fam == _RECURRENT, fam == _ADVERSARIAL

    # --- config (_draw_config) ---
    num_groups = rng.integer(1, max_groups, (R,))
    gidx = torch.arange(G, device=dev)
    valid = gidx < num_groups.unsqueeze(1)
    kind = rng.integer(0, len(KIND_CODES) - 1, (R, G))
    has_mamba = ((kind == KIND_MAMBA) & valid).any(1)
    force = recurrent & ~has_mamba
    at = rng.integer(0, num_groups - 1)
    kind = torch.where(force.unsqueeze(1) & (gidx == at.unsqueeze(1)), KIND_MAMBA, kind)
    has_mamba = ((kind == KIND_MAMBA) & valid).any(1)
    one_size = has_mamba | rng.boolean(0.4, (R,))
    size_one = rng.choice(_SIZES, (R,))
    palettes = torch.tensor([p + (p[0],) * (3 - len(p)) for p in _PALETTES], device=dev)
    pal_len = torch.tensor([len(p) for p in _PALETTES], device=dev)
    pal = rng.integer(0, len(_PALETTES) - 1, (R,))
    pick = (rng.uniform((R, G)) * pal_len[pal].unsqueeze(1)).floor().to(i64)
    b = torch.where(one_size.unsqueeze(1), size_one.unsqueeze(1), palettes[pal.unsqueeze(1), pick])
    b = torch.where(valid, b, 1)
    bpc = rng.choice(_BPC, (R,))
    gcd = _reduce_groups(b, valid, torch.gcd, 0) * bpc
    # the largest power of two (<= 64) dividing gcd; divisors[-3:] are it, /2, /4
    p2 = (gcd & -gcd).clamp(max=64)
    n_div = torch.log2(p2.to(torch.float64)).round().to(i64).clamp(max=2) + 1
    tph = p2 >> (n_div - 1 - rng.integer(0, n_div - 1))
    window = torch.zeros((R, G), dtype=i64, device=dev)
    sliding, chunked = (kind == KIND_SLIDING) & valid, (kind == KIND_CHUNKED) & valid
    window = torch.where(sliding, b * rng.integer(1, 4, (R, G)) - rng.choice((0, 0, 1), (R, G)), window)
    window = torch.where(chunked, b * rng.choice((1, 2, 4), (R, G)), window)

    # --- tokens (_draw_tokens) ---
    tpc = b * bpc.unsqueeze(1)
    unit_n = _reduce_groups(b, valid, torch.lcm, 1)
    unit_t = _reduce_groups(tpc, valid, torch.lcm, 1)
    b_min = _reduce_groups(b, valid, torch.minimum, 1 << 30)
    b_max = _reduce_groups(b, valid, torch.maximum, 0)
    budget = MAX_TABLE * b_min - 2 * b_max
    max_t_units = torch.clamp(torch.div(budget, unit_t, rounding_mode="floor"), min=1)
    N = unit_n * rng.integer(0, torch.div((max_t_units - 1) * unit_t, unit_n, rounding_mode="floor"))
    t_min = cdiv(N + unit_t, unit_t)
    T = unit_t * rng.integer(t_min, torch.maximum(t_min, max_t_units))
    fix = recurrent & (N == 0)  # the recurrent shape needs a computed prefix
    N = torch.where(fix, unit_n, N)
    T = torch.where(fix, cdiv(torch.maximum(T, N + unit_t), unit_t) * unit_t, T)
    sync = (fam == _REALISTIC) & rng.boolean(0.15, (R,))

    # --- tables (allocator_table / recurrent_state_table) ---
    Nc, Tc = N.unsqueeze(1), T.unsqueeze(1)
    k, local, f = cdiv(Tc, b), torch.div(Nc, b, rounding_mode="floor"), cdiv(Nc, b)
    skipped_tokens = num_skipped_tokens(sliding, chunked, Tc, window)
    s = torch.div(skipped_tokens, b, rounding_mode="floor")
    external = torch.minimum(Tc - skipped_tokens, Tc - Nc)
    before_fresh = torch.maximum(local, s)
    length = torch.where(external > 0, torch.maximum(before_fresh, k), before_fresh)
    mamba = (kind == KIND_MAMBA) & valid
    scratch = rng.integer(0, SCRATCH, (R, G))
    # the recurrent shape: the first Mamba group of a recurrent_state case, later ones with p=0.5
    first_mamba = mamba & (torch.cumsum(mamba.to(i64), 1) == 1)
    shaped = recurrent.unsqueeze(1) & mamba & (first_mamba | rng.boolean(0.5, (R, G)))
    length = torch.where(mamba, k + scratch, length)
    length = torch.where(shaped, k, length)
    n_hashed = rng.integer(0, f - 1, (R, G)).clamp(min=0)
    u_at = rng.integer(n_hashed, f - 1, (R, G))

    length = torch.where(valid, length, 0)
    L = max(L, int(length.max()) + 3 if R else 1)  # random_table may reach k + 2
    slot = torch.arange(L, device=dev).view(1, 1, L)
    k3, len3 = k.unsqueeze(-1), length.unsqueeze(-1)
    i8 = torch.int8  # [R, G, L] work in bytes: a 10k-case batch stays well under 100 MB
    fresh_state = torch.where(sync, STATE_H, STATE_U).to(i8).view(R, 1, 1)
    state = torch.full((R, G, L), STATE_N, dtype=i8, device=dev)
    # attention kinds: [N]*min(s, local) [H]*(local - min) [N]*(s - local) [fresh]... up to k
    state = torch.where((slot >= torch.minimum(s, local).unsqueeze(-1)) & (slot < local.unsqueeze(-1)), STATE_H, state)
    state = torch.where((slot >= before_fresh.unsqueeze(-1)) & (slot < len3), fresh_state, state)
    # Mamba (align): [N]*(k-1) [fresh] [U]*scratch
    m3 = mamba.unsqueeze(-1)
    mamba_state = torch.where(slot == k3 - 1, fresh_state, (slot >= k3).to(i8) * STATE_U)
    state = torch.where(m3, mamba_state, state)
    # the recurrent shape: [H]*n_hashed, [U] at u_at (< f), nulls, [U] at k - 1
    shaped_state = (slot < n_hashed.unsqueeze(-1)).to(i8) * STATE_H
    shaped_state = torch.where((slot == u_at.unsqueeze(-1)) | (slot == k3 - 1), STATE_U, shaped_state)
    state = torch.where(shaped.unsqueeze(-1), shaped_state, state)
    state = torch.where(slot < len3, state, STATE_N)
    state = torch.where(valid.unsqueeze(-1), state, STATE_N)
    length = torch.where(valid, length, 0)
    prompt = T + rng.integer(1, 2 * b_max)
    M = T - N

    # --- adversarial (_adversarial): one mutation on one group ---
    mutation = torch.where(adversarial, rng.integer(0, len(ADVERSARIAL_MUTATIONS) - 1, (R,)), -1)
    gi = rng.integer(0, num_groups - 1)
    rows = torch.arange(R, device=dev)
    b_g, k_g, f_g = b[rows, gi], k[rows, gi], f[rows, gi]
    len_g = length[rows, gi]
    at_g = rng.integer(0, 1 << 30, (R,))  # a slot choice, reduced per mutation below
    is_m = {m: mutation == c for m, c in MUTATION_CODES.items()}

    shift = rng.integer(1, torch.clamp(b_g - 1, min=1))
    unaligned = is_m["unaligned_n"] & (N + shift < T)
    N, M = N + unaligned * shift, M - unaligned * shift

    cut = at_g % (torch.clamp(torch.minimum(len_g, k_g) - 1, min=0) + 1)
    len_g = torch.where(is_m["short_table"], torch.where(len_g > 0, cut, len_g), len_g)

    fresh_slot = f_g + at_g % torch.clamp(k_g - f_g, min=1)
    below_slot = at_g % torch.clamp(f_g, min=1)
    set_slot = torch.full((R,), -1, device=dev)
    set_state = torch.zeros((R,), dtype=i8, device=dev)
    for name, cond, where_, st in (("null_in_fresh", f_g < k_g, fresh_slot, STATE_N),
                                   ("hashed_in_fresh", f_g < k_g, fresh_slot, STATE_H),
                                   ("unhashed_below_f", f_g > 0, below_slot, STATE_U)):
        hit = is_m[name] & cond
        set_slot = torch.where(hit, where_, set_slot)
        set_state = torch.where(hit, torch.tensor(st, dtype=i8, device=dev), set_state)

    prompt = torch.where(is_m["short_prompt"], rng.integer(0, torch.clamp(T - 1, min=0)), prompt)

    rand_len = rng.integer(torch.clamp(k_g - 2, min=0), k_g + 2)
    rand_slots = torch.where(rng.boolean(1 / 3, (R, L)), STATE_N,
                             torch.where(rng.boolean(0.5, (R, L)), STATE_H, STATE_U)).to(i8)
    rand_table = is_m["random_table"]
    len_g = torch.where(rand_table, rand_len, len_g)

    extra = rng.integer(1, 3, (R,)) * b_g * bpc
    wide = is_m["wide_hit"] & (T + extra <= MAX_TABLE * b_min)
    M, prompt = M + wide * extra, prompt + wide * extra

    # apply the table mutations to group gi of each mutated row
    row_state = state[rows, gi]  # [R, L]
    sl = torch.arange(L, device=dev).view(1, L)
    row_state = torch.where(rand_table.unsqueeze(1), rand_slots, row_state)
    row_state = torch.where(sl == set_slot.unsqueeze(1), set_state.unsqueeze(1), row_state)
    row_state = torch.where(sl < len_g.unsqueeze(1), row_state, STATE_N)
    state[rows, gi] = row_state
    length[rows, gi] = len_g

    # --- block ids: dense in (group, slot) order, gaps of 1-3, from 1-40 ---
    nonnull = (state != STATE_N).view(R, G * L)
    step = (rng.integer(1, 3, (R, G * L)) * nonnull).to(torch.int32)
    ids = rng.integer(1, 40, (R, 1)).to(torch.int32) + torch.cumsum(step, 1, dtype=torch.int32) - step
    block_id = (ids * nonnull).view(R, G, L)

    used = int(length.max()) if R else 1
    Lb = max(8, used + (-used % 8))
    window_tokens = torch.where(sliding | chunked, window, 0)
    state = state[:, :, :Lb].to(torch.uint8).contiguous()
    batch = PlanBatch(
        state=state,
        slot_words=pack_states(state),  # the form the impl reads: 16 bytes a group
        block_id=block_id[:, :, :Lb].contiguous(),
        table_length=length,
        num_groups=num_groups,
        kind=torch.where(valid, kind, KIND_FULL).to(torch.uint8),
        tokens_per_block=b,
        window_tokens=window_tokens,
        blocks_per_chunk=bpc,
        tokens_per_hash=tph,
        num_prompt_tokens=prompt,
        num_locally_computed_tokens=N,
        num_external_tokens=M,
        sync_load=sync,
    )
    return GeneratedBatch(batch, fam.to(i64), mutation, seed, first)
