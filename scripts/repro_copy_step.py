"""Replays one scheduler step of a ``kvbound prove`` copy witness (``copy.*``, proofs/copy_contract.py)
on a release's real ``KVCacheManager``, and reports every block copy the step makes with what its
source held before the step.

Run it in a release's import venv (kvbound need not be installed: the side package's vLLM adapter
is loaded from this checkout by path):

    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_copy_step.py WITNESS.json

The manager is vLLM's own (coordinator, single-type managers, block pool), built for the hybrid the
finding needs: a full-attention group and a Mamba group in ``align`` mode, both at the witness's
block size, hashed every ``U`` tokens (``hash_block_size``; partial hits need ``U`` below the block
size, 0.33.0 ``v1/core/kv_cache_utils.py:762-792``). Nothing of vLLM is faked or patched.

The witness's token sequences are built from its common prefixes (each request copies the prefix it
shares with the earlier request it shares most with, then unique tokens). Earlier steps: the holder
``E`` and every running request compute their ``c`` tokens, one request per step, fewest first (each
with the hit vLLM gives it; ``E``'s prompt ends one token past ``c``, so its last chunk ends on the
prompt's hash boundary, where the Mamba group caches a state, 0.33.0
``v1/core/single_type_kv_cache_manager.py:2085-2105``). Then the step: ``new_step_starts``, and the
step's requests scheduled in the witness's order as ``Scheduler.schedule()`` does (a new request:
``get_computed_blocks`` then ``allocate_slots`` with the hit; a running one: ``allocate_slots``
with its scheduled tokens), and ``take_kv_cache_block_copies``. Prints one JSON object: per request
the real hit and block tables, and per copy its source's holders with what each had computed before
the step, and whether the source is a block allocated in the step or one of the step's copy
destinations (the worker applies all copies at once, 0.33.0 ``v1/worker/utils.py:909-955``).
"""

import json
import sys

from repro_support import side_package

side_package()


def tokens(w):
    """name -> token ids realising the witness's common prefixes."""
    lcp = {}
    for a, b, n in w["lcp"]:
        lcp[(a, b)] = lcp[(b, a)] = n
    out, fresh = {}, 100000
    for q in w["requests"]:
        x, T = q["name"], q["T"]
        best = max(out, key=lambda y: lcp[(x, y)], default=None)
        shared = out[best][:lcp[(x, best)]] if best is not None else []
        out[x] = shared + list(range(fresh, fresh + T - len(shared)))
        fresh += T
    return out


def main(path):
    from kvbound_side import adapter
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.request import Request

    if not hasattr(KVCacheManager, "take_kv_cache_block_copies"):  # the copy-on-write path arrives in 0.26.0
        print("vllm %s cannot replay a copy step: its KVCacheManager makes no block copies "
              "(take_kv_cache_block_copies, KVCacheBlockCopy arrive in 0.26.0)" % __import__("vllm").__version__)
        return 2
    w = json.load(open(path))
    B, U = w["B"], w["U"]
    sha = adapter.hashing()
    cfg = adapter.kv_cache_config([adapter.kv_cache_spec({"kind": k, "tokens_per_block": B})
                                   for k in ("full_attention", "mamba")], 128, layer_names=["attn", "mamba"])
    for field in ("hash_block_size", "cache_hit_alignment_tokens"):
        if hasattr(cfg, field):
            setattr(cfg, field, U)
    mgr = KVCacheManager(cfg, max_model_len=8192, scheduler_block_size=B, hash_block_size=U, enable_caching=True)
    hasher = kcu.get_request_block_hasher(U, sha)
    toks = tokens(w)
    by = {q["name"]: q for q in w["requests"]}
    reqs = {n: Request(request_id=n, prompt_token_ids=toks[n], sampling_params=SamplingParams(max_tokens=4),
                       pooling_params=None, block_hasher=hasher) for n in toks}

    def schedule(name, upto=None):
        """One request's scheduling as schedule() does it; returns (hit, scheduled)."""
        req, q = reqs[name], by[name]
        hit, n = (mgr.get_computed_blocks(req)[:2] if req.num_computed_tokens == 0
                  else (mgr.empty_kv_cache_blocks, 0))
        start = req.num_computed_tokens + n
        new = (upto - start) if upto is not None else (q["s"] if not q["new"] else min(q["s"], q["T"] - start))
        out = mgr.allocate_slots(req, new, num_new_computed_tokens=n, new_computed_blocks=hit)
        if out is None:
            raise SystemExit(f"vLLM did not admit {name} (hit {n}, {new} new tokens)")
        return n, new

    mgrs = mgr.coordinator.single_type_managers

    def drain_step():
        """What the scheduler takes off the manager at the end of a step: the blocks to zero and the
        copies (handed to that step's worker), then the next step starts."""
        zeroed = set()
        for m in mgrs:
            if hasattr(m, "take_new_block_ids"):
                zeroed |= set(m.take_new_block_ids())
        copies = mgr.take_kv_cache_block_copies()[0]
        mgr.new_step_starts()
        return zeroed, copies

    # earlier steps: the holder and the running requests compute their c tokens
    for name in sorted((q["name"] for q in w["requests"] if q["c"] > 0), key=lambda n: (by[n]["c"], n)):
        _, new = schedule(name, upto=by[name]["c"])
        reqs[name].num_computed_tokens = by[name]["c"]
        drain_step()
    before = {n: reqs[n].num_computed_tokens for n in reqs}
    step = [q["name"] for q in w["requests"] if q["name"] != "E"]
    hits = {}
    for name in step:
        hits[name] = schedule(name)
    zeroed, copies = drain_step()
    tables = {n: [[None if b.is_null else b.block_id for b in m.req_to_blocks.get(n, [])] for m in mgrs] for n in reqs}
    dsts = {cp.dst_block_id for cp in copies}
    out = []
    for cp in copies:
        holders = [(n, g, i) for n in reqs for g, row in enumerate(tables[n]) for i, b in enumerate(row)
                   if b == cp.src_block_id]
        readers = [(n, g, i) for n in reqs for g, row in enumerate(tables[n]) for i, b in enumerate(row)
                   if b == cp.dst_block_id]
        out.append({"src": cp.src_block_id, "dst": cp.dst_block_id, "group": readers[0][1] if readers else None,
                    "reader": readers[0][0] if readers else None, "idx": readers[0][2] if readers else None,
                    "src_holders": {n: {"idx": i, "computed_before_step": before[n]} for n, g, i in holders},
                    "src_allocated_this_step": cp.src_block_id in zeroed, "src_copied_this_step": cp.src_block_id in dsts})
    print(json.dumps({"vllm": __import__("vllm").__version__, "hits": {n: h for n, (h, _) in hits.items()},
                      "scheduled": {n: s for n, (_, s) in hits.items()}, "computed_before_step": before,
                      "tables": tables, "copies": out}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
