"""The checks at one captured ``update_state_after_alloc`` call, shared by ``kvbound trace``
(``runner.check_result``, on the host after a segment) and the vLLM plugin's live monitor
(``kvbound.plugin``, inside a serving engine): the call against the release's spec
(``conform.compare.judge``) and against the premises of the proofs.

A call is the record the trace engine and ``side.capture`` both make: ``case`` (the
call as a kvbound case), ``outcome`` and, for ``ok``, the plan fields vLLM produced
(``dst_block_ids``, ``group_sizes``, ``block_indices``, ``keys``), with the lookup's
``partial_tail_boundary`` and ``sync_load_marked``.
"""

from __future__ import annotations

from kvbound.conform.compare import DISAGREE, judge
from kvbound.proofs.premises import evaluate as evaluate_premises
from kvbound.spec import case_from_dict

# Premises about whole-chunk hits, which a 0.33 partial-tail hit does not claim.
WHOLE_CHUNK_PREMISES = ("keys-cover-hit",)


def check_call(release: str, call: dict):
    """(verdict, findings) of one call on ``release``: verdict is the spec judge's (None
    when the call is no valid case); findings are ``(kind, detail)`` pairs, kinds as
    rows of the findings table (``plan:spec_disagreement``, ``premise:<id>``)."""
    found = []
    try:
        case = case_from_dict(call["case"], call["case"].get("name", "?"))
    except ValueError as e:
        # The call vLLM made is no valid case: the block table it handed the connector
        # breaks the format's rules (e.g. one GPU block in two places of one request,
        # seen on 0.21.0/0.22.1 swa). A finding about the call, never a host traceback.
        return None, [("premise:valid-call", {"detail": str(e), "step": call.get("step")})]
    rec = judge(case, release, call)
    if rec["verdict"] == DISAGREE:
        found.append(("plan:spec_disagreement", {"diff": rec["diff"], "real": rec["real"], "spec": rec["spec"],
                                                 "step": call.get("step"), "lookup": call.get("lookup")}))
    for v in evaluate_premises(case):
        if v.holds:
            continue
        if v.premise.id in WHOLE_CHUNK_PREMISES and call.get("partial_tail_boundary") is not None:
            continue  # a partial tail: the last, partial chunk is keyed by its boundary hash
        found.append(("premise:" + v.premise.id, {"group_index": v.group_index, "detail": v.detail,
                                                  "step": call.get("step")}))
    return rec["verdict"], found
