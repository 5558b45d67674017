"""Standalone reproducer: a partial prefix-cache hit copies a block that another
request caches, but has not computed yet, in the same step (vLLM 0.33.0).

Needs only vLLM (its KVCacheManager, built as tests/v1/core/test_prefix_caching.py
builds it) and runs on CPU:

    PYTHONPATH=<vllm tree> python repro.py

A hybrid model (full attention + Mamba "align", 64-token blocks) with a prefix-match
unit of 16 tokens (--prefix-match-unit 16), no KV connector, no speculative decoding.
Each step calls the manager as Scheduler.schedule() does (running requests first,
then waiting ones: get_computed_blocks, allocate_slots) with the chunk ends
Scheduler._mamba_block_aligned_split picks, then replays what the model runner does
before the forward: zero the step's new blocks, apply the step's block copies all at
once (gpu_model_runner.py: _zero_block_ids, copy_kv_cache_blocks_inplace). It tracks,
per block, how many leading tokens hold computed KV, and checks every copy: the tokens
the reader takes from the copy must hold computed KV in the source.

  step 1-3  S = doc[:150], chunks 128 | 16 | 6: its Mamba state at 144 is cached
  step 4    S decodes; W = doc[:300] (prompt_logprobs: skips the prefix-cache read)
            computes [0, 256) and caches its blocks 0-3 at scheduling; R = doc[:200] +
            41 own tokens hits 144 tokens = blocks 0-1 + 16 tokens of W's block 2,
            which is allocated (and zeroed) in this step: R's copy carries zeros.

Exit 1 with one line when a copy carries uncomputed tokens (0.33.0), 0 otherwise.
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
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec)
from vllm.v1.request import Request  # noqa: E402

BLOCK, UNIT = 64, 16
DOC = [1 + i for i in range(400)]


def make_request(request_id, prompt, prompt_logprobs=None):
    params = SamplingParams(max_tokens=4, prompt_logprobs=prompt_logprobs)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(UNIT, sha256))


class Run:
    def __init__(self):
        init_none_hash(sha256)
        config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["full"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1,
                                                         dtype=torch.float32)),
            KVCacheGroupSpec(["mamba"], MambaSpec(block_size=BLOCK, shapes=(1, 1), dtypes=(torch.float32,),
                                                  mamba_cache_mode="align"))])
        self.manager = KVCacheManager(config, max_model_len=8192, scheduler_block_size=BLOCK,
                                      hash_block_size=UNIT, enable_caching=True)
        self.written = {}  # full-attention block id -> leading tokens holding computed KV
        self.step_no = 0
        self.bad = []

    def table(self, request):
        return self.manager.get_block_ids(request.request_id)[0]

    def step(self, scheduled):
        """scheduled: [(request, new tokens or None = to the end of its prompt)], in order."""
        m = self.manager
        self.step_no += 1
        m.new_step_starts()
        done, hits = [], {}
        for request, n in scheduled:
            if request.request_id in m.coordinator.single_type_managers[0].req_to_blocks:
                blocks = m.allocate_slots(request, n)
            else:  # a waiting request: the local prefix-cache lookup, then its slots
                computed, hit, _ = m.get_computed_blocks(request)
                n = request.num_tokens - hit if n is None else n - hit
                blocks = m.allocate_slots(request, n, hit, computed)
                if blocks is not None:  # the scheduler adopts the hit once the slots are there
                    request.num_computed_tokens = hit
                    hits[request.request_id] = hit
            if blocks is None:  # cannot be scheduled in this step
                continue
            done.append((request, n))
        zero = m.take_new_block_ids()
        copies, retained = m.take_kv_cache_block_copies()
        for b in zero:  # the runner zeroes the step's new blocks, then copies at once
            self.written[b] = 0
        before = dict(self.written)
        for c in copies:
            self.written[c.dst_block_id] = before.get(c.src_block_id, 0)
        for request, _ in done:
            rid = request.request_id
            if rid not in hits or hits[rid] % BLOCK == 0:
                continue
            idx = hits[rid] // BLOCK
            dst = self.table(request)[idx]
            for c in copies:
                need = hits[rid] - idx * BLOCK
                if c.dst_block_id == dst and before.get(c.src_block_id, 0) < need:
                    self.bad.append((self.step_no, rid, c.src_block_id, c.dst_block_id, idx * BLOCK,
                                     idx * BLOCK + need, before.get(c.src_block_id, 0), c.src_block_id in zero))
        m.free_popped_blocks(retained) if hasattr(m, "free_popped_blocks") else None
        for request, n in done:  # the forward computes the scheduled tokens
            start = request.num_computed_tokens
            for i, b in enumerate(self.table(request)):
                lo = i * BLOCK
                if lo < start + n and b != 0:
                    self.written[b] = max(self.written.get(b, 0), min(BLOCK, start + n - lo))
            request.num_computed_tokens += n
        return hits


def main():
    run = Run()
    s = make_request("S", DOC[:150])
    run.step([(s, 128)])
    run.step([(s, 16)])
    run.step([(s, 6)])
    s.append_output_token_ids([7])
    w = make_request("W", DOC[:300], prompt_logprobs=1)
    r = make_request("R", DOC[:200] + [1000 + i for i in range(41)])
    hits = run.step([(s, 1), (w, 256), (r, None)])
    line = f"vllm {vllm.__version__}: step 4: W table {run.table(w)}, "
    if "R" not in hits:  # deferred: the next step, after W's forward wrote its blocks
        s.append_output_token_ids([7])
        hits = run.step([(s, 1), (w, 44), (r, None)])
        line += "R deferred; step 5: "
    line += f"R hit {hits.get('R')}, table {run.table(r)}"
    if run.bad:
        step, rid, src, dst, lo, hi, held, zeroed = run.bad[0]
        print(f"FAIL: vllm {vllm.__version__}: step {step}: request {rid} copies tokens [{lo}, {hi}) from block {src} to block "
              f"{dst}, but block {src} holds computed KV for only {held} tokens before the forward"
              f"{' (allocated and zeroed in this step)' if zeroed else ''}")
        return 1
    print(line + "; ok: every block copy carries KV computed before the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
