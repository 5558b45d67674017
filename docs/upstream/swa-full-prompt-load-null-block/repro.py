"""Standalone reproducer: a whole prompt loaded by a KV connector (a P/D consumer) under a
sliding window recomputes its last token over the null block (vLLM 0.33.0).

Needs only vLLM (its KVCacheManager, built as tests/v1/core/test_prefix_caching.py builds
it) and runs on CPU:

    PYTHONPATH=<vllm tree> python repro.py

Full attention + a 64-token sliding window, 16-token blocks, no speculative decoding. One
request of 255 tokens whose whole prompt an asynchronous connector loads, called as
Scheduler.schedule() calls the manager for it (allocate_slots with
num_external_computed_tokens=255, delay_cache_blocks=True); when the load has finished the
scheduler steps back one token to recompute the last (num_computed_tokens = 254,
sched/scheduler.py:3515-3516) and allocates its slot. Token 254 attends positions 191..254
(window_size = sliding_window - 1); the check: every block of the window that holds them is
a real block.

Exit 1 with one line when the window reads the null block (0.33.0), 0 otherwise.
"""

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec)
from vllm.v1.request import Request  # noqa: E402

BLOCK, WINDOW, PROMPT = 16, 64, 255  # (PROMPT - WINDOW + 1) % BLOCK == 0


def main():
    init_none_hash(sha256)
    attention = dict(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full"], FullAttentionSpec(**attention)),
        KVCacheGroupSpec(["swa"], SlidingWindowSpec(sliding_window=WINDOW, **attention))])
    manager = KVCacheManager(config, max_model_len=8192, scheduler_block_size=BLOCK,
                             hash_block_size=BLOCK, enable_caching=True)
    params = SamplingParams(max_tokens=4)
    params.update_from_generation_config({}, eos_token_id=0)
    request = Request(request_id="0", prompt_token_ids=[1 + i for i in range(PROMPT)], sampling_params=params,
                      pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    # step 1: the connector has the whole prompt, loaded asynchronously
    assert manager.allocate_slots(request, 0, num_external_computed_tokens=PROMPT,
                                  delay_cache_blocks=True) is not None
    manager.new_step_starts()
    # the load finished: the scheduler recomputes the last token
    request.num_computed_tokens = PROMPT - 1
    assert manager.allocate_slots(request, 1) is not None
    table = manager.get_blocks("0").blocks[1]
    query = PROMPT - 1
    first = query - WINDOW + 1
    null = [i for i in range(first // BLOCK, query // BLOCK + 1) if table[i].is_null]
    ids = [0 if b.is_null else b.block_id for b in table]
    if null:
        print(f"FAIL: vllm {vllm.__version__}: the recomputed token {query} attends positions [{first}, {query}]"
              f" but its sliding-window table {ids} holds the null block at index {null[0]}"
              f" (positions [{null[0] * BLOCK}, {null[0] * BLOCK + BLOCK}))")
        return 1
    print(f"vllm {vllm.__version__}: sliding-window table {ids}; ok: token {query}'s window [{first}, {query}]"
          " is in real blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
