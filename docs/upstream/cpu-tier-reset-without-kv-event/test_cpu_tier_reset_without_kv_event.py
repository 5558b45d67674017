# SPDX-License-Identifier: Apache-2.0
"""A cache reset that empties the CPU offloading tier must say so in the KV events:
every chunk a BlockStored (medium CPU) announced and no BlockRemoved withdrew is
withdrawn, so a KV-event consumer (a KV-aware router) stops listing blocks the tier
no longer holds. The GPU pool's AllBlocksCleared cannot stand for it: it names no
medium, is sent as well by a reset that keeps the tier, and is not sent at all when
the GPU pool refuses its reset while the connector's reset goes ahead.

Two parts, for vLLM's own suite:
- the manager (for tests/v1/kv_offload/cpu/test_manager.py): reset_cache() after
  stores, an eviction, a pending store and a load in flight;
- the engine-core Scheduler with the OffloadingConnector and KV events (for
  tests/v1/kv_connector/unit/offloading_connector/): the published stream of a
  reset_prefix_cache(reset_connector=True) served while a request runs, with the
  legacy payload and with self-describing events over two-block chunks. The helpers
  below stand in for that directory's scheduler and request helpers so the file
  also runs on its own against a release tree (a local config.json, no model is
  built)."""

import json

import pytest
import torch

from vllm import ModelRegistry, SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 16
NUM_BLOCKS = 64
_REQ_CTX = ReqContext(req_id="")


def to_key(int_hash: int) -> OffloadKey:
    return make_offload_key(str(int_hash).encode(), 0)


def to_keys(int_hashes: list[int]) -> list[OffloadKey]:
    return [to_key(i) for i in int_hashes]


@pytest.mark.parametrize("cache_policy", ["lru", "arc"])
def test_reset_cache_removes_every_announced_chunk(cache_policy):
    manager = CPUOffloadingManager(
        num_chunks=4, cache_policy=cache_policy, enable_events=True
    )
    manager.prepare_store(to_keys([1, 2, 3, 4]), _REQ_CTX)
    manager.complete_store(to_keys([1, 2, 3, 4]), _REQ_CTX)
    # chunk 5's store evicts one chunk and stays in flight (never announced)
    output = manager.prepare_store(to_keys([5]), _REQ_CTX)
    assert output is not None and len(output.evicted_keys) == 1
    announced = set(to_keys([1, 2, 3, 4])) - set(output.evicted_keys)
    # a chunk being loaded is dropped by the reset as well
    manager.prepare_load([sorted(announced)[0]], _REQ_CTX)
    list(manager.take_events())

    manager.reset_cache()

    events = list(manager.take_events())
    assert all(event.removed and event.medium == manager.medium for event in events)
    assert {key for event in events for key in event.keys} == announced
    for key in to_keys([1, 2, 3, 4, 5]):
        assert manager.lookup(key, _REQ_CTX) == LookupResult.MISS


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


def create_scheduler(tmp_path, extra_config):
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
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["full"], spec)],
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
            kv_connector_extra_config={
                "cpu_bytes_to_use": 256 * spec.page_size_bytes,
                **extra_config,
            },
        ),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
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


def run_step(scheduler):
    """One step; the worker completes every transfer job the step carries."""
    scheduler_output = scheduler.schedule()
    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        req = scheduler.requests[req_id]
        done = req.num_computed_tokens >= req.num_tokens
        sampled.append([1000 + req.num_output_tokens] if done else [])
    meta = scheduler_output.kv_connector_metadata
    completed = {job_id: 1 for job_id in [*meta.store_jobs, *meta.load_jobs]}
    scheduler.update_from_output(
        scheduler_output,
        ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                kv_connector_worker_meta=OffloadingWorkerMetadata(
                    completed_jobs=completed
                )
            ),
        ),
    )


@pytest.mark.parametrize(
    "extra_config",
    [{}, {"block_size": 2 * BLOCK_SIZE, "self_describing_kv_events": True}],
    ids=["placeholder-events", "self-describing-2-block-chunks"],
)
def test_connector_reset_withdraws_the_cpu_blocks_it_drops(tmp_path, extra_config):
    scheduler = create_scheduler(tmp_path, extra_config)
    published: list = []
    scheduler.kv_event_publisher.publish = lambda batch: published.extend(batch.events)

    prompt = list(range(1, 129))
    scheduler.add_request(create_request("A", prompt, 2))
    while "A" in scheduler.requests:
        run_step(scheduler)
    cpu_stored = {
        block_hash
        for event in published
        if isinstance(event, BlockStored) and event.medium == MEDIUM_CPU
        for block_hash in event.block_hashes
    }
    assert cpu_stored  # A's chunks reached the CPU tier

    # B is running when the reset is served: the GPU pool refuses its part
    scheduler.add_request(create_request("B", list(range(5000, 5096)), 64))
    for _ in range(3):
        run_step(scheduler)
    num_before = len(published)
    assert scheduler.reset_prefix_cache(reset_connector=True) is False
    run_step(scheduler)

    # the tier no longer holds A's prompt ...
    probe = create_request("A-again", prompt, 2)
    scheduler.connector.on_new_request(probe)
    assert scheduler.connector.get_num_new_matched_tokens(probe, 0)[0] == 0
    # ... and the stream withdrew every CPU block announced before the reset
    cpu_removed = {
        block_hash
        for event in published[num_before:]
        if isinstance(event, BlockRemoved) and event.medium == MEDIUM_CPU
        for block_hash in event.block_hashes
    }
    assert cpu_stored <= cpu_removed
