"""conform's worker: a real vLLM release's ``update_state_after_alloc``, one case at a time.

Part of the side package (``worker.py conform`` serves it): runs in the deps venv with
``PYTHONPATH=<release tree>``, where kvbound is NOT installed, so it imports only the
standard library, vLLM and the side package. Protocol: a hello line, then one JSON case
per stdin line -> one JSON result per stdout line. Anything vLLM prints goes to stderr,
so stdout carries only the protocol.

Only the offload tier (``OffloadingManager``) is faked, and it answers from the
case: HIT for chunk j of an offloaded group g with j below T (``cdiv(T, tpc_g)``
chunks, or ``T // tpc_g`` when the case has a partial tail; an EAGLE/MTP drafter
group also the chunk vLLM queries past them and pops), HIT for the case's
partial-tail boundary key of each group (at the token position vLLM keys it by,
the boundary plus the group's EAGLE proof margin), MISS for every other key. So
vLLM's own lookup (``get_num_new_matched_tokens``) picks the case's M and records
the case's ``partial_tail_boundary`` wherever the release's rules allow; its
answer is reported beside the case's, and the case's M is what
``update_state_after_alloc`` receives.
"""

import inspect
import traceback

from . import adapter, sidecar

NULL_BLOCK_ID = 0


def cdiv(a, b):
    return -(a // -b)


class Release:
    """The release's classes, imported once; names looked up where releases differ."""

    def __init__(self):
        adapter.quiet_environment()
        import vllm
        from vllm import SamplingParams
        from vllm.config import CacheConfig, DeviceConfig, ParallelConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler
        from vllm.v1.core import kv_cache_utils as kcu
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1 import kv_cache_interface as kci
        from vllm.v1.kv_offload import base, config as ocfg
        from vllm.v1.request import Request

        self.version = vllm.__version__
        self.scheduler, self.kcu, self.kci = scheduler, kcu, kci
        self.base, self.ocfg = base, ocfg
        self.SamplingParams, self.Request, self.KVCacheBlocks = SamplingParams, Request, KVCacheBlocks
        self.CacheConfig, self.DeviceConfig = CacheConfig, DeviceConfig
        self.ParallelConfig, self.VllmConfig = ParallelConfig, VllmConfig
        self.sha256 = adapter.hashing()
        try:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading import config as conncfg

            self.window_in_chunks = conncfg.get_sliding_window_size_in_chunks
        except (ImportError, AttributeError):  # before 0.33 it lived in scheduler.py
            self.window_in_chunks = scheduler.get_sliding_window_size_in_chunks
        self._vllm_configs = {}
        self.fake_manager_cls = _fake_manager_class(base)
        self.fake_spec_cls = _fake_spec_class(base)

    # -- config -----------------------------------------------------------------
    def vllm_config(self, block_size, dcp=1):
        if (block_size, dcp) not in self._vllm_configs:
            cfg = self.VllmConfig(
                cache_config=self.CacheConfig(block_size=block_size, enable_prefix_caching=True),
                parallel_config=self.ParallelConfig(),
                device_config=self.DeviceConfig(device="cpu"),
            )
            if dcp != 1:
                # Validation wants tp_size divisible by dcp_size (a GPU deployment); the
                # connector's scheduler only reads the number, so it is set afterwards.
                cfg.parallel_config.decode_context_parallel_size = dcp
            self._vllm_configs[block_size, dcp] = cfg
        return self._vllm_configs[block_size, dcp]

    def group_spec(self, g):
        return adapter.kv_cache_spec(g, head_size=1, state_size=1)

    def missing_features(self, case):
        """Why this release cannot express the case at all (its classes lack a field the
        case needs), or None. The spec answers ``unsupported`` for the same cases."""
        kci, ocfg = self.kci, self.ocfg
        why = []
        if any(g.get(EXTRA_RETAINED) for g in case["groups"]) and \
                EXTRA_RETAINED not in adapter.fields(kci.SlidingWindowSpec):
            why.append("SlidingWindowSpec has no extra_retained_tokens in this release")
        if any(g.get(EAGLE) for g in case["groups"]) and "is_eagle_group" not in adapter.fields(kci.KVCacheGroupSpec):
            why.append("KVCacheGroupSpec has no is_eagle_group in this release")
        if not all(_offloaded(g) for g in case["groups"]) and "group_id" not in adapter.fields(ocfg.OffloadingGroupConfig):
            why.append("OffloadingGroupConfig has no group_id in this release: every KV-cache group is"
                       " offloaded and indexed by position")
        return "; ".join(why) or None

    def offloading_config(self, specs, case, extra_config):
        o = self.ocfg
        bpc = case["blocks_per_chunk"]
        groups = tuple(
            adapter.build(o.OffloadingGroupConfig, tokens_per_block=s.block_size,
                   layer_names=("layer.%d" % i,), group_id=i,
                   sliding_window_size_in_chunks=self.window_in_chunks(s, s.block_size * bpc))
            for i, s in enumerate(specs) if _offloaded(case["groups"][i])
        )
        parallel = adapter.build(o.OffloadingParallelConfig, rank=0, world_size=1, tp_size=1, pp_size=1,
                          pcp_size=1, dcp_size=1, data_parallel_index=0, data_parallel_size=1,
                          data_parallel_rank_local=None, is_parallelism_agnostic=False)
        return adapter.build(
            o.OffloadingConfig, groups=groups, worker_kv_bytes_per_block=0,
            enable_kv_cache_events=False, extra_config=extra_config, engine_id="kvbound",
            model=adapter.build(o.OffloadingModelConfig, name="kvbound-conform", dtype="float32"),
            cache=adapter.build(o.OffloadingCacheConfig, tokens_per_hash=case["tokens_per_hash"],
                         blocks_per_chunk=bpc),
            parallel=parallel,
        )

    def kv_cache_config(self, case, specs):
        gs = case["groups"]
        return adapter.kv_cache_config(
            specs, 1 + max([_max_id(g["blocks"]) for g in gs] + [1]),
            eagle={i for i, g in enumerate(gs) if g.get(EAGLE)}, offloaded=[_offloaded(g) for g in gs],
            cache_hit_alignment_tokens=case.get(HIT_ALIGNMENT))

    # -- one case ---------------------------------------------------------------
    def run_case(self, case):
        out = {"phase": "setup"}
        try:
            return self._run_case(case, out)
        except AssertionError as e:
            out.update(outcome="assertion_error", assert_site=sidecar.assert_site(e))
        except Exception as e:  # noqa: BLE001 - any failure is this case's result
            out.update(outcome="exception", error="%s: %s" % (type(e).__name__, e),
                       traceback=traceback.format_exc()[-3000:])
        return out

    def _run_case(self, case, out):
        if "lookup" in case and "groups" not in case:
            return run_lookup_case(self, case["lookup"], out)
        N, M = case["num_locally_computed_tokens"], case["num_external_tokens"]
        T = N + M
        tph = case["tokens_per_hash"]
        P = case["num_prompt_tokens"]
        num_tokens = case.get(NUM_TOKENS)
        num_tokens = P if num_tokens is None else num_tokens
        tail = case.get(PARTIAL_TAIL)
        missing = self.missing_features(case)
        if missing:
            out.update(outcome="unsupported", phase="features", why=missing)
            return out
        specs = [self.group_spec(g) for g in case["groups"]]
        kv_cache_config = self.kv_cache_config(case, specs)
        # 0.33's real switch for sync loads: a step budget; the lookup then reserves it.
        extra = {"sync_load_budget_bytes": 1 << 60} if case.get("sync_load") else {}
        manager = self.fake_manager_cls()
        spec = self.fake_spec_cls(self.offloading_config(specs, case, extra), manager)
        sched = self.scheduler.OffloadingConnectorScheduler(
            spec, self.vllm_config(specs[0].block_size, case.get(DCP) or 1), kv_cache_config)
        cfg = sched.config
        group_configs = list(getattr(cfg, "kv_group_configs", ()))
        out["real_config"] = {
            "supports_partial_tail": getattr(cfg, "supports_partial_tail", None),
            "window_in_chunks": [getattr(gc, "sliding_window_size_in_chunks", None) for gc in group_configs]
            if all(hasattr(gc, "sliding_window_size_in_chunks") for gc in group_configs) else None,
            "eagle_groups": [gc.group_idx for gc in group_configs if getattr(gc, "is_eagle_group", False)],
            "eagle_proof_margins": {str(k): v for k, v in getattr(sched, "_eagle_proof_margins", {}).items()},
        }
        if tail is not None and not out["real_config"]["supports_partial_tail"]:
            has = out["real_config"]["supports_partial_tail"] is not None
            out.update(outcome="unsupported", phase="features",
                       why="the release's own SchedulerOffloadConfig.supports_partial_tail is False for this"
                           " config, so its lookup never records a partial tail" if has else
                           "this release has no partial tails (SchedulerOffloadConfig has no"
                           " supports_partial_tail)")
            return out
        req = self.Request(
            request_id="kvbound-case",
            prompt_token_ids=list(range(P)),
            sampling_params=self.SamplingParams(max_tokens=max(1, num_tokens - P + 1)),
            pooling_params=None,
            block_hasher=self.kcu.get_request_block_hasher(tph, self.sha256),
        )
        if num_tokens > P:  # a resumed request: its output so far is hashed too
            req.append_output_token_ids(list(range(P, num_tokens)))
        bpc = case["blocks_per_chunk"]
        chunk_groups, boundary_keys = [], {}
        for gc in group_configs:
            gi = gc.group_idx
            g = case["groups"][gi]
            tpc = g["tokens_per_block"] * bpc
            hit = T // tpc if tail is not None else cdiv(T, tpc)
            if getattr(gc, "is_eagle_group", False) and tail is None:
                hit += 1  # the volatile trailing chunk vLLM queries past the hit and pops
            chunk_groups.append((gi, tpc // tph, hit))
            if tail is not None:
                key_tokens = sched._partial_tail_key_tokens(gc, tail) if hasattr(
                    sched, "_partial_tail_key_tokens") else tail
                idx = key_tokens // tph - 1
                if 0 <= idx < len(req.block_hashes):
                    boundary_keys[self.base.make_offload_key(req.block_hashes[idx], gi)] = [
                        gi, "boundary", key_tokens]
        manager.expect(req, chunk_groups, boundary_keys, tph)
        out["phase"] = "lookup"
        sched.on_new_request(req)
        hit, is_async = sched.get_num_new_matched_tokens(req, N)
        out["lookup"] = {"num_external_tokens": hit, "load_async": bool(is_async)}
        sync_set = getattr(sched, "_current_batch_sync_loads", None)
        out["sync_load_marked"] = None if sync_set is None else req.request_id in sync_set
        status = getattr(sched, "_req_status", {}).get(req.request_id)
        out["partial_tail_boundary"] = getattr(status, "partial_tail_boundary", None)

        out["phase"] = "update_state_after_alloc"
        null = self.kcu.KVCacheBlock(block_id=NULL_BLOCK_ID)
        null.is_null = True
        tables = []
        for gi, g in enumerate(case["groups"]):
            table = []
            for tok in g["blocks"]:
                if tok == "N":
                    table.append(null)
                    continue
                blk = self.kcu.KVCacheBlock(block_id=int(tok[1:]))
                if tok[0] == "H":
                    blk.set_block_hash(self.kcu.make_block_hash_with_group_id(
                        b"kvbound-block-%d" % blk.block_id, gi))
                table.append(blk)
            tables.append(table)
        jobs_before = set(getattr(sched, "_current_batch_load_jobs", {}))
        sched.update_state_after_alloc(req, self.KVCacheBlocks(tuple(tables)), M)
        jobs = {j: v for j, v in getattr(sched, "_current_batch_load_jobs", {}).items()
                if j not in jobs_before}
        out["phase"] = "done"
        if not jobs:
            out.update(outcome="ok", dst_block_ids=[], group_sizes=[], block_indices=[], keys=[])
            return out
        (job,) = jobs.values()
        dst = job.dst_spec
        loaded = manager.loaded[-1] if manager.loaded else []
        out.update(
            outcome="ok",
            dst_block_ids=[int(x) for x in dst.block_ids],
            group_sizes=[int(x) for x in dst.group_sizes],
            block_indices=[int(x) for x in dst.block_indices],
            keys=[manager.describe(k) for k in loaded],
        )
        return out


# -- one lookup case (docs/case-format.md, "Lookup cases") ---------------------------------------
def run_lookup_case(rel, lk, out):
    """The real ``get_num_new_matched_tokens`` of a fresh request against a tier that
    answers the case's answers per key, in the order asked; reports the hit, the
    recorded partial-tail boundary, the keys asked and the config the release built."""
    tph = lk["tokens_per_hash"]
    groups = []
    for g in lk["groups"]:
        d = {"kind": g["kind"], "tokens_per_block": g["tokens_per_chunk"], "blocks": ["U1"]}
        if g["kind"] == "sliding_window":
            d["sliding_window"] = g["sliding_window"]
            if g.get("extra_retained_tokens"):
                d[EXTRA_RETAINED] = g["extra_retained_tokens"]
        if g.get("eagle"):
            d[EAGLE] = True
        groups.append(d)
    shim = {"blocks_per_chunk": 1, "tokens_per_hash": tph, "groups": groups}
    missing = rel.missing_features(shim)
    if missing:
        out.update(outcome="unsupported", phase="features", why=missing)
        return out
    specs = [rel.group_spec(g) for g in groups]
    kv_cache_config = rel.kv_cache_config(shim, specs)
    manager = _lookup_tier_class(rel.base)(lk["tier"])
    spec = rel.fake_spec_cls(rel.offloading_config(specs, shim, {}), manager)
    sched = rel.scheduler.OffloadingConnectorScheduler(spec, rel.vllm_config(specs[0].block_size),
                                                        kv_cache_config)
    cfg = sched.config
    gcs = list(cfg.kv_group_configs)
    # The state of the scheduler outside this request is not driven: a case that names it is
    # refused, never replayed without it (the spec would be judged on another input).
    undriven = [f for f in ("transfer_jobs", "skip_reading", "being_loaded") if lk.get(f)]
    if lk.get("prior_partial_tail_boundary") is not None:
        undriven.append("prior_partial_tail_boundary")
    if undriven:
        out.update(outcome="undriven", phase="setup",
                   why="the lookup driver sets no " + ", ".join(undriven) + " (a fresh request, nothing else loading)")
        return out
    # The request's caps as vLLM takes them: max_load_tokens from kv_transfer_params (0.31.0
    # offloading/scheduler.py:388-393, v1/request.py:120-121), max_num_new_tokens as the argument
    # of get_num_new_matched_tokens (0.30.0 offloading/scheduler.py:1016-1020).
    caps = {}
    if lk.get("max_num_new_tokens") is not None:
        if "max_num_new_tokens" not in inspect.signature(sched.get_num_new_matched_tokens).parameters:
            out.update(outcome="unsupported", phase="features",
                       why="this release's get_num_new_matched_tokens takes no max_num_new_tokens (0.30+)")
            return out
        caps["max_num_new_tokens"] = lk["max_num_new_tokens"]
    sp = {"max_tokens": max(1, lk["num_tokens"] - lk["num_prompt_tokens"] + 1)}
    if lk.get("max_load_tokens") is not None:
        sp["extra_args"] = {"kv_transfer_params": {"max_load_tokens": lk["max_load_tokens"]}}
    P, num_tokens = lk["num_prompt_tokens"], lk["num_tokens"]
    req = rel.Request(
        request_id="kvbound-lookup", prompt_token_ids=list(range(P)),
        sampling_params=rel.SamplingParams(**sp),
        pooling_params=None, block_hasher=rel.kcu.get_request_block_hasher(tph, rel.sha256))
    if num_tokens > P:
        req.append_output_token_ids(list(range(P, num_tokens)))
    tpcs = [adapter.first_attr(gc, "tokens_per_chunk", "offloaded_block_size") for gc in gcs]
    manager.name_keys(req, [(getattr(gc, "group_idx", i), tpcs[i] // tph) for i, gc in enumerate(gcs)], tph)
    out["phase"] = "lookup"
    if hasattr(sched, "on_new_request"):
        sched.on_new_request(req)
    hit, _ = sched.get_num_new_matched_tokens(req, lk["num_computed_tokens"], **caps)
    status = getattr(sched, "_req_status", {}).get(req.request_id)
    out.update(
        outcome="ok", phase="done", hit=hit, queries=manager.queries,
        partial_tail_boundary=getattr(status, "partial_tail_boundary", None),
        real_config={
            "lookup_groups": list(getattr(sched, "_lookup_groups", ())),
            "windows": [adapter.first_attr(gc, "sliding_window_size_in_chunks", "sliding_window_size_in_blocks")
                        for gc in gcs],
            "tokens_per_chunk": tpcs,
            "mamba_align_size": getattr(sched, "_mamba_align_size", None),
            "partial_tail_block_size": int(getattr(sched, "_partial_tail_block_size", 0) or 0)
            if getattr(cfg, "supports_partial_tail", False) else 0,
            "eagle_proof_margins": {str(k): v for k, v in getattr(sched, "_eagle_proof_margins", {}).items()},
        })
    return out


def _lookup_tier_class(base):
    """A tier that answers a lookup case's answers: the n-th ask of a key gets its n-th
    answer (the last again after that); an unnamed key is a MISS. 0.21-0.24 tiers answer
    True / None (pending) / False."""
    LR = getattr(base, "LookupResult", None)
    fake = _fake_manager_class(base)

    def __init__(self, tier):
        fake.__init__(self)
        self.tier, self.asked, self.queries, self.names = tier, {}, [], {}

    def name_keys(self, req, groups, tph):
        hashes = list(req.block_hashes)
        for gi, hpc in groups:
            for j in range(len(hashes) // hpc):
                self.names.setdefault(base.make_offload_key(hashes[(j + 1) * hpc - 1], gi), "%d:%d" % (gi, j))
        for gi, _ in groups:
            for i, h in enumerate(hashes):
                self.names.setdefault(base.make_offload_key(h, gi), "%d:b:%d" % (gi, (i + 1) * tph))

    def lookup(self, key, req_context=None):
        name = self.names.get(key, "unknown")
        self.queries.append(name)
        got = self.tier.get(name) or ["MISS"]
        n = self.asked.get(name, 0)
        self.asked[name] = n + 1
        a = got[min(n, len(got) - 1)]
        if LR is None:
            return {"HIT": True, "HIT_PENDING": None}.get(a, False)
        return getattr(LR, a)

    return type("KvboundLookupCaseTier", (fake,), {"__init__": __init__, "name_keys": name_keys,
                                                   "lookup": lookup})


# Case fields this adapter reads beyond v1 (case format v2, docs/case-format.md).
NUM_TOKENS = "num_tokens"
PARTIAL_TAIL = "partial_tail_boundary"
EXTRA_RETAINED = "extra_retained_tokens"
EAGLE = "is_eagle_group"
OFFLOADED = "offloaded"
HIT_ALIGNMENT = "cache_hit_alignment_tokens"
DCP = "decode_context_parallel_size"


def _offloaded(group):
    return group.get(OFFLOADED, True) is not False


def _max_id(tokens):
    return max([int(t[1:]) for t in tokens if t != "N"] + [0])


def _fake_manager_class(base):
    """The offload tier: HIT for the case's whole chunks, records prepare_load's keys."""

    def _unused(name):
        def method(self, *a, **k):
            self.calls.append(name)
            return None
        method.__name__ = name
        return method

    def __init__(self):
        self.calls, self.loaded = [], []
        self.key_of, self.boundary_of, self.hits = {}, {}, {}

    def expect(self, req, chunk_groups, boundary_keys, tokens_per_hash):
        """chunk_groups: (group index, hashes per chunk, chunks that HIT) per offloaded group;
        boundary_keys: {key: [group, "boundary", key_tokens]} of the case's partial tail."""
        self.key_of, self.hits = {}, {}
        hashes = list(req.block_hashes)
        for gi, hpc, hit in chunk_groups:
            self.hits[gi] = hit
            for j in range(len(hashes) // hpc):
                self.key_of[base.make_offload_key(hashes[(j + 1) * hpc - 1], gi)] = (gi, j)
        self.boundary_of = dict(boundary_keys)
        self.hash_index = {bytes(h): i for i, h in enumerate(hashes)}
        self.tokens_per_hash = tokens_per_hash

    def lookup(self, key, req_context=None):
        if key in self.boundary_of:
            return base.LookupResult.HIT
        gj = self.key_of.get(key)
        if gj is not None and gj[1] < self.hits[gj[0]]:
            return base.LookupResult.HIT
        return base.LookupResult.MISS

    def prepare_load(self, keys, req_context=None):
        self.loaded.append(list(keys))
        return _fake_load_spec_class(base)()

    def describe(self, key):
        """[group, chunk] for a chunk key, [group, "boundary", key_tokens] for a boundary key."""
        if key in self.boundary_of:
            return list(self.boundary_of[key])
        gj = self.key_of.get(key)
        if gj is not None:
            return [gj[0], gj[1]]
        raw = bytes(key)
        gi = int.from_bytes(raw[-4:], "big")
        i = self.hash_index.get(raw[:-4])
        return [gi, "boundary", None if i is None else (i + 1) * self.tokens_per_hash]

    def prepare_store(self, keys, req_context=None):
        return None

    def on_new_request(self, req_context=None):
        return base.RequestOffloadingContext()

    ns = {name: _unused(name) for name in getattr(base.OffloadingManager, "__abstractmethods__", ())}
    ns.update(__init__=__init__, expect=expect, lookup=lookup, prepare_load=prepare_load,
              describe=describe, prepare_store=prepare_store, on_new_request=on_new_request)
    return type("KvboundFakeOffloadTier", (base.OffloadingManager,), ns)


_LOAD_SPEC = {}


def _fake_load_spec_class(base):
    """What prepare_load hands the scheduler; only a worker would read it."""
    if "cls" not in _LOAD_SPEC:
        ns = {name: (lambda self, *a, **k: None)
              for name in getattr(base.LoadStoreSpec, "__abstractmethods__", ())}
        _LOAD_SPEC["cls"] = type("KvboundFakeLoadSpec", (base.LoadStoreSpec,), ns)
    return _LOAD_SPEC["cls"]


def _fake_spec_class(base):
    def __init__(self, config, manager):
        base.OffloadingSpec.__init__(self, config)
        self._kvbound_manager = manager

    ns = {name: (lambda self, *a, **k: None)
          for name in getattr(base.OffloadingSpec, "__abstractmethods__", ())}
    ns.update(__init__=__init__, get_manager=lambda self: self._kvbound_manager)
    return type("KvboundFakeOffloadingSpec", (base.OffloadingSpec,), ns)


def main():
    return sidecar.serve(Release, lambda rel, msg: rel.run_case(msg["case"]),
                         lambda rel: {"scheduler_file": sidecar.portable_path(rel.scheduler.__file__)})

