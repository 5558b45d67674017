# SPDX-License-Identifier: Apache-2.0
"""After reset_prefix_cache(reset_connector=True), the OffloadingConnector must store
only GPU blocks the request still holds: a sliding-window request's blocks below its
window were freed by remove_skipped_blocks and may belong to another request.

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
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 16
SLIDING_WINDOW = 4 * BLOCK_SIZE
NUM_BLOCKS = 34


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
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "float32",
            }
        )
    )
    spec = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    specs = [
        FullAttentionSpec(**spec),
        SlidingWindowSpec(sliding_window=SLIDING_WINDOW, **spec),
    ]
    page_size = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], specs[0]),
            KVCacheGroupSpec(["swa"], specs[1]),
        ],
    )
    model_config = ModelConfig(
        model=str(tmp_path),
        tokenizer=str(tmp_path),
        skip_tokenizer_init=True,
        max_model_len=4096,
        dtype="float32",
        enforce_eager=True,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=8,
            max_num_batched_tokens=64,
            max_model_len=4096,
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
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
    )


def create_request(request_id, prompt_token_ids, max_tokens):
    sampling_params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sampling_params.update_from_generation_config({}, eos_token_id=0)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
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


@pytest.mark.parametrize("reset_after_steps", [2, 24])
def test_reset_cache_stores_only_blocks_the_request_holds(tmp_path, reset_after_steps):
    """Step 2: during the prefill, nothing freed yet; step 24: request A's window
    has moved past its prompt's last window and B holds some of A's freed blocks."""
    scheduler = create_scheduler(tmp_path)
    connector_scheduler = scheduler.connector.connector_scheduler
    kv_cache_manager = scheduler.kv_cache_manager
    scheduler.add_request(create_request("A", list(range(1, 161)), 64))
    for step in range(1, reset_after_steps + 1):
        if step == 20:
            scheduler.add_request(create_request("B", list(range(5000, 5096)), 64))
        run_step(scheduler)

    scheduler.reset_prefix_cache(reset_connector=True)
    scheduler_output = scheduler.schedule()
    block_ids = kv_cache_manager.get_blocks("A").get_block_ids()
    store_jobs = [
        job
        for job in scheduler_output.kv_connector_metadata.store_jobs.values()
        if job.req_id == "A"
    ]
    run_step(scheduler, scheduler_output)

    assert store_jobs  # A re-offloads after the reset
    for job in store_jobs:
        src = [int(b) for b in job.src_spec.block_ids]
        start = 0
        for group_config, num_blocks in zip(
            connector_scheduler.config.kv_group_configs, job.src_spec.group_sizes
        ):
            group_blocks = src[start : start + num_blocks]
            start += num_blocks
            assert set(group_blocks) <= set(block_ids[group_config.group_idx])
