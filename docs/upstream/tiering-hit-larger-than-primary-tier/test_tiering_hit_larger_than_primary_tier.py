# SPDX-License-Identifier: Apache-2.0
"""Regression test for vLLM's tests/v1/kv_offload/tiering/test_tiering_offloading.py:
a request whose offloaded prefix has more chunks than the CPU primary tier holds
gets an answer from its lookup, instead of promoting its missing chunks over its own
resident ones every step for ever.

The TieringOffloadingManager over a CPUPrimaryTierOffloadingManager (a mocked mmap
region, as that file's tests build it) and the in-memory ExampleSecondaryTierManager
(its jobs complete at once). ``lookup_prefix`` scans the keys as the connector's
``_maximal_prefix_lookup`` does: it counts HIT and HIT_PENDING chunks up to the first
MISS, does not stop at a pending or RETRY chunk (so the manager starts every promotion
the scan reaches), and answers None (defer) if any chunk it counted was not HIT. Each
step ends with ``on_schedule_end``, which submits the step's promotions; the example
tier completes them, and the next step's first lookup makes them ready.

Request A stores a prompt of ``num_chunks`` chunks one chunk a step; every chunk
cascades to the secondary tier, and the primary tier, of 4 chunks, keeps the last
ones. Request B, with A's prompt, must get an answer within a few steps, and the chunks
it answers must still be ready in the primary tier (the connector pins them with
``prepare_load`` right after the lookup).
"""

from collections.abc import Iterable
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

PRIMARY_CHUNKS = 4
MAX_STEPS = 20


def _mock_mmap_region(num_chunks: int, row_bytes: int = 16):
    mock = MagicMock()
    view = memoryview(torch.zeros((num_chunks, row_bytes), dtype=torch.int8).numpy())
    mock.create_kv_memoryview.return_value = view
    return mock


def to_keys(int_ids: Iterable[int]) -> list[OffloadKey]:
    return [make_offload_key(str(i).encode(), 0) for i in int_ids]


def create_manager(cache_policy: str) -> TieringOffloadingManager:
    region = _mock_mmap_region(PRIMARY_CHUNKS)
    primary = CPUPrimaryTierOffloadingManager(
        PRIMARY_CHUNKS, mmap_region=region, cache_policy=cache_policy
    )
    secondary = ExampleSecondaryTierManager(
        offloading_spec=MagicMock(),
        primary_kv_view=region.create_kv_memoryview(),
        tier_type="example",
    )
    return TieringOffloadingManager(primary_tier=primary, secondary_tiers=[secondary])


def end_step(manager: TieringOffloadingManager) -> None:
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
    list(manager.take_events())


def lookup_prefix(
    manager: TieringOffloadingManager, keys: list[OffloadKey], ctx: ReqContext
) -> tuple[int | None, list[str]]:
    """The connector's scan (_maximal_prefix_lookup): the count of leading HIT /
    HIT_PENDING chunks, or None if one of them (or a RETRY before the first MISS)
    is not ready; with the answers, for the failure message."""
    hits, defer, answers = 0, False, []
    for i, key in enumerate(keys):
        result = manager.lookup(key, ctx)
        answers.append(f"{i}:{result.name}")
        if result in (LookupResult.HIT, LookupResult.HIT_PENDING):
            hits += 1
            defer |= result is LookupResult.HIT_PENDING
        elif result is LookupResult.RETRY:
            defer = True
        else:
            break
    return (None if defer else hits), answers


def store_prompt(manager: TieringOffloadingManager, keys: list[OffloadKey]) -> None:
    """Request A stores its chunks one a step; each cascades to the secondary tier."""
    ctx = ReqContext(req_id="A")
    manager.on_new_request(ctx)
    for key in keys:
        assert manager.prepare_store([key], ctx) is not None
        manager.complete_store([key], ctx, success=True)
        end_step(manager)
    manager.on_request_finished(ctx)
    end_step(manager)


@pytest.mark.parametrize("cache_policy", ["lru", "arc"])
@pytest.mark.parametrize("num_chunks", [5, 8, 12])
def test_lookup_larger_than_primary_tier_settles(cache_policy, num_chunks):
    manager = create_manager(cache_policy)
    keys = to_keys(range(num_chunks))
    store_prompt(manager, keys)
    secondary = manager.secondary_tiers[0]
    assert all(secondary.lookup(k, ReqContext(req_id="probe")) is LookupResult.HIT
               for k in keys)

    ctx = ReqContext(req_id="B")
    manager.on_new_request(ctx)
    scans = []
    hits = None
    for _ in range(MAX_STEPS):
        hits, answers = lookup_prefix(manager, keys, ctx)
        scans.append(" ".join(answers))
        if hits is not None:
            break
        end_step(manager)
    assert hits is not None, (
        f"{num_chunks} chunks in the secondary tier, {PRIMARY_CHUNKS} in the primary: "
        f"the lookup deferred {MAX_STEPS} steps in a row; last scans:\n"
        + "\n".join(scans[-2:])
    )
    assert 0 < hits <= PRIMARY_CHUNKS
    # the connector pins the hit right away; every chunk it answered is still ready
    manager.prepare_load(keys[:hits], ctx)
    manager.complete_load(keys[:hits], ctx)


@pytest.mark.parametrize("cache_policy", ["lru", "arc"])
def test_lookup_within_primary_tier_promotes_all(cache_policy):
    """A prefix that fits the primary tier is still promoted whole."""
    manager = create_manager(cache_policy)
    keys = to_keys(range(PRIMARY_CHUNKS))
    store_prompt(manager, keys + to_keys(range(100, 100 + PRIMARY_CHUNKS)))
    ctx = ReqContext(req_id="B")
    manager.on_new_request(ctx)
    hits = None
    for _ in range(MAX_STEPS):
        hits, _ = lookup_prefix(manager, keys, ctx)
        if hits is not None:
            break
        end_step(manager)
    assert hits == PRIMARY_CHUNKS
