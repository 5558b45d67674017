"""The copy premises: facts about one scheduler step's requests, not a load.

Their subject is the step the copy contract is about (``CopyTerms``): the requests scheduled in
order, the holder computed before the step, their common prefixes and what each had cached and
computed when the step began. The copy obligations (``copy_contract.py``) rest on them; the load premises,
and what every premise states (``Stated``), are ``premises.py``'s. Each term is written once with
``terms.py``'s helpers, so it is a Z3 formula over the world and folds to True/False on a concrete
witness (``CopyPremise.check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Callable

from kvbound.spec import GroupKind

from .premises import CORE_SCHED, KVM, STM, V33, Stated, source
from .terms import AND, IF, IMPLIES, NOT, OR

HOLDER = "E"  # the request computed before the step (not scheduled in it)
STEP = ("r0", "r1", "r2")  # the requests scheduled in the step, in the order schedule() takes them
NAMES = (HOLDER,) + STEP
KCU = "v1/core/kv_cache_utils.py"
COORD = "v1/core/kv_cache_coordinator.py"


@dataclass(frozen=True)
class CopyTerms:
    """What a copy premise reads: the step's numbers (Z3 terms of a world, or a witness's ints)."""

    B: object  # block_size of the full-attention group
    U: object  # the hash unit (hash_block_size: prefix_match_unit when set)
    T: dict  # name -> num_tokens
    c: dict  # name -> num_computed_tokens when the step begins
    s: dict  # step request -> num_scheduled_tokens (the holder: 0)
    h: dict  # step request -> its local hit (0 for a running request: no lookup this step)
    new: dict  # step request -> first scheduled in this step (num_computed_tokens == 0)
    K0: dict  # name -> tokens whose keys it had cached when the step began
    lcp: dict  # (a, b), a before b in NAMES -> the length of their common token prefix

    def common(self, a, b):
        return self.lcp[(a, b) if NAMES.index(a) < NAMES.index(b) else (b, a)]


@dataclass(frozen=True)
class CopyPremise(Stated):
    """A premise of a step: one term over ``CopyTerms``."""

    term: Callable  # (CopyTerms) -> a formula

    def check(self, t: CopyTerms) -> str | None:
        """None when the premise holds on a concrete step, else what is wrong."""
        return None if self.term(t) is True else f"{self.id}: {self.math} does not hold"


def _hash_unit(t):
    return AND(t.U >= 1, t.B >= t.U, t.B % t.U == 0)


def _prefixes(t):
    out = []
    for a, b in combinations(NAMES, 2):
        out += [t.common(a, b) >= 0, t.common(a, b) <= t.T[a], t.common(a, b) <= t.T[b]]
    for a, b, c in permutations(NAMES, 3):  # a common prefix of a and b and of b and c is one of a and c
        out.append(OR(t.common(a, c) >= t.common(a, b), t.common(a, c) >= t.common(b, c)))
    return AND(*out)


def _scheduled(t):
    out = [t.c[HOLDER] >= 1, t.c[HOLDER] <= t.T[HOLDER], t.s[HOLDER] == 0]
    for x in STEP:
        out += [t.s[x] >= 1, t.h[x] >= 0, t.c[x] >= 0, IF(t.new[x], t.h[x], t.c[x]) + t.s[x] <= t.T[x]]
    return AND(*out)


def _first_schedule(t):
    return AND(*[AND(IMPLIES(t.new[x], t.c[x] == 0), IMPLIES(NOT(t.new[x]), AND(t.c[x] >= 1, t.h[x] == 0)))
                 for x in STEP])


def _cached_computed(t):
    return AND(*[AND(t.K0[x] >= 0, t.K0[x] <= t.c[x]) for x in NAMES])


def _mamba_state(t):
    """A hybrid hit at h needs the Mamba group's state at h, cached in an earlier step."""
    out = []
    for x in STEP:
        has = OR(*[AND(t.common(x, z) >= t.h[x], t.K0[z] >= t.h[x]) for z in NAMES if z != x])
        out.append(IMPLIES(AND(t.new[x], t.h[x] >= 1), has))
    return AND(*out)


FULL = frozenset({GroupKind.FULL_ATTENTION})

COPY_PREMISES: tuple = (
    CopyPremise(
        "copy-hash-unit",
        "The hash unit divides the block size: vLLM rejects a prefix_match_unit that does not divide every "
        "prefix-cacheable group's block size; unset, it is the GCD of the block sizes.",
        "U ≥ 1 ∧ U ≤ B ∧ B mod U = 0", FULL,
        (source(V33, KCU, 890, "hash_block_size = prefix_match_unit or gcd(block sizes); :892 rejects one that "
                               "does not divide them"),),
        _hash_unit),
    CopyPremise(
        "copy-prefixes",
        "Token sequences share prefixes consistently: a common prefix is no longer than either sequence, and "
        "what a shares with b and b with c, a shares with c (block hashes are chained over the prefix).",
        "0 ≤ lcp(a,b) ≤ min(T_a, T_b) ∧ lcp(a,c) ≥ min(lcp(a,b), lcp(b,c))", FULL,
        (source(V33, KCU, 953, "get_request_block_hasher: hashes chained over the prefix, one per hash unit"),),
        _prefixes),
    CopyPremise(
        "copy-scheduled-within",
        "Each request scheduled in the step is scheduled at least one token and no token past num_tokens, "
        "from its hit (a new request) or its computed tokens (a running one); the holder computed before the "
        "step is not scheduled in it.",
        "s ≥ 1 ∧ start + s ≤ T, start = h (new) or c (running);  c_E ≥ 1 ∧ s_E = 0", FULL,
        (source(V33, KVM, 621, "allocate_slots caches min(total_computed_tokens + num_new_tokens, num_tokens)"),
         source(V33, CORE_SCHED, 1858, "_update_after_schedule: num_computed_tokens += num_scheduled_token")),
        _scheduled),
    CopyPremise(
        "copy-lookup-on-first-schedule",
        "Only a request scheduled for the first time (num_computed_tokens == 0) looks up a local hit; a running "
        "one has computed tokens and takes none this step.",
        "new → c = 0;  ¬new → c ≥ 1 ∧ h = 0", FULL,
        (source(V33, CORE_SCHED, 1110, "schedule: the local prefix-cache hit only if request.num_computed_tokens "
                                       "== 0 (:1127 _get_local_prefix_cache_hit)"),),
        _first_schedule),
    CopyPremise(
        "copy-cached-computed",
        "When the step begins, every key a request has cached covers tokens it has computed: each earlier step "
        "cached at scheduling what its forward then computed, and the forwards run in order, before this "
        "step's copies (one stream: zero, copy, forward per step).",
        "0 ≤ K0_x ≤ c_x", FULL,
        (source(V33, KVM, 621, "num_tokens_to_cache = min(total_computed_tokens + num_new_tokens, num_tokens)"),
         source(V33, "v1/worker/gpu_model_runner.py", 1205, "_zero_block_ids, then copy_kv_cache_blocks_inplace, "
                                                             "then the forward")),
        _cached_computed),
    CopyPremise(
        "copy-mamba-state-before-step",
        "A hybrid hit at h needs the Mamba group's state at h, cached in an earlier step: the coordinator trims "
        "the full-attention hit to the length every group hits, and the Mamba manager defers a request whose "
        "hit ends on a state cached in the current step.",
        "new ∧ h ≥ 1 → ∃ z ≠ x: lcp(x,z) ≥ h ∧ K0_z ≥ h", FULL,
        (source(V33, COORD, 919, "find_longest_cache_hit: every full-attention group truncated to the final "
                                 "hit_length (:931 del blks[num_blocks:])"),
         source(V33, STM, 1704, "MambaManager.get_num_blocks_to_allocate: a hit on a block in "
                                "cached_blocks_this_step is deferred (:1708)")),
        _mamba_state),
)

COPY_BY_ID = {p.id: p for p in COPY_PREMISES}

__all__ = ["COPY_BY_ID", "COPY_PREMISES", "HOLDER", "NAMES", "STEP", "CopyPremise", "CopyTerms"]
