"""Standalone reproducer: a request whose kv_transfer_params cap its offload
(max_offload_tokens) below its prompt's partial-tail boundary makes the
OffloadingConnector assert inside Scheduler.schedule() (vLLM 0.28.0 - 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py [--max-offload-tokens N]

The engine core's Scheduler with the OffloadingConnector (CPU tier), full attention +
Mamba ("align"), 528-token blocks, prefix-match unit 16 (--prefix-match-unit 16: the
connector's partial-tail offload is on), 24 GPU blocks. One request, A: 848 prompt
tokens (one full 528-token block and a 320-token partial tail), 3 output tokens,
kv_transfer_params={"max_offload_tokens": 528}. After its prefill the KV-cache manager
hands the connector the Mamba state at the prompt's last reusable hash boundary (832 on
0.32.0 - 0.33.0, 848 before) for partial-tail offload
(SchedulerOutput.kv_connector_block_state.boundary_state_offloads). The request asked
that nothing past token 528 be offloaded.

The check, on every step: schedule() returns, and no store job of the step reads a
boundary-state block handed off at a boundary past the request's cap (the aligned
boundary stores already skip those). Exit 1 with one line when schedule() raises or
such a store is built (0.28.0 - 0.33.0: the assert), 0 when every hand-off past the
cap is skipped and the run drains, 2 when no hand-off past the cap was offered.
--max-offload-tokens -1: the control, no cap (no hand-off is past it: exit 2).
"""

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # its log lines (no triton on CPU) to stderr, not stdout

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm import ModelRegistry, SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig,
    VllmConfig)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, MambaSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, UNIT, NUM_BLOCKS = 528, 16, 24
PROMPT = [1 + i for i in range(848)]
MAX_TOKENS = 3
STEPS = 20


class ReproNeverBuiltModel(torch.nn.Module):
    """The model architecture ModelConfig inspects; never instantiated (no model runs)."""

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


def kv_cache_tensor(size, layers, layer_stride, block_stride):
    """One tensor shared by both groups' layers (the CPU tier sizes its chunks from it)."""
    if "shared_by" in {f.name for f in dataclasses.fields(KVCacheTensor)}:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(size=size, layers=layers, layer_stride=layer_stride, block_stride=block_stride)


def make_scheduler(model_dir):
    specs = [FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32),
             MambaSpec(block_size=BLOCK, shapes=((64,),), dtypes=(torch.float32,), mamba_cache_mode="align")]
    page = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full", "mamba"], NUM_BLOCKS * max(
            s.page_size_bytes for s in specs), page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], specs[0]), KVCacheGroupSpec(["mamba"], specs[1])])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=16384, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, mamba_cache_mode="align",
                               prefix_match_unit=UNIT)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=16384,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    kw = {}
    if hasattr(kv_cache_utils, "resolve_kv_cache_block_sizes"):
        # as the engine core does (v1/engine/core.py): the hash block is the prefix-match
        # unit, set on the scheduler's KVCacheConfig with the cache-hit alignment
        bs, hbs = kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        kw["hash_block_size"] = hbs
        if hasattr(kv_cache_config, "hash_block_size"):
            kv_cache_config.hash_block_size = hbs
        if hasattr(kv_cache_utils, "resolve_cache_hit_alignment_tokens") and hasattr(
                kv_cache_config, "cache_hit_alignment_tokens"):
            kv_cache_config.cache_hit_alignment_tokens = kv_cache_utils.resolve_cache_hit_alignment_tokens(
                kv_cache_config, vllm_config, bs, hbs)
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK, **kw)


def make_request(request_id, prompt, max_tokens, max_offload_tokens):
    extra = {}
    if max_offload_tokens is not None:  # Request reads kv_transfer_params from extra_args
        extra["extra_args"] = {"kv_transfer_params": {"max_offload_tokens": max_offload_tokens}}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **extra)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(UNIT, sha256))


def finish(sched, so):
    """A fake model's output for a scheduled step: one token per request past its prompt."""
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                   sampled_token_ids=sampled))


def record_handoffs(sched):
    """The step's boundary-state hand-offs, {request: [(group, block, boundary), ...]}, as
    the connector's build_connector_meta receives them (the scheduler clears them from its
    output before schedule() returns): 0.29.0 on kv_connector_block_state, 0.27.0 - 0.28.0
    partial_tail_offloads. A pass-through wrapper; it changes nothing."""
    seen = {}
    build = sched.connector.build_connector_meta

    def build_connector_meta(so):
        seen.clear()
        state = getattr(so, "kv_connector_block_state", None)
        offs = state.boundary_state_offloads if state is not None else getattr(so, "partial_tail_offloads", None)
        seen.update({rid: list(entries) for rid, entries in (offs or {}).items()})
        return build(so)

    sched.connector.build_connector_meta = build_connector_meta
    return seen


def where(exc):
    """The failing line of vLLM, relative to its tree, and that frame's boundary/max_boundary."""
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    root = os.path.dirname(os.path.dirname(vllm.__file__))
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    loc = tb.tb_frame.f_locals
    extra = ""
    if "boundary" in loc and "max_boundary" in loc:
        extra = f" (boundary {loc['boundary']}, max_boundary {loc['max_boundary']})"
    return f"{os.path.relpath(frame.filename, root)}:{frame.lineno} `{frame.line}`{extra}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-offload-tokens", type=int, default=528, help="-1: no cap")
    cap = ap.parse_args().max_offload_tokens
    cap = None if cap < 0 else cap
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 16384,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir)
    handoffs = record_handoffs(sched)
    sched.add_request(make_request("A", PROMPT, MAX_TOKENS, cap))
    what = f"request A ({len(PROMPT)} prompt tokens, max_offload_tokens {cap})"
    past_cap, stores = [], 0
    for n in range(1, STEPS + 1):
        try:
            so = sched.schedule()
        except AssertionError as e:
            print(f"FAIL: vllm {vllm.__version__}: step {n}: schedule() raised AssertionError at {where(e)};"
                  f" {what}: the connector asserts its partial-tail boundary is within the cap instead of"
                  " skipping the store")
            return 1
        meta = so.kv_connector_metadata
        for group, block, boundary in handoffs.get("A", ()):
            if cap is not None and boundary > cap:
                past_cap.append((n, group, block, boundary))
                for jid, job in meta.store_jobs.items():
                    if block in [int(b) for b in job.src_spec.block_ids]:
                        print(f"FAIL: vllm {vllm.__version__}: step {n}: store job {jid} reads group {group} block"
                              f" {block}, the boundary state at {boundary} tokens, past {what}")
                        return 1
        stores += sum(job.req_id == "A" for job in meta.store_jobs.values())
        finish(sched, so)
        if not sched.requests:
            break
    if not past_cap:
        print(f"vllm {vllm.__version__}: cannot check: no boundary-state hand-off past the cap of {what}")
        return 2
    n, group, block, boundary = max(past_cap, key=lambda h: h[3])  # the partial tail's, the prompt's end
    print(f"vllm {vllm.__version__}: ok: the boundary state at {boundary} tokens (group {group} block {block},"
          f" step {n}), past {what}, is not stored; A's other store jobs: {stores}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
