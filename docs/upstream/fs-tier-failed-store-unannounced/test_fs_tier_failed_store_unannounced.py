# Regression test in the style of vLLM's tests/v1/kv_offload/tiering/test_fs_tier.py:
# a store job of the file-system tier that fails part-way must announce, as KV
# events, the blocks it wrote before the failure (the tier's lookup serves them),
# and only those.
import mmap
import os
import types

import numpy as np
import pytest
import torch

from vllm.v1.kv_offload.base import (
    OffloadingKVEventsConfig,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

_NUM_BLOCKS = 4
_CTX = ReqContext(req_id="test")


def _spec():
    parallel = OffloadingParallelConfig(
        rank=0,
        world_size=1,
        tp_size=1,
        pp_size=1,
        pcp_size=1,
        dcp_size=1,
        data_parallel_index=0,
        data_parallel_size=1,
        data_parallel_rank_local=None,
        is_parallelism_agnostic=False,
    )
    config = OffloadingConfig(
        groups=(),
        worker_kv_bytes_per_block=0,
        enable_kv_cache_events=True,
        extra_config={},
        engine_id="test-engine",
        model=OffloadingModelConfig(name="test-model", dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=parallel,
    )
    return types.SimpleNamespace(
        config=config,
        blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(
            enable_kv_cache_events=True, self_describing_kv_events=False
        ),
    )


def key(n: int):
    return make_offload_key(bytes([n]) * 8, 0)


@pytest.fixture
def fs_tier_with_events(tmp_path):
    raw = torch.zeros((_NUM_BLOCKS + 1) * mmap.PAGESIZE, dtype=torch.uint8)
    shift = (-raw.data_ptr()) % mmap.PAGESIZE
    blocks = raw[shift : shift + _NUM_BLOCKS * mmap.PAGESIZE]
    tier = FileSystemTierManager(
        offloading_spec=_spec(),
        primary_kv_view=memoryview(blocks.view(_NUM_BLOCKS, -1).numpy()),
        tier_type="fs",
        root_dir=str(tmp_path),
        n_read_threads=1,
        n_write_threads=1,
        enable_kv_events=True,
    )
    yield tier
    tier.shutdown()


def _block_directory_of(tier, k):
    """Make k's block unwritable: a regular file where its directory belongs."""
    directory = os.path.dirname(tier.file_mapper.get_file_name(k))
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    open(directory, "w").close()


def _store(tier, keys):
    tier.submit_store(
        TransferJob(
            job_id=1,
            keys=keys,
            chunk_ids=np.arange(len(keys)),
            is_promotion=False,
            req_context=_CTX,
        )
    )
    tier.drain_jobs()
    return list(tier.get_finished_jobs())


def _announced(tier):
    return [k for ev in tier.take_events() if not ev.removed for k in ev.keys]


def test_partially_failed_store_announces_the_blocks_it_wrote(fs_tier_with_events):
    tier = fs_tier_with_events
    keys = [key(0x10), key(0x20), key(0x30)]
    _block_directory_of(tier, keys[1])

    results = _store(tier, keys)

    assert [r.success for r in results] == [False]
    on_disk = [k for k in keys if os.path.isfile(tier.file_mapper.get_file_name(k))]
    assert on_disk == keys[:1]
    # the tier serves the block that landed ...
    hits = tier._lookup_manager.batch_lookup(keys, _CTX)
    assert [k for k, hit in zip(keys, hits) if hit] == on_disk
    # ... so a KV-event consumer must learn of it, and of nothing else
    assert _announced(tier) == on_disk


def test_store_failing_at_its_first_block_announces_nothing(fs_tier_with_events):
    tier = fs_tier_with_events
    keys = [key(0x40), key(0x50)]
    _block_directory_of(tier, keys[0])

    results = _store(tier, keys)

    assert [r.success for r in results] == [False]
    assert not any(os.path.isfile(tier.file_mapper.get_file_name(k)) for k in keys)
    assert _announced(tier) == []


def test_successful_store_announces_every_block(fs_tier_with_events):
    tier = fs_tier_with_events
    keys = [key(0x60), key(0x70)]

    results = _store(tier, keys)

    assert [r.success for r in results] == [True]
    assert _announced(tier) == keys
