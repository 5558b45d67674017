"""Standalone reproducer: with any KV connector on a Mamba hybrid, vLLM 0.24-0.26 start a
request at the full-attention group's local hit although its Mamba group has no state there.

Drives vLLM's real engine-core ``Scheduler`` and ``KVCacheManager`` (full attention 64 +
Mamba 64, ``mamba_cache_mode="align"``, prefix caching on) with a minimal KV connector of
its own that never has anything (no OffloadingConnector, no kvbound). Request A computes a
412-token prompt in one step, so the Mamba group caches a state only at A's last full
block (384 tokens). Request B shares A's first 341 tokens: the full-attention group hits 5
blocks (320 tokens), the Mamba group has no state at 320.

What happens (0.24.0 ``v1/core/sched/scheduler.py:674-701``): with a connector and Mamba
layers under the hybrid coordinator, the scheduler looks each group up on its own
(``find_longest_cache_hit_per_group``, ``v1/core/kv_cache_coordinator.py:734-771``) and takes
``num_new_local_computed_tokens = max(per_group_hits)`` (the comment: the Mamba state "is
transferred unconditionally by _apply_prefix_caching in nixl/worker.py", which only NIXL
does). B is scheduled from token 320 with its Mamba table null at block 4, the block whose
state the forward reads (the state after 320 tokens): B's Mamba layers start from no state.
Without a connector the same release asks ``get_computed_blocks`` for one hit every group
agrees on, and B starts from 0.

0.27.0 replaced the path (``kv_cache_manager.get_computed_blocks_for_connector``).

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=~/.cache/kvbound/vllm-0.24.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_mamba_connector_max_hit.py [--no-connector] [--json]

Exit 1 when B starts past its Mamba state (the defect), 0 otherwise.
"""

import argparse
import json
import sys

from repro_support import MODULE, idle_connector_base, install_connector, side_package

side_package()  # kvbound_side.adapter: vLLM on CPU

B = 64  # tokens per block, both groups
NUM_BLOCKS = 40
A_PROMPT, SHARED, B_PROMPT = 412, 341, 366


def _connector_module():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

    class NothingConnector(idle_connector_base(SupportsHMA)):
        """Never has a token: every lookup answers 0, synchronously (SupportsHMA: a
        connector on a hybrid model must be one, 0.24.0 scheduler.py:2325-2333)."""

        def request_finished_all_groups(self, request, block_ids):
            return False, None

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 0, False

    install_connector(NothingConnector)


def run(with_connector=True):
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
    d = adapter.model_dir(num_hidden_layers=2, vocab_size=65536, max_position_embeddings=8192)
    kv_cache_config = adapter.kv_cache_config(
        [adapter.kv_cache_spec({"kind": kind, "tokens_per_block": B}) for kind in ("full_attention", "mamba")],
        NUM_BLOCKS)
    model = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, max_model_len=8192, dtype="float32",
                        enforce_eager=True)
    cache = CacheConfig(block_size=B, enable_prefix_caching=True, mamba_cache_mode="align")
    cache.num_gpu_blocks = NUM_BLOCKS
    kv = dict(kv_transfer_config=KVTransferConfig(kv_connector="NothingConnector", kv_role="kv_both",
                                                  kv_connector_module_path=MODULE)) if with_connector else {}
    config = VllmConfig(
        model_config=model, cache_config=cache, parallel_config=ParallelConfig(),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=8192,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        device_config=DeviceConfig(device="cpu"), **kv)
    cache.num_gpu_blocks = NUM_BLOCKS
    sched = Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(config), block_size=B)
    hasher = kcu.get_request_block_hasher(B, sha256)
    doc = [1 + (i * 104729) % 60000 for i in range(A_PROMPT)]
    prompts = {"A": doc, "B": doc[:SHARED] + [60001 + i for i in range(B_PROMPT - SHARED)]}
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    seen = {}
    for rid in ("A", "B"):  # B arrives once A has finished
        sched.add_request(Request(request_id=rid, prompt_token_ids=prompts[rid],
                                  sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
                                  pooling_params=None, block_hasher=hasher))
        for _ in range(8):
            if not sched.has_requests():
                break
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            for r in ids:
                if r not in seen:
                    req = sched.requests[r]
                    c0 = req.num_computed_tokens - so.num_scheduled_tokens[r]
                    tables = [[0 if b.is_null else b.block_id for b in m.req_to_blocks[r]] for m in mgrs]
                    seen[r] = {"starts_at": c0, "tables": tables,
                               "mamba_state_block": None if c0 == 0 else tables[1][(c0 - 1) // B]}
            out = vout.ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens
                                   else [] for r in ids])
            sched.update_from_output(so, out)
    b = seen["B"]
    return {"vllm": vllm.__version__, "connector": with_connector, "A": seen["A"], "B": b,
            "defect": b["starts_at"] > 0 and b["mamba_state_block"] == 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-connector", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(not args.no_connector)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        b = res["B"]
        print(f"vllm {res['vllm']} ({'a connector' if res['connector'] else 'no connector'}):"
              f" B starts at token {b['starts_at']}; tables: full attention {b['tables'][0]},"
              f" mamba {b['tables'][1]}")
        print("B's Mamba layers start from no state (block %d of its Mamba table is null)"
              % ((b["starts_at"] - 1) // B) if res["defect"]
              else "B starts where every group has its state")
    return 1 if res["defect"] else 0


if __name__ == "__main__":
    sys.exit(main())
