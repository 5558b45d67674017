"""Host side: every captured ``_build_store_jobs`` call judged by the store spec.

The worker (``side/store_contract.py``) records, per request and call, group 0's inputs (its
allocated and keyed chunks among them) and its ``next_stored_chunk_idx`` before and after;
``spec/store.py`` says where the release advances it, and the store premises the proofs rest on
(``proofs/store_premises.py``) are folded on each call (``check_store_premises``). A call the tier refused (``prepare_store`` returned None) advances nothing:
every release ``continue``s past it to retry the chunks at a later step (0.33.0
``offloading/scheduler.py:1991-1996``, 0.29.0 ``:1406-1411``, 0.26.0 ``:1006-1012``).
"""

from __future__ import annotations

from kvbound.proofs.store_premises import StoreTerms, check_store_call
from kvbound.spec.store import computed_tokens, next_stored_chunk_idx, store_features, store_horizon


def covers(release: str) -> bool:
    """Whether the store spec has a row for this release (0.26 on)."""
    try:
        store_features(release)
    except ValueError:
        return False
    return True


def segment_calls(release: str, job: dict, res: dict) -> tuple:
    """(captured store calls, tokens per chunk, offload_prompt_only) of a segment; no calls where
    the store spec has no row for the release."""
    calls = res.get("store_calls") or ()
    if not calls or not covers(release):
        return (), 0, True
    lay, par = job["layout"], job["params"]
    return (calls, lay["groups"][0]["tokens_per_block"] * lay.get("blocks_per_chunk", 1),
            bool(par.get("offload_prompt_only", True)))


def judge_store_calls(release: str, job: dict, res: dict) -> tuple[list[dict], int]:
    """(disagreements, calls judged): the first disagreement of a segment in detail, with
    the count of all."""
    calls, tpc, prompt_only = segment_calls(release, job, res)
    if not calls:
        return [], 0
    feats = store_features(release)
    bad, judged = [], 0
    for step, rid, status, P, T, C, S, mot, alloc, keyed, before, after, refused, *_ in calls:
        judged += 1
        if refused:
            h, want = None, before
        else:
            h = store_horizon(release, status, P, T, C, S, prompt_only, mot)
            want = next_stored_chunk_idx(before, h, tpc, alloc, feats.store_caps_at_allocated,
                                         keyed if feats.store_caps_at_keyed else None)
        if want is None:
            continue  # the release asserts here: a crash:exception, reported as such
        if want != after:
            bad.append({"check": "store:spec_disagreement", "step": step, "request": rid,
                        "message": f"request {rid} ({status}, {P} prompt tokens, {T} tokens, {C} computed,"
                                   f" {S} scheduled): the release advanced group 0's next_stored_chunk_idx"
                                   f" {before} -> {after}, the store spec says {want} ("
                                   + (f"horizon {h} tokens, {alloc} chunks allocated, {keyed} keyed)" if h is not None
                                      else "the tier refused the store: nothing advances)"),
                        "real": after, "spec": want, "horizon": h})
    if bad:
        first = dict(bad[0], count=len(bad))
        return [first], judged
    return [], judged


def check_store_premises(release: str, job: dict, res: dict) -> tuple[list[dict], int]:
    """(findings, calls checked): every store premise of the call's status folded on every
    captured ``_build_store_jobs`` call (``premise:<id>``, the first call that breaks it in detail,
    with the count of all), as ``callcheck`` folds the load premises on every captured load."""
    calls, tpc, prompt_only = segment_calls(release, job, res)
    if not calls:
        return [], 0
    is_async = bool(job["params"].get("async"))
    caps = store_features(release).store_caps_at_allocated
    first, count, checked = {}, {}, 0
    for step, rid, status, P, T, C, S, mot, alloc, keyed, before, after, refused, *more in calls:
        if not more:
            continue  # a record without the premises' fields (placeholders, drafts, lookahead)
        x = more[0]
        checked += 1
        terms = StoreTerms(P, T - P, C, S, alloc, tpc, T, computed_tokens(status, T, C, S),
                           store_horizon(release, status, P, T, C, S, prompt_only, mot),
                           x["placeholders"], x["drafts"], x["lookahead"], is_async, before)
        for p, detail in check_store_call(terms, status, caps):
            count[p.id] = count.get(p.id, 0) + 1
            first.setdefault(p.id, {"check": "premise:" + p.id, "step": step, "request": rid, "status": status,
                                    "detail": f"request {rid} ({status}) at step {step}: {detail}"})
    return [dict(first[i], count=count[i]) for i in sorted(first)], checked
