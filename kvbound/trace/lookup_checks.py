"""Host side of the lookup checks: at every ``get_num_new_matched_tokens`` call the trace
captured (``kvbound/side/lookups.py``), (a) the spec of that release
(``spec/lookup.py``) must give the real answer (``lookup:spec_disagreement``) and, where it
does, ask the tier the same keys in the same order (``lookup:keys_disagreement``: what the tier
sees decides what a tiering backend fetches), and (b) the answer must keep the lookup contract
(``spec/lookup_contract.py``; docs/lookup.md): ``lookup:false_hit``, ``lookup:lost_hit`` and
``lookup:needless_deferral`` (the last two efficiency findings: kvbound/side/findings.py).
``liveness:stuck_request`` comes from the worker (it counts steps). A call whose tier answered
something that is no ``LookupResult`` (``foreign_answers``: a test double's) is not judged: a
lookup case cannot express the answer (docs/lookup.md, "In the trace")."""

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
    tally = {"lookups": 0, "lookup_spec_agree": 0, "lookup_keys_agree": 0, "lookup_not_judged": 0}
    seen = set()
    out = []
    for c in res.get("lookups", ()):
        tally["lookups"] += 1
        if c.get("foreign_answers"):
            tally["lookup_not_judged"] += 1
            continue
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
            if c.get("spec_hit_shift") is None:
                diff = keys_difference(spec.queries, real.get("queries") or [])
                if diff is None:
                    tally["lookup_keys_agree"] += 1
                elif ("keys", c.get("request")) not in seen:
                    seen.add(("keys", c.get("request")))
                    out.append(("lookup:keys_disagreement", dict(base, spec=spec.to_json(), **diff), c["case"]))
        for b in check_lookup(case, feats, real["hit"], real["partial_tail_boundary"]):
            key = (b.clause, c.get("request"))
            if _PER_REQUEST and key in seen:
                continue
            seen.add(key)
            extra = {"deferred_on": deferral_causes(case, feats)} if b.clause == "needless_deferral" else {}
            out.append(("lookup:" + b.clause, dict(base, message=b.message, tokens=b.tokens, **extra), c["case"]))
    return out, tally


def keys_difference(spec: list, real: list) -> dict | None:
    """None when vLLM asked the tier the spec's keys, in the spec's order; else where they part
    (the first index at which they differ) and the keys only one side asked."""
    if list(spec) == list(real):
        return None
    at = next((i for i, (a, b) in enumerate(zip(spec, real)) if a != b), min(len(spec), len(real)))
    only_real = sorted(set(real) - set(spec))
    only_spec = sorted(set(spec) - set(real))
    what = "another order" if not only_real and not only_spec and len(spec) == len(real) else "other keys"
    return {"first_difference": at, "only_real": only_real[:8], "only_spec": only_spec[:8],
            "message": f"vLLM asked the tier {len(real)} keys, the spec {len(spec)}; {what} from ask {at}:"
                       f" vLLM {', '.join(real[at:at + 4]) or 'nothing'}, spec {', '.join(spec[at:at + 4]) or 'nothing'}"
                       + (f"; only vLLM asked {', '.join(only_real[:4])}" if only_real else "")}


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
