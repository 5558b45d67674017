"""Generators of hybrid configurations and block tables, realistic and adversarial.

One builder, two drivers of the same ``random.Random`` interface: ``cases()`` is a
Hypothesis strategy that hands the builder ``st.randoms(use_true_random=False)``
(every draw is Hypothesis's, so it shrinks), and ``random_cases()`` hands it a seeded
``random.Random`` for the million-case batches Hypothesis is too slow for. Tables follow vLLM 0.33's
allocator (docs/vllm-semantics.md#block-tables): ``add_local_computed_blocks`` pads skipped blocks with the
null block, ``allocate_external_computed_blocks`` appends fresh ones.
"""

from __future__ import annotations

import math
import random
from typing import Iterator, Sequence

from hypothesis import strategies as st

from .case import Case
from .vocab import NULL, Block, BlockState, Group, GroupConfig, GroupKind, cdiv, get_num_skipped_tokens, lcm_all

FAMILIES = ("realistic", "recurrent_state", "adversarial")  # v1: the default mix
# case format v2 (docs/case-format.md): partial tails, short prompts, EAGLE groups, retained
# windows (MTP), resumed requests, group subsets, and partial tails with asserts to find
V2_FAMILIES = ("partial_tail", "short_prompt", "eagle", "retained_window", "resumed", "group_subset",
               "adversarial_tail")
ALL_FAMILIES = FAMILIES + V2_FAMILIES
ADVERSARIAL_FAMILIES = ("adversarial", "adversarial_tail")  # the others only hold what vLLM builds
_TAIL_FAMILIES = ("partial_tail", "short_prompt", "eagle", "adversarial_tail")
ADVERSARIAL_TAIL_MUTATIONS = ("tail_not_t", "short_table", "null_in_fresh", "unhashed_below_f")
MAX_TABLE = 48  # blocks per table in generated cases: keeps the symbolic model fast
ADVERSARIAL_MUTATIONS = (
    "unaligned_n", "short_table", "null_in_fresh", "hashed_in_fresh", "short_prompt",
    "unhashed_below_f", "random_table", "wide_hit",
)


def _coin(rng, p: float = 0.5) -> bool:
    return rng.random() < p


# --- configs ---------------------------------------------------------------

def _draw_config(rng, kinds: Sequence[GroupKind], max_groups: int, need_mamba: bool):
    """Groups, blocks_per_chunk and tokens_per_hash as a hybrid model would have them.

    Mamba hybrids share one block size (vLLM raises the attention block to cover the
    Mamba page); sliding-window hybrids may mix sizes (vLLM tests: 256/64/8, 16/4, 12/16).
    """
    n = rng.randint(1, max_groups)
    group_kinds = [rng.choice(kinds) for _ in range(n)]
    if need_mamba and GroupKind.MAMBA not in group_kinds:
        group_kinds[rng.randint(0, n - 1)] = GroupKind.MAMBA
    if GroupKind.MAMBA in group_kinds or _coin(rng, 0.4):
        sizes = [rng.choice((4, 8, 16, 32))] * n
    else:
        palette = rng.choice(((4, 8, 16), (8, 16, 32), (12, 16), (4, 16), (16, 32, 64)))
        sizes = [rng.choice(palette) for _ in range(n)]
    bpc = rng.choice((1, 1, 2, 4))
    gcd = math.gcd(*sizes) * bpc
    divisors = [t for t in (1, 2, 4, 8, 16, 32, 64) if gcd % t == 0]
    tph = rng.choice(divisors[-3:])
    configs = []
    for kind, b in zip(group_kinds, sizes):
        if kind is GroupKind.SLIDING_WINDOW:
            configs.append(GroupConfig(kind, b, sliding_window=b * rng.randint(1, 4) - rng.choice((0, 0, 1))))
        elif kind is GroupKind.CHUNKED_LOCAL:
            configs.append(GroupConfig(kind, b, attention_chunk_size=b * rng.choice((1, 2, 4))))
        else:
            configs.append(GroupConfig(kind, b))
    return configs, bpc, tph


def _draw_tokens(rng, configs, bpc: int):
    """N a multiple of every block size (the scheduler rounds it to their LCM); T on a
    chunk boundary of every group with M >= the largest chunk, since the lookup hits
    whole chunks past N or nothing (docs/vllm-semantics.md#lookup); small enough for MAX_TABLE."""
    unit_n = lcm_all(c.tokens_per_block for c in configs)
    unit_t = lcm_all(c.tokens_per_chunk(bpc) for c in configs)
    b_min = min(c.tokens_per_block for c in configs)
    budget = MAX_TABLE * b_min - 2 * max(c.tokens_per_block for c in configs)
    max_t_units = max(1, budget // unit_t)
    N = unit_n * rng.randint(0, (max_t_units - 1) * unit_t // unit_n)
    t_min = cdiv(N + unit_t, unit_t)
    T = unit_t * rng.randint(t_min, max(t_min, max_t_units))
    return N, T


# --- tables, per kind, as the allocator builds them -------------------------

class _Ids:
    def __init__(self, rng):
        self.rng, self.next = rng, rng.randint(1, 40)

    def __call__(self, state: BlockState) -> Block:
        bid = self.next
        self.next += self.rng.randint(1, 3)
        return Block(state, bid)


def allocator_table(rng, cfg: GroupConfig, N: int, T: int, ids, sync_load: bool = False) -> tuple:
    """``add_local_computed_blocks`` then ``allocate_external_computed_blocks``.

    Fresh blocks are unhashed, except for a sync load where 0.33 hashes them at
    allocation. Mamba (align mode) keeps only the state block: ``·*(k-1) F``.
    """
    b = cfg.tokens_per_block
    k, local = cdiv(T, b), N // b
    fresh = BlockState.HASHED if sync_load else BlockState.UNHASHED
    if cfg.kind is GroupKind.MAMBA:
        table = [NULL] * (k - 1) + [ids(fresh)]
        table += [ids(BlockState.UNHASHED) for _ in range(rng.randint(0, 2))]  # speculative scratch
        return tuple(table)
    skipped = get_num_skipped_tokens(cfg.kind, T, sliding_window=cfg.sliding_window,
                                     extra_retained_tokens=cfg.extra_retained_tokens,
                                     attention_chunk_size=cfg.attention_chunk_size)
    s = skipped // b
    table = [NULL] * min(s, local) + [ids(BlockState.HASHED) for _ in range(local - min(s, local))]
    table += [NULL] * max(0, s - local)
    external = min(T - skipped, T - N)
    if external > 0:
        table += [ids(fresh) for _ in range(max(0, k - len(table)))]
    return tuple(table)


def recurrent_state_table(rng, cfg: GroupConfig, N: int, T: int, ids) -> tuple:
    """The PR's shape ``[H][H][·][U][·]…[·][F]``: the state block, non-null and
    unhashed, sits below f among nulls (what production and vLLM's test build)."""
    b = cfg.tokens_per_block
    k, f = cdiv(T, b), cdiv(N, b)
    assert f >= 1, "the recurrent-state shape needs a computed prefix"
    table = [NULL] * k
    n_hashed = rng.randint(0, f - 1)
    for i in range(n_hashed):
        table[i] = ids(BlockState.HASHED)
    table[rng.randint(n_hashed, f - 1)] = ids(BlockState.UNHASHED)
    for i in range(f, k - 1):
        table[i] = NULL
    table[k - 1] = ids(BlockState.UNHASHED)
    return tuple(table)


# --- adversarial perturbations ----------------------------------------------

def _adversarial(rng, case_kw: dict, configs, ids) -> str:
    """Mutate a realistic case in place into one the allocator or lookup would not build."""
    how = rng.choice(ADVERSARIAL_MUTATIONS)
    groups = case_kw["groups"]
    gi = rng.randint(0, len(groups) - 1)
    cfg, table = groups[gi].config, list(groups[gi].blocks)
    b = cfg.tokens_per_block
    N, T = case_kw["num_locally_computed_tokens"], case_kw["num_locally_computed_tokens"] + case_kw["num_external_tokens"]
    k, f = cdiv(T, b), cdiv(N, b)
    if how == "unaligned_n":
        shift = rng.randint(1, max(1, b - 1))
        if N + shift < T:
            case_kw["num_locally_computed_tokens"] += shift
            case_kw["num_external_tokens"] -= shift
    elif how == "short_table" and table:
        table = table[: rng.randint(0, max(0, min(len(table), k) - 1))]
    elif how == "null_in_fresh" and f < k:
        table[rng.randint(f, k - 1)] = NULL
    elif how == "hashed_in_fresh" and f < k:
        i = rng.randint(f, k - 1)
        table[i] = ids(BlockState.HASHED)
    elif how == "short_prompt":
        case_kw["num_prompt_tokens"] = rng.randint(0, max(0, T - 1))
    elif how == "unhashed_below_f" and f > 0:
        table[rng.randint(0, f - 1)] = ids(BlockState.UNHASHED)
    elif how == "random_table":
        table = [rng.choice((NULL, None, None)) or ids(rng.choice((BlockState.HASHED, BlockState.UNHASHED)))
                 for _ in range(rng.randint(max(0, k - 2), k + 2))]
    elif how == "wide_hit":
        extra = rng.randint(1, 3) * cfg.tokens_per_chunk(case_kw["blocks_per_chunk"])
        if T + extra <= MAX_TABLE * min(c.tokens_per_block for c in configs):
            case_kw["num_external_tokens"] += extra
            case_kw["num_prompt_tokens"] += extra
    groups[gi] = Group(cfg, tuple(table))
    return how


# --- case format v2 families ---------------------------------------------------

def _tail_config(rng, eagle: bool):
    """A config where ``supports_partial_tail`` holds (docs/vllm-semantics.md#load-contract):
    one block per chunk, one block size b > tokens_per_hash, full-attention groups and
    align-mode Mamba groups (the hybrid GDN/Mamba models of the PR), in any order; with
    ``eagle`` one more full-attention group of drafter layers."""
    b = rng.choice((8, 16, 32))
    tph = rng.choice(tuple(t for t in (2, 4, 8) if t < b))
    kinds = [GroupKind.FULL_ATTENTION] * rng.randint(1, 2) + [GroupKind.MAMBA] * rng.randint(1, 3)
    rng.shuffle(kinds)
    configs = [GroupConfig(k, b) for k in kinds]
    if eagle:
        configs.insert(rng.randint(0, len(configs)), GroupConfig(GroupKind.FULL_ATTENTION, b, is_eagle_group=True))
    return configs, 1, tph


def _tail_tables(rng, configs, N: int, T: int, ids, recurrent: bool) -> list:
    """Full attention as the allocator builds it; Mamba either ``·*(k-1) F`` or, with
    ``recurrent`` and a computed prefix, the PR's ``[H][H][·][U][·]…[F]``."""
    f = cdiv(N, configs[0].tokens_per_block)
    out = []
    for cfg in configs:
        if cfg.kind is GroupKind.MAMBA and recurrent and f >= 1 and _coin(rng, 0.7):
            out.append(Group(cfg, recurrent_state_table(rng, cfg, N, T, ids)))
        else:
            out.append(Group(cfg, allocator_table(rng, cfg, N, T, ids)))
    return out


def _build_tail(rng, family: str, name: str) -> Case:
    """``partial_tail``, ``short_prompt``, ``eagle`` and ``adversarial_tail``: the lookup's
    partial tail (0.33 ``_lookup``): N a multiple of b, whole chunks past N, then a boundary
    inside the next block, a multiple of tokens_per_hash, below the prompt's end; T is that
    boundary."""
    eagle = family == "eagle"
    configs, bpc, tph = _tail_config(rng, eagle)
    b = configs[0].tokens_per_block
    alignment = rng.choice((None, None, tph, b)) if eagle else None
    if family == "short_prompt":  # a prompt shorter than a block (the 10-token prompt)
        N, P = 0, rng.randint(tph + 1, b)
        boundary = tph * rng.randint(1, (P - 1) // tph)
    else:
        N = b * rng.randint(0, 6)
        complete = b * rng.randint(0, 5)
        # inside the block after the whole chunks the lookup hit (a block-aligned boundary,
        # which 0.33 can record past an EAGLE group's popped chunk, is not drivable by a tier
        # that holds every chunk below T: the complete-chunk hit would already reach it)
        boundary = N + complete + tph * rng.randint(1, b // tph - 1)
        P = boundary + rng.randint(1, 2 * b)
    kw = dict(name=name, blocks_per_chunk=bpc, tokens_per_hash=tph, num_prompt_tokens=P,
              num_locally_computed_tokens=N, num_external_tokens=boundary - N, sync_load=False,
              cache_hit_alignment_tokens=alignment)
    if eagle:  # the proof key needs a hash past the boundary: the request must have those tokens
        fine = alignment is not None and alignment < b
        margin = tph if fine else b
        kw["num_prompt_tokens"] = P = max(P, boundary + margin)
        if _coin(rng, 0.2):
            kw["partial_tail_boundary"] = None  # an EAGLE config loading whole chunks
            # whole chunks: the EAGLE group queries one chunk past the hit and pops it, the query
            # capped at len(offload_keys) * tpc (0.33 scheduler.py:936-942, pop :984-985), so a hit
            # of T needs the chunk past T among the keys: keys ≥ T/b + 1, i.e. the prompt ≥ T + b
            kw["num_prompt_tokens"] = P = max(P, N + max(b, (boundary - N) // b * b) + b)
    if family != "short_prompt" and _coin(rng, 0.25):
        kw["num_tokens"] = P + rng.randint(1, 2 * b)  # resumed: its output is hashed too
    kw.setdefault("partial_tail_boundary", boundary)
    if kw["partial_tail_boundary"] is None:  # whole chunks only: T back on a block boundary
        kw["num_external_tokens"] = max(b, (boundary - N) // b * b)
    T = N + kw["num_external_tokens"]
    ids = _Ids(rng)
    groups = _tail_tables(rng, configs, N, T, ids, recurrent=family in ("partial_tail", "adversarial_tail"))
    if family == "adversarial_tail":
        kw["name"] = f"{name}-{_adversarial_tail(rng, kw, groups, ids)}"
    return Case(groups=groups, **kw)


def _adversarial_tail(rng, kw: dict, groups: list, ids) -> str:
    """A partial-tail case the lookup and allocator would not build (asserts to find)."""
    how = rng.choice(ADVERSARIAL_TAIL_MUTATIONS)
    gi = rng.randint(0, len(groups) - 1)
    cfg, table = groups[gi].config, list(groups[gi].blocks)
    b, N = cfg.tokens_per_block, kw["num_locally_computed_tokens"]
    T = N + kw["num_external_tokens"]
    k, f = cdiv(T, b), cdiv(N, b)
    if how == "tail_not_t":  # M is not the lookup's answer: the partial_tail assert
        kw["num_external_tokens"] = max(1, kw["num_external_tokens"] + rng.choice((-1, 1)) * kw["tokens_per_hash"])
        if N + kw["num_external_tokens"] == kw["partial_tail_boundary"]:
            kw["num_external_tokens"] += kw["tokens_per_hash"]
    elif how == "short_table" and table:
        table = table[: rng.randint(0, max(0, min(len(table), k) - 1))]
    elif how == "null_in_fresh" and f < k:
        table[rng.randint(f, k - 1)] = NULL
    elif how == "unhashed_below_f" and f > 0:
        table[rng.randint(0, f - 1)] = ids(BlockState.UNHASHED)
    groups[gi] = Group(cfg, tuple(table))
    return how


def _build_v1_shaped(rng, family: str, name: str, kinds, max_groups: int) -> Case:
    """``retained_window``, ``resumed`` and ``group_subset``: realistic configs and tables
    with one v2 input added."""
    if family == "retained_window":  # full attention + sliding window with MTP's retained tokens
        b = rng.choice((8, 16, 32))
        bpc = rng.choice((1, 1, 2))
        tph = rng.choice(tuple(t for t in (4, 8, 16) if b % t == 0))
        configs = [GroupConfig(GroupKind.FULL_ATTENTION, b)]
        for _ in range(rng.randint(1, 2)):
            w = b * rng.randint(1, 3) - rng.choice((0, 0, 1))
            extra = rng.choice((1, 2, 3, b - 1, b, 2 * b))  # num_spec_prefill_tokens - 1, ...
            configs.insert(rng.randint(0, len(configs)), GroupConfig(
                GroupKind.SLIDING_WINDOW, b, sliding_window=w, extra_retained_tokens=extra))
    else:
        configs, bpc, tph = _draw_config(rng, tuple(GroupKind(k) for k in (kinds or GroupKind)), max_groups, False)
    N, T = _draw_tokens(rng, configs, bpc)
    ids = _Ids(rng)
    groups = [Group(cfg, allocator_table(rng, cfg, N, T, ids)) for cfg in configs]
    b_max = max(c.tokens_per_block for c in configs)
    kw = dict(name=name, blocks_per_chunk=bpc, tokens_per_hash=tph, num_prompt_tokens=T + rng.randint(1, 2 * b_max),
              num_locally_computed_tokens=N, num_external_tokens=T - N, sync_load=False)
    if family == "resumed":  # preempted and resumed: the lookup may hit past the prompt
        kw["num_tokens"] = T + rng.randint(1, 3 * b_max)
        kw["num_prompt_tokens"] = rng.randint(1, kw["num_tokens"] - 1)
    if family == "group_subset":  # KV-cache groups the connector does not offload keep their place
        for _ in range(rng.randint(1, 2)):
            cfg = GroupConfig(rng.choice((GroupKind.FULL_ATTENTION, GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW)),
                              rng.choice(configs).tokens_per_block, offloaded=False)
            if cfg.kind is GroupKind.SLIDING_WINDOW:
                cfg = GroupConfig(cfg.kind, cfg.tokens_per_block, sliding_window=cfg.tokens_per_block * 2, offloaded=False)
            groups.insert(rng.randint(0, len(groups)), Group(cfg, allocator_table(rng, cfg, N, T, ids)))
    return Case(groups=groups, **kw)


# --- the builder ---------------------------------------------------------------

def build_case(rng, family: str, name: str, kinds=None, max_groups: int = 8) -> Case:
    """One case of ``family`` from ``rng`` (anything with ``random.Random``'s ``randint``,
    ``choice``, ``random`` and ``shuffle``)."""
    if family in _TAIL_FAMILIES:
        return _build_tail(rng, family, name)
    if family in ("retained_window", "resumed", "group_subset"):
        return _build_v1_shaped(rng, family, name, kinds, max_groups)
    if family not in FAMILIES:
        raise ValueError(f"family {family!r} is not one of {', '.join(ALL_FAMILIES)}")
    kinds = tuple(GroupKind(k) for k in (kinds or GroupKind))
    if family == "recurrent_state" and GroupKind.MAMBA not in kinds:
        kinds += (GroupKind.MAMBA,)
    configs, bpc, tph = _draw_config(rng, kinds, max_groups, need_mamba=family == "recurrent_state")
    N, T = _draw_tokens(rng, configs, bpc)
    if family == "recurrent_state" and N == 0:  # the shape needs a computed prefix
        unit_t = lcm_all(c.tokens_per_chunk(bpc) for c in configs)
        N = lcm_all(c.tokens_per_block for c in configs)
        T = cdiv(max(T, N + unit_t), unit_t) * unit_t
    sync_load = family == "realistic" and _coin(rng, 0.15)
    ids = _Ids(rng)
    groups = []
    recurrent_done = False
    for cfg in configs:
        if family == "recurrent_state" and cfg.kind is GroupKind.MAMBA and (not recurrent_done or _coin(rng)):
            table = recurrent_state_table(rng, cfg, N, T, ids)
            recurrent_done = True
        else:
            table = allocator_table(rng, cfg, N, T, ids, sync_load)
        groups.append(Group(cfg, table))
    case_kw = dict(
        name=name, blocks_per_chunk=bpc, tokens_per_hash=tph,
        num_prompt_tokens=T + rng.randint(1, 2 * max(c.tokens_per_block for c in configs)),
        num_locally_computed_tokens=N, num_external_tokens=T - N, groups=groups, sync_load=sync_load,
    )
    if family == "adversarial":
        case_kw["name"] = f"{name}-{_adversarial(rng, case_kw, configs, ids)}"
    return Case(**case_kw)


def family_of(case: Case) -> str:
    """Generated names are ``<family>-...``; anything else is a user/example case."""
    head = case.name.split("-", 1)[0]
    return head if head in ALL_FAMILIES else "example"


def _families(family) -> tuple:
    if family is None:
        return FAMILIES
    if family == "all":
        return ALL_FAMILIES
    if family not in ALL_FAMILIES:
        raise ValueError(f"family {family!r} is not one of {', '.join(ALL_FAMILIES)} (or all)")
    return (family,)


@st.composite
def cases(draw, family: str | None = None, kinds=None, max_groups: int = 8) -> Case:
    """Hypothesis strategy of ``Case``: ``family=None`` mixes the v1 families, ``"all"``
    every family. The builder draws from ``st.randoms(use_true_random=False)``."""
    fam = draw(st.sampled_from(_families(family)))
    rng = draw(st.randoms(use_true_random=False))
    return build_case(rng, fam, f"{fam}-hyp", kinds, max_groups)


def random_cases(n: int, seed: int = 0, family: str | None = None, kinds=None, max_groups: int = 8) -> Iterator[Case]:
    """``n`` cases from ``random.Random(seed)``; names are ``<family>-<seed>-<i>`` so a case
    is found again from its name. ``family=None`` takes the v1 families in turn (the same
    cases as before case format v2, seed for seed); ``"all"`` every family in turn."""
    rng = random.Random(seed)
    fams = _families(family)
    for i in range(n):
        fam = fams[i % len(fams)]
        yield build_case(rng, fam, f"{fam}-{seed}-{i}", kinds, max_groups)
