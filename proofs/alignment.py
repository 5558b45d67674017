"""Alignment across group kinds: does every group's tokens_per_block divide the
unit the scheduler rounds N to? Both sides as vLLM 0.33 derives them.

Facts (vLLM 0.33.0 wheel):
- ``kv_cache_utils.resolve_dcp_kv_block_size(spec, dcp)`` =
  ``spec.block_size * (dcp if spec.dcp_sharded else 1)``; ``AttentionSpec`` sets
  ``dcp_sharded = True``, ``KVCacheSpec`` (so ``MambaSpec``) defaults to False.
- ``kv_cache_utils.resolve_kv_cache_block_sizes``: the scheduler block size is,
  for one group, ``cache_config.block_size * dcp`` (dcp taken as 1 when that group
  is not DCP-sharded); for several groups ``math.lcm`` of every group's
  ``resolve_dcp_kv_block_size``.
- ``offloading/config.build_offloading_config``: the connector's per-group
  ``tokens_per_block`` is ``resolve_dcp_kv_block_size`` of each selected group
  (a subset of all groups).
- ``core/sched/scheduler.py``: the connector is handed
  ``num_new_local_computed_tokens - num_new_local_computed_tokens % self.block_size``
  and a load (M > 0) keeps that block-aligned N; ``self.block_size`` is the
  scheduler block size above (``engine/core.py``).
- Attention specs take ``cache_config.block_size`` (``Attention.get_kv_cache_spec``),
  except sliding-window layers, which may choose their own; Mamba specs take
  ``cache_config.mamba_block_size``, set to ``block_size`` when prefix caching is
  on and to ``max_model_len`` otherwise (``models/config.py``).

The number of groups is bounded by ``MAX_GROUPS`` (slots are unrolled: LCM has
no closed form over a symbolic count); the block sizes, DCP size, N and the
kinds are unbounded symbols. LCM is encoded as "a common multiple" — weaker than
the least one, so a proof covers it.
"""

from __future__ import annotations

from math import gcd

import z3

from kvbound.spec import KIND_CODES, KIND_MAMBA, KIND_OF_CODE, NULL, AssertName, Case, Group, GroupKind, H, U, Variant, cdiv
from kvbound.spec.verdicts import Verdict

from .problem import MODELLED, Bound, Obligation, Problem
from .replays import replay_assert
from .terms import AND, IF
from .world import config_for

MAX_GROUPS = 8


class AlignWorld:
    """A model config: up to MAX_GROUPS groups of symbolic kind and block size."""

    def __init__(self):
        self.n = z3.Int("num_groups")
        self.dcp = z3.Int("decode_context_parallel_size")
        self.cache_block_size = z3.Int("cache_config.block_size")
        self.kind = [z3.Int(f"kind[{j}]") for j in range(MAX_GROUPS)]
        self.spec_bs = [z3.Int(f"spec.block_size[{j}]") for j in range(MAX_GROUPS)]
        self.unit = z3.Int("scheduler_block_size")
        self.N_local = z3.Int("num_new_local_computed_tokens")
        # N_local = q*unit + r, 0 <= r < unit: the rounding, with its quotient named
        self.q, self.r = z3.Int("N_local div unit"), z3.Int("N_local mod unit")
        # unit = c_j * tpb_j: "a positive common multiple", multipliers named (Z3's
        # nonlinear arithmetic proves divisibility from products, not from mod)
        self.c = [z3.Int(f"unit / tpb[{j}]") for j in range(MAX_GROUPS)]
        self.tpb = [z3.Int(f"tokens_per_block[{j}]") for j in range(MAX_GROUPS)]
        self.scale = [z3.Int(f"dcp_scale[{j}]") for j in range(MAX_GROUPS)]
        self.bpc = z3.Int("blocks_per_chunk")

    def active(self, j):
        return j < self.n

    def sharded(self, j):
        """``dcp_sharded``: True for attention specs, False for Mamba."""
        return self.kind[j] != KIND_MAMBA

    def tokens_per_block(self, j):
        """``resolve_dcp_kv_block_size``: what the connector uses for group j (named; see base)."""
        return self.tpb[j]

    def base(self):
        out = [self.n >= 1, self.n <= MAX_GROUPS, self.dcp >= 1, self.cache_block_size >= 1,
               self.N_local >= 0, self.bpc >= 1]
        for j in range(MAX_GROUPS):
            out += [self.kind[j] >= 0, self.kind[j] < len(KIND_CODES), self.spec_bs[j] >= 1,
                    self.scale[j] == IF(self.sharded(j), self.dcp, 1),
                    self.tpb[j] == self.spec_bs[j] * self.scale[j]]
        return out

    def scheduler_unit(self):
        """``resolve_kv_cache_block_sizes``' scheduler block size, as premises on ``unit``."""
        single = self.unit == self.cache_block_size * self.scale[0]
        multiple = AND(self.unit >= 1, *[
            z3.Implies(self.active(j), AND(self.c[j] >= 1, self.unit == self.c[j] * self.tokens_per_block(j)))
            for j in range(MAX_GROUPS)
        ])
        rounding = AND(self.N_local == self.q * self.unit + self.r, self.r >= 0, self.r < self.unit)
        return [IF(self.n == 1, single, multiple), rounding]

    def lone_group_premise(self):
        """A lone group's spec.block_size is cache_config.block_size."""
        return z3.Implies(self.n == 1, self.spec_bs[0] == self.cache_block_size)

    def N(self):
        """What the scheduler hands the connector: the local hit rounded down to the unit."""
        return self.q * self.unit

    def every_group_aligned(self, N):
        return AND(*[z3.Implies(self.active(j), N % self.tokens_per_block(j) == 0) for j in range(MAX_GROUPS)])

    def quotient(self, j):
        """unit / tpb_j: 1 for a lone group, the common multiple's factor otherwise."""
        return IF(self.n == 1, 1, self.c[j])

    def unit_and_N_divisible(self):
        """tpb_j | unit and tpb_j | N for every group, shown by exhibiting the quotients
        (x = e·t with integer e is divisibility; Z3 checks products, where mod stalls)."""
        return AND(*[z3.Implies(self.active(j), AND(
            self.unit == self.quotient(j) * self.tpb[j],
            self.N() == self.q * self.quotient(j) * self.tpb[j])) for j in range(MAX_GROUPS)])

    def small(self, max_len=None):
        return [self.n <= 2, self.dcp <= 2, self.bpc == 1, self.N_local <= 256, self.cache_block_size <= 64,
                *[self.spec_bs[j] <= 64 for j in range(MAX_GROUPS)], self.kind[1] == 1]

    def to_case(self, model, name: str, N=None) -> Case:
        """A case with the model's groups and N; allocator-shaped tables, one chunk loaded."""
        v = lambda t: model.eval(t, model_completion=True).as_long()  # noqa: E731
        n, bpc = v(self.n), v(self.bpc)
        bs = [v(self.tokens_per_block(j)) for j in range(n)]
        kinds = [KIND_OF_CODE[v(self.kind[j])] for j in range(n)]
        N = v(self.N()) if N is None else v(N)
        M = bs[0] * bpc  # one chunk of the first group
        T = N + M
        groups, next_id = [], 1
        for j in range(n):
            b = bs[j]
            k, local = cdiv(T, b), N // b
            if kinds[j] is GroupKind.MAMBA:
                blocks = [NULL] * (k - 1) + [U(next_id)]
                next_id += 1
            else:
                blocks = [H(next_id + i) for i in range(local)] + [U(next_id + i) for i in range(local, k)]
                next_id += k
            groups.append(Group(config_for(kinds[j], b, bpc, 1 if kinds[j] is not GroupKind.FULL_ATTENTION else None),
                                tuple(blocks)))
        tph = 0
        for b in bs:
            tph = gcd(tph, b)
        keys_tokens = cdiv(T, min(bs) * bpc) * max(bs) * bpc  # enough keys for every group
        return Case(name=name, blocks_per_chunk=bpc, tokens_per_hash=tph, num_prompt_tokens=keys_tokens,
                    num_locally_computed_tokens=N, num_external_tokens=M, groups=tuple(groups))


# --- the obligations -------------------------------------------------------------

def _alignment(code):
    w = AlignWorld()
    prem = w.base() + w.scheduler_unit() + [w.lone_group_premise()]
    # split on the two branches of resolve_kv_cache_block_sizes: Z3 settles each at once
    return Problem(prem, w.unit_and_N_divisible(), w, tables=False, splits=(w.n == 1, w.n >= 2))


def _alignment_weaker(code):
    w = AlignWorld()
    fa_tpc = w.tokens_per_block(0) * w.bpc
    prem = w.base() + [w.n >= 2, w.kind[0] == 0, w.N_local % fa_tpc == 0]
    pow2 = [z3.Or(*[w.spec_bs[j] == v for v in (16, 32, 64)]) for j in range(2)]  # block sizes as deployed
    return Problem(prem, w.every_group_aligned(w.N_local), w, tables=False, shaping=w.small() + [w.n == 2, w.dcp == 1] + pow2,
                   witness=lambda m: w.to_case(m, "witness-alignment.weaker-premise", N=w.N_local))


def _alignment_lone(code):
    w = AlignWorld()
    prem = w.base() + w.scheduler_unit() + [w.n == 1]
    return Problem(prem, w.every_group_aligned(w.N()), w, tables=False, shaping=w.small() + [w.dcp == 1],
                   witness=lambda m: w.to_case(m, "witness-alignment.lone-group"))


ALIGN_BOUND = Bound(MAX_GROUPS, 0, "unbounded (block sizes, DCP size, N)",
                    f"at most {MAX_GROUPS} KV-cache groups: slots are unrolled, LCM has no closed form over a "
                    "symbolic count")

OBLIGATIONS: list[Obligation] = [
    Obligation(
        "alignment",
        "Every group's tokens_per_block divides the unit the scheduler rounds N to, for every mix of group "
        "kinds, block sizes and DCP size; so the N a load sees is a multiple of every tokens_per_block.",
        "unit = (n = 1 ? cache_bs·dcp₀ : lcm_j bs_j·dcp_j)  ⟹  ∀ g: tpb_g | unit ∧ tpb_g | (N_local − N_local mod unit)",
        "the scheduler rounds N to the LCM of every group's DCP-scaled block size (a lone group: its "
        "spec.block_size is cache_config.block_size)", Verdict.PROVED, _alignment, mutable=False, bound=ALIGN_BOUND, releases=MODELLED),
    Obligation(
        "alignment.weaker-premise",
        "The weaker premise 'N is a multiple of the full-attention group's tokens_per_chunk' does not make "
        "every group aligned.",
        "∃ config: tpc_FA | N ∧ ∃ g: tpb_g ∤ N",
        "the scheduler rounds to the LCM, not to the full-attention chunk", Verdict.REFUTED, _alignment_weaker,
        reproduce=replay_assert(Variant.FIXED, AssertName.ALIGNMENT), mutable=False, bound=ALIGN_BOUND, releases=MODELLED),
    Obligation(
        "alignment.lone-group",
        "With one group the scheduler rounds to cache_config.block_size*dcp, the connector uses the spec's "
        "block size: alignment needs them equal (a Mamba-only model without prefix caching has "
        "mamba_block_size = max_model_len; a sliding-window layer may pick its own block size).",
        "∃ lone group: spec.block_size ≠ cache_config.block_size ∧ tpb ∤ N",
        "a lone group's spec.block_size is cache_config.block_size", Verdict.REFUTED, _alignment_lone,
        reproduce=replay_assert(Variant.FIXED, AssertName.ALIGNMENT), mutable=False, bound=ALIGN_BOUND, releases=MODELLED),
]


__all__ = ["ALIGN_BOUND", "AlignWorld", "MAX_GROUPS", "OBLIGATIONS"]
