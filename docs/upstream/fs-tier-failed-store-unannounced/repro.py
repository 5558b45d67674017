"""Standalone reproducer: a store job of the file-system tier that fails part-way
leaves the blocks it wrote before the failure on disk, where the tier's lookup
hits them, and the tier announces none of them as KV events (vLLM 0.33.0).

Needs only vLLM and runs on CPU:

    PYTHONPATH=<vllm tree> python repro.py

The tiering spec's file-system secondary tier (FileSystemTierManager) with its
KV events on (enable_kv_events=True and KV cache events on globally), one I/O
thread each way, over a primary view of three page-aligned blocks. One store
job of three keys. Its second block cannot be written: a regular file stands
where that block's directory belongs, so vLLM's own store of it
(fs/io.py _store_block -> _ensure_dirs) raises, as a full disk or an I/O error
in the middle of a batch would; batch_store_block raises on the first error, so
the first block has already landed and the third is never written. The pool
reports the job failed.

Exit 1 with one line when a block of the failed job is on disk and the tier's
lookup hits it (FsAsyncLookupManager.batch_lookup) but the tier's events
announce none of the job's keys; 0 when every block the tier serves is
announced; 2 when the failure did not happen as set up (nothing to check).
"""

import mmap
import os
import sys
import tempfile
import types

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    OffloadingKVEventsConfig, ReqContext, make_offload_key)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig, OffloadingConfig, OffloadingModelConfig, OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager  # noqa: E402

NUM_BLOCKS = 3
BLOCK_BYTES = mmap.PAGESIZE


def offloading_spec():
    """What the file tier reads of the spec: its config (for the file mapper),
    blocks_per_chunk and the KV events switch."""
    parallel = OffloadingParallelConfig(
        rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
        is_parallelism_agnostic=False)
    config = OffloadingConfig(
        groups=(), worker_kv_bytes_per_block=0, enable_kv_cache_events=True, extra_config={},
        engine_id="repro", model=OffloadingModelConfig(name="repro-model", dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1), parallel=parallel)
    return types.SimpleNamespace(
        config=config, blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=True,
                                                  self_describing_kv_events=False))


def primary_view():
    """NUM_BLOCKS page-aligned blocks, as the CPU primary tier's region is."""
    raw = torch.zeros(NUM_BLOCKS * BLOCK_BYTES + mmap.PAGESIZE, dtype=torch.uint8)
    shift = (-raw.data_ptr()) % mmap.PAGESIZE
    blocks = raw[shift:shift + NUM_BLOCKS * BLOCK_BYTES].view(NUM_BLOCKS, BLOCK_BYTES)
    blocks[:] = torch.arange(1, NUM_BLOCKS + 1, dtype=torch.uint8).view(-1, 1)
    return blocks, memoryview(blocks.numpy())


def main():
    root = tempfile.mkdtemp(prefix="fs-tier-repro-")
    blocks, view = primary_view()
    tier = FileSystemTierManager(
        offloading_spec=offloading_spec(), primary_kv_view=view, tier_type="fs", root_dir=root,
        n_read_threads=1, n_write_threads=1, enable_kv_events=True)
    try:
        keys = [make_offload_key(bytes([0xA0 + i]) * 8, 0) for i in range(NUM_BLOCKS)]
        paths = [tier.file_mapper.get_file_name(k) for k in keys]
        # the second block's directory is a regular file: its write fails, after the first landed
        os.makedirs(os.path.dirname(os.path.dirname(paths[1])), exist_ok=True)
        open(os.path.dirname(paths[1]), "w").close()

        tier.submit_store(TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(NUM_BLOCKS),
                                      is_promotion=False, req_context=ReqContext(req_id="r")))
        tier.drain_jobs()
        results = list(tier.get_finished_jobs())
        announced = {k for ev in tier.take_events() if not ev.removed for k in ev.keys}
        on_disk = [i for i, p in enumerate(paths) if os.path.isfile(p)]
        served = [i for i, hit in enumerate(tier._lookup_manager.batch_lookup(keys, ReqContext(req_id="q")))
                  if hit]
    finally:
        tier.shutdown()
    if [r.success for r in results] != [False] or on_disk != [0]:
        print(f"vllm {vllm.__version__}: cannot check: the job reported {[r.success for r in results]},"
              f" blocks on disk {on_disk} (expected a failed job with block 0 on disk)")
        return 2
    unannounced = [i for i in served if keys[i] not in announced]
    if unannounced:
        print(f"FAIL: vllm {vllm.__version__}: a store job that failed at its block 1 of {NUM_BLOCKS} left"
              f" block(s) {on_disk} on disk; the tier's lookup hits block(s) {served}, and its KV events"
              f" announce {len(announced)} key(s): block(s) {unannounced} served but never announced")
        return 1
    print(f"vllm {vllm.__version__}: ok: the failed store job's block(s) {served} on disk, served by the"
          f" tier's lookup, are announced ({len(announced)} key(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
