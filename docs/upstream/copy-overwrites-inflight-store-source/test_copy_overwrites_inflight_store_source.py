# SPDX-License-Identifier: Apache-2.0
"""A block that a partial prefix-cache hit's copy-on-write writes (a
SchedulerOutput.kv_cache_block_copies destination) must not be the source of an
OffloadingConnector store that is still in flight, unless the step's connector
metadata flushes that store first: the copies run before the forward, the store's
copy after it.

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
    ]
    page_size = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[_kv_cache_tensor(NUM_BLOCKS * page_size, ["full", "mamba"])],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], specs[0]),
            KVCacheGroupSpec(["mamba"], specs[1]),
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
    vllm_config = VllmConfig(
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


def test_copy_on_write_destination_flushes_in_flight_store(tmp_path):
    """A (200 tokens) and B (300, A's prefix) arrive together, C (350, its own) a
    step later and takes the free blocks; at B's last prompt chunk the Mamba group's
    producer copy-on-write copies B's state into a fresh block, which is the Mamba
    block of B's store from two steps before (B has released it)."""
    scheduler = create_scheduler(tmp_path)
    doc = list(range(1, 601))
    scheduler.add_request(create_request("A", doc[:200], 1))
    scheduler.add_request(create_request("B", doc[:300], 3))
    store_src = {}  # store job id -> its GPU source blocks
    flushed = set()
    checked = 0
    for step in range(1, 9):
        if step == 2:
            scheduler.add_request(
                create_request("C", list(range(7500, 7850)), 2)
            )
        scheduler_output = scheduler.schedule()
        meta = scheduler_output.kv_connector_metadata
        flushed |= set(meta.jobs_to_flush or ())
        for copy in scheduler_output.kv_cache_block_copies or ():
            for job_id, (built, src) in store_src.items():
                if step - built <= 2 and copy.dst_block_id in src:
                    checked += 1
                    assert job_id in flushed, (step, copy, job_id, src)
        for job_id, job in meta.store_jobs.items():
            store_src[job_id] = (step, [int(b) for b in job.src_spec.block_ids])
        run_step(scheduler, scheduler_output)
    assert checked  # the traffic reaches a copy into an in-flight store's source
