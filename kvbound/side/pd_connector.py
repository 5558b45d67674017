"""A P/D consumer for the composition axis: the second connector beside the OffloadingConnector
inside vLLM's ``MultiConnector``.

Part of the side package (standard library and vLLM, imported lazily by ``install``). vLLM's own
asynchronous loaders need native transports on the worker side (NIXL, Mooncake, LMCache); the
connectors whose both sides run on CPU load synchronously (0.33.0
``kv_connector/v1/example_connector.py:299`` and ``decode_bench_connector.py:308`` return
``(n, False)``). So kvbound writes one against ``KVConnectorBase_V1``, shaped as NIXL's consumer
(0.33.0 ``kv_connector/v1/nixl/pull_scheduler.py:59-65``: the whole prompt beyond the local hit,
loaded asynchronously):

- scheduler side: a seeded share ``pd_p`` of requests (decided per request id, so no call order
  leaks in) answers ``(len(prompt) - num_computed_tokens, True)`` at its first lookup and never
  again (a decode node is handed one prefill per request); ``update_state_after_alloc`` notes
  the blocks the request got; ``build_connector_meta`` hands the step's loads to the worker;
- worker side: ``start_load_kv`` starts each load; it finishes 1..``pd_delay`` steps later
  (``get_finished`` reports it in ``finished_recving``), and writes its blocks at a seeded moment
  between start and finish, through the harness (``compose.external_load``: the shadow KV
  gets the KV a prefill node computed for those positions, in the blocks the metadata names).

Planted (tests only, ``defects.py``): ``pd_finish_before_write``, a load reported finished one
step before it writes.
"""

import random
import sys

PD_MODULE = "kvbound_trace_pd"
PD_CONNECTOR = "KvboundPDConnector"
# the same consumer without SupportsHMA (engine setting pd_hma false): one that predates the hybrid
# allocator, as a MultiConnector child (0.33.0 kv_connector/v1/multi_connector.py:157-170, :612-622)
PD_CONNECTOR_NO_HMA = "KvboundPDConnectorNoHMA"


def connector_name(par):
    """The P/D consumer's class name for a job's settings (engine setting ``pd_hma``, default true)."""
    return PD_CONNECTOR if par.get("pd_hma", True) else PD_CONNECTOR_NO_HMA


def install():
    """``PD_MODULE`` in ``sys.modules`` with ``PD_CONNECTOR``, for vLLM's connector factory
    (``kv_connector_module_path``, 0.33.0 ``kv_connector/factory.py:103-115``)."""
    if PD_MODULE in sys.modules:
        return
    import types

    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                    SupportsHMA)

    class KvboundPDMetadata(KVConnectorMetadata):
        def __init__(self, loads):
            self.loads = loads  # request id -> (start, end, block ids per group)

    class KvboundPDConsumer(KVConnectorBase_V1):
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
            cfg = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
            self.pd_p, self.seed = float(cfg.get("pd_p", 0.0)), cfg.get("seed", 0)
            self.pd_delay, self.mutant = max(1, int(cfg.get("pd_delay", 3))), cfg.get("mutant")
            self.on_load = None  # the harness's writer (compose.external_load), set once the engine is built
            self.served = set()  # request ids answered once (scheduler side)
            self.asked = {}  # request id -> the lookup's num_computed_tokens
            self.to_load = {}  # request id -> (start, end, block ids): this step's loads
            self.inflight = {}  # request id -> [steps left, write at, start, end, block ids] (worker side)
            self.hits = self.loads = 0
            self.finished_one_group = self.finished_all_groups = 0  # the finish path vLLM took

        def _rng(self, rid, what):
            return random.Random("pd/%s/%s/%s" % (self.seed, what, rid))

        # -- scheduler side --------------------------------------------------------------
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            rid = request.request_id
            if rid in self.served or self._rng(rid, "hit").random() >= self.pd_p:
                return 0, False
            count = len(request.prompt_token_ids or ()) - num_computed_tokens
            if count <= 0:
                return 0, False
            self.asked[rid] = num_computed_tokens
            return count, True

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            rid = request.request_id
            if num_external_tokens and rid in self.asked:
                start = self.asked.pop(rid)
                self.served.add(rid)
                self.hits += 1
                ids = tuple(list(g) for g in blocks.get_block_ids())
                self.to_load[rid] = (start, start + num_external_tokens, ids)

        def build_connector_meta(self, scheduler_output):
            meta, self.to_load = KvboundPDMetadata(self.to_load), {}
            return meta

        def request_finished(self, request, block_ids):
            self.finished_one_group += 1
            return self._finished(request)

        def _finished(self, request):  # a consumer keeps no blocks past the end of a request
            self.asked.pop(request.request_id, None)
            return False, None

        # -- worker side -----------------------------------------------------------------
        def start_load_kv(self, forward_context, **kwargs):
            for rid, (start, end, ids) in sorted(self._get_connector_metadata().loads.items()):
                rng = self._rng(rid, "delay")
                steps = rng.randint(1, self.pd_delay)
                self.inflight[rid] = {"left": steps, "write_in": rng.randint(0, steps), "reported": False,
                                      "load": (start, end, ids)}
                self.loads += 1
            self._write_due()

        def _write_due(self):
            for rid in sorted(self.inflight):
                job = self.inflight[rid]
                if job["write_in"] is not None and job["write_in"] <= 0:
                    job["write_in"] = None
                    self.on_load(rid, *job["load"])

        def _no_layer_work(self, *args, **kwargs):  # a consumer saves nothing; its loads finish by step
            return None

        wait_for_layer_load = save_kv_layer = wait_for_save = _no_layer_work

        def get_finished(self, finished_req_ids):
            """One step of every load in flight; a load writes, at the latest, as it is reported
            finished (planted ``pd_finish_before_write``: a step after)."""
            done = set()
            for rid in sorted(self.inflight):
                job = self.inflight[rid]
                job["left"] -= 1
                if job["write_in"] is not None:
                    job["write_in"] -= 1
                if not job["reported"] and job["left"] <= 0:
                    job["reported"] = True
                    done.add(rid)
                    if job["write_in"] is not None:
                        job["write_in"] = 1 if self.mutant == "pd_finish_before_write" else 0
            self._write_due()
            for rid in [r for r, job in self.inflight.items() if job["reported"] and job["write_in"] is None]:
                del self.inflight[rid]
            return None, done or None

    class KvboundPDConnector(KvboundPDConsumer, SupportsHMA):
        def request_finished_all_groups(self, request, block_ids):
            self.finished_all_groups += 1
            return self._finished(request)

    mod = types.ModuleType(PD_MODULE)
    setattr(mod, PD_CONNECTOR, KvboundPDConnector)
    setattr(mod, PD_CONNECTOR_NO_HMA, type(PD_CONNECTOR_NO_HMA, (KvboundPDConsumer,), {}))
    sys.modules[PD_MODULE] = mod
