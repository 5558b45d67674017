"""Standalone reproducer: with a KV connector, vLLM 0.26.0 hands every KV-cache group
the longest group's prefix-cache hit, and a group whose own hit is a block shorter
records a copy-on-write tail it does not hold; the next allocation asserts in
_apply_cow (AssertionError inside Scheduler.schedule()).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py

The engine core's Scheduler with the OffloadingConnector (CPU tier), full attention +
Mamba ("align") + an EAGLE drafter's full-attention group (is_eagle_group, 2
speculative tokens), 64-token blocks, prefix-match unit 16 (--prefix-match-unit 16), 16
GPU blocks. Request A (213 tokens, 4 output tokens) runs and finishes. Request B (A's
prompt, A's first output token and 48 tokens of its own) then hits 208 tokens in the
Mamba group (its state at A's prompt end) and 192 in both attention groups (their one
lookup drops the EAGLE block); the scheduler's connector path
(v1/core/sched/scheduler.py:742) takes the longest, 208, for every group, and each
attention group records a copy-on-write tail at block index 3 of its 3 blocks.

Exit 1 with one line when schedule() raises the AssertionError of _apply_cow (0.26.0),
0 when B is scheduled past its hit and finishes, 2 when B did not get the diverged hit
(the traffic did not reach the case).
"""

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
    SpeculativeConfig, VllmConfig)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, MambaSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, UNIT, NUM_BLOCKS = 64, 16, 16
PROMPT_A = [1 + i for i in range(213)]  # 3 full blocks and 21 tokens: Mamba's state is cached at 192
A_OUT = 4
STEPS = 120


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
             MambaSpec(block_size=BLOCK, shapes=((64,),), dtypes=(torch.float32,), mamba_cache_mode="align"),
             FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)]
    page = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full", "mamba", "draft"], NUM_BLOCKS * max(
            s.page_size_bytes for s in specs), page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], specs[0]), KVCacheGroupSpec(["mamba"], specs[1]),
                         KVCacheGroupSpec(["draft"], specs[2], is_eagle_group=True)])  # the EAGLE drafter's layer
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=8192, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, mamba_cache_mode="align",
                               prefix_match_unit=UNIT)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    speculative_config = SpeculativeConfig(  # EAGLE, 2 tokens; the drafter is never built either
        method="eagle", model=model_dir, num_speculative_tokens=2, target_model_config=model_config,
        target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(
        speculative_config=speculative_config, model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=8192,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    kw = {}
    from vllm.v1.core import kv_cache_utils
    if hasattr(kv_cache_utils, "resolve_kv_cache_block_sizes"):
        bs, hbs = kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        kw["hash_block_size"] = hbs
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK, **kw)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
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


def main():
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 8192,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    # the target and the EAGLE drafter SpeculativeConfig derives from it ("Eagle" + the target's class)
    ModelRegistry.register_model("LlamaForCausalLM", ReproNeverBuiltModel)
    ModelRegistry.register_model("EagleLlamaForCausalLM", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir)
    sched.add_request(make_request("A", PROMPT_A, A_OUT))
    hits = None  # B's per-group prefix-cache hits, as the scheduler's connector path looks them up
    for n in range(1, STEPS + 1):
        if n > 1 and hits is None and "A" not in sched.requests:
            # A's prompt, its first output token (the fake model's) and 48 tokens of B's own
            b = make_request("B", PROMPT_A + [1000] + [5000 + i for i in range(48)], 1)
            lookup = getattr(sched.kv_cache_manager.coordinator, "find_longest_cache_hit_per_group", None)
            hits = lookup(b.block_hashes, b.num_tokens - 1)[1] if lookup else ()  # () where no such path
            sched.add_request(b)
        try:
            so = sched.schedule()
        except AssertionError:
            tb = traceback.extract_tb(sys.exc_info()[2])[-1]
            print(f"FAIL: vllm {vllm.__version__}: step {n}: schedule() raised AssertionError at"
                  f" {tb.filename.split('vllm/', 1)[-1]}:{tb.lineno} ({tb.name}: {tb.line}): request B's"
                  f" per-group hits {tuple(hits)}, the longest taken for every group, and a shorter group"
                  " recorded a copy-on-write tail past its blocks")
            return 1
        finish(sched, so)
        if hits is not None and "B" not in sched.requests:
            break
    if hits is None or (hits and (max(hits) % BLOCK == 0 or min(hits) == max(hits))):
        print(f"vllm {vllm.__version__}: cannot check: B's per-group hits {hits} do not diverge at a sub-block tail")
        return 2
    if "B" in sched.requests:
        print(f"vllm {vllm.__version__}: cannot check: B did not finish in {STEPS} steps")
        return 2
    where = f"per-group hits {tuple(hits)}" if hits else "no per-group lookup in this release"
    print(f"vllm {vllm.__version__}: ok: B ({where}) scheduled and finished")
    return 0

if __name__ == "__main__":
    sys.exit(main())
