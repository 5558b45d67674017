"""The calls the model runner and the engine core make into the connector beside the scheduler's:
each step's worker-side sequence, the attention backend's layout question, the model runner's cross-layer
question, and the teardown.

Part of the side package (standard library and vLLM only), used by ``engine.py`` and
``trace_worker.py``. The order is the release's model runner's (0.33.0
``v1/worker/kv_connector_model_runner_mixin.py:67-107``, ``gpu_model_runner.py:3937``); where an
older release lacks a call or a field of ``KVConnectorOutput``, it is not made or not filled.
"""

import functools
import inspect

from . import adapter


def attention_layers(rel, kv_cache_config):
    """The layers whose attention op the connector's per-layer hooks wrap (0.33.0
    ``model_executor/layers/attention/kv_transfer_utils.py:15-59``, on ``attention.py:771``):
    every layer of an attention group, none of a Mamba group's."""
    return [n for g in kv_cache_config.kv_cache_groups
            if isinstance(g.kv_cache_spec, rel.kci.AttentionSpec) for n in g.layer_names]


def worker_side(eng, so):
    """One step's worker-side calls: preemptions, bind, the transfers' start, the forward (the
    attention layers' hooks around it; no layer runs in a step that schedules no token,
    ``kv_connector_no_forward``), the save, then the step's ``KVConnectorOutput``: finished
    transfers, load errors, the worker's transfer stats and KV events, its metadata for the
    scheduler.

    ``start_load_kv`` (the OffloadingConnector submits the step's loads and the previous step's
    deferred stores there, 0.33.0 ``offloading/worker.py:246-251``) runs before the forward when
    the step has a sync load, and after it otherwise, from 0.29.0 (``SchedulerOutput.has_sync_kv_loads``;
    0.33.0 ``kv_connector_model_runner_mixin.py:83-90``, 0.29.0 ``:86-93``); before 0.29 always before it
    (0.26.0 ``:95``). The trace's forward is one event (what every layer reads, then what it writes), so
    every layer's ``wait_for_layer_load`` comes before it and every ``save_kv_layer`` after it,
    where vLLM pairs them layer by layer (``kv_transfer_utils.py:49-57``); the OffloadingConnector's
    and the P/D consumer's hooks do nothing either way."""
    w = eng.wconn
    meta = so.kv_connector_metadata
    w.handle_preemptions(meta)
    eng.tap.publish("update_states", so)  # the model runner's _update_states: zeroing, block copies
    w.bind_connector_metadata(meta)
    after_forward = getattr(so, "has_sync_kv_loads", None) is False
    if not after_forward:
        w.start_load_kv(None)
    layers = eng.attention_layers if so.total_num_scheduled_tokens > 0 else ()
    for name in layers:
        w.wait_for_layer_load(name)
    eng.tap.publish("forward", so)  # the forward: what it reads, then what it writes
    for name in layers:
        w.save_kv_layer(name, None, None)  # the runner's KV tensor and attention metadata: none on CPU
    if after_forward:
        w.start_load_kv(None)
    w.wait_for_save()
    more = {}  # what the release's runner reports beside, where its KVConnectorOutput has the field
    if hasattr(w, "get_transfer_results"):
        tr = w.get_transfer_results(so.finished_req_ids)
        fs, fr = tr.finished_sending, tr.finished_recving
        more["failed_recving"] = getattr(tr, "failed_recving", None)
    else:
        fs, fr = w.get_finished(so.finished_req_ids)
    invalid = w.get_block_ids_with_load_errors()
    for field, method in (("kv_connector_stats", "get_kv_connector_stats"),
                          ("kv_cache_events", "get_kv_connector_kv_cache_events")):
        if hasattr(w, method):
            more[field] = getattr(w, method)()
    fields = _output_fields(eng.rel.vout.KVConnectorOutput)
    out = eng.rel.vout.KVConnectorOutput(
        finished_sending=fs, finished_recving=fr, invalid_block_ids=invalid,
        kv_connector_worker_meta=w.build_connector_worker_meta(),
        **{k: v for k, v in more.items() if k in fields and v is not None})
    w.clear_connector_metadata()
    return out


@functools.lru_cache(maxsize=None)
def _output_fields(cls):
    """The fields of the release's ``KVConnectorOutput``: read once, not at every step."""
    return adapter.fields(cls)


def kv_cache_layout(vllm_config):
    """The question the worker's attention backend asks the configured connector class when it
    lays out the KV cache (0.33.0 ``v1/attention/backends/utils.py:369`` ->
    ``distributed/kv_transfer/kv_connector/utils.py:48-61``, each child's under a MultiConnector);
    the trace allocates no KV tensors, so the answer only has to come back. Before 0.29 the
    function reads the config the worker set current (0.26.0 ``kv_connector/utils.py:39-52``)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector import utils

    ask = getattr(utils, "get_kv_connector_cache_layout", None)
    if ask is None:
        return
    if inspect.signature(ask).parameters:
        ask(vllm_config)
    else:
        with set_current_vllm_config(vllm_config):
            ask()


def cross_layer_question(wconn):
    """The question the GPU model runner asks the worker's connector before it lays the KV cache out
    (0.21.0 - 0.28.0 ``v1/worker/kv_connector_model_runner_mixin.py`` ``use_uniform_kv_cache``,
    0.21.0 :157, 0.28.0 :148: ``get_kv_transfer_group().prefer_cross_layer_blocks``; a MultiConnector
    asks each child, 0.28.0 ``multi_connector.py:213-216``; the mixin asks none from 0.29.0). The trace
    lays out no KV tensors: the answer only has to come back."""
    return wconn.prefer_cross_layer_blocks if hasattr(type(wconn), "prefer_cross_layer_blocks") else None


def shutdown(eng):
    """The engine core's teardown (0.33.0 ``v1/engine/core.py:834-840``): the executor's workers
    shut their connector down, then the scheduler (``v1/core/sched/scheduler.py:3324-3329``) its
    own, which shuts the offload tier down (``offloading/scheduler.py:2461-2462``)."""
    eng.wconn.shutdown()
    eng.sched.shutdown()
    eng.shut_down = True
