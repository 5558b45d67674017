"""kvbound trace's faults (docs/trace.md "Faults"): failed transfers, refused stores, late
completions, stalls and evictions, each an engine setting off by default; what each release
takes; and real 0.33.0 runs where each fault's planted defect is caught by the kinds its
row names while a clean run of the same point reports nothing."""

from __future__ import annotations

import collections

import pytest

from kvbound.side.defects import BY_NAME
from kvbound.spec.versions import CAMPAIGN_RELEASES
from kvbound.trace import runner as R
from kvbound.trace.layouts import LAYOUTS, OVERRIDES, PARAM_NEEDS, parse_override
from kvbound.trace.space import support
from kvbound.trace.storecheck import judge_store_calls

FAULTS = ("fail_p", "store_fail_p", "refuse_p", "late_p", "late_steps", "stall_p", "evict_p")
FAULT_LAYOUTS = ("full-faults", "mamba-faults")
# the lookup's known efficiency classes (docs/lookup.md: the cross-group deferral of a hybrid
# whose attention key is HIT_PENDING, which a late store makes): not what the faults check
LOOKUP_EFFICIENCY = ("lookup:lost_hit", "lookup:needless_deferral")


def test_every_fault_is_an_engine_key_and_off_in_every_other_layout():
    assert set(FAULTS) <= set(OVERRIDES)
    assert parse_override("refuse_p=0.25") == ("refuse_p", 0.25) and parse_override("late_steps=9") == ("late_steps", 9)
    for name, lay in LAYOUTS.items():
        on = {k for k in FAULTS if lay.params().get(k)}
        if name in FAULT_LAYOUTS:
            assert on == {"refuse_p", "late_p", "late_steps", "evict_p"}, name
        elif not name.endswith(("-scripted", "-stalled")):
            assert not on, (name, on)


def test_a_failed_transfer_is_unsupported_on_every_release_in_one_line():
    for version in CAMPAIGN_RELEASES:
        for key in ("fail_p", "store_fail_p"):
            line = support("full", version, {key: 0.1})
            assert line.startswith(f"vllm {version} cannot run layout full:") and "\n" not in line
            assert "offloading/worker.py:299-301" in line and "complete_store(success=False)" in line
        assert support("full", version, {"fail_p": 0.0}) is None  # off: nothing needed
    # the scripted tier's faults need its schedule-end hook (0.23 on)
    assert "on_schedule_end" in support("full", "0.22.1", {"refuse_p": 0.1})
    assert support("full", "0.23.0", {"refuse_p": 0.1}) is None
    assert set(PARAM_NEEDS) <= set(OVERRIDES)


def test_run_trace_refuses_a_failed_transfer_override_before_starting_an_engine():
    from kvbound.errors import LayoutUnsupported

    env = R.ReleaseEnv("0.33.0", "python", None)
    with pytest.raises(LayoutUnsupported, match="we currently do not support job failures"):
        R.run_trace(env, ["full"], 10, overrides={"store_fail_p": 0.1}, worker=object())  # no job runs


def test_a_refused_store_advances_nothing():
    """The store judge holds a refused prepare_store to "nothing advances" (every release
    ``continue``s past it to retry later) instead of setting it aside."""
    job = R.make_job("full-faults", (0, "x"), 1, 0, "sync")
    # step, rid, status, P, T, C, S, max_offload_tokens, allocated chunks, keyed chunks, before, after, refused
    call = [5, "1", "running", 64, 64, 64, 0, None, 4, 4, 1]
    assert judge_store_calls("0.33.0", job, {"store_calls": [call + [1, True]]})[0] == []
    bad, judged = judge_store_calls("0.33.0", job, {"store_calls": [call + [4, True]]})
    assert judged == 1 and bad[0]["check"] == "store:spec_disagreement" and bad[0]["spec"] == 1
    assert "refused" in bad[0]["message"]


# --- real vLLM 0.33.0 ------------------------------------------------------------------------

def _run(w, layout, overrides=None, n=80, seed=3, tag="mut"):
    job = R.make_job(layout, (seed, tag), n, 0, "sync", overrides)
    job["max_steps"] = 3000
    res = w.job(job)
    found, _ = R.check_result("0.33.0", layout, job, res)
    return collections.Counter(f.kind for f in found), res


def test_the_fault_layouts_reach_their_faults_and_report_nothing(workers):
    """Each fault strikes (refusals, late jobs, one held past its request's preemption,
    evictions of confirmed chunks), loads still happen, and no check fires."""
    env, w = workers("0.33.0")
    for layout in FAULT_LAYOUTS:
        got, res = _run(w, layout, n=120, seed=1)
        assert not {k: v for k, v in got.items() if k not in LOOKUP_EFFICIENCY}, (layout, dict(got))
        st = res["stats"]
        assert min(st["tier_refused"], st["late_jobs"], st["tier_evicted"], st["loads"]) > 0, (layout, st)
    held = collections.Counter()
    for seed in range(4):  # a late job in flight at its request's preemption: 3 in these 480 requests
        _, res = _run(w, "full-faults", n=120, seed=seed, tag="sync")
        held.update({k: res["stats"].get(k, 0) for k in ("preemptions", "late_past_preemption")})
    assert held["preemptions"] > 0 and held["late_past_preemption"] > 0, held


def test_off_faults_leave_a_run_as_it_was(workers):
    """A fault setting at 0 draws nothing: the run is the run without it, byte for byte."""
    env, w = workers("0.33.0")
    _, plain = _run(w, "full", n=40)
    _, off = _run(w, "full", {"late_steps": 16, "late_p": 0.0, "store_fail_p": 0.0}, n=40)
    drop = ("seconds", "cpu_seconds", "step_cpu")  # measurements of this machine
    assert {k: v for k, v in off.items() if k not in drop} == {k: v for k, v in plain.items() if k not in drop}


@pytest.mark.parametrize("key", ["fail_p", "store_fail_p"])
def test_a_failed_transfer_trips_the_workers_assert(key, workers):
    """What the unsupported line says, on the real worker: a failed load or store job is the
    connector's `assert transfer_result.success` (0.33.0 offloading/worker.py:301)."""
    env, w = workers("0.33.0")
    job = R.make_job("full", (3, "fail"), 80, 0, "sync", {key: 0.3})
    res = w.job(job)
    assert not res["ok"] and res["assert_site"]["function"] == "get_finished"
    assert "assert transfer_result.success" in res["assert_site"]["statement"]


@pytest.mark.parametrize("name", ["failed_transfer_reported_ok", "late_reported_on_time", "advance_on_refusal",
                                  "refusal_leaks"])
def test_a_planted_fault_defect_is_caught_and_its_clean_point_is_not(name, workers):
    d = BY_NAME[name]
    env, w = workers(d.release)
    got, _ = _run(w, d.layout, {"mutant": name})
    assert set(d.catches) <= set(got), dict(got)
    clean, _ = _run(w, d.layout)
    assert not clean, dict(clean)
