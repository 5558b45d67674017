# SPDX-License-Identifier: Apache-2.0
"""Regression test for vLLM's tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py:
the OffloadingConnector's lookup defers (get_num_new_matched_tokens returns None) only
while a pending write or a lookup to retry can still make the hit larger.

The tier's answers are scripted per chunk, as that directory's tests script
``manager.lookup``; ``create_scheduler`` and ``create_request`` stand in for its helpers
so the file runs on its own against a release tree. Three lookups:

* EAGLE pop: the first chunk past the locally computed tokens is pending and the next
  one is a miss. The drafter group pops its last chunk (the volatile trailing chunk) and
  needs the next one as its proof, so no answer of the pending write gives a hit: 0, now.
* cross-group: the full-attention group's first chunk is pending and its second a miss,
  so it can give at most one chunk; the sliding-window group misses that chunk. The
  window group's own RETRY far to the right (a tiering backend's answer) is past any hit
  the first group allows: 0, now.
* a pending chunk that can pay: the same EAGLE geometry with a ready proof chunk after the
  pending one: the wait can give a chunk, so the lookup defers.
"""

import dataclasses
import functools
import itertools
import json
import os
import tempfile

import pytest
import torch

from vllm import ModelRegistry, SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, SpeculativeConfig, VllmConfig)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor,
                                        SlidingWindowSpec)
from vllm.v1.kv_offload.base import LookupResult, make_offload_key
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
NUM_BLOCKS = 64
H, P, R, M = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.RETRY, LookupResult.MISS


class NeverBuiltModel(torch.nn.Module):
    """The architecture ModelConfig inspects; never instantiated."""

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


def _kv_cache_tensor(size, layers, layer_stride, block_stride):
    if "shared_by" in {f.name for f in dataclasses.fields(KVCacheTensor)}:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(size=size, layers=layers, layer_stride=layer_stride, block_stride=block_stride)


@functools.cache
def create_scheduler(groups: str) -> Scheduler:
    """The OffloadingConnector over 16-token blocks and either one full-attention group
    holding an EAGLE drafter's layers too ("eagle", 2 speculative tokens) or full attention
    and a 64-token sliding window ("window")."""
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp()
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("LlamaForCausalLM", NeverBuiltModel)
    ModelRegistry.register_model("EagleLlamaForCausalLM", NeverBuiltModel)
    attention = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    if groups == "eagle":  # the target's and the drafter's layers in one group, tagged as the drafter's
        specs = [FullAttentionSpec(**attention)]
        kv_cache_groups = [KVCacheGroupSpec(["full", "draft"], specs[0], is_eagle_group=True)]
    else:
        specs = [FullAttentionSpec(**attention), SlidingWindowSpec(sliding_window=64, **attention)]
        kv_cache_groups = [KVCacheGroupSpec(["full"], specs[0]), KVCacheGroupSpec(["window"], specs[1])]
    layers = [name for g in kv_cache_groups for name in g.layer_names]
    page = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[_kv_cache_tensor(NUM_BLOCKS * page, layers,
                                           NUM_BLOCKS * max(s.page_size_bytes for s in specs), page)],
        kv_cache_groups=kv_cache_groups)
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=4096, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    speculative_config = None
    if groups == "eagle":
        speculative_config = SpeculativeConfig(method="eagle", model=model_dir, num_speculative_tokens=2,
                                               target_model_config=model_config,
                                               target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(
        speculative_config=speculative_config, model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK_SIZE)


_request_ids = itertools.count()


def create_request(num_tokens: int) -> Request:
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=f"req-{next(_request_ids)}", prompt_token_ids=list(range(1, num_tokens + 1)), sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256))


def lookup(scheduler: Scheduler, request: Request, num_computed_tokens: int, answers: dict) -> int | None:
    """The connector's answer with the tier answering ``answers[group][chunk]`` (MISS elsewhere)."""
    by_key = {make_offload_key(request.block_hashes[chunk], group): answer
              for group, chunks in answers.items() for chunk, answer in chunks.items()}
    manager = scheduler.connector.connector_scheduler.manager
    manager.lookup = lambda key, req_context=None: by_key.get(key, M)
    scheduler.add_request(request)
    hit, _ = scheduler.connector.get_num_new_matched_tokens(request, num_computed_tokens)
    return hit


def test_no_deferral_on_a_chunk_the_eagle_pop_discards():
    # chunks 0-4 computed locally (80 tokens); chunk 5 pending, chunk 6 never stored
    hit = lookup(create_scheduler("eagle"), create_request(136), 80, {0: {5: P}})
    assert hit == 0, f"deferred ({hit}) on chunk 5, which the drafter group's pop discards whatever it becomes"


def test_no_deferral_on_a_chunk_a_sibling_group_rules_out():
    # full attention: chunk 0 pending, chunk 1 a miss, so at most 16 tokens; the window group
    # misses chunk 0, and its RETRY at chunk 10 lies past any hit the first group allows
    full = {0: P, **{c: H for c in (2, 4, 5, 6, 7, 8, 9, 10, 11)}}
    window = {8: H, 9: H, 10: R, 11: H}
    hit = lookup(create_scheduler("window"), create_request(203), 0, {0: full, 1: window})
    assert hit == 0, f"deferred ({hit}) although no answer of the pending keys gives a hit"


@pytest.mark.parametrize("answers, can_give", [
    ({0: {4: P, 5: H}}, "chunk 4, with chunk 5 as the drafter's proof"),
    ({0: {c: P for c in range(6)}}, "chunks 0-4"),
])
def test_a_pending_chunk_that_can_pay_still_defers(answers, can_give):
    first = min(answers[0])
    hit = lookup(create_scheduler("eagle"), create_request(136), first * BLOCK_SIZE, answers)
    assert hit is None, f"answered {hit} although the pending writes can give {can_give}"
