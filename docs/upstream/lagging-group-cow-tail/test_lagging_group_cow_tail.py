# SPDX-License-Identifier: Apache-2.0
"""With a KV connector and a Mamba group, the scheduler takes one local hit length
for every KV-cache group. A group whose own prefix-cache hit is shorter must not
record a copy-on-write tail at a block it does not hold: scheduling a request whose
per-group hits diverge at a sub-block tail must not fail.

Written for vLLM's tests/v1/core/test_prefix_caching.py's hybrid cases (the
engine-core Scheduler with the OffloadingConnector on CPU, full attention + Mamba
"align" + an EAGLE drafter's full-attention group); the helpers below stand in for
vLLM's test helpers so the file also runs on its own against a release tree (a local
config.json, no model is built)."""

import json

import pytest
import torch

from vllm import ModelRegistry, SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 64
PREFIX_MATCH_UNIT = 16
NUM_BLOCKS = 16


class _NeverBuiltModel(torch.nn.Module):
    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


@pytest.fixture(autouse=True)
def _auto_init_hash_fn():
    init_none_hash(sha256)


def _kv_cache_tensor(size, layers):
    # one tensor shared by both groups' layers: the CPU tier sizes its chunks from it
    return KVCacheTensor(size=size, shared_by=layers)


def create_scheduler(tmp_path):
    # the target and the EAGLE drafter SpeculativeConfig derives from its class
    ModelRegistry.register_model("LlamaForCausalLM", _NeverBuiltModel)
    ModelRegistry.register_model("EagleLlamaForCausalLM", _NeverBuiltModel)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "num_hidden_layers": 2,
                "vocab_size": 32000,
                "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "float32",
            }
        )
    )
    specs = [
        FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32
        ),
        MambaSpec(
            block_size=BLOCK_SIZE,
            shapes=((64,),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
        ),
        FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32
        ),
    ]
    page_size = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[_kv_cache_tensor(NUM_BLOCKS * page_size, ["full", "mamba", "draft"])],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], specs[0]),
            KVCacheGroupSpec(["mamba"], specs[1]),
            KVCacheGroupSpec(["draft"], specs[2], is_eagle_group=True),
        ],
    )
    model_config = ModelConfig(
        model=str(tmp_path),
        tokenizer=str(tmp_path),
        skip_tokenizer_init=True,
        max_model_len=8192,
        dtype="float32",
        enforce_eager=True,
    )
    cache_config = CacheConfig(
        block_size=BLOCK_SIZE,
        enable_prefix_caching=True,
        mamba_cache_mode="align",
        prefix_match_unit=PREFIX_MATCH_UNIT,
    )
    cache_config.num_gpu_blocks = NUM_BLOCKS
    speculative_config = SpeculativeConfig(
        method="eagle",
        model=str(tmp_path),
        num_speculative_tokens=2,
        target_model_config=model_config,
        target_parallel_config=ParallelConfig(),
    )
    vllm_config = VllmConfig(
        speculative_config=speculative_config,
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=512,
            max_model_len=8192,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        parallel_config=ParallelConfig(),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page_size},
        ),
    )
    cache_config.num_gpu_blocks = NUM_BLOCKS
    kwargs = {}
    if hasattr(kv_cache_utils, "resolve_kv_cache_block_sizes"):
        # as the engine core does: the hash block is the prefix-match unit
        _, kwargs["hash_block_size"] = kv_cache_utils.resolve_kv_cache_block_sizes(
            kv_cache_config, vllm_config
        )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        **kwargs,
    )


def create_request(request_id, prompt_token_ids, max_tokens):
    sampling_params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sampling_params.update_from_generation_config({}, eos_token_id=0)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(PREFIX_MATCH_UNIT, sha256),
    )


def run_step(scheduler, scheduler_output=None):
    if scheduler_output is None:
        scheduler_output = scheduler.schedule()
    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        req = scheduler.requests[req_id]
        done = req.num_computed_tokens >= req.num_tokens
        sampled.append([1000 + req.num_output_tokens] if done else [])
    scheduler.update_from_output(
        scheduler_output,
        ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        ),
    )


def test_diverged_per_group_hit_with_sub_block_tail(tmp_path):
    """A (213 tokens) runs and finishes. B (A's prompt, A's first output token, 48
    tokens of its own) then hits 208 tokens in the Mamba group (its state at A's
    prompt end) and 192 in both full-attention groups (the EAGLE group drops its last
    block, the target group follows it): the scheduler must admit B from a hit every
    group holds."""
    scheduler = create_scheduler(tmp_path)
    prompt = list(range(1, 214))
    scheduler.add_request(create_request("A", prompt, 4))
    hits = None
    for step in range(1, 13):
        if hits is None and "A" not in scheduler.requests:
            req = create_request("B", prompt + [1000] + list(range(5000, 5048)), 1)
            _, hits = scheduler.kv_cache_manager.coordinator.find_longest_cache_hit_per_group(
                req.block_hashes, req.num_tokens - 1
            )
            scheduler.add_request(req)
        run_step(scheduler)  # 0.26.0: AssertionError in _apply_cow
        if hits is not None and "B" not in scheduler.requests:
            break
    # the traffic reaches per-group hits that diverge at a sub-block tail
    assert hits is not None and max(hits) % BLOCK_SIZE != 0 and min(hits) < max(hits), hits
    assert "B" not in scheduler.requests  # B was scheduled and finished
