"""Reproducer of the reset / KV-event finding (docs/findings.md): a connector cache reset
(``reset_prefix_cache(reset_connector=True)``) empties the CPU tier, yet the tier publishes no
KV event saying so, so a KV-event consumer still lists the blocks the tier no longer holds.

One request on one full-attention group (16-token blocks) runs to its end; its chunks reach the
CPU tier (BlockStored, medium CPU). Then the scheduler resets the prefix cache with the
connector, and the same prompt arrives again: the connector finds nothing (the tier is empty),
while the events it published still list every chunk as held (no BlockRemoved, and the GPU
pool's AllBlocksCleared names no medium and is also sent by a reset that keeps the tier).

Run with the release's side interpreter and tree (kvbound conform prepares them):
    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \
        scripts/repro_reset_kv_events.py [--json] [--no-reset]
``--no-reset``: the control, the GPU prefix cache reset alone (the tier keeps its blocks).
Prints one JSON line with --json. Exit 1 when a block the events list as held on the CPU tier
is one the tier cannot load after the reset (the finding), else 0.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kvbound/side
import vllm.config as vc  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved, BlockStored  # noqa: E402

from kvbound.side import engine as E  # noqa: E402


def build_with_events(rel, lay, par):
    """The engine kvbound builds, with KV cache events on (publisher "null"): the engine's own
    VllmConfig call, given a kv_events_config."""
    real = vc.VllmConfig

    def with_events(**kw):
        kw["kv_events_config"] = vc.KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        return real(**kw)

    vc.VllmConfig = with_events
    try:
        return rel.build(lay, par)
    finally:
        vc.VllmConfig = real

LAYOUT = {"groups": [{"kind": "full_attention", "tokens_per_block": 16}], "blocks_per_chunk": 1, "name": "full"}
PARAMS = {"num_gpu_blocks": 64, "cpu_chunks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 512,
          "max_delay": 0, "fail_p": 0.0, "max_model_len": 4096, "abort_p": 0.0, "seed": 0}
PROMPT = [["doc", 1, 0, 128]]


def main():
    reset = "--no-reset" not in sys.argv
    rel = E.Release()
    eng = build_with_events(rel, LAYOUT, PARAMS)
    conn = eng.sched.connector
    held = {}  # medium -> hashes the connector's events say the medium holds
    orig_take = conn.take_events

    def take_events():
        evs = list(orig_take())
        for ev in evs:
            if isinstance(ev, BlockStored):
                held.setdefault(ev.medium, set()).update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                held.setdefault(ev.medium, set()).difference_update(ev.block_hashes)
        return evs

    conn.take_events = take_events
    hits = {}  # request id -> the connector's answer to its first lookup (external tokens)
    orig_match = conn.get_num_new_matched_tokens

    def get_num_new_matched_tokens(request, num_computed_tokens):
        res = orig_match(request, num_computed_tokens)
        hits.setdefault(request.request_id, res[0])
        return res

    conn.get_num_new_matched_tokens = get_num_new_matched_tokens
    eng.run([{"id": 1, "arrive": 0, "prompt": PROMPT, "max_tokens": 2, "abort_after": None}], 2000)
    stored_before = len(held.get("CPU", ()))
    if reset:
        E.reset_prefix_cache(eng)
        take_events()  # what the reset published, if anything
    else:  # the same prompt, with the GPU prefix cache reset alone: the tier keeps the blocks
        eng.sched.reset_prefix_cache()
    # the consumer's view the moment the reset is published, before the prompt is stored again
    listed_after_reset = len(held.get("CPU", ()))
    eng.run([{"id": 2, "arrive": 0, "prompt": PROMPT, "max_tokens": 2, "abort_after": None}], 2000)
    external = hits.get("2")
    res = {"vllm": eng.rel.version, "reset": reset, "cpu_blocks_by_events_before_reset": stored_before,
           "cpu_blocks_by_events_after_reset": listed_after_reset,
           "cpu_blocks_by_events_after": len(held.get("CPU", ())), "connector_hit_tokens_after": external,
           "prompt_tokens": 128}
    # the finding: right after the reset the events list CPU blocks the tier no longer has (a lookup
    # of the same prompt finds none of them); the end state cannot tell, as the second request
    # stores the prompt again
    res["stale"] = bool(listed_after_reset) and not external
    print(json.dumps(res) if "--json" in sys.argv else res)
    return 1 if res["stale"] else 0


if __name__ == "__main__":
    sys.exit(main())
