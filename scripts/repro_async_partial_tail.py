"""Standalone reproducer: under async scheduling, a Mamba (align) producer's partial-tail prefix
entry is registered again on its live state block after the copy-on-write moved it, and the next
step copies the block after the producer's first decode overwrote it (vLLM 0.27.0).

Drives vLLM's real engine-core ``AsyncScheduler`` (``--sync``: ``Scheduler``, the control) and
``KVCacheManager``: full attention + Mamba, ``mamba_cache_mode="align"``, 64-token blocks hashed
every 16 tokens (``prefix_match_unit``), prefix caching on, no KV connector, no kvbound code
beyond the side package's CPU boot (``kvbound_side.adapter``). No model runs: the script keeps
what each Mamba block holds as the model runner would (the forward writes the state after the
request's computed tokens into its Mamba block at ``(c - 1) // 64``; the step's
``kv_cache_block_copies`` run before the forward, ``new_block_ids_to_zero`` zero first), and the
engine core's batch queue of 2 (async: step t+1 is scheduled before step t's output is applied).

P (208 tokens: three blocks and a 16-token tail) prefills in one step; its Mamba group caches the
partial tail at 208 on P's live state block (0.27.0 ``single_type_kv_cache_manager.py:1703-1744``).
Next step P decodes: the copy-on-write moves the entry to a fresh block and queues the copy
(``:1615-1643``). Then, in that same step, ``allocate_slots`` caches up to
``min(computed + new, request.num_tokens)`` (``kv_cache_manager.py:559-563``), 208 again, since
under async scheduling the token in flight is a placeholder not yet in ``num_tokens``; and
``AsyncScheduler._update_request_with_output`` caches ``num_computed_tokens -
num_output_placeholders`` = 208 as well (``async_scheduler.py:64-68``). Both re-register the 208
entry on P's live block. The step after, the copy-on-write moves it again and copies the live
block, which the previous step's forward already advanced to 209 tokens. C (P's 208 tokens and its
own) then hits the entry and resumes from the state after P's 209 tokens.

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=~/.cache/kvbound/vllm-0.27.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_async_partial_tail.py [--sync] [--json]

Prints what each prefix entry's copy carried and what C read. Exit 1 when a copy gives a block
the state of another token count than its entry names, or C reads a state other than its
prefix's (the defect); 0 when neither; 2 when the traffic made no copy (nothing checked), or, in one
line, on a release without ``prefix_match_unit`` (before 0.26.0).
"""

import argparse
import json
import sys

from repro_support import side_package

side_package()  # kvbound_side.adapter: vLLM on CPU

B, UNIT, NUM_BLOCKS = 64, 16, 12
P_PROMPT, C_OWN, F_PROMPT = 208, 40, 192
# P prefills in steps 1-2 (192 + 16 tokens: align mode chunks at block ends) and decodes from step 3;
# F (its own 192 tokens) takes the free blocks, so the pool evicts the first copy of P's entry (the
# good one, first in the entry's block list) before C looks the prefix up
ARRIVALS = {1: [("P", 4)], 5: [("F", 1)], 6: [("C", 1)]}  # step -> [(request, max_tokens)]
STEPS = 14


def run(is_async=True, p_prompt=P_PROMPT):
    from kvbound_side import adapter

    adapter.quiet_environment()
    import vllm
    from vllm import SamplingParams
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1 import outputs as vout
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    if "prefix_match_unit" not in adapter.fields(CacheConfig):
        return {"vllm": vllm.__version__, "refused": "vllm %s has no CacheConfig.prefix_match_unit (0.26.0"
                " vllm/config/cache.py:56): no block hashed below its size, no partial tail" % vllm.__version__}
    sha256 = adapter.hashing()
    adapter.register_never_built("LlamaForCausalLM")
    d = adapter.model_dir(num_hidden_layers=2, vocab_size=65536, max_position_embeddings=8192)
    kv_cache_config = adapter.kv_cache_config(
        [adapter.kv_cache_spec({"kind": kind, "tokens_per_block": B}) for kind in ("full_attention", "mamba")],
        NUM_BLOCKS)
    model = ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, max_model_len=8192, dtype="float32",
                        enforce_eager=True)
    cache = CacheConfig(block_size=B, enable_prefix_caching=True, mamba_cache_mode="align", prefix_match_unit=UNIT)
    cache.num_gpu_blocks = NUM_BLOCKS
    config = VllmConfig(
        model_config=model, cache_config=cache, parallel_config=ParallelConfig(),
        scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=8192,
                                         enable_chunked_prefill=True, async_scheduling=is_async,
                                         is_encoder_decoder=False),
        device_config=DeviceConfig(device="cpu"))
    cache.num_gpu_blocks = NUM_BLOCKS
    bs, hbs = kcu.resolve_kv_cache_block_sizes(kv_cache_config, config)
    cls = AsyncScheduler if is_async else Scheduler
    sched = cls(vllm_config=config, kv_cache_config=kv_cache_config,
                structured_output_manager=StructuredOutputManager(config), block_size=bs, hash_block_size=hbs)
    hasher = kcu.get_request_block_hasher(hbs, sha256)
    doc = [1 + (i * 104729) % 60000 for i in range(p_prompt)]
    prompts = {"P": doc, "C": doc + [60001 + i for i in range(C_OWN)], "F": [62001 + i for i in range(F_PROMPT)]}
    mamba = sched.kv_cache_manager.coordinator.single_type_managers[1]
    pool = mamba.block_pool

    def prefix(rid, n):
        return tuple(prompts[rid][:n]) if n <= len(prompts[rid]) else None

    def entries():
        """Mamba blocks with a prefix entry -> the tokens it names (the primary entry, where the
        release keeps ``block_hash_num_tokens``; a partial tail's entry is its block's primary one)."""
        out = {}
        for blk in pool.blocks:
            key = blk.block_hash
            if key is None or kcu.get_group_id(key) != 1:
                continue
            n = getattr(blk, "block_hash_num_tokens", None)
            if n is not None:
                out[blk.block_id] = n
        return out

    holds = {}  # Mamba block id -> (request, tokens its state is after), as the model runner leaves it
    copies, reads, stale, started = [], [], [], set()
    queue = []  # (scheduler output, which requests it samples), oldest last: the engine core's batch queue
    for step in range(1, STEPS + 1):
        for rid, max_tokens in ARRIVALS.get(step, ()):
            sched.add_request(Request(request_id=rid, prompt_token_ids=prompts[rid],
                                      sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                      pooling_params=None, block_hasher=hasher))
        if not sched.has_requests() and not queue:
            break
        so = sched.schedule()
        # the model runner's _update_states (0.27.0 gpu_model_runner.py:1219-1228): zero, then copy
        for bid in so.new_block_ids_to_zero or ():
            holds.pop(int(bid), None)
        moved = [(c.src_block_id, c.dst_block_id, holds.get(c.src_block_id)) for c in so.kv_cache_block_copies or ()]
        for src, dst, content in moved:
            holds[dst] = content
            copies.append({"step": step, "src": src, "dst": dst, "carries": content})
        # the forward: each request reads the state its resume point needs, then writes its new state
        samples = {}  # request -> whether the step samples a token (it reaches the prompt's end)
        for rid, n in so.num_scheduled_tokens.items():
            req = sched.requests[rid]
            c = req.num_computed_tokens  # advanced by schedule()
            table = [0 if b.is_null else b.block_id for b in mamba.req_to_blocks[rid]]
            c0 = c - n
            if rid not in started:
                started.add(rid)
                if c0 > 0:
                    got = holds.get(table[(c0 - 1) // B])
                    ok = got is not None and got[1] == c0 and prefix(got[0], c0) == prefix(rid, c0)
                    reads.append({"step": step, "request": rid, "resumes_at": c0,
                                  "block": table[(c0 - 1) // B], "reads": got, "own_prefix": ok})
            holds[table[(c - 1) // B]] = (rid, c)
            samples[rid] = c >= req.num_prompt_tokens
        # after the forward: what the next step's copies read. An entry naming N tokens must sit on a
        # block holding a state after N tokens (a hit resumes at N from a copy of it)
        for bid, n in sorted(entries().items()):
            got = holds.get(bid)
            if got is not None and got[1] != n and not any(
                    (e["block"], e["entry_tokens"], e["holds"]) == (bid, n, got) for e in stale):
                stale.append({"step": step, "block": bid, "entry_tokens": n, "holds": got})  # once each
        queue.insert(0, (so, samples))
        if is_async and len(queue) < 2:
            continue
        done, samples = queue.pop()
        ids = list(done.num_scheduled_tokens)
        out = vout.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] if samples[r] else [] for r in ids])
        sched.update_from_output(done, out)
    wrong = [r for r in reads if not r["own_prefix"]]
    return {"vllm": vllm.__version__, "async": is_async, "prompt": p_prompt, "copies": copies, "reads": reads,
            "stale_entries": stale, "wrong_reads": wrong, "checked": bool(copies)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sync", action="store_true", help="the engine core's Scheduler (the control)")
    ap.add_argument("--prompt", type=int, default=P_PROMPT, help="P's prompt tokens (C shares them all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(not args.sync, args.prompt)
    if "refused" in res:
        sys.stderr.write("repro_async_partial_tail: %s\n" % res["refused"])
        return 2
    if args.json:
        print(json.dumps(res))
    else:
        print("vllm %s (%s scheduling)" % (res["vllm"], "async" if res["async"] else "sync"))
        for cp in res["copies"]:
            print("  step %d: copy %d -> %d carries %s" % (cp["step"], cp["src"], cp["dst"], cp["carries"]))
        for e in res["stale_entries"]:
            print("  after step %d's forward: block %d holds %s under an entry of %d tokens"
                  % (e["step"], e["block"], e["holds"], e["entry_tokens"]))
        for r in res["reads"]:
            print("  step %d: %s resumes at %d from block %d holding %s (%s)"
                  % (r["step"], r["request"], r["resumes_at"], r["block"], r["reads"],
                     "its prefix" if r["own_prefix"] else "NOT its prefix's state"))
    if res["stale_entries"] or res["wrong_reads"]:
        return 1
    return 0 if res["checked"] else 2


if __name__ == "__main__":
    sys.exit(main())
