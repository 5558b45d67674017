"""Second reproducer of the 0.30-0.33 same-step copy-on-write defect (docs/findings.md),
read off vLLM's own SchedulerOutput, without kvbound's shadow KV.

A partial prefix-cache hit (the hit ends inside a block: 16-token hashes under 64-token
blocks) is redirected to a private copy of the cached block: the scheduler emits a
``KVCacheBlockCopy(src, dst)`` (0.33.0 ``v1/core/single_type_kv_cache_manager.py:316-325``,
``:388-398``, ``:458-475``; ``v1/core/kv_cache_manager.py:863-878``) and the model runner
zeroes the step's new blocks, then applies the copies, then runs the forward (0.33.0
``v1/worker/gpu_model_runner.py:1205-1211``). When ``src`` was cached in the same step by
another request, whose forward is what writes it, the copy runs first: it copies tokens
that no request has computed yet (a block allocated this step was even zeroed a moment
before), and the request then attends over them for the hit's tokens.

Run it in a release's import venv, with the trace's engine (which builds the real
scheduler with the offloading connector on CPU) replaying a trace file's requests:

    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_cow_same_step.py docs/trace-findings/0-33-0-mamba-eagle-untagged-data-wrong-kv-4req.json

Prints one JSON line per copy that carries tokens no owner of its source had computed before
the step (every owner's ``num_computed_tokens`` before the step falls short of the reader's
hit; the trace's own contract, ``checks.uncomputed_copies``, applied to each SchedulerOutput),
and exits 1 if there is one (0 if none).
"""

import json
import sys

from repro_support import side_package


def main(path):
    side_package()
    from kvbound_side.checks import uncomputed_copies
    from kvbound_side.engine import Release

    seg = json.load(open(path))["segment"]
    eng = Release().build(seg["layout"], dict(seg["params"]))
    sched = eng.sched
    schedule = sched.schedule
    bad = []

    def observed_schedule(*a, **kw):
        out = schedule(*a, **kw)
        for r in uncomputed_copies(sched, out):
            bad.append(dict({"step": eng.step_no}, **r))
            print(json.dumps(bad[-1]))
        return out

    sched.schedule = observed_schedule
    eng.run(seg["requests"], 200000)
    print(f"vllm {eng.rel.version}: {len(bad)} copy(ies) of tokens no owner of the source had computed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
