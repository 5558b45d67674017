"""Run by tests/test_plugin.py with a vLLM release's side venv and ``PYTHONPATH=<release tree>``.

``argv[1]`` is the site directory kvbound is installed in (its dist-info, with the
``vllm.general_plugins`` entry point, and its dependencies): added after the side venv's
own, as ``pip install kvbound`` beside vLLM leaves it. vLLM's own
``load_general_plugins()`` then finds and calls kvbound's ``register``; the real
engine-core scheduler with the OffloadingConnector (kvbound trace's engine adapter) steps
the job in ``argv[2]`` twice: clean, then with a planted wrong load plan (each new load
job's GPU destination moved one block up, under kvbound's wrapper, as a vLLM bug would).
The last stdout line is ``KVBOUND-RESULT <json>``; stderr has the log, each run after a
``=== run NAME`` line.
"""

import json
import site
import sys

site.addsitedir(sys.argv[1])

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (  # noqa: E402
    OffloadingConnectorScheduler,
)

defect = {"on": False}
real_update = OffloadingConnectorScheduler.update_state_after_alloc


def update_state_after_alloc(self, request, blocks, num_external_tokens):
    before = set(self._current_batch_load_jobs)
    out = real_update(self, request, blocks, num_external_tokens)
    if defect["on"]:
        for job_id, job in self._current_batch_load_jobs.items():
            if job_id not in before:  # (src, dst) is transfer_spec before 0.25
                (job.dst_spec if hasattr(job, "dst_spec") else job.transfer_spec[1]).block_ids += 1
    return out


OffloadingConnectorScheduler.update_state_after_alloc = update_state_after_alloc

import vllm.plugins  # noqa: E402

vllm.plugins.load_general_plugins()  # as EngineCore.__init__ does
vllm.plugins.plugins_loaded = False
vllm.plugins.load_general_plugins()  # and a worker in the same process: nothing twice

from kvbound.side.engine import Release  # noqa: E402 - kvbound is installed here

rel = Release()
with open(sys.argv[2]) as f:
    job = json.load(f)
out = {}
for name in ("clean", "defect"):
    defect["on"] = name == "defect"
    print("=== run %s" % name, file=sys.stderr, flush=True)
    eng = rel.build(job["layout"], job["params"])
    eng.run(job["requests"], job.get("max_steps", 20000))
    out[name] = {"requests": eng.stats["requests"], "loads": eng.stats["loads"],
                 "left": len(eng.sched.requests), "cases": [c["case"] for c in eng.cases]}
print("=== done", file=sys.stderr, flush=True)
print("KVBOUND-RESULT " + json.dumps(out), flush=True)
