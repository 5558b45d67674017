"""The store premises: facts about one _build_store_jobs call, not a load.

Their subject is one request's numbers where ``_build_store_jobs`` reads them (``StoreTerms``):
what the scheduler scheduled and computed, and what the allocator holds. The store obligations
(``store.py``) rest on them; the load premises, and what every premise states (``Stated``), are
``premises.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbound.spec import GroupKind

from .premises import CORE_SCHED, KVM, SCHED, V26, V30, Stated, source
from .terms import AND

@dataclass(frozen=True)
class StoreTerms:
    """What a store premise reads: one request at one ``_build_store_jobs`` call (Z3 terms)."""

    P: object  # num_prompt_tokens
    O: object  # output tokens: num_tokens = P + O
    C: object  # num_computed_tokens
    S: object  # num_scheduled_tokens this step
    A: object  # GPU blocks allocated to the group (one block per chunk)
    B: object  # tokens per block (= per chunk)
    T: object  # num_tokens
    computed: object  # tokens whose KV the forward wrote once the batch ran (spec.store.computed_tokens)
    horizon: object  # the release's store horizon (spec.store.store_horizon)


@dataclass(frozen=True)
class StorePremise(Stated):
    """A premise of a store: one term over ``StoreTerms``."""

    term: Callable  # (StoreTerms) -> Z3 formula


FULL = frozenset({GroupKind.FULL_ATTENTION})

STORE_PREMISES: tuple = (
    StorePremise(
        "store-running-scheduled",
        "A running request is scheduled only tokens it has (no speculative decoding): computed and scheduled "
        "tokens stay within num_tokens.",
        "C + S ≤ T", FULL,
        (source(V30, CORE_SCHED, 656, "schedule: num_new_tokens = num_tokens_with_spec + placeholders - "
                                      "num_computed_tokens"),),
        lambda s: s.C + s.S <= s.T),
    StorePremise(
        "store-finished-by-sampling",
        "A request that finished by sampling has one output token at least and computed all but the final "
        "sampled one, which is never forwarded; nothing is scheduled for it.",
        "O ≥ 1 ∧ C = T − 1 ∧ S = 0", FULL,
        (source(V30, CORE_SCHED, 1533, "_update_after_schedule: num_computed_tokens += num_scheduled_token; the "
                                       "token sampled from the last forward is appended after it"),),
        lambda s: AND(s.O >= 1, s.C == s.T - 1, s.S == 0)),
    StorePremise(
        "store-aborted-computed",
        "An aborted request computed at most its tokens, and nothing is scheduled for it.",
        "C ≤ T ∧ S = 0", FULL,
        (source(V30, CORE_SCHED, 1533, "_update_after_schedule: num_computed_tokens counts forwarded tokens"),),
        lambda s: AND(s.C <= s.T, s.S == 0)),
    StorePremise(
        "store-allocated-computed",
        "The allocator holds blocks for the tokens computed so far: A ≤ cdiv(computed, B).",
        "A·B < computed + B", FULL,
        (source(V30, KVM, 370, "allocate_slots: blocks for the computed and the scheduled tokens"),),
        lambda s: s.A * s.B < s.computed + s.B),
    StorePremise(
        "store-no-cap-assert",
        "0.26 does not cap the stored chunks at the allocated blocks: the store is reached only where its "
        "assert passes (more chunks than blocks is a crash, not a store).",
        "⌊horizon/B⌋ ≤ A", FULL,
        (source(V26, SCHED, 975, "_build_store_jobs: assert len(offload_keys) == len(offload_block_ids)"),),
        lambda s: s.horizon / s.B <= s.A),
)

STORE_BY_ID = {p.id: p for p in STORE_PREMISES}

__all__ = ["STORE_BY_ID", "STORE_PREMISES", "StorePremise", "StoreTerms"]
