"""Standalone reproducer: vLLM 0.26-0.30's scheduler deadlocks when a request whose async
KV load has finished waits, holding its blocks, behind a request that needs those blocks.

Drives vLLM's real engine-core ``Scheduler`` and ``KVCacheManager`` with a minimal KV
connector of its own (no OffloadingConnector, no kvbound): one that answers a lookup
``(None, False)`` once for request B ("ask again": the scheduler skips B this step, as it
does for any deferred lookup), and a 64-token async hit for request A. The model runner's
output is built here: one sampled token per scheduled request, and A's load reported done
in ``kv_connector_output.finished_recving`` right after it was allocated.

What happens (0.30.0 ``v1/core/sched/scheduler.py``):
- step 1: A's lookup hits, A gets its blocks and is parked WAITING_FOR_REMOTE_KVS; B's
  lookup says "ask again". Both are put on ``skipped_waiting``, B ahead of A
  (``step_skipped_waiting.prepend_request`` at :883/:947, then
  ``skipped_waiting.prepend_requests`` at :1291-1292);
- from step 2: FCFS takes ``skipped_waiting`` first (:2317-2319); its head is B, which is
  WAITING (not a blocked status), so it is looked up and allocated; the pool cannot hold B
  while A holds its blocks, so ``allocate_slots`` returns None and the loop ``break``s
  (:1173-1180). A, behind B, is never promoted, although its load finished
  (``finished_recving_kv_req_ids``), so it never frees its blocks: no request is ever
  scheduled again, and ``has_requests()`` stays true.

0.31.0 drains the requests that hold KV blocks first (``kv_holding_waiting``,
``scheduler.py:886-887``, ``_holds_kv_blocks`` :2386), and the same script finishes.

Run it in a release's import venv (kvbound need not be installed: the side package's vLLM
adapter is loaded from this checkout by path):

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=~/.cache/kvbound/vllm-0.30.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_waiting_kv_deadlock.py [--json]

Exit 1 when the scheduler deadlocks (the defect), 0 when both requests finish.
"""

import argparse
import json
import sys

from repro_support import MODULE, idle_connector_base, install_connector, side_package

side_package()  # kvbound_side.adapter: vLLM on CPU

B = 16  # tokens per block
NUM_BLOCKS = 12  # the pool, null block included: 11 usable
A_PROMPT, A_HIT = 80, 64  # A: 5 blocks, 64 tokens from the connector
B_PROMPT = 128  # B: 8 blocks (+1 for its first sampled token): cannot fit beside A's 5
STEPS = 60


def _connector_module():
    class ReproConnector(idle_connector_base()):
        """A's first lookup: 64 tokens, async; B's first lookup: ask again; else nothing."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.asked = {}

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            n = self.asked.get(request.request_id, 0)
            self.asked[request.request_id] = n + 1
            if request.request_id == "A" and n == 0:
                return A_HIT - num_computed_tokens, True
            if request.request_id == "B" and n == 0:
                return None, False
            return 0, False

    install_connector(ReproConnector)


def run():
    from kvbound_side import adapter

    adapter.stub_einops()
    import vllm
    from vllm import SamplingParams
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.v1 import outputs as vout
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    sha256 = adapter.hashing()
    _connector_module()
    adapter.register_never_built("LlamaForCausalLM")
    d = adapter.model_dir(num_hidden_layers=1, vocab_size=1024, max_position_embeddings=4096)
    kv_cache_config = adapter.kv_cache_config(
        [adapter.kv_cache_spec({"kind": "full_attention", "tokens_per_block": B})], NUM_BLOCKS)
    model = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, max_model_len=1024, dtype="float32",
                        enforce_eager=True)
    cache = CacheConfig(block_size=B, enable_prefix_caching=True)
    cache.num_gpu_blocks = NUM_BLOCKS
    config = VllmConfig(
        model_config=model, cache_config=cache, parallel_config=ParallelConfig(),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=1024,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(kv_connector="ReproConnector", kv_role="kv_both",
                                            kv_connector_module_path=MODULE))
    cache.num_gpu_blocks = NUM_BLOCKS
    sched = Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(config), block_size=B)
    hasher = kcu.get_request_block_hasher(B, sha256)
    for rid, n, base in (("B", B_PROMPT, 500), ("A", A_PROMPT, 1)):  # B arrives first
        sched.add_request(Request(request_id=rid, prompt_token_ids=list(range(base, base + n)),
                                  sampling_params=SamplingParams(max_tokens=2, ignore_eos=True),
                                  pooling_params=None, block_hasher=hasher))
    trace = []
    done_loads = set()
    for step in range(1, STEPS + 1):
        if not sched.has_requests():
            break
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        finished_recving = {r for r in ("A",) if r in sched.requests and r not in done_loads
                            and str(sched.requests[r].status).endswith("WAITING_FOR_REMOTE_KVS")}
        done_loads |= finished_recving
        sampled = []
        for rid in ids:
            req = sched.requests[rid]
            sampled.append([7] if req.num_computed_tokens + so.num_scheduled_tokens[rid] >= req.num_tokens else [])
        out = vout.ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                     sampled_token_ids=sampled,
                                     kv_connector_output=vout.KVConnectorOutput(finished_recving=finished_recving))
        sched.update_from_output(so, out)
        state = {rid: str(r.status).split(".")[-1] for rid, r in sched.requests.items()}
        trace.append({"step": step, "scheduled": ids, "finished_recving": sorted(finished_recving),
                      "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
                      "requests": state})
    left = {rid: str(r.status).split(".")[-1] for rid, r in sched.requests.items()}
    return {"vllm": vllm.__version__, "steps": len(trace), "left": left,
            "deadlock": bool(left), "trace": trace[:4] + trace[-1:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run()
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for t in res["trace"]:
            print(f"step {t['step']:>2}: scheduled {t['scheduled']}, loads done {t['finished_recving']},"
                  f" free blocks {t['free_blocks']}, {t['requests']}")
        print(f"vllm {res['vllm']}: " + (
            f"DEADLOCK after {res['steps']} steps: {res['left']} never finish" if res["deadlock"]
            else f"both requests finished in {res['steps']} steps"))
    return 1 if res["deadlock"] else 0


if __name__ == "__main__":
    sys.exit(main())
