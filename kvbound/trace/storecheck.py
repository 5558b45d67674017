"""Host side: every captured ``_build_store_jobs`` call judged by the store spec.

The worker (``side/store_contract.py``) records, per request and call, group 0's inputs (its
allocated and keyed chunks among them) and its ``next_stored_chunk_idx`` before and after;
``spec/store.py`` says where the release advances it. A call the tier refused (``prepare_store`` returned None) advances nothing:
every release ``continue``s past it to retry the chunks at a later step (0.33.0
``offloading/scheduler.py:1991-1996``, 0.29.0 ``:1406-1411``, 0.26.0 ``:1006-1012``).
"""

from __future__ import annotations

from kvbound.spec.store import next_stored_chunk_idx, store_features, store_horizon


def covers(release: str) -> bool:
    """Whether the store spec has a row for this release (0.26 on)."""
    try:
        store_features(release)
    except ValueError:
        return False
    return True


def judge_store_calls(release: str, job: dict, res: dict) -> tuple[list[dict], int]:
    """(disagreements, calls judged): the first disagreement of a segment in detail, with
    the count of all."""
    calls = res.get("store_calls") or ()
    if not calls or not covers(release):
        return [], 0
    lay, par = job["layout"], job["params"]
    tpc = lay["groups"][0]["tokens_per_block"] * lay.get("blocks_per_chunk", 1)
    prompt_only = bool(par.get("offload_prompt_only", True))
    feats = store_features(release)
    bad, judged = [], 0
    for step, rid, status, P, T, C, S, mot, alloc, keyed, before, after, refused in calls:
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
