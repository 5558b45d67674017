"""Dump case files from a RUNNING vLLM: every ``update_state_after_alloc`` call that
loads (``num_external_tokens > 0``) is written as one kvbound case line, before vLLM
plans it, so a call that crashes the engine is on disk first.

Part of the side package: it imports only the standard library, vLLM and the side package,
so it can be loaded in an engine process where kvbound is not installed (docs/case-format.md:
``kvbound/side/`` on the engine's path and, in a ``sitecustomize.py`` there, ``import worker``,
then ``kvbound_side.capture.install_from_env()`` with ``KVBOUND_CAPTURE=/path/cases.jsonl``
set); the plugin imports it as ``kvbound.side.capture``. Replay with ``kvbound plan
--vllm-version X cases.jsonl`` or ``kvbound conform``.
"""

import functools
import json
import logging
import os
import threading

from .adapter import first_attr, kind_of

_lock = threading.Lock()


def _token(block):
    if block.is_null:
        return "N"
    return ("H%d" if block.block_hash is not None else "U%d") % block.block_id


def _group_fields(spec, kind):
    out = {"kind": kind, "tokens_per_block": spec.block_size}
    if kind == "sliding_window":
        out["sliding_window"] = spec.sliding_window
        if getattr(spec, "extra_retained_tokens", 0):
            out["extra_retained_tokens"] = spec.extra_retained_tokens
    if kind == "chunked_local":
        out["attention_chunk_size"] = spec.attention_chunk_size
    if kind == "mamba" and getattr(spec, "mamba_cache_mode", "align") != "align":
        out["mamba_cache_mode"] = spec.mamba_cache_mode
    return out


def tokens_per_hash(cfg):
    """0.28+ name it; before, a group's tokens_per_chunk / hashes_per_chunk."""
    if hasattr(cfg, "tokens_per_hash"):
        return cfg.tokens_per_hash
    g = cfg.kv_group_configs[0]
    return (first_attr(g, "tokens_per_chunk", "offloaded_block_size")
            // first_attr(g, "hashes_per_chunk", "hash_block_size_factor"))


def case_of_call(sched, request, blocks, num_external_tokens, name=None, kv_cache_config=None):
    """The case (a dict in kvbound's case format v2) of one ``update_state_after_alloc``
    call: every KV-cache group of ``blocks.blocks`` (a group the connector does not
    offload marked ``"offloaded": false``), the request's ``num_tokens`` and the
    partial-tail boundary its lookup recorded, as vLLM holds them at the call.

    The group kinds come from the engine's ``kv_cache_config`` (given, or kept by
    ``install``'s wrapped ``__init__``); before 0.33 a group's config carries no
    ``kv_cache_spec``, so without it only a 0.33+ scheduler can be described."""
    cfg = sched.config
    status = sched._req_status[request.request_id]
    kv_cache_config = kv_cache_config or getattr(sched, "_kvbound_kv_cache_config", None)
    by_idx = {getattr(g, "group_idx", gi): g for gi, g in enumerate(cfg.kv_group_configs)}
    groups = []
    for gi, table in enumerate(blocks.blocks):
        g = by_idx.get(gi)
        if kv_cache_config is not None:
            kv_group = kv_cache_config.kv_cache_groups[gi]
            spec, eagle = kv_group.kv_cache_spec, getattr(kv_group, "is_eagle_group", False)
        elif getattr(g, "kv_cache_spec", None) is not None:
            spec, eagle = g.kv_cache_spec, getattr(g, "is_eagle_group", False)
        else:
            raise ValueError("KV-cache group %d: its spec is unknown (the scheduler was built before"
                             " capture was installed and no kv_cache_config was given)" % gi)
        out = _group_fields(spec, kind_of(spec))
        if g is not None:  # as the connector sees it (DCP-scaled where DCP is on)
            out["tokens_per_block"] = first_attr(g, "tokens_per_block", "gpu_block_size")
        if eagle:
            out["is_eagle_group"] = True
        if g is None:
            out["offloaded"] = False
        out["blocks"] = [_token(b) for b in table]
        groups.append(out)
    case = {
        "name": name or "captured-%s" % request.request_id,
        "blocks_per_chunk": first_attr(cfg, "blocks_per_chunk", "block_size_factor"),
        "tokens_per_hash": tokens_per_hash(cfg),
        "num_prompt_tokens": request.num_prompt_tokens,
        "num_locally_computed_tokens": status.num_locally_computed_tokens,
        "num_external_tokens": num_external_tokens,
        "sync_load": request.request_id in getattr(sched, "_current_batch_sync_loads", ()),
    }
    if request.num_tokens != request.num_prompt_tokens:
        case["num_tokens"] = request.num_tokens
    if getattr(status, "partial_tail_boundary", None) is not None:
        case["partial_tail_boundary"] = status.partial_tail_boundary
    alignment = getattr(kv_cache_config, "cache_hit_alignment_tokens", None)
    if alignment is not None:
        case["cache_hit_alignment_tokens"] = alignment
    dcp = getattr(cfg, "dcp_world_size", None) or getattr(sched, "_kvbound_dcp", 1)
    if dcp != 1:
        case["decode_context_parallel_size"] = dcp
    case["groups"] = groups
    return case


def load_job_fields(sched, jobs_before):
    """The destination of the load job one call added to ``_current_batch_load_jobs`` (the
    job ids in ``jobs_before`` were there already), in ``kvbound plan``'s fields; None when
    the call added no job."""
    jobs = [v for j, v in (getattr(sched, "_current_batch_load_jobs", {}) or {}).items()
            if j not in jobs_before]
    if not jobs:
        return None
    (job,) = jobs
    # a TransferJob names its (src, dst) pair as transfer_spec before 0.25
    # (0.24.0 offloading/common.py:63) and dst_spec since: probed by feature
    dst = job.dst_spec if hasattr(job, "dst_spec") else job.transfer_spec[1]
    return {"dst_block_ids": [int(x) for x in dst.block_ids],
            "group_sizes": [int(x) for x in dst.group_sizes],
            "block_indices": [int(x) for x in dst.block_indices]}


def describe_keys(sched, request, keys):
    """The offload keys passed to the tier's ``prepare_load`` as kvbound's plan names them:
    [group_idx, chunk], and [group_idx, "boundary", key_tokens] for a key that is no whole
    chunk's (a partial tail's, keyed by the hash of its first key_tokens tokens)."""
    from vllm.v1.kv_offload.base import make_offload_key

    hashes = list(request.block_hashes)
    tph = tokens_per_hash(sched.config)
    where = {}
    for pos, g in enumerate(sched.config.kv_group_configs):
        gi = getattr(g, "group_idx", pos)
        hpc = first_attr(g, "hashes_per_chunk", "hash_block_size_factor")
        for j in range(len(hashes) // hpc):
            where[make_offload_key(hashes[(j + 1) * hpc - 1], gi)] = [gi, j]
        for i, h in enumerate(hashes):
            where.setdefault(make_offload_key(h, gi), [gi, "boundary", (i + 1) * tph])
    return [where.get(k, ["unknown"]) for k in keys]


def _arg(args, kwargs, i, name, default=None):
    return kwargs[name] if name in kwargs else args[i] if len(args) > i else default


def install(path=None, scheduler_cls=None, observer=None):
    """Wrap ``update_state_after_alloc`` of ``scheduler_cls`` (vLLM's
    ``OffloadingConnectorScheduler`` by default) to append each loading call to ``path``
    and hand it to ``observer``; ``__init__`` is wrapped too, to keep the ``KVCacheConfig``
    (the kinds of groups the connector does not offload, EAGLE flags, the hit alignment)
    and the keys each load passes to the tier's ``prepare_load``.

    Idempotent: the class is wrapped once, whichever copy of this module (the package's or
    one loaded by path) installs first; a later call adds its ``path`` and ``observer`` to
    that wrapper (each once). ``observer(sched, request, record, exc)`` is called after
    the real call with ``record`` the call as ``kvbound trace`` records it (``case``,
    ``partial_tail_boundary``, ``sync_load_marked``, ``outcome`` and, for ``ok``, the plan
    fields and ``keys``) and ``exc`` what vLLM raised (re-raised after), or None; an
    observer that raises is logged and ignored."""
    if scheduler_cls is None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
            OffloadingConnectorScheduler as scheduler_cls,
        )
    current = scheduler_cls.update_state_after_alloc
    sinks = getattr(current, "_kvbound_capture", None)
    if sinks is None:
        sinks = _wrap(scheduler_cls)
    if path and path not in sinks["paths"]:
        sinks["paths"].append(path)
    if observer is not None and observer not in sinks["observers"]:
        sinks["observers"].append(observer)
    return scheduler_cls.update_state_after_alloc


def _wrap(scheduler_cls):
    original = scheduler_cls.update_state_after_alloc
    original_init = scheduler_cls.__init__
    sinks = {"paths": [], "observers": []}
    counter = [0]

    @functools.wraps(original_init)
    def __init__(self, spec, *args, **kwargs):
        original_init(self, spec, *args, **kwargs)
        self._kvbound_seen = True
        # 0.26+: (spec, vllm_config, kv_cache_config); before, (spec) and the spec holds both
        vllm_config = _arg(args, kwargs, 0, "vllm_config", getattr(spec, "vllm_config", None))
        self._kvbound_kv_cache_config = _arg(args, kwargs, 1, "kv_cache_config",
                                             getattr(spec, "kv_cache_config", None))
        self._kvbound_dcp = getattr(getattr(vllm_config, "parallel_config", None),
                                    "decode_context_parallel_size", 1)
        manager = getattr(self, "manager", None)
        if manager is not None and hasattr(manager, "prepare_load"):
            prepare_load = manager.prepare_load

            def keep_keys(keys, *a, **k):
                keys = list(keys)
                self._kvbound_load_keys = keys
                return prepare_load(keys, *a, **k)
            manager.prepare_load = keep_keys

    def _failed(what, e):
        line = "%s: %s: %s" % (what, type(e).__name__, e)
        logging.getLogger("kvbound").warning("kvbound capture: %s", line)
        for path in sinks["paths"]:
            with open(path + ".errors", "a") as f:
                f.write(line + "\n")

    @functools.wraps(original)
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if not num_external_tokens or not (sinks["paths"] or sinks["observers"]):
            return original(self, request, blocks, num_external_tokens)
        record = None
        try:
            with _lock:
                counter[0] += 1
                case = case_of_call(self, request, blocks, num_external_tokens,
                                    "captured-%d-%s" % (counter[0], request.request_id))
                for path in sinks["paths"]:
                    with open(path, "a") as f:
                        f.write(json.dumps(case) + "\n")
            record = {"case": case, "partial_tail_boundary": case.get("partial_tail_boundary"),
                      "sync_load_marked": case["sync_load"]}
        except Exception as e:  # noqa: BLE001 - capturing must never take the engine down
            _failed("request %s" % request.request_id, e)
        if record is None or not sinks["observers"]:
            return original(self, request, blocks, num_external_tokens)
        jobs_before = set(getattr(self, "_current_batch_load_jobs", {}) or {})
        self._kvbound_load_keys = None
        try:
            out = original(self, request, blocks, num_external_tokens)
        except BaseException as e:
            record["outcome"] = "assertion_error" if isinstance(e, AssertionError) else "exception"
            record["error"] = "%s: %s" % (type(e).__name__, e)
            _observe(self, request, record, e, jobs_before)
            raise
        record["outcome"] = "ok"
        _observe(self, request, record, None, jobs_before)
        return out

    def _observe(sched, request, record, exc, jobs_before):
        if not getattr(sched, "_kvbound_seen", False):
            if not sinks.get("unseen_said"):
                sinks["unseen_said"] = True
                logging.getLogger("kvbound").warning(
                    "kvbound capture: a scheduler built before capture was installed is captured but"
                    " not observed (its prepare_load keys were not kept)")
            return
        try:
            if exc is None:
                load = load_job_fields(sched, jobs_before)
                record.update(load or {"dst_block_ids": [], "group_sizes": [], "block_indices": []})
                keys = getattr(sched, "_kvbound_load_keys", None)
                record["keys"] = describe_keys(sched, request, keys) if keys else []
        except Exception as e:  # noqa: BLE001
            _failed("request %s: describing the call" % request.request_id, e)
            return
        for obs in list(sinks["observers"]):
            try:
                obs(sched, request, record, exc)
            except Exception as e:  # noqa: BLE001 - an observer never takes the engine down
                _failed("request %s: observer %s" % (request.request_id, getattr(obs, "__name__", obs)), e)

    update_state_after_alloc._kvbound_capture = sinks
    scheduler_cls.__init__ = __init__
    scheduler_cls.update_state_after_alloc = update_state_after_alloc
    return sinks


def install_from_env(var="KVBOUND_CAPTURE"):
    """``install`` when ``$KVBOUND_CAPTURE`` names a file; nothing otherwise."""
    path = os.environ.get(var)
    if path:
        install(path)
