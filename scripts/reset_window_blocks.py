"""Second opinion on the reset finding (docs/findings.md): for each store job the connector builds, the GPU blocks it reads that the request's own
block table (the core KV-cache manager's) no longer holds, per group, and whether a reset came
before. Evidence from vLLM's own state, beside the shadow's.

Run with the release's side interpreter and tree (kvbound conform prepares them):
    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \
        scripts/reset_window_blocks.py TRACE_FILE.json [--no-reset]
Exit 1 when some store reads a block its request's table no longer holds. ``--no-reset``: the same
requests with ``reset_p`` off.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kvbound/side
from kvbound.side import engine as E
d = json.load(open(sys.argv[1]))
seg = d.get("segment", d)
if "--no-reset" in sys.argv:
    seg["params"].pop("reset_p", None)
rel = E.Release()
eng = rel.build(seg["layout"], seg["params"])
cs = eng.csched
kvm = eng.sched.kv_cache_manager
resets = []
stale = []
orig_reset = E.reset_prefix_cache


def reset(e):
    resets.append(e.step_no)
    orig_reset(e)


E.reset_prefix_cache = reset
orig = cs._build_store_jobs
def bsj(so):
    jobs = orig(so)
    for jid, job in jobs.items():
        rid = job.req_id
        if rid not in eng.sched.requests: continue
        table = kvm.get_blocks(rid).get_block_ids()
        ids = [int(x) for x in job.src_spec.block_ids]
        sizes = list(job.src_spec.group_sizes)
        o = 0
        for gi, (n, gc) in enumerate(zip(sizes, cs.config.kv_group_configs)):
            mine = set(table[gc.group_idx])
            for b in ids[o:o + n]:
                if b not in mine:
                    stale.append((jid, b))
                    other = [r for r in eng.sched.requests if b in kvm.get_blocks(r).get_block_ids()[gc.group_idx]]
                    print("step %d store job %d request %s group %d reads block %d, not in its table; held by %s; resets before: %s"
                          % (eng.step_no, jid, rid, gc.group_idx, b, other, [r for r in resets if r < eng.step_no][-3:]))
            o += n
    return jobs
cs._build_store_jobs = bsj
eng.run(seg["requests"], 20000)
print("resets", len(resets), "stale reads", len(stale), "violations", sorted({v["check"] for v in eng.violations}))
sys.exit(1 if stale else 0)
