"""A secondary tier that asks for request-level offload, and the promise vLLM makes it.

A secondary tier of the tiering spec may ask, per request, for every chunk of it, not only the
ones the request computed (``OffloadPolicy.REQUEST_LEVEL``, 0.33.0 v1/kv_offload/base.py:130-141,
from 0.23.0): the peer-to-peer tier asks it on a P/D producer leg, "the peer needs every block
of the request" (0.33.0 tiering/p2p/manager.py:451-462), and the trace cannot run that tier (it
needs NIXL and its peers). ``REQUEST_TIER`` stands in for it, loaded the way vLLM lets an
out-of-tree tier in (its config's ``module_path`` from 0.28.0, 0.33.0 tiering/factory.py:100-143;
``SecondaryTierFactory.register_tier`` before, :50-59): an in-memory tier beside the layout's own
that asks for request-level offload on a drawn share of requests (engine setting
``request_tier_p``), keeps what it is sent and serves no lookup (a producer leg serves its peer,
not this engine).

The promise, read from the connector and the tiering manager:

- the connector offers a request-level request's every chunk, its hits too (0.33.0
  offloading/scheduler.py:1467-1471: ``next_stored_chunk_idx`` stays 0);
- the manager sends the tier, under that request, each chunk it offers that the primary tier
  already holds (tiering/manager.py:862-875), one whose primary write is still in flight once it
  lands (``HIT_PENDING`` parked, :880-935), and each chunk the request stores once its store
  succeeds (``complete_store``, :963-975);
- and tells the tier the request finished only after that (``_maybe_finalize_request``,
  :1056-1078: "once no more cascades can be submitted").

So when the tier hears a request finished, each chunk that request offered which the primary held,
or stored with success, has reached the tier in a job of that request, unless the primary chunk
it was owed from left the primary before it was sent: evicted, removed by a failed write, or a
parked key that resolved to a miss and was dropped, "nothing is there to read" (:889-892,
:907-910); a chunk is told by its identity (the primary's ``ChunkStatus``), so one stored again
since is another chunk. A connector reset voids the ledger (it empties the primary and clears
the parked keys, :1141-1181). A breach is ``store:request_tier_incomplete``: the peer waits out its
timeout and recomputes (efficiency; no KV is wrong). A chunk sent after the finish is
``tier_lifecycle``'s, as for every secondary tier.

Planted (tests only, the job's ``mutant``): ``request_cascade_drops_pending``, the manager keeps
only the keys the primary holds ready when it cascades to a request-level tier, as 0.23.0 - 0.28.0
did (vLLM #53062, fixed by #53329 in 0.29.0).

Part of the side package (standard library; vLLM's classes are imported when a run installs it).
"""

import random

from . import adapter, kv_events

TIER_MODULE = "kvbound_trace_request_tier"
REQUEST_TIER = "KvboundRequestLevelTier"
SHOWN = 4  # keys a finding shows


def _tier_class():
    """``REQUEST_TIER``: vLLM's example tier (in memory), asking for request-level offload."""
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager

    miss = base.LookupResult.MISS if hasattr(base, "LookupResult") else False  # True/None/False before 0.25

    class KvboundRequestLevelTier(ExampleSecondaryTierManager):
        """The example tier's in-memory store, asking for request-level offload on a drawn share
        of requests and serving no lookup; ``owed`` (the check) hears each store and finish."""

        owed = None  # set by ``subscribe``

        def on_new_request(self, req_context):
            if self.owed is not None and self.owed.producer_leg(req_context.req_id):
                return base.RequestOffloadingContext(policy=base.OffloadPolicy.REQUEST_LEVEL)
            return base.RequestOffloadingContext()

        def lookup(self, key, req_context):
            return miss

        def submit_store(self, job_metadata):
            if self.owed is not None:
                self.owed.received(job_metadata.req_context.req_id, job_metadata.keys)
            return super().submit_store(job_metadata)

        def on_request_finished(self, req_context):
            if self.owed is not None:
                self.owed.finished(req_context.req_id)
            return super().on_request_finished(req_context)

    return KvboundRequestLevelTier


def tier_config(par):
    """The tier's entry of ``secondary_tiers`` where engine setting ``request_tier_p`` is on, else
    None (loaded as a user loads an out-of-tree tier, ``adapter.secondary_tier``)."""
    if not float(par.get("request_tier_p") or 0.0):
        return None
    return adapter.secondary_tier(REQUEST_TIER, TIER_MODULE, _tier_class)


class Owed:
    """What the request-level tier is owed, per request, and the check at its finish."""

    def __init__(self, eng, manager):
        self.eng, self.manager = eng, manager
        self.p = float(eng.par.get("request_tier_p") or 0.0)
        self.seed = eng.par.get("seed", 0)
        self.owed = {}  # req id -> {key: how it became owed}
        self.got = {}  # req id -> keys sent to the tier in that request's jobs
        self.legs = set()

    def producer_leg(self, rid):
        if rid not in self.legs and random.Random("%r-request-tier-%s" % (self.seed, rid)).random() < self.p:
            self.legs.add(rid)
            self.eng.stats["request_level_requests"] += 1
        return rid in self.legs

    def _chunks(self):
        """The primary tier's chunk status object per key, read without touching its policy."""
        return dict(kv_events.policy_chunks(kv_events.cpu_tier(self.manager)._policy))

    def _owe(self, rid, keys, why):
        chunks = self._chunks()
        self.owed.setdefault(rid, {}).update((k, (why, chunks.get(k))) for k in keys)

    def offered(self, rid, keys, out):
        if rid in self.legs and out is not None:
            new = set(out.keys_to_store)
            self._owe(rid, [k for k in keys if k not in new], "held by the primary when offered")

    def stored(self, rid, keys, success):
        if rid in self.legs and success:
            self._owe(rid, keys, "stored by the request")

    def reset(self):
        """A connector reset empties the primary tier and drops the parked cascades with it (0.33.0
        tiering/manager.py:1141-1181: a running request's state stays, its pending cascade keys are
        cleared, and a finished request waiting on them is told it finished there): what was owed
        until then had nothing left to read."""
        self.owed.clear()

    def received(self, rid, keys):
        self.got.setdefault(rid, set()).update(keys)
        self.eng.stats["request_tier_keys"] += len(keys)

    def finished(self, rid):
        owed, got = self.owed.pop(rid, {}), self.got.pop(rid, set())
        self.legs.discard(rid)
        missing = [k for k in owed if k not in got]
        if not missing:
            return
        chunks = self._chunks()
        # owed while the chunk it was owed from is still the primary's: one that left is dropped by design
        self._violate(rid, {k: owed[k][0] for k in missing if owed[k][1] is not None and chunks.get(k) is owed[k][1]},
                      len(owed), len(got))

    def _violate(self, rid, missing, owed, sent):
        if not missing:
            return
        shown = [[k.hex()[:16] if isinstance(k, bytes) else repr(k), why] for k, why in list(missing.items())[:SHOWN]]
        self.eng.violations.append({
            "check": "store:request_tier_incomplete", "step": self.eng.step_no, "request": rid,
            "why": sorted(set(missing.values())), "chunks": len(missing), "owed": owed, "sent": sent, "keys": shown,
            "message": "the request-level tier did not get, under request %s and before it heard the request finished,"
                       " %d chunk(s) it is owed (%d owed, %d sent before the finish) that the primary tier holds;"
                       " first [key, why owed]: %s" % (rid, len(missing), owed, sent, shown)})


def subscribe(eng, tap):
    """The check on the engine's request-level tier (nothing where it has none)."""
    m = eng.csched.manager
    tier = next((t for t in getattr(m, "secondary_tiers", None) or () if type(t).__name__ == REQUEST_TIER), None)
    if tier is None:
        return None
    owed = tier.owed = Owed(eng, m)
    eng.stats.update(request_level_requests=0, request_tier_keys=0)

    def prepare_store(call, keys, req_context, *a, **k):
        out = call(keys, req_context, *a, **k)
        owed.offered(req_context.req_id, list(keys), out)
        return out

    def complete_store(call, keys, req_context, *a, **k):
        success = a[0] if a else k.get("success", True)
        owed.stored(req_context.req_id, list(keys), success)
        return call(keys, req_context, *a, **k)

    def reset_cache(call, *a, **k):
        owed.reset()  # before: the reset itself finalizes the finished requests it drops the cascades of
        return call(*a, **k)

    tap.around(m, "prepare_store", prepare_store)
    tap.around(m, "complete_store", complete_store)
    if hasattr(m, "reset_cache"):
        tap.around(m, "reset_cache", reset_cache)
    if eng.mutant == "request_cascade_drops_pending":
        _drop_pending(m, tap)
    return owed


def _drop_pending(m, tap):
    """Planted: the cascade to a request-level tier keeps only the keys the primary holds ready."""
    from vllm.v1.kv_offload import base

    ready = base.LookupResult.HIT if hasattr(base, "LookupResult") else True
    name = next(n for n in ("_cascade_existing_chunks_to_request_level_tiers",
                            "_cascade_existing_blocks_to_request_level_tiers") if hasattr(m, n))

    def cascade(call, keys, req_context, *a, **k):
        return call([key for key in keys if m.primary_tier.lookup(key, req_context) is ready], req_context, *a, **k)

    tap.around(m, name, cascade)
