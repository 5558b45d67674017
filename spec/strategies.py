"""Generators of hybrid configurations and block tables, realistic and adversarial.

One builder, two drivers: ``cases()`` is a Hypothesis strategy (shrinks), and
``random_cases()`` drives the very same builder from ``random.Random`` for the
million-case batches Hypothesis is too slow for. Tables follow vLLM 0.33's
allocator (docs/vllm-semantics.md#block-tables): ``add_local_computed_blocks`` pads skipped blocks with the
null block, ``allocate_external_computed_blocks`` appends fresh ones.
"""

from __future__ import annotations

import math
import random
from typing import Iterator, Sequence

from hypothesis import strategies as st

from .vocab import NULL, Block, BlockState, Case, Group, GroupConfig, GroupKind, cdiv, lcm_all

FAMILIES = ("realistic", "recurrent_state", "adversarial")
MAX_TABLE = 48  # blocks per table in generated cases: keeps the symbolic model fast
ADVERSARIAL_MUTATIONS = (
    "unaligned_n", "short_table", "null_in_fresh", "hashed_in_fresh", "short_prompt",
    "unhashed_below_f", "random_table", "wide_hit",
)


class _Draw:
    """The few choices the builder makes; the two drivers implement them."""

    def integer(self, lo: int, hi: int) -> int: ...
    def choice(self, seq: Sequence): ...
    def boolean(self, p: float = 0.5) -> bool: ...


class _RandomDraw(_Draw):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo, hi):
        return self.rng.randint(lo, hi)

    def choice(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def boolean(self, p=0.5):
        return self.rng.random() < p


class _HypothesisDraw(_Draw):
    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def choice(self, seq):
        return self.draw(st.sampled_from(list(seq)))

    def boolean(self, p=0.5):
        return self.draw(st.booleans())


# --- configs ---------------------------------------------------------------

def _draw_config(d: _Draw, kinds: Sequence[GroupKind], max_groups: int, need_mamba: bool):
    """Groups, blocks_per_chunk and tokens_per_hash as a hybrid model would have them.

    Mamba hybrids share one block size (vLLM raises the attention block to cover the
    Mamba page); sliding-window hybrids may mix sizes (vLLM tests: 256/64/8, 16/4, 12/16).
    """
    n = d.integer(1, max_groups)
    group_kinds = [d.choice(kinds) for _ in range(n)]
    if need_mamba and GroupKind.MAMBA not in group_kinds:
        group_kinds[d.integer(0, n - 1)] = GroupKind.MAMBA
    if GroupKind.MAMBA in group_kinds or d.boolean(0.4):
        sizes = [d.choice((4, 8, 16, 32))] * n
    else:
        palette = d.choice(((4, 8, 16), (8, 16, 32), (12, 16), (4, 16), (16, 32, 64)))
        sizes = [d.choice(palette) for _ in range(n)]
    bpc = d.choice((1, 1, 2, 4))
    gcd = math.gcd(*sizes) * bpc
    divisors = [t for t in (1, 2, 4, 8, 16, 32, 64) if gcd % t == 0]
    tph = d.choice(divisors[-3:])
    configs = []
    for kind, b in zip(group_kinds, sizes):
        if kind is GroupKind.SLIDING_WINDOW:
            configs.append(GroupConfig(kind, b, sliding_window=b * d.integer(1, 4) - d.choice((0, 0, 1))))
        elif kind is GroupKind.CHUNKED_LOCAL:
            configs.append(GroupConfig(kind, b, attention_chunk_size=b * d.choice((1, 2, 4))))
        else:
            configs.append(GroupConfig(kind, b))
    return configs, bpc, tph


def _draw_tokens(d: _Draw, configs, bpc: int):
    """N a multiple of every block size (the scheduler rounds it to their LCM); T on a
    chunk boundary of every group with M >= the largest chunk, since the lookup hits
    whole chunks past N or nothing (docs/vllm-semantics.md#lookup); small enough for MAX_TABLE."""
    unit_n = lcm_all(c.tokens_per_block for c in configs)
    unit_t = lcm_all(c.tokens_per_chunk(bpc) for c in configs)
    b_min = min(c.tokens_per_block for c in configs)
    budget = MAX_TABLE * b_min - 2 * max(c.tokens_per_block for c in configs)
    max_t_units = max(1, budget // unit_t)
    N = unit_n * d.integer(0, (max_t_units - 1) * unit_t // unit_n)
    t_min = cdiv(N + unit_t, unit_t)
    T = unit_t * d.integer(t_min, max(t_min, max_t_units))
    return N, T


# --- tables, per kind, as the allocator builds them -------------------------

class _Ids:
    def __init__(self, d: _Draw):
        self.d, self.next = d, d.integer(1, 40)

    def __call__(self, state: BlockState) -> Block:
        bid = self.next
        self.next += self.d.integer(1, 3)
        return Block(state, bid)


def _num_skipped_tokens(cfg: GroupConfig, T: int) -> int:
    if cfg.kind is GroupKind.SLIDING_WINDOW:
        return max(0, T - cfg.sliding_window + 1)
    if cfg.kind is GroupKind.CHUNKED_LOCAL:
        return (T // cfg.attention_chunk_size) * cfg.attention_chunk_size
    return 0


def allocator_table(d: _Draw, cfg: GroupConfig, N: int, T: int, ids, sync_load: bool = False) -> tuple:
    """``add_local_computed_blocks`` then ``allocate_external_computed_blocks``.

    Fresh blocks are unhashed, except for a sync load where 0.33 hashes them at
    allocation. Mamba (align mode) keeps only the state block: ``·*(k-1) F``.
    """
    b = cfg.tokens_per_block
    k, local = cdiv(T, b), N // b
    fresh = BlockState.HASHED if sync_load else BlockState.UNHASHED
    if cfg.kind is GroupKind.MAMBA:
        table = [NULL] * (k - 1) + [ids(fresh)]
        table += [ids(BlockState.UNHASHED) for _ in range(d.integer(0, 2))]  # speculative scratch
        return tuple(table)
    s = _num_skipped_tokens(cfg, T) // b
    table = [NULL] * min(s, local) + [ids(BlockState.HASHED) for _ in range(local - min(s, local))]
    table += [NULL] * max(0, s - local)
    external = min(T - _num_skipped_tokens(cfg, T), T - N)
    if external > 0:
        table += [ids(fresh) for _ in range(max(0, k - len(table)))]
    return tuple(table)


def recurrent_state_table(d: _Draw, cfg: GroupConfig, N: int, T: int, ids) -> tuple:
    """The PR's shape ``[H][H][·][U][·]…[·][F]``: the state block, non-null and
    unhashed, sits below f among nulls (what production and vLLM's test build)."""
    b = cfg.tokens_per_block
    k, f = cdiv(T, b), cdiv(N, b)
    assert f >= 1, "the recurrent-state shape needs a computed prefix"
    table = [NULL] * k
    n_hashed = d.integer(0, f - 1)
    for i in range(n_hashed):
        table[i] = ids(BlockState.HASHED)
    table[d.integer(n_hashed, f - 1)] = ids(BlockState.UNHASHED)
    for i in range(f, k - 1):
        table[i] = NULL
    table[k - 1] = ids(BlockState.UNHASHED)
    return tuple(table)


# --- adversarial perturbations ----------------------------------------------

def _adversarial(d: _Draw, case_kw: dict, configs, ids) -> str:
    """Mutate a realistic case in place into one the allocator or lookup would not build."""
    how = d.choice(ADVERSARIAL_MUTATIONS)
    groups = case_kw["groups"]
    gi = d.integer(0, len(groups) - 1)
    cfg, table = groups[gi].config, list(groups[gi].blocks)
    b = cfg.tokens_per_block
    N, T = case_kw["num_locally_computed_tokens"], case_kw["num_locally_computed_tokens"] + case_kw["num_external_tokens"]
    k, f = cdiv(T, b), cdiv(N, b)
    if how == "unaligned_n":
        shift = d.integer(1, max(1, b - 1))
        if N + shift < T:
            case_kw["num_locally_computed_tokens"] += shift
            case_kw["num_external_tokens"] -= shift
    elif how == "short_table" and table:
        table = table[: d.integer(0, max(0, min(len(table), k) - 1))]
    elif how == "null_in_fresh" and f < k:
        table[d.integer(f, k - 1)] = NULL
    elif how == "hashed_in_fresh" and f < k:
        i = d.integer(f, k - 1)
        table[i] = ids(BlockState.HASHED)
    elif how == "short_prompt":
        case_kw["num_prompt_tokens"] = d.integer(0, max(0, T - 1))
    elif how == "unhashed_below_f" and f > 0:
        table[d.integer(0, f - 1)] = ids(BlockState.UNHASHED)
    elif how == "random_table":
        table = [d.choice((NULL, None, None)) or ids(d.choice((BlockState.HASHED, BlockState.UNHASHED)))
                 for _ in range(d.integer(max(0, k - 2), k + 2))]
    elif how == "wide_hit":
        extra = d.integer(1, 3) * cfg.tokens_per_chunk(case_kw["blocks_per_chunk"])
        if T + extra <= MAX_TABLE * min(c.tokens_per_block for c in configs):
            case_kw["num_external_tokens"] += extra
            case_kw["num_prompt_tokens"] += extra
    groups[gi] = Group(cfg, tuple(table))
    return how


# --- the builder ---------------------------------------------------------------

def build_case(d: _Draw, family: str, name: str, kinds=None, max_groups: int = 8) -> Case:
    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is not one of {', '.join(FAMILIES)}")
    kinds = tuple(GroupKind(k) for k in (kinds or GroupKind))
    if family == "recurrent_state" and GroupKind.MAMBA not in kinds:
        kinds += (GroupKind.MAMBA,)
    configs, bpc, tph = _draw_config(d, kinds, max_groups, need_mamba=family == "recurrent_state")
    N, T = _draw_tokens(d, configs, bpc)
    if family == "recurrent_state" and N == 0:  # the shape needs a computed prefix
        unit_t = lcm_all(c.tokens_per_chunk(bpc) for c in configs)
        N = lcm_all(c.tokens_per_block for c in configs)
        T = cdiv(max(T, N + unit_t), unit_t) * unit_t
    sync_load = family == "realistic" and d.boolean(0.15)
    ids = _Ids(d)
    groups = []
    recurrent_done = False
    for cfg in configs:
        if family == "recurrent_state" and cfg.kind is GroupKind.MAMBA and (not recurrent_done or d.boolean()):
            table = recurrent_state_table(d, cfg, N, T, ids)
            recurrent_done = True
        else:
            table = allocator_table(d, cfg, N, T, ids, sync_load)
        groups.append(Group(cfg, table))
    case_kw = dict(
        name=name, blocks_per_chunk=bpc, tokens_per_hash=tph,
        num_prompt_tokens=T + d.integer(1, 2 * max(c.tokens_per_block for c in configs)),
        num_locally_computed_tokens=N, num_external_tokens=T - N, groups=groups, sync_load=sync_load,
    )
    if family == "adversarial":
        case_kw["name"] = f"{name}-{_adversarial(d, case_kw, configs, ids)}"
    return Case(**case_kw)


def family_of(case: Case) -> str:
    """Generated names start with their family; anything else is a user/example case."""
    for fam in FAMILIES:
        if case.name.startswith(fam):
            return fam
    return "example"


@st.composite
def cases(draw, family: str | None = None, kinds=None, max_groups: int = 8) -> Case:
    """Hypothesis strategy of ``Case``; ``family=None`` mixes all three."""
    fam = family or draw(st.sampled_from(FAMILIES))
    return build_case(_HypothesisDraw(draw), fam, f"{fam}-hyp", kinds, max_groups)


def random_cases(n: int, seed: int = 0, family: str | None = None, kinds=None, max_groups: int = 8) -> Iterator[Case]:
    """``n`` cases from ``random.Random(seed)``; names are ``<family>-<seed>-<i>`` so a case
    is found again from its name."""
    rng = random.Random(seed)
    d = _RandomDraw(rng)
    for i in range(n):
        fam = family or FAMILIES[i % len(FAMILIES)]
        yield build_case(d, fam, f"{fam}-{seed}-{i}", kinds, max_groups)


group_kinds = st.sampled_from(list(GroupKind))
