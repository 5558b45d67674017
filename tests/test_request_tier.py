"""A secondary tier that asks for request-level offload (engine setting request_tier_p,
side/request_tier.py) and the lifecycle every secondary tier is promised (side/tier_lifecycle.py):
where the table runs it, clean on the latest release, a planted drop caught, and the two upstream
defects the checks were not written from found on the releases that had them (vLLM #53062, fixed
in 0.29.0 by #53329; a tier told a request finished before its stores cascade, fixed by #45823 and
#46284) and gone where they were fixed."""

from __future__ import annotations

from kvbound.side.defects import BY_NAME, REQUEST_TIER_POINT
from kvbound.trace import runner as R
from kvbound.trace.space import SWEEP, support

EXAMPLE_POINT = "full@offload_spec=tiering-example,shadow=false,prefix_burst_p=0.5,request_tier_p=0.5"
INCOMPLETE = "store:request_tier_incomplete[held by the primary when offered]"
AFTER_FINISH = "lifecycle:tier_call_after_finish[submit_store to KvboundRequestLevelTier]"


def _keys(w, version, point, mutant=None, n=200):
    job = R.make_job(point, (7, "request-tier"), n, 0, "sync", {"mutant": mutant} if mutant else None)
    job["max_steps"] = 5000
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    return res, {f.key() for f in found}


def test_the_request_level_tier_runs_where_the_table_says():
    assert EXAMPLE_POINT in SWEEP and REQUEST_TIER_POINT in SWEEP
    assert support(EXAMPLE_POINT, "0.23.0") is None and support(REQUEST_TIER_POINT, "0.30.0") is None
    assert "request-level offload (OffloadPolicy.REQUEST_LEVEL) arrived in 0.23" in support(EXAMPLE_POINT, "0.22.1")
    assert "request_tier_p applies to the tiering spec" in support("full@request_tier_p=0.5", "0.33.0")


def test_the_latest_release_sends_a_request_level_tier_every_chunk_and_a_dropped_cascade_is_caught(workers):
    """0.33.0, the file tier and a request-level tier on half the requests under shared-prefix
    bursts: the tier gets chunks of those requests, none owed is missing and none comes after a
    finish, the same job twice runs the same; a manager that drops the chunks whose primary write is
    in flight from the cascade (planted) is caught."""
    defect = BY_NAME["request_cascade_drops_pending"]
    assert defect.layout == REQUEST_TIER_POINT
    env, w = workers(defect.release)
    res, keys = _keys(w, defect.release, defect.layout)
    st = res["stats"]
    assert keys == set(), keys
    assert st["request_level_requests"] > 20 and st["request_tier_keys"] > 100, st
    again, _ = _keys(w, defect.release, defect.layout)
    assert again["stats"] == st
    _, keys = _keys(w, defect.release, defect.layout, defect.name)
    assert set(defect.catches) <= {k.split("[")[0] for k in keys} and INCOMPLETE in keys, keys


def test_the_upstream_defects_are_found_where_vllm_had_them_and_gone_where_it_fixed_them(workers):
    """0.23.0: the tiers hear a request finish while its stores are in flight, and its cascades
    come after (#45823, #46284); 0.27.0 (its tier factory loads no tier by module path: the tier is
    registered by name) and 0.28.0 (by module path): a chunk whose primary write is in flight is
    dropped from the request-level cascade (#53062); 0.29.0 (#53329): neither."""
    found, res = {}, {}
    for version in ("0.23.0", "0.27.0", "0.28.0", "0.29.0"):
        res[version], found[version] = _keys(workers(version)[1], version, EXAMPLE_POINT)
    # a second run in the same worker, where the tier is registered by name already (a shrink's
    # reruns): the same run (once, the tier's config kept module_path, which 0.25.0 - 0.27.0 hand
    # to the tier's constructor, and every rerun failed to start)
    again, keys = _keys(workers("0.27.0")[1], "0.27.0", EXAMPLE_POINT)
    assert again["ok"] and keys == found["0.27.0"] and again["stats"] == res["0.27.0"]["stats"], again.get("setup_error")
    assert {INCOMPLETE, AFTER_FINISH} <= found["0.23.0"], found["0.23.0"]
    for version in ("0.27.0", "0.28.0"):
        assert INCOMPLETE in found[version] and not any(k.startswith(("lifecycle:", "crash:")) for k in found[version]), found
    assert found["0.29.0"] == set(), found["0.29.0"]


def test_a_tier_never_told_a_request_finished_is_caught(workers):
    """Every request a secondary tier saw begin it hears finish by the drain (clean on 0.33.0's file
    tier); a manager that forgets every fifth finish it owes a tier (planted) is caught."""
    defect = BY_NAME["tier_finish_dropped"]
    env, w = workers(defect.release)
    _, keys = _keys(w, defect.release, defect.layout)
    assert keys == set(), keys
    _, keys = _keys(w, defect.release, defect.layout, defect.name)
    assert "lifecycle:tier_request_not_finished[fs]" in keys, keys
