# SPDX-License-Identifier: Apache-2.0
"""A request's kv_transfer_params max_offload_tokens caps what the
OffloadingConnector stores for it: a Mamba "align" boundary-state hand-off
(SchedulerOutput.kv_connector_block_state.boundary_state_offloads) past the cap,
the partial tail's included, is skipped, never asserted on, and one within the
cap is still stored.

Written for vLLM's tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py
(the engine-core Scheduler with the OffloadingConnector on CPU); the helpers below stand
in for that directory's scheduler and request helpers so the file also runs on its own
against a release tree (a local config.json, no model is built)."""

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

# A Mamba block must hold the recurrent state: 528 tokens, hashed every 16
# (--prefix-match-unit 16), so a prompt may end inside a block (a partial tail).
BLOCK_SIZE = 528
PREFIX_MATCH_UNIT = 16
NUM_BLOCKS = 24
NUM_PROMPT_TOKENS = 848
# the prompt's reusable Mamba checkpoint: the last hash boundary short of its end
# (get_mamba_prefill_checkpoint_position), inside block 1
PARTIAL_TAIL_BOUNDARY = 832


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


def create_scheduler(tmp_path):
    ModelRegistry.register_model("NeverBuiltForCausalLM", _NeverBuiltModel)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["NeverBuiltForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "num_hidden_layers": 2,
                "vocab_size": 32000,
                "max_position_embeddings": 16384,
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
    ]
    page_size = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        # one tensor shared by both groups' layers: the CPU tier sizes its chunks from it
        kv_cache_tensors=[
            KVCacheTensor(
                size=NUM_BLOCKS * page_size,
                layers=["full", "mamba"],
                layer_stride=NUM_BLOCKS * max(s.page_size_bytes for s in specs),
                block_stride=page_size,
            )
        ],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], specs[0]),
            KVCacheGroupSpec(["mamba"], specs[1]),
        ],
    )
    model_config = ModelConfig(
        model=str(tmp_path),
        tokenizer=str(tmp_path),
        skip_tokenizer_init=True,
        max_model_len=16384,
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
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            max_model_len=16384,
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
    # as the engine core does (v1/engine/core.py): the hash block is the
    # prefix-match unit, set on the scheduler's KVCacheConfig with the alignment
    block_size, hash_block_size = kv_cache_utils.resolve_kv_cache_block_sizes(
        kv_cache_config, vllm_config
    )
    kv_cache_config.hash_block_size = hash_block_size
    kv_cache_config.cache_hit_alignment_tokens = (
        kv_cache_utils.resolve_cache_hit_alignment_tokens(
            kv_cache_config, vllm_config, block_size, hash_block_size
        )
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        hash_block_size=hash_block_size,
    )


def create_request(request_id, prompt_token_ids, max_tokens, kv_transfer_params=None):
    sampling_params = SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=True,
        extra_args=(
            {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
        ),
    )
    sampling_params.update_from_generation_config({}, eos_token_id=0)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(PREFIX_MATCH_UNIT, sha256),
    )


def run_step(scheduler, scheduler_output):
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


def record_boundary_state_offloads(scheduler):
    """Each step's hand-offs, as the connector receives them (the scheduler
    clears kv_connector_block_state before schedule() returns)."""
    seen = []
    build_connector_meta = scheduler.connector.build_connector_meta

    def record(scheduler_output):
        block_state = scheduler_output.kv_connector_block_state
        seen.append(dict(block_state.boundary_state_offloads) if block_state else {})
        return build_connector_meta(scheduler_output)

    scheduler.connector.build_connector_meta = record
    return seen


@pytest.mark.parametrize(
    "max_offload_tokens",
    [None, 0, BLOCK_SIZE, PARTIAL_TAIL_BOUNDARY - 1, PARTIAL_TAIL_BOUNDARY, NUM_PROMPT_TOKENS],
)
def test_max_offload_tokens_caps_boundary_state_stores(tmp_path, max_offload_tokens):
    """One request of 848 prompt tokens: its boundary states are handed off at
    528 (a block end) and at 832 (the partial tail, when its next step
    copies-on-write the Mamba block). Each is stored iff it is within the cap."""
    scheduler = create_scheduler(tmp_path)
    handoffs = record_boundary_state_offloads(scheduler)
    params = None if max_offload_tokens is None else {"max_offload_tokens": max_offload_tokens}
    scheduler.add_request(
        create_request("A", list(range(1, NUM_PROMPT_TOKENS + 1)), 3, params)
    )
    cap = NUM_PROMPT_TOKENS if max_offload_tokens is None else max_offload_tokens
    boundaries = set()
    for _ in range(20):
        scheduler_output = scheduler.schedule()
        store_sources = {
            int(block_id)
            for job in scheduler_output.kv_connector_metadata.store_jobs.values()
            for block_id in job.src_spec.block_ids
        }
        for _, block_id, boundary in handoffs[-1].get("A", ()):
            boundaries.add(boundary)
            assert (block_id in store_sources) == (boundary <= cap), (
                boundary,
                cap,
                block_id,
                store_sources,
            )
        run_step(scheduler, scheduler_output)
        if not scheduler.requests:
            break
    assert not scheduler.requests
    # the traffic reaches both hand-offs, the partial tail's included
    assert boundaries == {BLOCK_SIZE, PARTIAL_TAIL_BOUNDARY}
