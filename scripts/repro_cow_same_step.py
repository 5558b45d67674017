"""Second reproducer of the 0.30-0.33 same-step copy-on-write defect (docs/findings.md),
read off vLLM's own SchedulerOutput, without kvbound's shadow KV.

A partial prefix-cache hit (the hit ends inside a block: 16-token hashes under 64-token
blocks) is redirected to a private copy of the cached block: the scheduler emits a
``KVCacheBlockCopy(src, dst)`` (0.33.0 ``v1/core/single_type_kv_cache_manager.py:316-325``,
``:388-398``, ``:458-475``; ``v1/core/kv_cache_manager.py:863-878``) and the model runner
zeroes the step's new blocks, then applies the copies, then runs the forward (0.33.0
``v1/worker/gpu_model_runner.py:1205-1211``). When ``src`` was allocated and cached in the
same step by another request, whose forward is what writes it, the copy runs first: it
copies a block zeroed a moment before (``src`` is in the same output's
``new_block_ids_to_zero``), and the request then attends over zeros for the hit's tokens.

Run it in a release's import venv, with the trace's engine (which builds the real
scheduler with the offloading connector on CPU) replaying a trace file's requests:

    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_cow_same_step.py docs/trace-findings/0-33-0-mamba-eagle-untagged-data-wrong-kv-4req.json

Prints one JSON line per copy whose source is fresh in the same step, and exits 1 if there
is one (0 if none).
"""

import json
import os
import sys

TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kvbound", "trace")


def main(path):
    sys.path.insert(0, TRACE)
    import worker  # noqa: F401  (the trace worker's side packages)
    from kvbound_trace_side.engine import Release

    seg = json.load(open(path))["segment"]
    eng = Release().build(seg["layout"], dict(seg["params"]))
    sched = eng.sched
    schedule = sched.schedule
    bad = []

    def tables():
        mgrs = sched.kv_cache_manager.coordinator.single_type_managers
        return {rid: [[b.block_id for b in m.req_to_blocks.get(rid, ())] for m in mgrs] for rid in sched.requests}

    def observed_schedule(*a, **kw):
        out = schedule(*a, **kw)
        zero = set(getattr(out, "new_block_ids_to_zero", None) or ())
        copies = getattr(out, "kv_cache_block_copies", None) or ()
        if copies and zero:
            tabs = None
            for cp in copies:
                if cp.src_block_id in zero:
                    tabs = tabs or tables()
                    owners = sorted(rid for rid, t in tabs.items() if any(cp.src_block_id in g for g in t))
                    readers = sorted(rid for rid, t in tabs.items() if any(cp.dst_block_id in g for g in t))
                    bad.append({"step": eng.step_no, "src_block_id": cp.src_block_id, "dst_block_id": cp.dst_block_id,
                                "src_zeroed_this_step": True, "src_in_tables_of": owners,
                                "dst_in_tables_of": readers,
                                "scheduled_tokens": {r: out.num_scheduled_tokens.get(r, 0) for r in owners + readers}})
                    print(json.dumps(bad[-1]))
        return out

    sched.schedule = observed_schedule
    eng.run(seg["requests"], 200000)
    print(f"vllm {eng.rel.version}: {len(bad)} copy(ies) from a block zeroed in the same step")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
