"""A secondary tier that cannot start (engine setting tier_start_fail, side/failed_start.py): where
the table runs it, clean on the releases whose tiering spec releases what a failed start took (vLLM
#51227, from 0.28.0), the leak found where it did not (0.27.0), a planted one caught on the latest
release, and nothing the failed start left outliving the run."""

from __future__ import annotations

import os
import re

from kvbound.side.defects import BY_NAME
from kvbound.trace import runner as R
from kvbound.trace.space import SWEEP, support

POINT = "full-tiering-fs@shadow=false,tier_start_fail=true"
KIND = "lifecycle:failed_start_unclean"
REGION = KIND + "[its shared region left in /dev/shm]"


def _run(w, version, mutant=None):
    job = R.make_job(POINT, (7, "failed-start"), 20, 0, "sync", {"mutant": mutant} if mutant else None)
    res = w.job(job)
    found, _ = R.check_result(version, POINT, job, res)
    left = [v for v in res.get("violations", ()) if v["check"] == KIND]
    # what the failed start left, the harness released: no region it names is still in /dev/shm
    for v in left:
        name = re.match(r".*?: (vllm_offload_\S+\.mmap) ", v["message"])
        assert name is None or not os.path.exists(os.path.join("/dev/shm", name.group(1))), v
    return res, {f.key() for f in found if f.key().startswith(KIND)}


def test_a_failed_start_runs_where_the_table_says():
    assert POINT in SWEEP
    assert support(POINT, "0.24.0") is None and support(POINT, "0.33.0") is None
    assert "drain_jobs" in support(POINT, "0.23.0")
    assert "tier_start_fail applies to the tiering spec" in support("full@tier_start_fail=true", "0.33.0")


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
    _, keys = _run(workers("0.27.0")[1], "0.27.0")
    assert keys == {REGION, KIND + "[tier fs not shut down]"}, keys
    _, keys = _run(workers("0.28.0")[1], "0.28.0")
    assert keys == set(), keys
