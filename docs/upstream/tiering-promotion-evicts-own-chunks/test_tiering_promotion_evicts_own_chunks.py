# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression test for vLLM's tests/v1/kv_offload/tiering/test_tiering_offloading.py:
a chunk that TieringOffloadingManager promotes from a secondary tier for a request's
lookup is wanted now, so the primary tier's cache policy must not rank it below chunks
committed before the promotion. With the LRU policy's provisional request rank (fixed at
the request's first access) it did: once the rest of the primary tier was newer than the
waiting request, each of its promotions evicted one of its own ready chunks (the one
furthest into its prompt), its lookup answered HIT_PENDING on every step, and the
request was deferred forever.

The tiers are the ones that file's tests use: a CPUPrimaryTierOffloadingManager over a
mock mmap region and the in-memory ExampleSecondaryTierManager, which completes every
transfer at once (reported at the next poll). ``scan`` is the connector's prefix lookup
(``_maximal_prefix_lookup``: stop at the first MISS, go on past HIT_PENDING and RETRY),
``end_step`` its ``on_schedule_end``.
"""

from unittest.mock import MagicMock

import pytest
import torch

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

TOKENS_PER_CHUNK = 16


def _mock_mmap_region(num_chunks: int, row_bytes: int = 16):
    mock = MagicMock()
    view = memoryview(torch.zeros((num_chunks, row_bytes), dtype=torch.int8).numpy())
    mock.create_kv_memoryview.return_value = view
    return mock


def make_manager(num_chunks: int, cache_policy: str) -> TieringOffloadingManager:
    region = _mock_mmap_region(num_chunks)
    primary_tier = CPUPrimaryTierOffloadingManager(
        num_chunks=num_chunks, mmap_region=region, cache_policy=cache_policy
    )
    secondary_tier = ExampleSecondaryTierManager(
        offloading_spec=MagicMock(),
        primary_kv_view=region.create_kv_memoryview(),
        tier_type="example",
    )
    return TieringOffloadingManager(
        primary_tier=primary_tier, secondary_tiers=[secondary_tier]
    )


def to_keys(prefix: str, n: int) -> list[OffloadKey]:
    return [make_offload_key(f"{prefix}{i}".encode(), 0) for i in range(n)]


def start_request(
    manager: TieringOffloadingManager, req_id: str, keys: list[OffloadKey]
) -> ReqContext:
    """A request whose prompt is ``keys``, one chunk each, in prefix order."""
    req_context = ReqContext(req_id=req_id)
    for i, key in enumerate(keys):
        req_context.set_offload_key_position(key, (i + 1) * TOKENS_PER_CHUNK)
    manager.on_new_request(req_context)
    return req_context


def end_step(manager: TieringOffloadingManager) -> None:
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def run_request(
    manager: TieringOffloadingManager, req_id: str, keys: list[OffloadKey]
) -> None:
    """A request that computes ``keys``, stores them (cascaded to the secondary
    tier) and finishes, committing their recency."""
    req_context = start_request(manager, req_id, keys)
    assert manager.prepare_store(keys, req_context) is not None
    manager.complete_store(keys, req_context)
    end_step(manager)
    manager.on_request_finished(req_context)
    end_step(manager)


def scan(
    manager: TieringOffloadingManager, req_context: ReqContext, keys: list[OffloadKey]
) -> list[LookupResult]:
    results = []
    for key in keys:
        results.append(manager.lookup(key, req_context))
        if results[-1] is LookupResult.MISS:
            break
    return results


@pytest.mark.parametrize("cache_policy", ["lru", "arc"])
def test_waiting_request_completes_its_hit_while_the_tier_turns_over(cache_policy):
    manager = make_manager(num_chunks=8, cache_policy=cache_policy)
    prompt = to_keys("d", 6)
    run_request(manager, "A", prompt)  # 6 of 8 chunks, also in the secondary tier
    run_request(manager, "F", to_keys("f", 3))  # evicts A's last chunk

    # B asks for A's prompt: its first promotion fixes B's first access. One
    # step later N stores 3 chunks and finishes: they are newer than B's access.
    b = start_request(manager, "B", prompt)
    answers = []
    for step in range(8):
        answers.append([r.name for r in scan(manager, b, prompt)])
        if step == 1:
            run_request(manager, "N", to_keys("n", 3))
        end_step(manager)
        if answers[-1] == ["HIT"] * len(prompt):
            break
    # B's 6 chunks and N's 3 cannot all stay in 8 chunks: a promotion for B must
    # evict one of N's chunks, not one of B's own ready chunks every time.
    assert answers[-1] == ["HIT"] * len(prompt), (
        f"B's hit never became ready; its lookups in the last steps: {answers[-3:]}"
    )
    manager.shutdown()


@pytest.mark.parametrize("cache_policy", ["lru", "arc"])
def test_promoted_chunk_outranks_chunks_committed_before_its_promotion(cache_policy):
    manager = make_manager(num_chunks=2, cache_policy=cache_policy)
    x = to_keys("x", 2)
    run_request(manager, "A", x)  # x0, x1: in both tiers
    run_request(manager, "N1", to_keys("n1-", 2))  # x0, x1: secondary tier only

    b = start_request(manager, "B", x)
    assert scan(manager, b, x[:1]) == [LookupResult.HIT_PENDING]  # B's first access
    end_step(manager)
    run_request(manager, "N2", to_keys("n2-", 1))  # committed after B's first access
    run_request(manager, "N3", to_keys("n3-", 1))  # evicts x0 again

    # B's lookup promotes x0 once more (evicting n2-0, the older of the two); it lands.
    assert scan(manager, b, x[:1]) == [LookupResult.HIT_PENDING]
    end_step(manager)
    assert scan(manager, b, x[:1]) == [LookupResult.HIT]
    end_step(manager)

    # The next chunk stored must evict n3-0, committed before x0's promotion,
    # not x0, which B's lookup has just brought in for its load.
    n4 = start_request(manager, "N4", to_keys("n4-", 1))
    stored = manager.prepare_store(to_keys("n4-", 1), n4)
    assert stored is not None
    assert stored.evicted_keys == to_keys("n3-", 1), (
        "a store evicted x0, the chunk B's lookup had just promoted, before n3-0"
    )
    manager.shutdown()
