# SPDX-License-Identifier: Apache-2.0
"""A partial prefix-cache hit must not copy a block that another request caches,
but has not computed yet, in the same step.

Written for vLLM's tests/v1/core/test_partial_prefix_cache_hits.py (in-tree,
``make_request`` and ``make_kv_cache_manager`` come from
tests/v1/core/test_prefix_caching.py; the two helpers below are their minimal
stand-ins so the file also runs on its own against a release tree)."""

import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request

pytestmark = pytest.mark.cpu_test


@pytest.fixture(autouse=True)
def _auto_init_hash_fn():
    init_none_hash(sha256)


def make_request(request_id, prompt_token_ids, block_size, hash_fn, prompt_logprobs=None):
    sampling_params = SamplingParams(max_tokens=17, prompt_logprobs=prompt_logprobs)
    sampling_params.update_from_generation_config({}, eos_token_id=100)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, hash_fn),
    )


def make_kv_cache_manager(kv_cache_config, **kwargs):
    kwargs.setdefault("scheduler_block_size", 64)
    return KVCacheManager(kv_cache_config, **kwargs)


def test_partial_hit_does_not_copy_a_block_cached_in_the_same_step():
    hash_block_size = 16
    block_size = 4 * hash_block_size
    kv_cache_config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["full"],
                FullAttentionSpec(
                    block_size=block_size,
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                ),
            ),
            KVCacheGroupSpec(
                ["mamba"],
                MambaSpec(
                    block_size=block_size,
                    shapes=(1, 1),
                    dtypes=(torch.float32,),
                    mamba_cache_mode="align",
                ),
            ),
        ],
    )
    manager = make_kv_cache_manager(
        kv_cache_config=kv_cache_config,
        max_model_len=8192,
        enable_caching=True,
        hash_block_size=hash_block_size,
    )
    doc = [1 + i for i in range(400)]

    # req0 caches its prompt checkpoint at 144 tokens, chunked as
    # Scheduler._mamba_block_aligned_split chunks it: 128 | 16 | 6.
    req0 = make_request("0", doc[:150], hash_block_size, sha256)
    computed_blocks, num_computed, _ = manager.get_computed_blocks(req0)
    assert num_computed == 0
    for num_new_tokens in (128, 16, 6):
        if req0.num_computed_tokens == 0:
            assert manager.allocate_slots(req0, 128, 0, computed_blocks) is not None
        else:
            assert manager.allocate_slots(req0, num_new_tokens) is not None
        req0.num_computed_tokens += num_new_tokens
        manager.take_new_block_ids()
        manager.take_kv_cache_block_copies()
        manager.new_step_starts()

    # One step: req0 decodes; req1 (prompt logprobs: no prefix-cache read)
    # computes [0, 256) and caches blocks 0-3 at scheduling; req2 shares 200
    # tokens and hits req0's Mamba checkpoint at 144, inside req1's block 2.
    req0.append_output_token_ids([3])
    assert manager.allocate_slots(req0, 1) is not None
    req1 = make_request("1", doc[:300], hash_block_size, sha256, prompt_logprobs=1)
    computed_blocks, num_computed, _ = manager.get_computed_blocks(req1)
    assert num_computed == 0
    assert manager.allocate_slots(req1, 256, num_computed, computed_blocks) is not None
    req1_block_2 = manager.get_blocks("1").get_block_ids()[0][2]

    own = [1000 + i for i in range(41)]
    req2 = make_request("2", doc[:200] + own, hash_block_size, sha256)
    computed_blocks, num_computed, _ = manager.get_computed_blocks(req2)
    assert num_computed == 144
    assert computed_blocks.get_block_ids()[0][2] == req1_block_2
    scheduled = manager.allocate_slots(req2, 97, num_computed, computed_blocks)

    new_block_ids = set(manager.take_new_block_ids())
    copies, _ = manager.take_kv_cache_block_copies()
    assert req1_block_2 in new_block_ids
    # The runner zeroes new blocks, then applies the copies, then runs the
    # forward that writes req1's block 2: a copy from it carries zeros.
    assert all(copy.src_block_id not in new_block_ids for copy in copies)

    if scheduled is None:
        # Deferred: the next step, after req1's forward, takes the hit.
        req0.num_computed_tokens += 1
        req1.num_computed_tokens = 256
        manager.new_step_starts()
        computed_blocks, num_computed, _ = manager.get_computed_blocks(req2)
        assert num_computed == 144
        assert manager.allocate_slots(req2, 97, num_computed, computed_blocks) is not None
        copies, _ = manager.take_kv_cache_block_copies()
        assert req1_block_2 in [c.src_block_id for c in copies]
