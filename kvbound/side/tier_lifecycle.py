"""A secondary tier's request lifecycle: nothing of a request comes after the tier heard it finish.

vLLM's tiering spec tells each secondary tier when a request finished, and promises that by then
"all per-request calls for this request (submit_store, submit_load, touch) have already been
issued, and none will follow" (``SecondaryTierManager.on_request_finished``, 0.33.0
v1/kv_offload/tiering/base.py:328-341): the tier frees the request's bookkeeping there (the file
tier its lookup state, a peer-to-peer tier its session). vLLM delays the call for it: until the
request's stores to the primary tier complete (their cascades come from ``complete_store``,
#45823 and #46284, 0.25.1 tiering/manager.py:589, 0.33.0 :1056-1078) and its parked request-level
cascades drain (#53329, 0.29.0). A job of the request submitted to the tier after that call is
``lifecycle:tier_call_after_finish``, shaped by the call and the tier. And the call comes: a
request the tier saw begin (``on_new_request``, where it may set up per-request state: the
peer-to-peer tier its session, 0.33.0 tiering/p2p/manager.py:436-462) that it never hears finish by
the time the engine drained is ``lifecycle:tier_request_not_finished`` (its bookkeeping is never
released).

Part of the side package (standard library; the tiers come in as the engine's objects).
"""

CALLS = ("submit_store", "submit_load")


def subscribe(eng, tap):
    """Every secondary tier of the engine's manager: its per-request calls against its finishes."""
    tiers = getattr(eng.csched.manager, "secondary_tiers", None) or ()
    for tier in tiers:
        _watch(eng, tap, tier)


def _watch(eng, tap, tier):
    if not (hasattr(tier, "on_request_finished") and hasattr(tier, "on_new_request")):
        return  # 0.22.1's tiers hear of no request (tiering/base.py: lookup, submit_*, touch, shutdown)
    begun, finished = {}, set()  # the requests this tier saw begin (in order, as keys); those it heard finish
    name = getattr(tier, "tier_type", None) or type(tier).__name__

    def on_new_request(call, req_context, *a, **k):
        begun[req_context.req_id] = None
        finished.discard(req_context.req_id)  # an id vLLM takes again after its finish is a new request
        return call(req_context, *a, **k)

    def drained():
        if eng.stopped:
            return  # requests still in the scheduler: the finding that stopped the run says it
        left = [rid for rid in begun if rid not in finished]
        if left:
            eng.violations.append({
                "check": "lifecycle:tier_request_not_finished", "step": eng.step_no, "request": left[0],
                "tier": name, "requests": len(left), "first": left[:4],
                "message": "after drain, the %s tier was never told %d request(s) it saw begin had finished"
                           " (first: %s)" % (name, len(left), ", ".join(left[:4]))})

    def on_request_finished(call, req_context, *a, **k):
        finished.add(req_context.req_id)
        return call(req_context, *a, **k)

    def job_call(what):
        def around(call, job_metadata, *a, **k):
            rid = job_metadata.req_context.req_id
            if rid in finished:
                eng.violations.append({
                    "check": "lifecycle:tier_call_after_finish", "step": eng.step_no, "request": rid,
                    "call": what, "tier": name, "keys": len(job_metadata.keys),
                    "message": "the %s tier got %s of %d chunk(s) for request %s after it was told the request"
                               " finished (SecondaryTierManager.on_request_finished: none will follow)"
                               % (name, what, len(job_metadata.keys), rid)})
            return call(job_metadata, *a, **k)
        return around

    tap.around(tier, "on_new_request", on_new_request)
    tap.around(tier, "on_request_finished", on_request_finished)
    tap.subscribe("drained", drained)
    if eng.mutant == "tier_finish_dropped":  # planted: the manager forgets every fifth finish it owes the tier
        dropped = []

        def forget(call, req_context, *a, **k):
            dropped.append(req_context.req_id)
            return None if len(dropped) % 5 == 0 else call(req_context, *a, **k)

        tap.around(tier, "on_request_finished", forget)
    for what in CALLS:
        tap.around(tier, what, job_call(what))
