"""Reproducer of the offload-limit / partial-tail finding (docs/findings.md): one request with a
cap on what it offloads (kv_transfer_params ``max_offload_tokens``, 0.33.0
offloading/scheduler.py:399-410) on a Mamba (align) hybrid whose chunk outgrows its hash unit
(528-token blocks hashed every 16 tokens: a store may end in a partial tail). The Mamba state's
boundary hand-off is stored at the prompt's end (848 tokens), past the cap (528), and the
connector asserts ``boundary <= max_boundary`` (0.33.0 offloading/scheduler.py:1662-1668) inside
``build_connector_meta``: the scheduler step raises.

Run with the release's side interpreter and tree (kvbound conform prepares them):
    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \
        scripts/repro_offload_limit_tail.py [--json] [--limit N] [--async]
``--limit -1``: the control, the same request with no cap. Prints one JSON line with --json; exit 1
when the step raised (the finding), else 0.
"""
import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kvbound/side
from kvbound.side import engine as E  # noqa: E402

LAYOUT = {"groups": [{"kind": "full_attention", "tokens_per_block": 528}, {"kind": "mamba", "tokens_per_block": 528}],
          "blocks_per_chunk": 1, "prefix_match_unit": 16, "name": "mamba528"}
PARAMS = {"num_gpu_blocks": 24, "cpu_chunks": 256, "max_num_seqs": 8, "max_num_batched_tokens": 2048,
          "max_delay": 2, "fail_p": 0.0, "max_model_len": 16384, "abort_p": 0.0, "seed": 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--limit", type=int, default=528)
    ap.add_argument("--async", dest="is_async", action="store_true")
    a = ap.parse_args()
    req = {"id": 1, "arrive": 0, "prompt": [["doc", 3, 0, 848]], "max_tokens": 3, "abort_after": None}
    if a.limit >= 0:
        req["kv_transfer_params"] = {"max_offload_tokens": a.limit}
    rel = E.Release()
    eng = rel.build(LAYOUT, dict(PARAMS, **{"async": a.is_async}))
    res = {"vllm": rel.version, "limit": a.limit, "async": a.is_async, "prompt_tokens": 848, "error": None}
    try:
        eng.run([req], 2000)
        res["stores"] = eng.stats["stores"]
    except AssertionError as e:
        fr = traceback.extract_tb(e.__traceback__)[-1]
        root = os.path.dirname(os.path.dirname(sys.modules["vllm"].__file__))  # the release's tree
        res["error"] = "AssertionError at %s:%d %s" % (os.path.relpath(fr.filename, root), fr.lineno, fr.line)
    print(json.dumps(res) if a.json else res)
    return 1 if res["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
