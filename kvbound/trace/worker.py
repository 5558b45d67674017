"""kvbound trace's adapter: vLLM's real engine-core ``Scheduler`` stepping a workload.

Runs in the release's deps venv with ``PYTHONPATH=<release tree>``, where kvbound is
NOT installed: standard library and vLLM only (like ``kvbound/conform/worker.py``,
whose ``capture.case_of_call`` it loads by path to turn each real
``update_state_after_alloc`` call into a kvbound case).

Real: ``Scheduler`` / ``AsyncScheduler``, ``KVCacheManager``, block pool, the
single-type managers, ``OffloadingConnector`` on the scheduler AND worker side, the
CPU offload tier (``CPUOffloadingSpec`` -> ``CPUOffloadingManager``, LRU).
Faked: the model class (registered, never instantiated), the ``KVCacheConfig``
(by hand, as vLLM's own tests build it), the transfer engine (an
``OffloadingWorker`` that copies nothing and finishes jobs 0..N steps later, or
fails them), and the model runner's output (one sampled token per request whose
prefill is complete).

Protocol: a hello line, then one JSON job per stdin line -> one JSON result line.
"""

import importlib.util
import json
import os
import random
import sys
import tempfile
import time
import traceback
import types
import warnings

PROTOCOL = 1
HERE = os.path.dirname(os.path.abspath(__file__))


def _send(out, obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _load_conform(name):
    """A module of kvbound/conform loaded by path (kvbound is not importable here):
    ``capture`` (case_of_call) and ``worker`` (assert_site); both import only the
    standard library at load time."""
    path = os.path.join(HERE, "..", "conform", name + ".py")
    spec = importlib.util.spec_from_file_location("kvbound_conform_" + name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stub_einops():
    """0.29's scheduler import chain reaches vit_attn_wrappers, which imports einops
    (pure Python, not in the import-deps lock); nothing here calls it."""
    try:
        import einops  # noqa: F401
    except ImportError:
        m = types.ModuleType("einops")
        m.rearrange = m.repeat = m.reduce = m.einsum = m.pack = m.unpack = (
            lambda *a, **k: (_ for _ in ()).throw(RuntimeError("einops stub")))
        sys.modules["einops"] = m


def tok(doc, i):
    """Token i of shared document ``doc`` (documents are what prompts share)."""
    return 1 + (doc * 7919 + i * 104729) % 60000


def out_tok(rid, i):
    """The i-th token the fake model samples for request ``rid``."""
    return 1 + (rid * 31337 + i * 977) % 60000


def prompt_tokens(segments):
    """A prompt from segments: ["doc", d, start, n] (document d's tokens [start, start+n)),
    ["out", rid, n] (request rid's first n sampled tokens), ["uniq", rid, n]."""
    toks = []
    for s in segments:
        if s[0] == "doc":
            toks += [tok(s[1], i) for i in range(s[2], s[2] + s[3])]
        elif s[0] == "out":
            toks += [out_tok(s[1], i) for i in range(s[2])]
        else:  # uniq
            toks += [tok(100000 + s[1], i) for i in range(s[2])]
    return toks


class Release:
    def __init__(self):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        warnings.filterwarnings("ignore")
        _stub_einops()
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

        try:
            from vllm.utils.hashing import sha256
        except ImportError:
            from vllm.utils import sha256
        self.version = vllm.__version__
        self.torch, self.kcu, self.kci, self.obase, self.vout = torch, kcu, kci, obase, vout
        self.Scheduler, self.AsyncScheduler = Scheduler, AsyncScheduler
        self.Request, self.RequestStatus, self.SamplingParams = Request, RequestStatus, SamplingParams
        self.oc, self.KVConnectorRole, self.osched = oc, KVConnectorRole, osched
        self.sha256 = sha256
        kcu.init_none_hash(sha256)
        self.capture = _load_conform("capture")
        self.assert_site = _load_conform("worker").assert_site
        self.model_dir = self._model_dir()
        self._register_model()
        self.scheduler_file = osched.__file__

    # -- model: a local config.json and a registered class object (no model code) ---------
    def _model_dir(self):
        d = tempfile.mkdtemp(prefix="kvbound-trace-model-")
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
            "num_hidden_layers": 2, "vocab_size": 65536, "max_position_embeddings": 1 << 16,
            "rms_norm_eps": 1e-5, "torch_dtype": "float32", "tie_word_embeddings": False,
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        return d

    def _register_model(self):
        from vllm import ModelRegistry
        import torch.nn as nn

        class KvboundTraceModel(nn.Module):
            """Never instantiated: only its interface is inspected."""

            def __init__(self, *, vllm_config, prefix=""):
                super().__init__()

            def embed_input_ids(self, input_ids):
                raise NotImplementedError

            def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
                raise NotImplementedError

            def compute_logits(self, hidden_states):
                raise NotImplementedError

        ModelRegistry.register_model("LlamaForCausalLM", KvboundTraceModel)
        # the EAGLE drafter a speculative config names (SpeculativeConfig inspects its class)
        ModelRegistry.register_model("EagleLlamaForCausalLM", KvboundTraceModel)

    # -- one engine --------------------------------------------------------------------
    def build(self, lay, par):
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 ParallelConfig, SchedulerConfig, VllmConfig)

        t = self.torch.float32
        groups = []
        page_bytes = []
        for gi, g in enumerate(lay["groups"]):
            b = g["tokens_per_block"]
            kind = g["kind"]
            if kind == "full_attention":
                spec = self.kci.FullAttentionSpec(block_size=b, num_kv_heads=1, head_size=8, dtype=t)
            elif kind == "sliding_window":
                spec = _build(self.kci.SlidingWindowSpec, block_size=b, num_kv_heads=1, head_size=8,
                              dtype=t, sliding_window=g["sliding_window"],
                              extra_retained_tokens=g.get("extra_retained_tokens", 0))
            elif kind == "chunked_local":
                spec = self.kci.ChunkedLocalAttentionSpec(block_size=b, num_kv_heads=1, head_size=8,
                                                          dtype=t, attention_chunk_size=g["attention_chunk_size"])
            elif kind == "mamba":
                spec = _build(self.kci.MambaSpec, block_size=b, shapes=((g.get("state", 64),),),
                              dtypes=(t,), mamba_cache_mode="align")
            else:
                raise ValueError(kind)
            gs = self.kci.KVCacheGroupSpec(["layer.%d" % gi], spec)
            if g.get("eagle"):  # the drafter's layers: vLLM's planner tags them (kv_cache_planning)
                if not hasattr(gs, "is_eagle_group"):
                    raise ValueError("vllm %s has no KVCacheGroupSpec.is_eagle_group (EAGLE layouts"
                                     " need 0.33 or later)" % self.version)
                gs.is_eagle_group = True
            groups.append(gs)
            page_bytes.append(spec.page_size_bytes)
        nb = par["num_gpu_blocks"]
        kv_cache_config = _build(
            self.kci.KVCacheConfig, num_blocks=nb,
            # 0.29 sizes the CPU tier from kv_cache_tensors[0].size (offloading/config.py)
            kv_cache_tensors=[_build(
                self.kci.KVCacheTensor, size=nb * sum(page_bytes),
                shared_by=["layer.%d" % i for i in range(len(groups))],
                layers=["layer.%d" % i for i in range(len(groups))],
                layer_stride=nb * max(page_bytes), block_stride=sum(page_bytes))],
            kv_cache_groups=groups)
        block_size = lay["groups"][0]["tokens_per_block"]
        extra = {"cpu_bytes_to_use": par["cpu_chunks"] * sum(page_bytes) * lay.get("blocks_per_chunk", 1)
                 + 4096 * 64, "blocks_per_chunk": lay.get("blocks_per_chunk", 1)}
        if par.get("sync_load_budget_bytes"):
            extra["sync_load_budget_bytes"] = par["sync_load_budget_bytes"]
        script = {k: par[k] for k in ("pending_p", "retry_p", "evict_p") if par.get(k)}
        if par.get("mutant") == "evict_at_lookup":  # planted: the tier evicts what it just answered HIT
            script["evict_at_lookup"] = True
        if script:  # the scripted tier, through vLLM's spec factory (out-of-tree path)
            _install_scripted_tier(self.obase)
            extra.update(spec_name="KvboundScriptedSpec", spec_module_path=TIER_MODULE,
                         kvbound_script=dict(script, seed=par.get("seed", 0)))
        model_config = ModelConfig(model=self.model_dir, tokenizer=self.model_dir, skip_tokenizer_init=True,
                                   max_model_len=par.get("max_model_len", 8192), dtype="float32",
                                   enforce_eager=True)
        cc = {"block_size": block_size, "enable_prefix_caching": True}
        if any(g["kind"] == "mamba" for g in lay["groups"]):
            cc["mamba_cache_mode"] = "align"
        if lay.get("prefix_match_unit"):
            cc["prefix_match_unit"] = lay["prefix_match_unit"]
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
            spec_kw["speculative_config"] = SpeculativeConfig(
                method=sp["method"], model=self.model_dir,
                num_speculative_tokens=sp["num_speculative_tokens"],
                target_model_config=model_config, target_parallel_config=ParallelConfig())
        vllm_config = VllmConfig(
            **spec_kw,
            model_config=model_config, cache_config=cache_config, scheduler_config=sched_cfg,
            parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
            kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                kv_connector_extra_config=extra),
        )
        cache_config.num_gpu_blocks = nb
        bs, hbs = self._block_sizes(kv_cache_config, vllm_config)
        cls = self.AsyncScheduler if par.get("async") else self.Scheduler
        sched = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                    structured_output_manager=_structured(vllm_config), block_size=bs,
                    **({"hash_block_size": hbs} if hbs is not None else {}))
        wconn = self.oc.OffloadingConnector(vllm_config, self.KVConnectorRole.WORKER, kv_cache_config)
        return Engine(self, lay, par, vllm_config, kv_cache_config, sched, wconn, hbs or bs)

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


def _build(cls, **kw):
    import dataclasses

    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in kw.items() if k in names}
    return cls(**kw)


TIER_MODULE = "kvbound_trace_tier"


def _install_scripted_tier(obase):
    """An out-of-tree offload tier for vLLM's spec factory (``kv_connector_extra_config``
    ``spec_name``/``spec_module_path``, ``v1/kv_offload/factory.py``): vLLM's own CPU tier
    with a script (extra config ``kvbound_script``) that makes it adversarial:
    ``pending_p``: a lookup that would HIT answers HIT_PENDING once (not yet readable),
    ``retry_p``: ... answers RETRY once (location unknown), and ``evict_p``: at each
    schedule end, every idle ready chunk some lookup answered HIT in that step is evicted
    with this probability (between a lookup and a later ``prepare_load``)."""
    if TIER_MODULE in sys.modules:
        return
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    LR = obase.LookupResult

    class KvboundScriptedSpec(CPUOffloadingSpec):
        def get_manager(self):
            m = super().get_manager()
            if not getattr(m, "_kvbound_script", None):
                _script_manager(m, dict(self.extra_config.get("kvbound_script") or {}), LR)
            return m

    mod = types.ModuleType(TIER_MODULE)
    mod.KvboundScriptedSpec = KvboundScriptedSpec
    sys.modules[TIER_MODULE] = mod


def _script_manager(m, script, LR):
    rng = random.Random(script.get("seed", 0))
    pending_p, retry_p, evict_p = (float(script.get(k, 0.0)) for k in ("pending_p", "retry_p", "evict_p"))
    m._kvbound_script = script
    m.kvbound_evicted = []  # keys the script evicted, in order (the harness reads them)
    m.kvbound_counts = {"pending": 0, "retry": 0, "evicted": 0}
    delayed = set()  # (request id, key) answered PENDING/RETRY once already
    hit_now = []
    orig_lookup, orig_end = m.lookup, m.on_schedule_end

    def evict(keys):
        evicted = []
        for key in dict.fromkeys(keys):
            chunk = m._policy.get(key)
            if chunk is None or not chunk.is_ready or chunk.ref_cnt != 0:
                continue
            m._policy.remove(key)
            m._num_evictable_cache_chunks -= 1
            m._free_chunk(chunk)
            evicted.append(key)
        if evicted:
            m.kvbound_evicted.extend(evicted)
            m.kvbound_counts["evicted"] += len(evicted)
            if m.events is not None:
                m.events.append(_evict_event(m, evicted))

    def lookup(key, req_context):
        r = orig_lookup(key, req_context)
        if r is LR.HIT:
            hit_now.append(key)
            tag = (getattr(req_context, "req_id", None), key)
            if tag not in delayed:
                x = rng.random()
                if script.get("evict_at_lookup"):  # tests only: a tier that breaks its contract
                    evict([key])
                if x < pending_p:
                    delayed.add(tag)
                    m.kvbound_counts["pending"] += 1
                    return LR.HIT_PENDING
                if x < pending_p + retry_p:
                    delayed.add(tag)
                    m.kvbound_counts["retry"] += 1
                    return LR.RETRY
        return r

    def on_schedule_end(context):
        orig_end(context)
        evict([key for key in hit_now if rng.random() < evict_p])
        del hit_now[:]

    m.lookup, m.on_schedule_end = lookup, on_schedule_end


def _evict_event(m, keys):
    from vllm.v1.kv_offload.base import OffloadingEvent

    return OffloadingEvent(keys=keys, medium=m.medium, removed=True)


def _fake_worker_class(obase):
    class KvboundFakeTransferEngine(obase.OffloadingWorker):
        """Copies nothing; a job finishes ``delay`` steps after submission (0..max_delay),
        a load fails with probability ``fail_p``."""

        def __init__(self, rng, max_delay, fail_p, eng):
            self.rng, self.max_delay, self.fail_p, self.eng = rng, max_delay, fail_p, eng
            self.pending = {}  # job_id -> [steps_left, success, kind]
            self.submitted = {}

        def submit_store(self, job_id, src_spec, dst_spec):
            if self.eng.mutant != "lost_store":  # planted defect: a store that never completes
                self.pending[job_id] = [self.rng.randint(0, self.max_delay), True, "store"]
            self.submitted[job_id] = "store"
            self.eng.on_submit("store", job_id, src_spec)
            return True

        def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
            ok = self.rng.random() >= self.fail_p
            self.pending[job_id] = [0 if expedited else self.rng.randint(0, self.max_delay), ok, "load"]
            self.submitted[job_id] = "load"
            self.eng.on_submit("load", job_id, dst_spec)
            return True

        def get_finished(self):
            done = []
            for j, v in list(self.pending.items()):
                if v[0] <= 0:
                    done.append(obase.TransferResult(job_id=j, success=v[1]))
                    del self.pending[j]
                else:
                    v[0] -= 1
            return done

        def wait(self, job_ids):
            for j in job_ids:
                if j in self.pending:
                    self.pending[j][0] = 0

    return KvboundFakeTransferEngine


class Engine:
    def __init__(self, rel, lay, par, vllm_config, kv_cache_config, sched, wconn, hash_block_size):
        self.rel, self.lay, self.par = rel, lay, par
        self.vllm_config, self.kv_cache_config = vllm_config, kv_cache_config
        self.sched, self.wconn = sched, wconn
        self.csched = sched.connector.connector_scheduler
        self.rng = random.Random(par.get("seed", 0))
        self.mutant = par.get("mutant")  # tests only: a planted defect the checks must report
        cls = _fake_worker_class(rel.obase)
        self.transfers = cls(self.rng, par.get("max_delay", 2), par.get("fail_p", 0.0), self)
        wconn.connector_worker.worker = self.transfers
        self.hasher = rel.kcu.get_request_block_hasher(hash_block_size, rel.sha256)
        self.cases = []
        self.violations = []
        self.stats = dict(requests=0, steps=0, lookups=0, loads=0, partial_hits=0, partial_tails=0,
                          stores=0, preemptions=0, aborts=0, failed_loads=0, drafts=0, accepted=0)
        sp = lay.get("speculative")
        self.num_spec = sp["num_speculative_tokens"] if sp else 0
        self.accept_p = sp.get("accept_p", 0.7) if sp else 0.0
        self._wrap()

    # -- connector calls seen -----------------------------------------------------------
    def _wrap(self):
        eng = self
        cs = self.csched
        orig_uasa = cs.update_state_after_alloc
        orig_lookup = cs.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens, *a, **k):
            res = orig_lookup(request, num_computed_tokens, *a, **k)
            eng.stats["lookups"] += 1
            eng.last_lookup[request.request_id] = (num_computed_tokens, res)
            return res

        def update_state_after_alloc(request, blocks, num_external_tokens):
            case = None
            if num_external_tokens:
                ctx = eng.call_context(request)  # before the call: it clears partial_tail_boundary
                try:
                    case = eng.rel.capture.case_of_call(
                        cs, request, blocks, num_external_tokens,
                        "trace-s%d-%s" % (eng.step_no, request.request_id),
                        kv_cache_config=eng.kv_cache_config)
                except Exception as e:  # noqa: BLE001
                    eng.violations.append({"check": "harness-capture", "step": eng.step_no,
                                           "request": request.request_id,
                                           "error": "%s: %s" % (type(e).__name__, e)})
            jobs_before = set(getattr(cs, "_current_batch_load_jobs", {}) or {})
            nkeys = len(eng.loaded_keys)
            try:
                r = orig_uasa(request, blocks, num_external_tokens)
            except BaseException as e:
                if case is not None:
                    eng.cases.append(dict(ctx, case=case, outcome=(
                        "assertion_error" if isinstance(e, AssertionError) else "exception"),
                        error="%s: %s" % (type(e).__name__, e), assert_site=eng.rel.assert_site(e)))
                raise
            if case is not None:
                jobs = {j: v for j, v in (getattr(cs, "_current_batch_load_jobs", {}) or {}).items()
                        if j not in jobs_before}
                res = dict(ctx, case=case, outcome="ok")
                keys = eng.loaded_keys[nkeys:]
                res["keys"] = eng.describe_keys(request, keys[-1]) if keys else []
                if jobs:
                    (job,) = jobs.values()
                    dst = job.dst_spec
                    ids = [int(x) for x in dst.block_ids]
                    if eng.mutant == "dst_off_by_one":  # planted defect: tests show the checks see it
                        ids = [i + 1 for i in ids]
                    res.update(dst_block_ids=ids, group_sizes=[int(x) for x in dst.group_sizes],
                               block_indices=[int(x) for x in dst.block_indices])
                    eng.stats["loads"] += 1
                    eng.check_load_dst(request, ids)
                else:
                    res.update(dst_block_ids=[], group_sizes=[], block_indices=[])
                if case["num_locally_computed_tokens"] > 0:
                    eng.stats["partial_hits"] += 1
                if ctx["partial_tail_boundary"] is not None:
                    eng.stats["partial_tails"] += 1
                eng.cases.append(res)
            return r

        mgr = cs.manager
        orig_prepare_load = mgr.prepare_load
        orig_mgr_lookup = mgr.lookup
        hit = self.rel.obase.LookupResult.HIT

        def _rid(a, k):
            ctx = a[0] if a else k.get("req_context")
            return getattr(ctx, "req_id", None)

        def sync_evictions():  # the scripted tier's evictions (read at every tier call)
            ev = getattr(mgr, "kvbound_evicted", ())
            eng.forget(ev[eng.evictions_seen:])
            eng.evictions_seen = len(ev)

        def lookup(key, *a, **k):
            sync_evictions()
            r = orig_mgr_lookup(key, *a, **k)
            if r == hit:
                eng.confirmed.setdefault(_rid(a, k), set()).add(key)
            return r

        def prepare_load(keys, *a, **k):
            keys = list(keys)
            sync_evictions()
            eng.loaded_keys.append(keys)
            rid = _rid(a, k)
            unconfirmed = [x for x in keys if x not in eng.confirmed.get(rid, ())]
            if unconfirmed:
                eng.violate("load_key_not_confirmed", rid, "%d of %d keys passed to prepare_load were"
                            " not answered HIT by this request's lookup, or were evicted since"
                            % (len(unconfirmed), len(keys)))
            return orig_prepare_load(keys, *a, **k)

        # Every allocation takes no more blocks from the pool than the admission check
        # reserved (get_num_blocks_to_allocate): else a request admitted with exactly
        # that many free blocks crashes get_new_blocks.
        kvm = self.sched.kv_cache_manager
        coord = kvm.coordinator
        orig_alloc, orig_count = kvm.allocate_slots, coord.get_num_blocks_to_allocate
        counted = []

        def get_num_blocks_to_allocate(*a, **k):
            n = orig_count(*a, **k)
            if not k.get("apply_admission_cap"):
                counted.append(n)
            return n

        def allocate_slots(request, *a, **k):
            del counted[:]
            free = kvm.block_pool.get_num_free_blocks()
            out = orig_alloc(request, *a, **k)
            taken = free - kvm.block_pool.get_num_free_blocks()
            if out is not None and counted and taken > counted[-1]:
                eng.violate("allocation_exceeds_reservation", request.request_id,
                            "allocate_slots took %d blocks from the pool, get_num_blocks_to_allocate"
                            " reserved %d (num_external_computed_tokens=%s, num_new_tokens=%s)"
                            % (taken, counted[-1], k.get("num_external_computed_tokens"),
                               a[0] if a else k.get("num_new_tokens")))
            return out

        kvm.allocate_slots = allocate_slots
        coord.get_num_blocks_to_allocate = get_num_blocks_to_allocate
        cs.get_num_new_matched_tokens = get_num_new_matched_tokens
        cs.update_state_after_alloc = update_state_after_alloc
        mgr.prepare_load = prepare_load
        mgr.lookup = lookup
        self.confirmed = {}  # request id -> keys the tier answered HIT (and not evicted since)
        policy = getattr(mgr, "_policy", None)  # vLLM's CPU tier: its own LRU evictions too
        if policy is not None and hasattr(policy, "evict"):
            orig_evict = policy.evict

            def evict(*a, **k):
                out = orig_evict(*a, **k)
                eng.forget([key for key, _ in out or ()])
                return out
            policy.evict = evict
        self.evictions_seen = 0
        self.last_lookup = {}
        self.loaded_keys = []

    def forget(self, keys):
        """Evicted keys are no longer confirmed for any request: a later prepare_load of
        one without a new HIT is a load of an evicted key."""
        if keys:
            gone = set(keys)
            for s in self.confirmed.values():
                s -= gone

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

    def describe_keys(self, request, keys):
        """prepare_load's keys as kvbound's plan names them: [group_idx, chunk], and
        [group_idx, "boundary", key_tokens] for a key that is no whole chunk's (a partial
        tail's, keyed by the hash of its first key_tokens tokens)."""
        ob = self.rel.obase
        hashes = list(request.block_hashes)
        tph = self.rel.capture._tokens_per_hash(self.csched.config)
        where = {}
        for pos, g in enumerate(self.csched.config.kv_group_configs):
            gi = getattr(g, "group_idx", pos)
            hpc = self.rel.capture._first(g, "hashes_per_chunk", "hash_block_size_factor")
            for j in range(len(hashes) // hpc):
                where[ob.make_offload_key(hashes[(j + 1) * hpc - 1], gi)] = [gi, j]
            for i, h in enumerate(hashes):
                where.setdefault(ob.make_offload_key(h, gi), [gi, "boundary", (i + 1) * tph])
        return [where.get(k, ["unknown"]) for k in keys]

    def violate(self, check, request_id, msg):
        self.violations.append({"check": check, "step": self.step_no, "request": request_id,
                                "message": msg})

    def owned_block_ids(self, request_id):
        mgr = self.sched.kv_cache_manager
        out = set()
        for g, m in enumerate(mgr.coordinator.single_type_managers):
            for b in m.req_to_blocks.get(request_id, ()):
                if not b.is_null:
                    out.add(b.block_id)
        return out

    def check_load_dst(self, request, ids):
        owned = self.owned_block_ids(request.request_id)
        for bid in ids:
            if bid == 0:
                self.violate("load_into_null_block", request.request_id, "load destination block 0 (null)")
            elif bid not in owned:
                self.violate("load_into_foreign_block", request.request_id,
                             "load destination block %d is not one of the request's blocks" % bid)

    def on_submit(self, kind, job_id, spec):
        if kind == "store":
            self.stats["stores"] += 1

    # -- stepping --------------------------------------------------------------------------
    def new_request(self, r):
        rel = self.rel
        req = rel.Request(
            request_id=str(r["id"]), prompt_token_ids=prompt_tokens(r["prompt"]),
            sampling_params=rel.SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
            pooling_params=None, block_hasher=self.hasher)
        return req

    def worker_side(self, so):
        w = self.wconn
        meta = so.kv_connector_metadata
        w.handle_preemptions(meta)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        w.wait_for_save()
        if hasattr(w, "get_transfer_results"):
            tr = w.get_transfer_results(so.finished_req_ids)
            fs, fr = tr.finished_sending, tr.finished_recving
        else:
            fs, fr = w.get_finished(so.finished_req_ids)
        out = self.rel.vout.KVConnectorOutput(
            finished_sending=fs, finished_recving=fr,
            invalid_block_ids=w.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=w.build_connector_worker_meta())
        w.clear_connector_metadata()
        return out

    def model_output(self, so, kv_out):
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests.get(rid)
            if req is not None and req.num_computed_tokens >= req.num_tokens:
                # async: this step's token is already counted as a placeholder
                idx = req.num_output_tokens + max(0, getattr(req, "num_output_placeholders", 0) - 1)
                # speculative decoding: the drafts the fake model would have sampled are
                # accepted up to the first wrong one, plus one bonus token
                drafts = (getattr(so, "scheduled_spec_decode_tokens", None) or {}).get(rid, ())
                toks = []
                for d in drafts:
                    if d != out_tok(int(rid), idx + len(toks)):
                        break
                    toks.append(d)
                self.stats["accepted"] += len(toks)
                sampled.append(toks + [out_tok(int(rid), idx + len(toks))])
            else:
                sampled.append([])
        return self.rel.vout.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, kv_connector_output=kv_out)

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
        while True:
            s = self.step_no
            for r in by_step.pop(s, ()):
                sched.add_request(self.new_request(r))
                self.stats["requests"] += 1
                if r.get("abort_after") is not None:
                    aborts.setdefault(s + r["abort_after"], []).append(str(r["id"]))
            for rid in aborts.pop(s, ()):
                if rid in sched.requests:
                    sched.finish_requests(rid, self.rel.RequestStatus.FINISHED_ABORTED)
                    self.stats["aborts"] += 1
            if s >= max_steps:
                self.violate("not_drained", None, "still running after %d steps" % max_steps)
                break
            self.step_no += 1
            if self.engine_busy():
                self.stats["steps"] += 1
                so = sched.schedule()
                self.stats["preemptions"] += len(getattr(so, "preempted_req_ids", ()) or ())
                mro = self.model_output(so, self.worker_side(so))
                queue.insert(0, (so, mro))
                executed = so.total_num_scheduled_tokens > 0
                if is_async and len(queue) < 2 and (executed or self.engine_busy()):
                    continue
            elif not queue:
                if s > last_arrival and not aborts:
                    break
                continue  # idle until the next arrival
            so, mro = queue.pop()
            sched.update_from_output(so, mro)
            if self.num_spec and not is_async:
                self.propose_drafts(so)
        self.check_drained()

    def propose_drafts(self, so):
        """The drafter's proposals after a sync step (the engine core's
        ``take_draft_token_ids`` -> ``update_draft_token_ids``): ``num_speculative_tokens``
        per request that sampled, each right with probability ``accept_p``."""
        ids, drafts = [], []
        for rid in so.num_scheduled_tokens:
            req = self.sched.requests.get(rid)
            if req is None or req.is_finished() or req.num_computed_tokens < req.num_tokens - 1:
                continue
            d = []
            for i in range(self.num_spec):
                t = out_tok(int(rid), req.num_output_tokens + i)
                d.append(t if self.rng.random() < self.accept_p else 1 + (t % 59999))
            ids.append(rid)
            drafts.append(d)
            self.stats["drafts"] += len(d)
        if ids:
            self.sched.update_draft_token_ids(self.rel.vout.DraftTokenIds(req_ids=ids, draft_token_ids=drafts))

    def engine_busy(self):
        """The engine core's own loop condition (``has_requests``: unfinished requests,
        finished ones not yet sent to the workers, a connector with pending work)."""
        sched = self.sched
        if hasattr(sched, "has_requests"):
            return sched.has_requests()
        return sched.has_unfinished_requests() or bool(sched.finished_req_ids)

    def check_drained(self):
        bp = self.sched.kv_cache_manager.block_pool
        free = bp.get_num_free_blocks()
        total = self.kv_cache_config.num_blocks - 1  # the null block is never free
        if free != total:
            self.violate("blocks_not_freed", None, "%d of %d blocks free after drain" % (free, total))
        cs = self.csched
        for name in ("_req_status", "_requests", "_reqs_being_loaded", "_reqs_being_stored",
                     "_current_batch_load_jobs", "_jobs", "_load_jobs", "_store_jobs"):
            v = getattr(cs, name, None)
            if v:
                self.violate("connector_state_left", None, "%s holds %d entries after drain" % (name, len(v)))
        if self.transfers.pending:
            self.violate("transfer_not_finished", None, "%d jobs pending" % len(self.transfers.pending))


def run_job(rel, job):
    t0, c0 = time.monotonic(), time.process_time()
    eng = rel.build(job["layout"], job["params"])
    res = {"ok": True}
    try:
        eng.run(job["requests"], job.get("max_steps", 200000))
    except Exception as e:  # noqa: BLE001 - an exception inside vLLM is a finding
        res = {"ok": False, "error": "%s: %s" % (type(e).__name__, e), "assert_site": rel.assert_site(e),
               "traceback": traceback.format_exc()[-4000:], "step": eng.step_no}
    counts = getattr(eng.csched.manager, "kvbound_counts", None)
    if counts:
        eng.stats.update(("tier_" + k, v) for k, v in counts.items())
    res.update(stats=eng.stats, cases=eng.cases, violations=eng.violations,
               seconds=time.monotonic() - t0, cpu_seconds=time.process_time() - c0)
    return res


def main():
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        rel = Release()
    except BaseException as e:  # noqa: BLE001
        _send(proto, {"fatal": "import", "error": "%s: %s" % (type(e).__name__, e),
                      "traceback": traceback.format_exc()[-4000:]})
        return 3
    _send(proto, {"hello": PROTOCOL, "vllm": rel.version, "scheduler_file": rel.scheduler_file})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        try:
            res = run_job(rel, msg["job"])
        except Exception as e:  # noqa: BLE001 - a setup failure
            res = {"ok": False, "setup_error": "%s: %s" % (type(e).__name__, e),
                   "traceback": traceback.format_exc()[-4000:]}
        res["id"] = msg.get("id")
        _send(proto, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
