"""A secondary tier that cannot start or stop (engine settings tier_start_fail and tier_stop_fail,
side/failed_start.py): where the table runs them, clean on the releases whose tiering spec releases
what a failed start took (vLLM #51227, from 0.28.0) and gives every tier its shutdown (#52290, from
0.30.0), the leak found where it did not (0.27.0, 0.29.0), a planted one caught on the latest release,
and nothing the failed start left outliving the run."""

from __future__ import annotations

import os
import re

from kvbound.side.defects import BY_NAME
from kvbound.trace import runner as R
from kvbound.trace.space import SWEEP, support

POINT = "full-tiering-fs@shadow=false,tier_start_fail=true"
KIND = "lifecycle:failed_start_unclean"
REGION = KIND + "[its shared region left in /dev/shm]"
STOP_POINT = "full-tiering-fs@shadow=false,tier_stop_fail=true"
STOP_KIND = "lifecycle:failed_stop_unclean"


def _run(w, version, mutant=None, point=POINT, kind=KIND):
    job = R.make_job(point, (7, "failed-start"), 20, 0, "sync", {"mutant": mutant} if mutant else None)
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    left = [v for v in res.get("violations", ()) if v["check"] == kind]
    # what the failed start left, the harness released: no region it names is still in /dev/shm
    for v in left:
        name = re.match(r".*?: (vllm_offload_\S+\.mmap) ", v["message"])
        assert name is None or not os.path.exists(os.path.join("/dev/shm", name.group(1))), v
    return res, {f.key() for f in found if f.key().startswith(kind)}


def test_a_failed_start_runs_where_the_table_says():
    assert POINT in SWEEP
    assert support(POINT, "0.24.0") is None and support(POINT, "0.33.0") is None
    assert support(POINT, "0.22.1") is None  # the file tier's pool held on the step clock there too
    assert "0.22.1 v1/kv_offload/tiering/spec.py" in support(POINT, "0.21.0")
    assert "tier_start_fail applies to the tiering spec" in support("full@tier_start_fail=true", "0.33.0")
    assert STOP_POINT in SWEEP and support(STOP_POINT, "0.24.0") is None
    assert support("full@offload_spec=tiering-example,shadow=false,tier_stop_fail=true", "0.22.1") is None
    assert "tier_stop_fail applies to the tiering spec" in support("full@tier_stop_fail=true", "0.33.0")


def test_the_latest_release_releases_a_failed_start_and_a_kept_region_is_caught(workers):
    """0.33.0: the failed start shuts its file tier and its primary tier down and its region's file is
    gone; the run then runs; a primary tier whose shutdown keeps its region (planted) is caught."""
    defect = BY_NAME["failed_start_keeps_region"]
    assert defect.layout == POINT
    env, w = workers(defect.release)
    res, keys = _run(w, defect.release)
    assert res["ok"] and res["stats"]["failed_start_left"] == 0 and keys == set(), (res.get("error"), keys)
    assert res["stats"]["steps"] > 0
    res, keys = _run(w, defect.release, defect.name)
    assert set(defect.catches) <= {k.split("[")[0] for k in keys} and keys == {REGION}, keys


def test_the_leak_is_found_where_vllm_had_it_and_gone_where_it_fixed_it(workers):
    """0.27.0 leaves the file tier running and the region's file in /dev/shm after a failed start;
    0.28.0 (#51227) leaves neither."""
    res, keys = _run(workers("0.27.0")[1], "0.27.0")
    assert res["ok"] and res["stats"]["failed_start_left"] == 2, res.get("setup_error") or res.get("error")
    assert keys == {REGION, KIND + "[tier fs not shut down]"}, keys
    res, keys = _run(workers("0.28.0")[1], "0.28.0")
    assert res["ok"] and res["stats"]["failed_start_left"] == 0 and res["stats"]["steps"] > 0, res.get("setup_error")
    assert keys == set(), keys


def test_a_failed_stop_gives_every_tier_its_shutdown_and_one_that_does_not_is_caught(workers):
    """0.33.0: a secondary tier whose shutdown fails before the file tier; the teardown raises its
    error and still shuts the file tier down; a manager that stops at the failure (planted, as before
    vLLM #52290) is caught."""
    defect = BY_NAME["failed_stop_ends_early"]
    assert defect.layout == STOP_POINT
    env, w = workers(defect.release)
    res, keys = _run(w, defect.release, point=STOP_POINT, kind=STOP_KIND)
    assert res["ok"] and res["stats"]["failed_stop_left"] == 0 and keys == set(), (res.get("error"), keys)
    assert res["stats"]["steps"] > 0
    res, keys = _run(w, defect.release, defect.name, STOP_POINT, STOP_KIND)
    assert keys == {STOP_KIND + "[tier fs not shut down]"}, keys


def test_a_failed_stop_leaves_the_later_tiers_running_where_vllm_did_and_not_where_it_fixed_it(workers):
    """0.29.0 ends its teardown at the first tier that fails: the file tier after it is never shut
    down; 0.30.0 (#52290) shuts it down."""
    res, keys = _run(workers("0.29.0")[1], "0.29.0", point=STOP_POINT, kind=STOP_KIND)
    assert res["ok"] and res["stats"]["failed_stop_left"] == 1, res.get("setup_error") or res.get("error")
    assert keys == {STOP_KIND + "[tier fs not shut down]"}, keys
    res, keys = _run(workers("0.30.0")[1], "0.30.0", point=STOP_POINT, kind=STOP_KIND)
    assert res["ok"] and res["stats"]["failed_stop_left"] == 0 and res["stats"]["steps"] > 0, res.get("error")
    assert keys == set(), keys


SET_UP_FAULT = r'''
import json, os, sys, threading
sys.path.insert(0, sys.argv[1])
import worker  # the side package, as a worker loads it
from kvbound_side import compose, engine
from vllm.v1.kv_offload.cpu import shared_offload_region as sor
job, made = json.loads(sys.argv[2]), []
real_init, real_subscribe = sor.SharedOffloadRegion.__init__, compose.subscribe_tiers
def init(self, *a, **k):
    real_init(self, *a, **k)
    made.append(self.mmap_path)
def subscribe_then_fail(eng, tap):
    real_subscribe(eng, tap)
    raise RuntimeError("a planted fault of the harness")
sor.SharedOffloadRegion.__init__, compose.subscribe_tiers = init, subscribe_then_fail
rel = engine.Release()
threads = threading.active_count()
try:
    rel.build(job["layout"], job["params"])
except RuntimeError as e:
    raised = str(e)
bp = sys.modules["vllm.v1.kv_offload.tiering.backpressure"]
print(json.dumps({"raised": raised, "regions": made, "left": [p for p in made if os.path.exists(p)],
                  "threads": threading.active_count() - threads, "clock": type(bp.time).__name__}))
'''


def test_a_fault_while_the_engine_is_set_up_releases_what_vllm_started(workers, tmp_path):
    """A harness fault after the file tier, its backpressure clock and the region exist (planted in
    the side package, in the release's venv): the fault is raised as it was, and the tiering manager's
    threads, its /dev/shm region and the patched clock are released (before, all three leaked for the
    life of the worker, the region past it)."""
    import json
    import subprocess
    from pathlib import Path

    env, _ = workers("0.33.0")
    job = R.make_job("full-tiering-fs@shadow=false,tier_backpressure=throttled", (7, "set-up"), 1, 0, "sync")
    script = tmp_path / "set_up_fault.py"
    script.write_text(SET_UP_FAULT)
    side = str(Path(R.__file__).resolve().parents[1] / "side")
    out = subprocess.run([env.python, "-P", str(script), side, json.dumps(job)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=env.tree or ""), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["raised"] == "a planted fault of the harness" and len(got["regions"]) == 1, got
    assert got["left"] == [] and got["threads"] == 0 and got["clock"] == "module", got
