"""Dump case files from a RUNNING vLLM: every ``update_state_after_alloc`` call that
loads (``num_external_tokens > 0``) is written as one kvbound case line, before vLLM
plans it, so a call that crashes the engine is on disk first.

Like ``worker.py`` it imports only the standard library and vLLM, so it can be loaded
in an engine process where kvbound is not installed: put this file on the engine's
path and, in a ``sitecustomize.py`` there, ``import capture; capture.install_from_env()``
with ``KVBOUND_CAPTURE=/path/cases.jsonl`` set. Replay with ``kvbound plan
--vllm-version X cases.jsonl`` or ``kvbound conform``.
"""

import functools
import json
import os
import threading

_KINDS = (  # checked in this order: a subclass before its base
    ("ChunkedLocalAttentionSpec", "chunked_local"),
    ("SlidingWindowSpec", "sliding_window"),
    ("MambaSpec", "mamba"),
    ("FullAttentionSpec", "full_attention"),
)
_lock = threading.Lock()


def _kind(kv_cache_spec):
    names = {c.__name__ for c in type(kv_cache_spec).__mro__}
    for cls_name, kind in _KINDS:
        if cls_name in names:
            return kind
    raise ValueError("kvbound has no group kind for %s" % type(kv_cache_spec).__name__)


def _first(obj, *names):
    """The field under whichever name this release uses (0.20-0.24 vs 0.26+)."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    raise AttributeError("none of %s on %s" % (names, type(obj).__name__))


def _token(block):
    if block.is_null:
        return "N"
    return ("H%d" if block.block_hash is not None else "U%d") % block.block_id


def _tokens_per_hash(cfg):
    """0.28+ name it; before, a group's tokens_per_chunk / hashes_per_chunk."""
    if hasattr(cfg, "tokens_per_hash"):
        return cfg.tokens_per_hash
    g = cfg.kv_group_configs[0]
    return g.tokens_per_chunk // g.hashes_per_chunk


def case_of_call(sched, request, blocks, num_external_tokens, name=None, kv_cache_config=None):
    """The case (a dict in kvbound's case format) of one ``update_state_after_alloc`` call.

    Before 0.33 a group's config carries no ``kv_cache_spec``: pass the engine's
    ``kv_cache_config`` and the spec is read from its groups."""
    cfg = sched.config
    status = sched._req_status[request.request_id]
    groups = []
    for gi, g in enumerate(cfg.kv_group_configs):
        spec = getattr(g, "kv_cache_spec", None)
        if spec is None and kv_cache_config is not None:
            spec = kv_cache_config.kv_cache_groups[getattr(g, "group_idx", gi)].kv_cache_spec
        kind = _kind(spec)
        out = {"kind": kind, "tokens_per_block": _first(g, "tokens_per_block", "gpu_block_size")}
        if kind == "sliding_window":
            out["sliding_window"] = spec.sliding_window
        if kind == "chunked_local":
            out["attention_chunk_size"] = spec.attention_chunk_size
        out["blocks"] = [_token(b) for b in blocks.blocks[getattr(g, "group_idx", gi)]]
        groups.append(out)
    return {
        "name": name or "captured-%s" % request.request_id,
        "blocks_per_chunk": _first(cfg, "blocks_per_chunk", "block_size_factor"),
        "tokens_per_hash": _tokens_per_hash(cfg),
        "num_prompt_tokens": request.num_prompt_tokens,
        "num_locally_computed_tokens": status.num_locally_computed_tokens,
        "num_external_tokens": num_external_tokens,
        "sync_load": request.request_id in getattr(sched, "_current_batch_sync_loads", ()),
        "groups": groups,
    }


def install(path, scheduler_cls=None):
    """Wrap ``update_state_after_alloc`` of ``scheduler_cls`` (vLLM's
    ``OffloadingConnectorScheduler`` by default) to append each loading call to ``path``."""
    if scheduler_cls is None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
            OffloadingConnectorScheduler as scheduler_cls,
        )
    original = scheduler_cls.update_state_after_alloc
    if getattr(original, "_kvbound_capture", None):
        return original
    counter = [0]

    @functools.wraps(original)
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens:
            try:
                with _lock:
                    counter[0] += 1
                    case = case_of_call(self, request, blocks, num_external_tokens,
                                        "captured-%d-%s" % (counter[0], request.request_id))
                    with open(path, "a") as f:
                        f.write(json.dumps(case) + "\n")
            except Exception as e:  # noqa: BLE001 - capturing must never take the engine down
                with open(path + ".errors", "a") as f:
                    f.write("%s: %s\n" % (type(e).__name__, e))
        return original(self, request, blocks, num_external_tokens)

    update_state_after_alloc._kvbound_capture = True
    scheduler_cls.update_state_after_alloc = update_state_after_alloc
    return update_state_after_alloc


def install_from_env(var="KVBOUND_CAPTURE"):
    """``install`` when ``$KVBOUND_CAPTURE`` names a file; nothing otherwise."""
    path = os.environ.get(var)
    if path:
        install(path)
