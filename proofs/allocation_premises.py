"""The allocation premises: facts about a pair of allocate_slots calls, not a load.

Their subject is a pair of allocate_slots calls of one request on one manager (``allocator.Calls``),
not a load; the terms fold on ints, so ``check`` is the same formula evaluated on a concrete pair
(``allocator.AllocCalls``). The reservation obligations (``reservation.py``) rest on them; the load
premises, and what every premise states (``Stated``), are ``premises.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbound.spec import GroupKind

from .allocator import AllocCalls, skipped_blocks
from .premises import ALL_KINDS, CORE_SCHED, KVM, SCHED, STM, V28, V29, V32, V33, Stated, source
from .terms import AND, CDIV, IMPLIES, MAX

@dataclass(frozen=True)
class AllocationPremise(Stated):
    """A premise of a pair of allocate_slots calls: one term, over the manager kind and the calls."""

    term: Callable  # (kind, Calls) -> formula (a bool on a concrete pair of calls)

    def check(self, calls: AllocCalls) -> str | None:
        """None when the pair of calls (a witness, or a replay's) meets it, else the statement."""
        return None if self.term(calls.kind, calls.inputs) is True else f"{self.id}: {self.statement}"


def _t_nonempty(kind, x):
    return x.L + x.E + x.NEW >= 1


def _t_evictable(kind, x):
    h = CDIV(x.L, x.b)
    if kind is GroupKind.MAMBA:
        return AND(x.ev <= 1, x.ev <= h)
    s = skipped_blocks(kind, x, x.L + x.E)
    return x.ev <= MAX(h - s, 0)


def _t_running(kind, x):
    T = x.L + x.E
    return x.C == T + x.NEW


def _t_checkpoint(kind, x):
    return AND(IMPLIES(x.c1, CDIV(x.L + x.E + x.NEW, x.b) >= 2), IMPLIES(x.c2, CDIV(x.C + x.NEW2, x.b) >= 2))


def _t_async(kind, x):
    return IMPLIES(x.E > 0, AND(x.NEW == 0, x.LA == 0))


def _t_window(kind, x):
    if kind is GroupKind.SLIDING_WINDOW:
        return AND(x.w >= 1, x.extra >= 0)
    if kind is GroupKind.CHUNKED_LOCAL:
        return x.chunk >= 1
    return True


ALLOCATION_PREMISES: tuple = (
    AllocationPremise(
        "alloc-call-adopts-or-computes",
        "An allocate_slots call adopts a local hit or connector tokens, or schedules new ones: it raises "
        "ValueError otherwise.", "L + E + NEW ≥ 1", ALL_KINDS,
        (source(V33, KVM, 483, "allocate_slots: num_new_tokens must be greater than 0 when there are no computed "
              "tokens to adopt"),),
        _t_nonempty),
    AllocationPremise(
        "alloc-evictable-hit",
        "Only non-null hit blocks with ref_cnt 0 are evictable: a Mamba hit is nulls then its one state block "
        "(at most one evictable); another manager's evictable blocks lie in the hit past the skipped blocks "
        "(the ones add_local_computed_blocks touches and get_num_blocks_to_allocate counts).",
        "Mamba: ev ≤ min(1, ⌈L/b⌉);  else ev ≤ max(⌈L/b⌉ − ⌊skipped(T)/b⌋, 0)", ALL_KINDS,
        (source(V33, STM, 161, "_get_num_evictable_blocks: ref_cnt == 0 and not null"),
         source(V33, STM, 1516, "MambaManager.find_longest_cache_hit: nulls, then the cached state block"),
         source(V33, STM, 259, "get_num_blocks_to_allocate: evictable blocks of new_computed_blocks past the skip"),
         source(V33, STM, 305, "add_local_computed_blocks: touches new_computed_blocks[num_skipped_blocks:]")),
        _t_evictable),
    AllocationPremise(
        "alloc-running-computed",
        "At the running call the request has computed what its first call adopted and scheduled: the "
        "scheduler adds the scheduled tokens to num_computed_tokens, and a first call schedules prompt tokens, "
        "no draft tokens to reject (an async load's first call schedules nothing, so C = T).",
        "C = L + E + NEW;  NEW2 ≥ 1", ALL_KINDS,
        (source(V33, KVM, 510, "allocate_slots: num_local_computed_tokens = request.num_computed_tokens + "
              "num_new_computed_tokens"),
         source(V33, CORE_SCHED, 1858, "_update_after_schedule: request.num_computed_tokens += num_scheduled_token"),
         source(V33, CORE_SCHED, 1286, "schedule: an async load schedules num_new_tokens = 0")),
        _t_running),
    AllocationPremise(
        "alloc-checkpoint-index",
        "A Mamba prefill checkpoint block is reserved only where its index cdiv(query_end, b) - 2 is a block.",
        "c ⟹ ⌈(C + NEW)/b⌉ ≥ 2", frozenset({GroupKind.MAMBA}),
        (source(V33, STM, 1668, "_needs_internal_checkpoint: checkpoint_idx = cdiv(query_end, block_size) - 2 >= 0"),
         source(V29, STM, 1572, "_needs_internal_checkpoint: the same index")),
        _t_checkpoint),
    AllocationPremise(
        "alloc-async-load",
        "The connector's tokens are loaded asynchronously: the call that adopts them schedules no new tokens and "
        "no lookahead (the offloading connector of 0.28 - 0.32 always; 0.33's unless it reserves a sync load).",
        "E > 0 ⟹ NEW = 0 ∧ LA = 0", ALL_KINDS,
        (source(V33, CORE_SCHED, 1286, "schedule: if load_kv_async: num_new_tokens = 0"),
         source(V33, CORE_SCHED, 1403, "schedule: no lookahead tokens for an async load"),
         source(V28, CORE_SCHED, 1008, "schedule: the same lookahead rule"),
         source(V29, SCHED, 991, "get_num_new_matched_tokens returns (hits, bool(hits)): always async"),
         source(V32, SCHED, 1097, "the same"),
         source(V33, SCHED, 1277, "get_num_new_matched_tokens: async unless _reserve_sync_load")),
        _t_async),
    AllocationPremise(
        "alloc-window-config",
        "A sliding window is at least one token and retains a non-negative number of extra tokens; an attention "
        "chunk is at least one token.",
        "SWA: w ≥ 1 ∧ extra ≥ 0;  chunked local: c ≥ 1", frozenset({GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL}),
        (source(V33, STM, 1148, "SlidingWindowManager.get_num_skipped_tokens"),
         source(V33, STM, 1381, "ChunkedLocalAttentionManager.get_num_skipped_tokens")),
        _t_window),
)

ALLOCATION_BY_ID = {p.id: p for p in ALLOCATION_PREMISES}

__all__ = ["ALLOCATION_BY_ID", "ALLOCATION_PREMISES", "AllocationPremise"]
