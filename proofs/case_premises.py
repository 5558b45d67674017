"""The premises folded on the other case kinds: a lookup case and a store case (``kvbound premises``).

A lookup case is what a load's lookup facts are about: the load premises that read only what the
lookup returns (``LOOKUP_FACTS``: the hit within the keys, a partial tail the lookup
chose) are folded per group on the release's answer (``spec/lookup.py``), as ``case_terms``
folds them on a load case. A store case is one ``_build_store_jobs`` call: the store premises of its
status and scheduling mode (``store_premises.store_premise_ids``) folded on its numbers, as the trace
folds them on every captured call (``kvbound/trace/storecheck.py``). Each premise keeps its one
definition; only the terms handed to it are built here.
"""

from __future__ import annotations

from kvbound.spec import GroupKind
from kvbound.spec.lookup import lookup_for_version
from kvbound.spec.lookup_case import LookupCase
from kvbound.spec.store import computed_tokens, store_features, store_horizon
from kvbound.spec.store_case import StoreCase
from kvbound.spec.versions import LATEST

from .premises import BY_ID, GroupTerms, PremiseCheck
from .store_premises import STORE_BY_ID, StoreTerms, check_store_call, store_premise_ids

# the load premises about what the lookup returned (they read N, M, the keys and the tail only)
LOOKUP_FACTS = ("keys-cover-hit", "partial-tail-lookup")


def lookup_terms(case: LookupCase, ci: int, hit: int, boundary: int | None) -> GroupTerms:
    """Group ``ci`` of a lookup case as a load premise reads it once the lookup returned ``hit``:
    N, M = hit, the group's chunk and keys, the partial tail. The table's terms are no lookup's."""
    g = case.groups[ci]
    N, tpc = case.num_computed_tokens, g.tokens_per_chunk
    tail = boundary is not None
    refusal = None if case.partial_tail_block_size else "the connector has no partial tails (partial_tail_block_size 0)"
    return GroupTerms(N, hit, N + hit, tpc, 1, tpc, None, None, None, None, False, g.num_keys, g.window,
                      g.sliding_window or None, g.extra_retained_tokens, tail, boundary or 0, case.tokens_per_hash,
                      case.num_prompt_tokens, case.num_tokens, refusal if tail else None, notes=[])


def evaluate_lookup(case: LookupCase, version: str | None = None, ids=None) -> list[PremiseCheck]:
    """The lookup facts on every group once the release's lookup answered (nothing without a hit:
    no load follows). ``group_index`` is the group's position in ``case.groups``."""
    res = lookup_for_version(case, version or case.release or LATEST)
    if res.unsupported or not res.hit:
        return []
    chosen = [BY_ID[i] for i in (ids or LOOKUP_FACTS) if i in LOOKUP_FACTS]
    out = []
    for ci, g in enumerate(case.groups):
        terms = lookup_terms(case, ci, res.hit, res.partial_tail_boundary)
        for p in chosen:
            if p.applies(GroupKind(g.kind)):
                problem = p.check_terms(terms)
                out.append(PremiseCheck(p, ci, problem is None, problem or ""))
    return out


def store_terms(case: StoreCase, version: str | None = None) -> StoreTerms:
    """A store case's numbers as the store premises read them (the group's chunks as its blocks)."""
    v = version or case.release
    P, T, C, S = case.num_prompt_tokens, case.num_tokens, case.num_computed_tokens, case.num_scheduled_tokens
    return StoreTerms(P, T - P, C, S, case.num_allocated_chunks, case.tokens_per_chunk, T,
                      computed_tokens(case.status, T, C, S),
                      store_horizon(v, case.status, P, T, C, S, case.offload_prompt_only, case.max_offload_tokens),
                      case.num_output_placeholders, case.num_draft_tokens, case.num_lookahead_tokens,
                      case.scheduler == "async", case.next_stored_chunk_idx)


def evaluate_store(case: StoreCase, version: str | None = None, ids=None) -> list[PremiseCheck]:
    """The store premises of the case's status and mode on its numbers (nothing before the store
    spec's first release)."""
    v = version or case.release
    try:
        caps = store_features(v).store_caps_at_allocated
    except ValueError:
        return []
    terms = store_terms(case, v)
    failed = {p.id: detail for p, detail in check_store_call(terms, case.status, caps)}
    chosen = store_premise_ids(case.status, caps, bool(terms.is_async) and terms.L > 0)
    return [PremiseCheck(STORE_BY_ID[i], 0, i not in failed, failed.get(i, ""))
            for i in chosen if ids is None or i in ids]


__all__ = ["LOOKUP_FACTS", "evaluate_lookup", "evaluate_store", "lookup_terms", "store_terms"]
