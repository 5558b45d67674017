# SPDX-License-Identifier: Apache-2.0
"""A prompt loaded whole by a KV connector under a sliding window must keep the
window of the token the scheduler recomputes (num_tokens - 1) in real blocks.

Written for vLLM's tests/v1/core/test_prefix_caching.py (in-tree, ``make_request``
and ``make_kv_cache_manager`` come from that file; the two helpers below are their
minimal stand-ins so the file also runs on its own against a release tree)."""

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
    SlidingWindowSpec,
)
from vllm.v1.request import Request

pytestmark = pytest.mark.cpu_test


@pytest.fixture(autouse=True)
def _auto_init_hash_fn():
    init_none_hash(sha256)


def make_request(request_id, prompt_token_ids, block_size, hash_fn):
    sampling_params = SamplingParams(max_tokens=17)
    sampling_params.update_from_generation_config({}, eos_token_id=100)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, hash_fn),
    )


def make_kv_cache_manager(kv_cache_config, **kwargs):
    kwargs.setdefault("scheduler_block_size", 16)
    return KVCacheManager(kv_cache_config, **kwargs)


@pytest.mark.parametrize("num_prompt_tokens", [255, 256, 257])
def test_full_prompt_external_load_keeps_recomputed_token_window(num_prompt_tokens):
    block_size = 16
    sliding_window = 4 * block_size
    spec = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(**spec)),
            KVCacheGroupSpec(
                ["swa"], SlidingWindowSpec(sliding_window=sliding_window, **spec)
            ),
        ],
    )
    manager = make_kv_cache_manager(
        kv_cache_config=kv_cache_config,
        max_model_len=8192,
        enable_caching=True,
        hash_block_size=block_size,
    )
    req = make_request("0", list(range(num_prompt_tokens)), block_size, sha256)

    # The connector loads the whole prompt asynchronously.
    assert (
        manager.allocate_slots(
            req,
            0,
            num_external_computed_tokens=num_prompt_tokens,
            delay_cache_blocks=True,
            skip_zeroing_group_ids=(0, 1),
        )
        is not None
    )
    manager.new_step_starts()

    # Load done: the scheduler recomputes the last prompt token.
    req.num_computed_tokens = num_prompt_tokens - 1
    assert manager.allocate_slots(req, 1) is not None

    query = num_prompt_tokens - 1
    swa_blocks = manager.get_blocks("0").blocks[1]
    window = range((query - sliding_window + 1) // block_size, query // block_size + 1)
    assert not any(swa_blocks[i].is_null for i in window)
    assert len(manager.get_blocks("0").blocks[0]) == -(-num_prompt_tokens // block_size)
