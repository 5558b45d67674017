"""Standalone reproducer: after reset_prefix_cache(reset_connector=True) the
OffloadingConnector re-offloads a sliding-window request from chunk 0 and stores
window blocks the request no longer holds (vLLM 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py

The engine core's Scheduler with the OffloadingConnector (CPU tier), full attention +
a 64-token sliding window, 16-token blocks, 34 GPU blocks. Request A (160 prompt
tokens) prefills, offloads its chunks and decodes until its window has moved past the
prompt's last window: the core frees those blocks (remove_skipped_blocks) and request
B, arriving then, is given some of them. Between two steps the engine core serves
reset_prefix_cache(reset_connector=True), as for an RL weight update. The check, on
the first step after the reset: every GPU block a store job of A reads (its src_spec
in the step's connector metadata, per group) is in A's own table for that group in the
KVCacheManager, read right after that schedule(). A block A no longer holds is free or another request's: the store
copies it under A's key, and a later request with A's prefix loads it.

Exit 1 with one line when a store reads such a block (0.33.0), 0 when every store
job of A after the reset reads blocks A holds, 2 when A made no store job to check.
"""

import dataclasses
import json
import os
import sys
import tempfile

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
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, SlidingWindowSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, WINDOW, NUM_BLOCKS = 16, 64, 34
PROMPT_A, PROMPT_B = 160, 96
B_ARRIVES, RESET_AFTER = 20, 24  # steps: B arrives after A's window left the prompt's


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
    """One tensor shared by both groups' layers (the CPU tier sizes its chunks from it), in the
    release's KVCacheTensor fields (0.33.0: layers and strides; before: shared_by)."""
    if "shared_by" in {f.name for f in dataclasses.fields(KVCacheTensor)}:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(size=size, layers=layers, layer_stride=layer_stride, block_stride=block_stride)


def make_scheduler(model_dir):
    attention = dict(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    specs = [FullAttentionSpec(**attention), SlidingWindowSpec(sliding_window=WINDOW, **attention)]
    page = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full", "swa"], NUM_BLOCKS * max(
            s.page_size_bytes for s in specs), page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], specs[0]), KVCacheGroupSpec(["swa"], specs[1])])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=4096, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def step(sched):
    """One engine step: schedule, then the model's output."""
    finish(sched, sched.schedule())


def finish(sched, so):
    """A fake model's output for a scheduled step: one token per request past its prompt."""
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                   sampled_token_ids=sampled))


def main():
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir)
    cs = sched.connector.connector_scheduler
    manager = sched.kv_cache_manager
    sched.add_request(make_request("A", [1 + i for i in range(PROMPT_A)], 64))
    for n in range(1, RESET_AFTER + 1):
        if n == B_ARRIVES:
            sched.add_request(make_request("B", [5000 + i for i in range(PROMPT_B)], 64))
        step(sched)
    sched.reset_prefix_cache(reset_connector=True)
    # the step after the reset: the store jobs its schedule() builds, against A's tables then
    so = sched.schedule()
    tables = manager.get_blocks("A").get_block_ids()
    stores = {jid: job for jid, job in so.kv_connector_metadata.store_jobs.items() if job.req_id == "A"}
    finish(sched, so)
    if not stores:
        print(f"vllm {vllm.__version__}: cannot check: request A made no store job after the connector reset")
        return 2
    for jid, job in sorted(stores.items()):
        ids = [int(b) for b in job.src_spec.block_ids]
        sizes = list(job.src_spec.group_sizes or [len(ids)])
        at = 0
        for group_config, n in zip(cs.config.kv_group_configs, sizes):
            g = group_config.group_idx
            foreign = [b for b in ids[at:at + n] if b not in tables[g]]
            at += n
            if foreign:
                holders = [f"request {r} (group {h})" for r in sched.requests if r != "A"
                           for h, held in enumerate(manager.get_blocks(r).get_block_ids()) if foreign[0] in held]
                print(f"FAIL: vllm {vllm.__version__}: after the connector reset, store job {jid} of request A reads"
                      f" group {g} blocks {foreign} that A's table no longer holds (block {foreign[0]}:"
                      f" {'held by ' + holders[0] if holders else 'free'}; A's group {g} table {tables[g]})")
                return 1
    print(f"vllm {vllm.__version__}: A's sliding-window table {tables[1]}; ok: the {len(stores)} store job(s) of A"
          " after the connector reset read only blocks A holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
