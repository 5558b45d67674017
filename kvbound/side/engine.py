"""kvbound trace's engine adapter: vLLM's real engine-core ``Scheduler`` stepping a workload.

Part of the side package: runs in the release's deps venv with ``PYTHONPATH=<release
tree>``, where kvbound is NOT installed (standard library, vLLM and the side package),
imported by ``trace_worker.py``. vLLM is booted on CPU by ``adapter.py``;
``capture.case_of_call`` turns each real ``update_state_after_alloc`` call into a kvbound
case.

Real: ``Scheduler`` / ``AsyncScheduler``, ``KVCacheManager``, block pool, the
single-type managers, ``OffloadingConnector`` on the scheduler AND worker side, the
CPU offload tier (``CPUOffloadingSpec`` -> ``CPUOffloadingManager``, LRU).
Faked (``fakes.py``): the model class (registered, never instantiated), the
``KVCacheConfig`` (by hand, as vLLM's own tests build it), the transfer engine and the
model runner's output. Checked (``checks.py``): the lifecycle promises.
"""

import dataclasses
import random
import time

from . import (adapter, capture, checks, compose, defects, fakes, hisparse, kv_events, lookups, runner_calls, shadow,
               sidecar, stats_logger, store_contract, tap, tier_clock)


class Release:
    def __init__(self):
        adapter.quiet_environment()
        import torch
        import vllm
        from vllm.v1.core import kv_cache_utils as kcu
        from vllm.v1 import kv_cache_interface as kci
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.kv_offload import base as obase
        from vllm.v1 import outputs as vout
        from vllm.v1.request import Request, RequestStatus
        from vllm import SamplingParams
        from vllm.distributed.kv_transfer.kv_connector.v1 import offloading_connector as oc
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as osched

        self.version = vllm.__version__
        self.torch, self.kcu, self.kci, self.obase, self.vout = torch, kcu, kci, obase, vout
        self.Scheduler, self.AsyncScheduler = Scheduler, AsyncScheduler
        self.Request, self.RequestStatus, self.SamplingParams = Request, RequestStatus, SamplingParams
        self.oc, self.KVConnectorRole, self.osched = oc, KVConnectorRole, osched
        self.sha256 = adapter.hashing()
        # three MTP modules: a speculative config of method "mtp" is multi-module
        # (SpeculativeConfig.use_multi_module_mtp, 0.30.0 vllm/config/speculative.py:1944-1950);
        # every segment's engine reads the directory, gone with the worker
        self.model_dir = adapter.model_dir(max_position_embeddings=1 << 16, tie_word_embeddings=False,
                                           num_nextn_predict_layers=3)
        # and the EAGLE drafter a speculative config names (SpeculativeConfig inspects its class)
        adapter.register_never_built("LlamaForCausalLM", "EagleLlamaForCausalLM")
        self.scheduler_file = osched.__file__

    # -- one engine --------------------------------------------------------------------
    def build(self, lay, par):
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 ParallelConfig, SchedulerConfig, VllmConfig)
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        mutant = defects.planted(par.get("mutant"))  # tests only: a row of defects.DEFECTS
        nb = par["num_gpu_blocks"]
        hs = lay.get("composition") == hisparse.COMPOSITION  # vLLM's builder lays the groups out, below
        if hs:
            layer_specs = hisparse.layer_specs(lay)
            page_bytes = hisparse.offloaded_page_bytes(layer_specs)
        else:
            mamba_mode = lay.get("mamba_cache_mode", "align")  # CacheConfig.mamba_cache_mode of a Mamba layout
            specs = [adapter.kv_cache_spec(dict(g, mamba_cache_mode=mamba_mode) if g["kind"] == "mamba" else g,
                                           head_size=8, state_size=g.get("state", 64)) for g in lay["groups"]]
            eagle = {gi for gi, g in enumerate(lay["groups"]) if g.get("eagle")}
            # the drafter's layers: vLLM's planner tags them (kv_cache_planning)
            if eagle and "is_eagle_group" not in adapter.fields(self.kci.KVCacheGroupSpec):
                raise ValueError("vllm %s has no KVCacheGroupSpec.is_eagle_group (EAGLE layouts"
                                 " need 0.33 or later)" % self.version)
            page_bytes = [s.page_size_bytes for s in specs]
            kv_cache_config = adapter.kv_cache_config(specs, nb, eagle=eagle, tensors=True)
        # the engine core sets the cache's block size to the smallest group's before it builds the
        # scheduler (0.21.0 v1/engine/core.py:276-278; 0.33.0 :342-351, of the prefix-cacheable groups)
        block_size = min(g["tokens_per_block"] for g in lay["groups"])
        # the chunk alignment of the spec the tier is built by: the CPU spec's is 1 in 0.23.0 - 0.26.0
        # (0.23.0 cpu/spec.py:25), the tiering spec's the host page from 0.23.0 (0.23.0
        # tiering/spec.py:66); none before
        spec_cls = CPUOffloadingSpec
        if lay.get("offload_spec") is not None:
            from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
            spec_cls = TieringOffloadingSpec
        align = getattr(spec_cls, "BLOCK_SIZE_ALIGNMENT", 1)
        extra = {"cpu_bytes_to_use": compose.cpu_bytes_to_use(par["cpu_chunks"], page_bytes,
                                                              lay.get("blocks_per_chunk", 1), align)}
        extra.update(compose.chunk_size_config(lay))
        if par.get("sync_load_budget_bytes"):
            extra["sync_load_budget_bytes"] = par["sync_load_budget_bytes"]
        if "offload_prompt_only" in par:  # OffloadingSpec reads it (0.29 v1/kv_offload/base.py:598-600)
            extra["offload_prompt_only"] = bool(par["offload_prompt_only"])
        # the CPU tier's knobs: its cache policy (0.33.0 v1/kv_offload/cpu/spec.py:142, "lru" or "arc",
        # cpu/policies/factory.py) and how often a chunk is offered before it is stored (spec.py:156-170)
        for k in ("eviction_policy", "store_threshold"):
            if par.get(k):
                extra[k] = par[k]
        if lay.get("offload_spec") is not None:  # the spec factory's registry (v1/kv_offload/factory.py:55-69)
            extra.update(compose.tiering_config(lay, par))
        script = {k: par[k] for k in ("pending_p", "retry_p", "evict_p", "stall_p", "refuse_p") if par.get(k)}
        if script and lay.get("offload_spec") is not None:
            raise ValueError("the scripted tier is a CPU spec: layout %s runs %s" % (lay.get("name"), lay["offload_spec"]))
        if mutant == "evict_at_lookup":  # planted: the tier evicts what it just answered HIT
            script["evict_at_lookup"] = True
        if mutant == "refusal_leaks" and script.get("refuse_p"):  # planted: a refusal after allocating
            script["refusal_leaks"] = True
        if script:  # the scripted tier, through vLLM's spec factory (out-of-tree path)
            fakes.install_scripted_tier(self.obase)
            extra.update(spec_name="KvboundScriptedSpec", spec_module_path=fakes.TIER_MODULE,
                         kvbound_script=dict(script, seed=par.get("seed", 0)))
        model = hisparse.model_dir() if hs else self.model_dir
        model_config = ModelConfig(model=model, tokenizer=model, skip_tokenizer_init=True,
                                   max_model_len=par.get("max_model_len", 8192), dtype="float32",
                                   enforce_eager=True)
        cc = {"block_size": block_size, "enable_prefix_caching": True}
        if any(g["kind"] == "mamba" for g in lay["groups"]):
            cc["mamba_cache_mode"] = lay.get("mamba_cache_mode", "align")
        if lay.get("prefix_match_unit"):
            cc["prefix_match_unit"] = lay["prefix_match_unit"]
        if par.get("retention_interval") is not None:  # 0.33.0 vllm/config/cache.py:275 (0: the default)
            cc["prefix_cache_retention_interval"] = None if par["retention_interval"] == "dense" \
                else par["retention_interval"]
        cache_config = CacheConfig(**cc)
        cache_config.num_gpu_blocks = nb
        sched_cfg = SchedulerConfig(max_num_seqs=par["max_num_seqs"],
                           max_num_batched_tokens=par["max_num_batched_tokens"],
                           max_model_len=par.get("max_model_len", 8192),
                           enable_chunked_prefill=True, async_scheduling=bool(par.get("async")),
                           is_encoder_decoder=False)
        spec_kw = {}
        if lay.get("speculative"):
            from vllm.config import SpeculativeConfig

            sp = lay["speculative"]
            # SpeculativeConfig takes method "mtp" only from an MTP model type (0.33.0
            # vllm/config/speculative.py:1469-1499) and the trace has no model: an MTP drafter is
            # built as EAGLE, then named "mtp", so the release's own properties (use_eagle,
            # use_multi_module_mtp with the config's num_nextn_predict_layers, the scheduler's
            # num_prefill_lookahead_tokens) answer as for that drafter
            sc = SpeculativeConfig(
                method="eagle" if sp["method"] == "mtp" else sp["method"], model=self.model_dir,
                num_speculative_tokens=sp["num_speculative_tokens"],
                target_model_config=model_config, target_parallel_config=ParallelConfig())
            sc.method = sp["method"]
            spec_kw["speculative_config"] = sc
        spec_kw.update(kv_events.config(par))  # engine setting kv_events: KV cache events on
        transfer = compose.composed(lay, par, extra, mutant)
        vllm_config = VllmConfig(
            **spec_kw,
            model_config=model_config, cache_config=cache_config, scheduler_config=sched_cfg,
            parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
            kv_transfer_config=KVTransferConfig(**transfer),
        )
        # as on CUDA: vLLM's CPU platform turns async scheduling off (0.33.0 platforms/cpu.py:346-348, 0.21.0 :135),
        # and with it the batches in flight its KV-cache manager budgets for (config/vllm.py:587-609)
        vllm_config.scheduler_config.async_scheduling = bool(par.get("async"))
        if hs:  # HiSparse set on the config vLLM built without it (side/hisparse.py)
            hisparse.configure(vllm_config, KVTransferConfig(**hisparse.connector_config(transfer, par, layer_specs)))
            kv_cache_config = hisparse.kv_cache_config(vllm_config, layer_specs, nb)
        cache_config.num_gpu_blocks = nb
        self._tag_retained_tokens(kv_cache_config, vllm_config)
        bs, hbs = self._block_sizes(kv_cache_config, vllm_config)
        cls = self.AsyncScheduler if par.get("async") else self.Scheduler
        sched = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                    structured_output_manager=_structured(vllm_config), block_size=bs,
                    log_stats=bool(par.get("log_stats")),  # the engine core's (not disable_log_stats)
                    **({"hash_block_size": hbs} if hbs is not None else {}))
        return Engine(self, lay, par, vllm_config, kv_cache_config, sched, hbs or bs)

    def _tag_retained_tokens(self, kv_cache_config, vllm_config):
        """What the release's planner does after merging the workers' specs: every sliding-window
        spec retains ``extra_retained_tokens`` more tokens behind its window under a multi-module
        MTP drafter (0.30.0 v1/core/kv_cache_utils.py:2672-2682: num_speculative_tokens - 1;
        0.31.0 :2738 and 0.33.0 v1/core/kv_cache_planning.py:1636: num_prefill_lookahead_tokens - 1,
        the same number, read here from the release's own VllmConfig where it has the property)."""
        sc = vllm_config.speculative_config
        if not hasattr(self.kci.SlidingWindowSpec, "extra_retained_tokens") or sc is None:
            return
        if hasattr(type(vllm_config), "num_prefill_lookahead_tokens"):
            extra = max(0, vllm_config.num_prefill_lookahead_tokens - 1)
        else:
            extra = sc.num_speculative_tokens - 1 if sc.use_multi_module_mtp() else 0
        for g in kv_cache_config.kv_cache_groups:
            if isinstance(g.kv_cache_spec, self.kci.SlidingWindowSpec):
                g.kv_cache_spec = dataclasses.replace(g.kv_cache_spec, extra_retained_tokens=extra)

    def _block_sizes(self, kv_cache_config, vllm_config):
        fn = getattr(self.kcu, "resolve_kv_cache_block_sizes", None)
        if fn is None:
            return vllm_config.cache_config.block_size, None
        bs, hbs = fn(kv_cache_config, vllm_config)
        if hasattr(kv_cache_config, "hash_block_size"):
            kv_cache_config.hash_block_size = hbs
        align = getattr(self.kcu, "resolve_cache_hit_alignment_tokens", None)
        if align is not None and hasattr(kv_cache_config, "cache_hit_alignment_tokens"):
            kv_cache_config.cache_hit_alignment_tokens = align(kv_cache_config, vllm_config, bs, hbs)
        return bs, hbs


def _structured(vllm_config):
    from vllm.v1.structured_output import StructuredOutputManager

    return StructuredOutputManager(vllm_config)


STALL_STEPS = 2000  # idle steps after which a run that cannot change any more is not drained
PROGRESS_STEPS = 1000  # steps that schedule tokens with none sampled since, after which the engine is livelocked


def _allocate_past_lookahead(kvm, lay):
    """Planted (tests only): allocate_slots reserves two blocks more than the lookahead slots it is
    asked for, so the connector holds blocks for tokens no step scheduled (the engine's tap wraps
    this in turn)."""
    extra, real = 2 * lay["groups"][0]["tokens_per_block"], kvm.allocate_slots

    def allocate_slots(*a, **k):
        k["num_lookahead_tokens"] = k.get("num_lookahead_tokens", 0) + extra
        return real(*a, **k)

    kvm.allocate_slots = allocate_slots


class Engine:
    def __init__(self, rel, lay, par, vllm_config, kv_cache_config, sched, hash_block_size):
        self.rel, self.lay, self.par = rel, lay, par
        self.vllm_config, self.kv_cache_config = vllm_config, kv_cache_config
        self.sched, self.shut_down = sched, False
        self.csched = compose.sub_connector(sched.connector, compose.OFFLOADING).connector_scheduler
        try:
            self._set_up(hash_block_size)
        except BaseException as e:  # a fault in the set-up: what vLLM started and the trace installed, released
            try:
                compose.close(self)
            except Exception as c:  # noqa: BLE001 - the set-up's own error is the one raised
                e.add_note("and releasing the engine raised %s: %s" % (type(c).__name__, c))
            raise

    def _set_up(self, hash_block_size):
        rel, lay, par, sched = self.rel, self.lay, self.par, self.sched
        vllm_config, kv_cache_config = self.vllm_config, self.kv_cache_config
        self.wconn = wconn = type(sched.connector)(vllm_config, rel.KVConnectorRole.WORKER, kv_cache_config)
        hisparse.stand_in(wconn, compose.sub_connector)  # composition multi-hisparse: its worker's page transfers
        hisparse.plant(sched.connector, compose.sub_connector, par.get("mutant"))
        runner_calls.kv_cache_layout(vllm_config)
        runner_calls.cross_layer_question(wconn)
        if par.get("mutant") == "allocate_past_lookahead":  # planted: the allocator reserves past the lookahead
            _allocate_past_lookahead(sched.kv_cache_manager, lay)
        self.pd_sched, self.pd_worker = compose.pd_sides(self)  # composition: the P/D consumer beside it
        got = compose.as_asked(self.csched, lay, par, rel.version)  # the chunks and the tier the layout asked for
        self.rng = random.Random(par.get("seed", 0))
        self.mutant = par.get("mutant")  # tests only: a planted defect the checks must report (defects.py)
        cls = fakes.fake_transfer_engine_class(rel.obase)
        self.transfers = cls(self.rng, par.get("max_delay", 2), par.get("fail_p", 0.0), self)
        compose.sub_connector(wconn, compose.OFFLOADING).connector_worker.worker = self.transfers
        self.hasher = rel.kcu.get_request_block_hasher(hash_block_size, rel.sha256)
        self.cases = []
        self.violations = []
        self.stopped = None  # the check that stopped the run before its requests finished (``stop``)
        self.stats = dict(requests=0, steps=0, lookups=0, loads=0, partial_hits=0, partial_tails=0,
                          stores=0, preemptions=0, aborts=0, failed_loads=0, drafts=0, accepted=0, resets=0,
                          tier_chunks=got)
        sp = lay.get("speculative")
        self.num_spec = sp["num_speculative_tokens"] if sp else 0
        self.accept_p = sp.get("accept_p", 0.7) if sp else 0.0
        self.model_runner = fakes.FakeModelRunner(self, self.num_spec, self.accept_p)
        self.attention_layers = runner_calls.attention_layers(rel, kv_cache_config)
        self.checks = checks.LifecycleChecks(self)
        self.lookup_capture = lookups.LookupCapture(self)
        self.last_lookup = {}
        self.loaded_keys = []
        self.step_no = 0
        self.step_cpu = []  # process CPU time at the start of each step (the host's time to detect)
        # Shadow KV (docs/trace.md). Not under async scheduling with spec decode (store calls recorded all
        # the same): a step is scheduled before the previous one's rejections apply and the real runner fixes
        # its positions on the GPU (gpu_model_runner.py's deferred state corrections; not modelled).
        # Nor on the pre-0.25 worker API (one transfer_async per job): its fake moves nothing.
        self.shadow = None if par.get("shadow") is False or (par.get("async") and self.num_spec) \
            or not hasattr(self.transfers, "submit_store") else shadow.ShadowKV(self)
        # Every observed vLLM method is wrapped once, by the tap; each subscriber below sits
        # inside the ones subscribed after it (the scripted tier innermost, nearest vLLM).
        self.tap = tap.Tap()
        if getattr(self.csched.manager, "_kvbound_script", None):
            fakes.script_tier(self.csched.manager, rel.obase, self.tap)
        if getattr(self.csched.manager, "secondary_tiers", None):
            tier_clock.settle_tiers(self.csched.manager, self.tap, self)
        compose.subscribe_tiers(self, self.tap)  # the tiers' faults, clocks and checks
        store_contract.record_store_calls(self, self.tap)  # eng.store_calls, with the shadow or not
        self._subscribe()
        self.checks.subscribe(self.tap)
        self.lookup_capture.subscribe(self.tap)
        if self.shadow is not None:
            self.shadow.subscribe(self.tap)
        self.frontend = stats_logger.subscribe(self, self.tap)  # the frontend's stat loggers (log_stats)
        self.kv_events = kv_events.subscribe(self, self.tap)  # the tier's KV events (engine setting kv_events)

    # -- connector calls seen -----------------------------------------------------------
    def _subscribe(self):
        eng = self
        cs = self.csched

        def get_num_new_matched_tokens(call, request, num_computed_tokens, *a, **k):
            res = eng.lookup_capture.call(call, request, num_computed_tokens, a, k)
            eng.stats["lookups"] += 1
            eng.last_lookup[request.request_id] = (num_computed_tokens, res)
            return res

        def update_state_after_alloc(call, request, blocks, num_external_tokens):
            case = None
            if num_external_tokens:  # a load: within what the groups the connector does not fill hold
                eng.checks.check_load_bound(request, blocks, eng.last_lookup.get(request.request_id, (0,))[0] or 0,
                                            num_external_tokens)
            if num_external_tokens and eng.lay.get("composition") != hisparse.COMPOSITION:  # hisparse.NO_CASE
                ctx = eng.call_context(request)  # before the call: it clears partial_tail_boundary
                try:
                    case = capture.case_of_call(
                        cs, request, blocks, num_external_tokens,
                        "trace-s%d-%s" % (eng.step_no, request.request_id),
                        kv_cache_config=eng.kv_cache_config)
                except Exception as e:  # noqa: BLE001
                    eng.violations.append({"check": "harness:capture", "step": eng.step_no,
                                           "request": request.request_id,
                                           "error": "%s: %s" % (type(e).__name__, e)})
            jobs_before = set(getattr(cs, "_current_batch_load_jobs", {}) or {})
            nkeys = len(eng.loaded_keys)
            try:
                r = call(request, blocks, num_external_tokens)
            except BaseException as e:
                if case is not None:
                    eng.cases.append(dict(ctx, case=case, outcome=(
                        "assertion_error" if isinstance(e, AssertionError) else "exception"),
                        error="%s: %s" % (type(e).__name__, e), assert_site=sidecar.assert_site(e)))
                raise
            load = capture.load_job_fields(cs, jobs_before) if num_external_tokens else None
            if load is not None:
                if eng.mutant == "dst_off_by_one":  # planted defect: tests show the checks see it
                    load["dst_block_ids"] = [i + 1 for i in load["dst_block_ids"]]
                eng.stats["loads"] += 1
                eng.checks.check_load_dst(request, load["dst_block_ids"])
            if case is not None:
                res = dict(ctx, case=case, outcome="ok")
                keys = eng.loaded_keys[nkeys:]
                res["keys"] = capture.describe_keys(cs, request, keys[-1]) if keys else []  # as the plan names them
                res.update(load or dict(dst_block_ids=[], group_sizes=[], block_indices=[]))
                if case["num_locally_computed_tokens"] > 0:
                    eng.stats["partial_hits"] += 1
                if ctx["partial_tail_boundary"] is not None:
                    eng.stats["partial_tails"] += 1
                eng.cases.append(res)
            return r

        self.tap.around(cs, "get_num_new_matched_tokens", get_num_new_matched_tokens)
        self.tap.around(cs, "update_state_after_alloc", update_state_after_alloc)

    def call_context(self, request):
        """What the lookup answered for this request, beside the captured case."""
        cs = self.csched
        st = getattr(cs, "_req_status", {}).get(request.request_id)
        sync = getattr(cs, "_current_batch_sync_loads", None)
        n, res = self.last_lookup.get(request.request_id, (None, (None, None)))
        return {"step": self.step_no,
                "lookup": {"num_computed_tokens": n, "num_external_tokens": res[0],
                           "load_async": None if res[1] is None else bool(res[1])},
                "sync_load_marked": None if sync is None else request.request_id in sync,
                "partial_tail_boundary": getattr(st, "partial_tail_boundary", None)}

    def stop(self, check, msg):
        """The run stops before its requests finished: ``check`` says why; ``stopped`` keeps it for the
        checks of a drained engine, which then say nothing (side/tier_lifecycle.py, stats_logger.py)."""
        self.stopped = check
        self.violate(check, None, msg)

    def violate(self, check, request_id, msg):
        self.violations.append({"check": check, "step": self.step_no, "request": request_id,
                                "message": msg})

    def on_submit(self, kind, job_id, spec):
        if kind == "store":
            self.stats["stores"] += 1

    # -- stepping --------------------------------------------------------------------------
    def new_request(self, r):
        rel = self.rel
        req = rel.Request(
            request_id=str(r["id"]), prompt_token_ids=fakes.prompt_tokens(r["prompt"]),
            sampling_params=rel.SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, **fakes.sampling_extras(r)),
            pooling_params=None, block_hasher=self.hasher)
        return req

    def run(self, requests, max_steps=200000):
        """Step as the engine core does: ``step`` (sync), or ``step_with_batch_queue``
        with a queue of 2 (async: a batch is scheduled before the previous one's
        output is applied), until its loop condition ``has_requests`` is false."""
        sched = self.sched
        by_step = {}
        for r in requests:
            by_step.setdefault(r["arrive"], []).append(r)
        aborts = {}
        last_arrival = max(by_step) if by_step else 0
        self.step_no = 0
        is_async = bool(self.par.get("async"))
        queue = []  # (scheduler_output, model_output), oldest last
        stalled = 0  # consecutive steps that scheduled nothing with nothing in flight or to come
        idle = 0  # steps that scheduled tokens since one sampled a token
        reset_rng = random.Random(repr(self.par.get("seed", 0)) + "-reset") if self.par.get("reset_p") else None
        while True:
            s = self.step_no
            if reset_rng is not None and not queue and reset_rng.random() < self.par["reset_p"]:
                reset_prefix_cache(self)
            for r in by_step.pop(s, ()):
                sched.add_request(self.new_request(r))
                self.stats["requests"] += 1
                if r.get("abort_after") is not None:
                    aborts.setdefault(s + r["abort_after"], []).append(str(r["id"]))
            for rid in self.lookup_capture.take_aborts():  # liveness:stuck_request, reported
                if rid in sched.requests:
                    sched.finish_requests(rid, self.rel.RequestStatus.FINISHED_ABORTED)
            for rid in aborts.pop(s, ()):
                if rid in sched.requests:
                    sched.finish_requests(rid, self.rel.RequestStatus.FINISHED_ABORTED)
                    self.stats["aborts"] += 1
            if s >= max_steps:
                self.stop("lifecycle:not_drained", "still running after %d steps" % max_steps)
                break
            self.step_no += 1
            self.step_cpu.append(time.process_time())
            if engine_busy(sched):
                self.stats["steps"] += 1
                so = sched.schedule()
                preempted = getattr(so, "preempted_req_ids", ()) or ()
                self.stats["preemptions"] += len(preempted)
                if preempted and self.shadow is not None:  # a late completion held past a preemption
                    self.transfers.faults.held_past(preempted, self.shadow.transfers.jobs)
                # A fixed point: nothing scheduled, no transfer pending, no arrival or abort to
                # come. The scheduler's state changes only through model outputs (empty now)
                # and transfer completions (none pending), so it never drains: say so now
                # rather than after max_steps (a shrink reruns it many times).
                if (so.total_num_scheduled_tokens == 0 and not self.transfers.pending
                        and not (self.pd_worker is not None and self.pd_worker.inflight)
                        and s > last_arrival and not aborts):
                    stalled += 1
                    if stalled >= STALL_STEPS:
                        self.stop("lifecycle:not_drained", "stalled: no token scheduled for %d steps, no"
                                     " transfer in flight and no request left to arrive (%d requests"
                                     " left)" % (STALL_STEPS, len(sched.requests)))
                        break
                else:
                    stalled = 0
                mro = self.model_runner.output(so, runner_calls.worker_side(self, so))
                queue.insert(0, (so, mro))
                idle = 0 if any(mro.sampled_token_ids) else idle + bool(so.total_num_scheduled_tokens)
                if idle >= PROGRESS_STEPS:  # the engine core's loop serves every request it took
                    self.stop("liveness:no_progress", "%d steps scheduled tokens and none sampled one (%d requests"
                              " left, %d preemptions so far)" % (idle, len(sched.requests), self.stats["preemptions"]))
                    break
                executed = so.total_num_scheduled_tokens > 0
                if is_async and len(queue) < 2 and (executed or engine_busy(sched)):
                    continue
            elif not queue:
                if s > last_arrival and not aborts:
                    break
                continue  # idle until the next arrival
            so, mro = queue.pop()
            sched.update_from_output(so, mro)
            if self.num_spec and not is_async:
                self.model_runner.propose_drafts(so)
        self.checks.check_drained()
        if self.frontend is not None:
            self.frontend.check(self.transfers.reported)
        compose.count(self)
        if self.shadow is not None:
            self.shadow.contract.check_lost_chunks()
            self.stats.update(self.shadow.stats)


def engine_busy(sched):
    """The engine core's own loop condition (``has_requests``: unfinished requests,
    finished ones not yet sent to the workers, a connector with pending work)."""
    if hasattr(sched, "has_requests"):
        return sched.has_requests()
    return sched.has_unfinished_requests() or bool(sched.finished_req_ids)


def reset_prefix_cache(eng):
    """``reset_p``: between two steps, as the engine core serves the utility call (0.33.0
    v1/engine/core.py reset_prefix_cache), the scheduler resets the GPU prefix cache and the
    connector's (0.33.0 v1/core/sched/scheduler.py:3184-3249: the GPU reset fails while running
    requests hold blocks; the connector's runs either way, offloading/scheduler.py:2401-2459)."""
    eng.sched.reset_prefix_cache(reset_connector=True)
    eng.stats["resets"] += 1
    if eng.shadow is not None:
        eng.shadow.transfers.on_reset()
