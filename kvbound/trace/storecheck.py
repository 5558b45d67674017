"""Host side: every captured ``_build_store_jobs`` call judged by the store spec, group by group.

The worker (``side/store_contract.py``) records, per request and call, the request's inputs and,
for every offloaded group, its kind, whether vLLM's planner tagged it a drafter's and whether the
connector treats it as one, its allocated and keyed chunks and its ``next_stored_chunk_idx`` before
and after. ``group_verdicts`` holds each group to ``spec/store.py``: which groups are a drafter's
(``is_drafter_group``), and how far its frontier advances (the one rule for every kind, with the
group's own tokens per chunk, caps and, for a drafter, the trailing-chunk hold-back,
``drafter_holds_tail``). A record without ``groups`` (hand-made, or from before the per-group
capture) is group 0 alone, a non-draft group. The store premises the proofs rest on
(``proofs/store_premises.py``) are folded on each call (``check_store_premises``). A call the tier
refused (``prepare_store`` returned None) advances no group: every release ``continue``s past it to
retry the chunks at a later step (0.33.0 ``offloading/scheduler.py:1991-1996``, 0.29.0
``:1406-1411``, 0.26.0 ``:1006-1012``).
"""

from __future__ import annotations

from kvbound.proofs.store_premises import PREEMPTED_STORED, StoreTerms, check_store_call
from kvbound.spec.store_case import StoreCase, store_case_to_dict
from kvbound.spec.store import (computed_tokens, group_frontier, is_drafter_group, offer_violations, store_features,
                                store_horizon)


def covers(release: str) -> bool:
    """Whether the store spec has a row for this release (0.26 on)."""
    try:
        store_features(release)
    except ValueError:
        return False
    return True


def segment_calls(release: str, job: dict, res: dict) -> tuple:
    """(captured store calls, group 0's tokens per chunk, offload_prompt_only) of a segment; no calls
    where the store spec has no row for the release."""
    calls = res.get("store_calls") or ()
    if not calls or not covers(release):
        return (), 0, True
    lay, par = job["layout"], job["params"]
    return (calls, lay["groups"][0]["tokens_per_block"] * lay.get("blocks_per_chunk", 1),
            bool(par.get("offload_prompt_only", True)))


def _groups(call: list) -> tuple[list, bool]:
    """(every group's [index, kind, tagged, draft, allocated, keyed, before, after, and from the worker
    cow, offered, offered_null, nulls], eagle speculation)."""
    step, rid, status, P, T, C, S, mot, alloc, keyed, before, after, refused, *more = call
    x = more[0] if more else {}
    if "groups" in x:
        return x["groups"], bool(x.get("eagle_speculation"))
    return [[0, "full_attention", False, False, alloc, keyed, before, after]], False


def group_verdicts(release: str, job: dict, res: dict):
    """One verdict per captured call and offloaded group: a dict with the call's step, request and
    status, the group's index and kind, ``draft`` (the connector's) and ``spec_draft``, its frontier
    ``before``/``after`` and ``spec`` (None where the release asserts instead: a crash:exception,
    reported as such), the ``horizon`` (None: the tier refused the store), the chunks ``offered`` and
    what the offer breaks (``offer``, ``spec/store.py`` ``offer_violations``; a refused offer is not
    judged: the chunks are offered again later) and ``ok``."""
    calls, _, prompt_only = segment_calls(release, job, res)
    if not calls:
        return
    lay = job["layout"]
    bpc = lay.get("blocks_per_chunk", 1)
    for call in calls:
        step, rid, status, P, T, C, S, mot, _, _, _, _, refused, *_ = call
        groups, eagle_speculation = _groups(call)
        any_tagged = any(g[2] for g in groups)
        for gi, kind, tagged, draft, alloc, keyed, before, after, *offer in groups:
            spec_draft = is_drafter_group(release, tagged, any_tagged, eagle_speculation)
            h, holds, want = group_frontier(release, status, P, T, C, S, lay["groups"][gi]["tokens_per_block"] * bpc,
                                            alloc, keyed, before, prompt_only, mot, bool(refused), spec_draft)
            broken = (offer_violations(release, kind, offer[0], before, after, *offer[1:])
                      if offer and h is not None and want == after else [])  # a refused offer: retried later
            yield {"step": step, "request": rid, "status": status, "P": P, "T": T, "C": C, "S": S,
                   "group": gi, "kind": kind, "draft": draft, "spec_draft": spec_draft, "allocated": alloc,
                   "keyed": keyed, "before": before, "after": after, "spec": want, "horizon": h,
                   "holds_tail": holds, "offered": offer[1] if offer else None, "offer": broken,
                   "ok": draft == spec_draft and (want is None or want == after) and not broken, "call": call}


def _message(v: dict) -> str:
    who = (f"request {v['request']} ({v['status']}, {v['P']} prompt tokens, {v['T']} tokens, {v['C']} computed,"
           f" {v['S']} scheduled), group {v['group']} ({v['kind']}{', drafter' if v['draft'] else ''})")
    if v["draft"] != v["spec_draft"]:
        return (f"{who}: the connector treats the group as {'a' if v['draft'] else 'no'} drafter's, the store"
                f" spec says {'a' if v['spec_draft'] else 'no'} drafter's (is_drafter_group)")
    if v["offer"]:
        return f"{who}, next_stored_chunk_idx {v['before']} -> {v['after']}: " + "; ".join(v["offer"])
    why = (f"horizon {v['horizon']} tokens, {v['allocated']} chunks allocated, {v['keyed']} keyed"
           + (", the drafter's trailing chunk held back" if v["holds_tail"] else "") + ")"
           if v["horizon"] is not None else "the tier refused the store: nothing advances)")
    return (f"{who}: the release advanced next_stored_chunk_idx {v['before']} -> {v['after']},"
            f" the store spec says {v['spec']} ({why}")


def judge_store_calls(release: str, job: dict, res: dict) -> tuple[list[dict], int]:
    """(disagreements, calls judged): the first disagreeing group verdict of a segment in detail, with
    the count of all and the group kinds that disagreed."""
    bad, seen = [], set()
    for v in group_verdicts(release, job, res):
        seen.add((v["step"], v["request"]))
        if not v["ok"]:
            bad.append(v)
    if not bad:
        return [], len(seen)
    v = bad[0]
    first = {"check": "store:spec_disagreement", "step": v["step"], "request": v["request"], "group": v["group"],
             "kind": v["kind"], "message": _message(v), "real": v["after"], "spec": v["spec"],
             "horizon": v["horizon"], "count": len(bad), "kinds": sorted({b["kind"] for b in bad}),
             "store_case": store_case_of(release, job, v["call"], v["group"], v["spec_draft"])}
    if v["draft"] != v["spec_draft"]:
        first.update(real_draft=v["draft"], spec_draft=v["spec_draft"])
    return [first], len(seen)


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
    refused_rids = set()  # requests the tier refused a store: store-preempted-stored is not theirs
    for call in calls:
        step, rid, status, P, T, C, S, mot, alloc, keyed, before, after, refused, *more = call
        if refused:
            refused_rids.add(rid)
        if not more:
            continue  # a record without the premises' fields (placeholders, drafts, lookahead)
        x = more[0]
        checked += 1
        terms = StoreTerms(P, T - P, C, S, alloc, tpc, T, computed_tokens(status, T, C, S),
                           store_horizon(release, status, P, T, C, S, prompt_only, mot),
                           x["placeholders"], x["drafts"], x["lookahead"], is_async, before)
        for p, detail in check_store_call(terms, status, caps):
            if p.id == PREEMPTED_STORED and rid in refused_rids:
                continue  # the premise holds only when every store of the request was accepted (its text)
            count[p.id] = count.get(p.id, 0) + 1
            if p.id not in first:
                first[p.id] = {"check": "premise:" + p.id, "step": step, "request": rid, "status": status,
                               "detail": f"request {rid} ({status}) at step {step}: {detail}",
                               "store_case": store_case_of(release, job, call, 0)}
    return [dict(first[i], count=count[i]) for i in sorted(first)], checked


def store_case_of(release: str, job: dict, call: list, group: int, drafter: bool = False) -> dict:
    """One group of a captured ``_build_store_jobs`` call as a store case (spec/store_case.py), the
    replayable input of a store finding: ``kvbound plan``, ``explain`` and ``premises`` take it."""
    step, rid, status, P, T, C, S, mot, alloc, keyed, before, after, refused, *more = call
    lay, par = job["layout"], job["params"]
    x = more[0] if more else {}
    row = next((g for g in _groups(call)[0] if g[0] == group), None)
    if row is not None:
        alloc, keyed, before, after = row[4:8]
    return store_case_to_dict(StoreCase(
        name=f"trace-{release}-step{step}-request{rid}-group{group}", release=release, status=status,
        num_prompt_tokens=P, num_tokens=T, num_computed_tokens=C, num_scheduled_tokens=S,
        tokens_per_block=lay["groups"][group]["tokens_per_block"], blocks_per_chunk=lay.get("blocks_per_chunk", 1),
        num_allocated_chunks=alloc, num_keyed_chunks=keyed,
        offload_prompt_only=bool(par.get("offload_prompt_only", True)), max_offload_tokens=mot,
        refused=bool(refused), next_stored_chunk_idx=before, next_stored_chunk_idx_after=after, drafter=drafter,
        scheduler="async" if par.get("async") else "sync", num_output_placeholders=x.get("placeholders", 0),
        num_draft_tokens=x.get("drafts", 0), num_lookahead_tokens=x.get("lookahead", 0)))
