"""Host side of the lookup checks: at every ``get_num_new_matched_tokens`` call the trace
captured (``kvbound/side/lookups.py``), (a) the spec of that release
(``spec/lookup.py``) must give the real answer (``lookup:spec_disagreement``), and
(b) the answer must keep the lookup contract (``spec/lookup_contract.py``;
docs/lookup.md): ``lookup:false_hit``, ``lookup:lost_hit`` and
``lookup:needless_deferral`` (the last two efficiency findings: kvbound/side/findings.py).
``liveness:stuck_request`` comes from the worker (it counts steps)."""

from __future__ import annotations

from dataclasses import replace

from kvbound.spec.lookup import get_num_new_matched_tokens
from kvbound.spec.lookup_case import Answer, lookup_case_from_dict
from kvbound.spec.lookup_contract import check_lookup
from kvbound.spec.versions import release_features

# one finding of each kind per request is enough to act on (a deferral repeats each step)
_PER_REQUEST = True


def check_lookups(release: str, res: dict):
    """Yield (kind, detail, case dict) per breach; and the tallies."""
    feats = release_features(release)
    tally = {"lookups": 0, "lookup_spec_agree": 0, "lookup_not_judged": 0}
    seen = set()
    out = []
    for c in res.get("lookups", ()):
        tally["lookups"] += 1
        case = lookup_case_from_dict(c["case"], c["case"].get("name", "?"))
        real = c["real"]
        spec = get_num_new_matched_tokens(case, feats)
        base = {"step": c.get("step"), "request": c.get("request"), "real": real}
        if spec.unsupported:
            tally["lookup_not_judged"] += 1
        elif c.get("spec_hit_shift") is None and (
                spec.hit != real["hit"] or spec.partial_tail_boundary != real["partial_tail_boundary"]):
            key = ("spec", c.get("request"))
            if key not in seen:
                seen.add(key)
                out.append(("lookup:spec_disagreement", dict(base, spec=spec.to_json(),
                            message=f"the spec of {release}'s lookup gives {spec.hit}"
                                    f" (boundary {spec.partial_tail_boundary}), vLLM {real['hit']}"
                                    f" (boundary {real['partial_tail_boundary']})"), c["case"]))
        else:
            tally["lookup_spec_agree"] += 1
        for b in check_lookup(case, feats, real["hit"], real["partial_tail_boundary"]):
            key = (b.clause, c.get("request"))
            if _PER_REQUEST and key in seen:
                continue
            seen.add(key)
            extra = {"deferred_on": deferral_causes(case, feats)} if b.clause == "needless_deferral" else {}
            out.append(("lookup:" + b.clause, dict(base, message=b.message, tokens=b.tokens, **extra), c["case"]))
    return out, tally


def deferral_causes(case, feats) -> list:
    """The keys a deferral hangs on, each alone: a HIT_PENDING or RETRY key that, answered
    HIT instead (its write or lookup done), leaves the release's spec not deferring. Named "<group kind> <answer>
    <key>" (e.g. "sliding_window HIT_PENDING 1:8"), so findings of one shape can be told
    from another's without a pattern in the check itself."""
    out = []
    kinds = {g.group_idx: g.kind for g in case.groups}
    for name, answers in sorted(case.tier.items()):
        if not answers or Answer(answers[-1]) not in (Answer.HIT_PENDING, Answer.RETRY):
            continue
        alt = replace(case, tier=dict(case.tier, **{name: (Answer.HIT,)}))
        if get_num_new_matched_tokens(alt, feats).hit is not None:
            out.append(f"{kinds.get(int(name.split(':')[0]), '?')} {Answer(answers[-1]).value} {name}")
    return out
