"""The configuration axes of issue 25 item 1 that compose the connector: composition (inside vLLM's
MultiConnector after a P/D consumer), offload spec and tier (TieringOffloadingSpec with its real
file-system tier), the Mamba cache mode; each found by a planted defect on a real release and
clean on the same point without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbound.side.defects import BY_NAME
from kvbound.trace import runner as R
from kvbound.trace import tracefile as TF
from kvbound.trace.layouts import LAYOUTS
from kvbound.trace.space import SWEEP, support

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "trace-findings"
NEW = {"full-multi-pd": "composition", "swa-multi-pd": "composition", "full-tiering-fs": "offload_spec",
       "mamba-all": "mamba_cache_mode", "hisparse": "composition", "hisparse-swa": "composition"}


def test_the_new_axes_leave_every_other_layouts_job_as_it_was():
    for name, lay in LAYOUTS.items():
        job = lay.job_layout()
        fields = {"composition", "offload_spec", "mamba_cache_mode"} & set(job)
        assert fields == ({NEW[name]} if name in NEW else set()), name
        assert ("pd_p" in lay.params()) == (lay.composition == "multi-pd"), name


def test_each_axis_value_runs_where_the_table_says():
    assert support("mamba-all", "0.23.0") is None and support("mamba-all", "0.31.0") is None
    assert support("full-tiering-fs", "0.30.0") is None and support("full-multi-pd", "0.21.0") is None


def _run(w, version, layout, mutant=None, n=80):
    job = R.make_job(layout, (5, "axis"), n, 0, "sync", {"mutant": mutant} if mutant else None)
    job["max_steps"] = 3000
    res = w.job(job)
    found, _ = R.check_result(version, layout, job, res)
    return res, {f.kind for f in found}


@pytest.mark.parametrize("point,hma", [("full-multi-pd", True), ("full-multi-pd@pd_hma=false", False)])
def test_the_consumer_finishes_through_the_path_its_hma_support_picks(point, hma, workers):
    """With SupportsHMA the MultiConnector finishes every child through request_finished_all_groups;
    without it (vLLM turns the hybrid allocator off) through each child's request_finished."""
    env, w = workers("0.33.0")
    res, kinds = _run(w, "0.33.0", point)
    st = res["stats"]
    assert kinds == set() and st["requests"] > 0, kinds
    finished = (st["pd_finished_one_group"], st["pd_finished_all_groups"])
    assert (finished[0] == 0 and finished[1] > 0) if hma else (finished[0] > 0 and finished[1] == 0), st


def test_a_consumer_without_hma_goes_beside_one_group_only():
    from kvbound.trace.space import resolve

    assert support("full-multi-pd@pd_hma=false", "0.33.0") is None
    assert resolve("full-multi-pd@pd_hma=false").params()["pd_hma"] is False
    for point in ("swa-multi-pd@pd_hma=false", "full@pd_hma=false"):
        assert "pd_hma applies to composition multi-pd on one KV-cache group" in support(point, "0.33.0"), point


@pytest.mark.parametrize("layout,version,defect,counter", [
    ("full-multi-pd", "0.33.0", "pd_finish_before_write", "pd_loads"),
    ("full-multi-pd@pd_hma=false", "0.33.0", "pd_finish_before_write", "pd_loads"),
    ("full-tiering-fs", "0.33.0", "promote_reversed_keys", "loads"),
    ("mamba-all", "0.31.0", "load_dst_shift", "loads"),
])
def test_an_axis_finds_its_planted_defect_and_its_clean_point_none(layout, version, defect, counter, workers):
    env, w = workers(version)
    res, kinds = _run(w, version, layout)
    assert kinds == set(), kinds
    assert res["stats"][counter] > 0
    _, kinds = _run(w, version, layout, defect)
    assert set(BY_NAME[defect].catches) <= kinds


def test_the_scheduler_axis_runs_every_segment_of_its_point_on_its_scheduler():
    """A point's ``scheduler`` overrides the run's (a campaign alternates per segment): every job of
    ``full@scheduler=async`` is an async one, of ``full`` the run's, and a point without the axis
    keeps the run's alternation."""
    from kvbound.trace.space import resolve

    class Recorder:  # stands for the worker: records the jobs run_trace sends, answers an empty segment
        def __init__(self):
            self.jobs = []

        def job(self, job):
            self.jobs.append(job)
            return {"calls": [], "stats": {}, "findings": []}

    rec = Recorder()
    R.run_trace(type("Env", (), {"version": "0.33.0"})(), ["full@scheduler=async", "full", "full@scheduler=sync"],
                800, sched="both", worker=rec)
    by_point = [(j["layout"]["name"], j["params"]["async"]) for j in rec.jobs]
    assert by_point == [("full@scheduler=async", True), ("full@scheduler=async", True), ("full", False),
                        ("full", True), ("full@scheduler=sync", False), ("full@scheduler=sync", False)]
    assert resolve("full@scheduler=async").scheduler == "async" and resolve("full").scheduler is None


def test_an_async_point_finds_a_planted_store_defect_and_its_clean_run_none(workers):
    """``full@scheduler=async`` on the real 0.33.0 AsyncScheduler: the store premises restated for
    async hold on a clean run, and an allocator that holds blocks past the lookahead breaks
    ``store-allocated-scheduled`` (the planted ``allocate_past_lookahead``)."""
    env, w = workers("0.33.0")
    point = "full@scheduler=async"
    _, clean = R.run_trace(env, [point], 80, 5, worker=w)
    assert clean == [], [f.kind for f in clean]
    _, found = R.run_trace(env, [point], 80, 5, worker=w, overrides={"mutant": "allocate_past_lookahead"})
    assert {f.kind for f in found} >= set(BY_NAME["allocate_past_lookahead"].catches)
    assert all(f.segment["params"]["async"] for f in found)


def test_a_lost_tier_file_fails_its_promotion_and_vllm_keeps_every_promise(workers):
    """tier_lose_p: files of the file-system tier go missing before a promotion reads them; vLLM's
    partial keep and its recompute (fs/manager.py:239-315, tiering/manager.py:460-499) are judged by
    every check and found clean; a tier that reported such a read a success would serve chunks holding
    nothing (the planted lost_read_reported_ok, data:wrong_kv)."""
    defect = BY_NAME["lost_read_reported_ok"]
    env, w = workers(defect.release)
    res, kinds = _run(w, defect.release, defect.layout, n=200)
    assert kinds == set(), kinds
    st = res["stats"]
    assert st["tier_lost_files"] > 0 and st["tier_failed_reads"] > 0 and st["loads"] > 0, st
    _, kinds = _run(w, defect.release, defect.layout, defect.name, n=200)
    assert set(defect.catches) <= kinds, kinds
    assert "full-tiering-fs@tier_lose_p=0.1,kv_events=true" in SWEEP
    assert "tier_lose_p applies to the tiering spec" in support("full@tier_lose_p=0.1", "0.33.0")


def test_a_key_the_example_tier_loses_fails_its_promotion_and_the_cpu_tier_frees_its_chunks(workers):
    """tier_lose_p on vLLM's example tier (0.22.1): it forgets a key a promotion is about to read, the
    job fails, and the tiering manager frees the primary chunks it was to fill through the CPU tier's
    complete_store(success=False) (0.22.1 tiering/manager.py:87,203-207): every check finds the run
    clean; a tier that never reported the failed job (planted failed_promotion_never_reported) leaves
    the requests waiting on those chunks for ever."""
    defect = BY_NAME["failed_promotion_never_reported"]
    env, w = workers(defect.release)
    res, kinds = _run(w, defect.release, defect.layout, n=200)
    assert kinds == set(), kinds
    st = res["stats"]
    assert st["tier_lost_keys"] > 0 and st["tier_failed_reads"] == st["tier_lost_keys"] and st["loads"] > 0, st
    _, kinds = _run(w, defect.release, defect.layout, defect.name, n=200)
    assert set(defect.catches) <= kinds, kinds
    assert defect.layout in SWEEP and support(defect.layout, "0.22.1") is None


def test_a_torn_tier_file_is_removed_at_its_short_read_and_one_kept_is_caught(workers):
    """tier_torn_p: a file a promotion is about to read is cut to half its bytes; vLLM's read comes up
    short, it removes the file and fails the read there (0.33.0 tiering/fs/io.py:148-160), and every check
    finds the run clean, the same job twice the same; a tier that kept the short file (planted
    torn_file_kept) is caught as store:torn_file_kept."""
    defect = BY_NAME["torn_file_kept"]
    env, w = workers(defect.release)
    res, kinds = _run(w, defect.release, defect.layout, n=200)
    assert kinds == set(), kinds
    st = res["stats"]
    assert st["tier_torn_files"] > 5 and st["tier_failed_reads"] == st["tier_torn_files"], st
    assert _run(w, defect.release, defect.layout, n=200)[0]["stats"] == st
    _, kinds = _run(w, defect.release, defect.layout, defect.name, n=200)
    assert set(defect.catches) == kinds, kinds
    assert defect.layout in SWEEP and support(defect.layout, "0.30.0") is None
    assert "tier_torn_p applies to the tiering spec" in support("full@tier_torn_p=0.1", "0.33.0")


LATE_LOOKUP = FINDINGS / ("0-29-0-full-tiering-fs-shadow-false-prefix-burst-p-0-5-abort-p-0-2-tier-lookup-late-p-0-5-"
                          "crash-exception-drain-results-3req.json")


@pytest.mark.parametrize("version,mutant,want", [
    ("0.29.0", None, "crash:exception@drain_results:assert state.result is None"),  # the real defect
    ("0.27.0", None, None),  # no assert: the late answer is applied silently (0.27.0 async_lookup.py:160-173)
    ("0.30.0", None, None),  # probe generations: the late answer is discarded
    ("0.33.0", None, None),
    ("0.33.0", "stale_lookup_applied", "crash:exception@drain_results:assert state.phase is LookupPhase.IN_FLIGHT"),
])
def test_a_late_lookup_answer_after_its_request_finished(version, mutant, want, workers):
    """tier_lookup_late_p: the file tier's lookup thread answers a step's probes late_steps steps
    late (side/tier_clock.py). Three requests: one aborted while its probe of a shared prefix is out,
    another looking the prefix up before the late answer lands. 0.28-0.29 drop the state at cleanup
    and the late answer fills the new one, whose own answer trips drain_results's assert
    (async_lookup.py:177); 0.30+ keep the state until its answer (generations); the same traffic
    on 0.33.0 with that fix undone (the planted stale_lookup_applied) is caught."""
    f = TF.load(LATE_LOOKUP)
    env, w = workers(version)
    job = dict(f.segment, params=dict(f.segment["params"], **({"mutant": mutant} if mutant else {})))
    res = w.job(job)
    found, _ = R.check_result(version, f.layout, job, res)
    assert res["stats"]["tier_lookups_late"] > 0
    assert sorted(g.key() for g in found) == ([want] if want else []), [g.key() for g in found]
    assert BY_NAME["stale_lookup_applied"].layout == f.layout and f.layout in SWEEP


EXAMPLE_TIER = "full@offload_spec=tiering-example,shadow=false,cpu_chunks=32"


def test_the_example_tier_runs_where_the_table_says_and_never_with_shadow_kv():
    assert support(EXAMPLE_TIER, "0.22.1") is None and support(EXAMPLE_TIER, "0.33.0") is None
    why = support(EXAMPLE_TIER, "0.21.0")
    assert "file-system and example tiers, arrived in 0.22.1 (0.22.1 v1/kv_offload/tiering/spec.py" in why
    why = support("full@offload_spec=tiering-example,cpu_chunks=32", "0.33.0")
    assert why.startswith("point full@offload_spec=tiering-example,cpu_chunks=32: shadow KV cannot follow the example tier")
    assert EXAMPLE_TIER in SWEEP and BY_NAME["promotion_never_reported"].layout == EXAMPLE_TIER


@pytest.mark.parametrize("version", ["0.22.1", "0.32.0"])
def test_the_example_tier_promotes_and_a_promotion_never_reported_is_caught(version, workers):
    """offload_spec tiering-example: the tiering manager behind vLLM's in-memory example tier, on
    0.22.1 (where the file tier cannot run on the step clock) and 0.32.0: clean, its promotions
    loaded; a tier that never reports a promotion finished (planted) leaves a request waiting on
    its primary chunks for ever (liveness:stuck_request). (0.33.0 finds its LRU promotion livelock
    here too, behind the example tier: docs/findings.md.)"""
    defect = BY_NAME["promotion_never_reported"]
    env, w = workers(version)
    res, kinds = _run(w, version, EXAMPLE_TIER, n=200)
    assert kinds == set() and res["stats"]["loads"] > 0, (kinds, res["stats"])
    _, kinds = _run(w, version, EXAMPLE_TIER, defect.name, n=200)
    assert set(defect.catches) <= kinds, kinds


BACKPRESSURE = "full-tiering-fs@tier_backpressure=throttled,tier_store_slow_p=0.3"


def test_the_file_tiers_backpressure_runs_where_the_table_says():
    assert support(BACKPRESSURE, "0.31.0") is None and support(BACKPRESSURE, "0.33.0") is None
    assert "backpressure detector arrived in 0.31" in support(BACKPRESSURE, "0.30.0")
    assert "tier_backpressure applies to the tiering spec" in support("full@tier_backpressure=drop", "0.33.0")
    assert BACKPRESSURE in SWEEP and BY_NAME["backpressure_ignored"].layout == BACKPRESSURE


def test_a_slow_file_tier_is_throttled_and_a_manager_that_stores_past_a_refusal_is_caught(workers):
    """tier_backpressure, tier_store_slow_p: vLLM's EMABackpressureDetector on the step clock
    (side/tier_pressure.py) measures slow stores, comes under pressure and refuses stores; the
    manager keeps every refusal (clean, and the same job twice gives the same run); a manager that
    asks and stores all the same (planted backpressure_ignored) is caught."""
    defect = BY_NAME["backpressure_ignored"]
    env, w = workers(defect.release)
    res, kinds = _run(w, defect.release, defect.layout, n=200)
    assert kinds == set(), kinds
    st = res["stats"]
    assert st["tier_stores_slow"] > 0 and st["tier_stores_dropped"] > 0, st
    again, _ = _run(w, defect.release, defect.layout, n=200)
    assert again["stats"] == st
    _, kinds = _run(w, defect.release, defect.layout, defect.name, n=200)
    assert set(defect.catches) <= kinds, kinds


def test_the_step_clock_reads_steps_and_is_put_back():
    import types

    from kvbound.side import tier_pressure as TP

    module = types.SimpleNamespace(time=__import__("time"))
    clock = TP.StepTime(module)
    module.time = clock
    assert clock.monotonic() == TP.START_S and clock.sleep is module.time.real.sleep
    clock.steps = 20  # the detector's 2-s half-life
    assert clock.monotonic() == TP.START_S + 2.0
    TP.restore(types.SimpleNamespace(step_time=clock))
    assert module.time is clock.real
    assert TP.tier_config({"tier_backpressure": "drop"})["policy_cls"] == "DropStorePolicy"
    assert TP.tier_config({}) is None


def test_a_full_disk_fails_file_tier_stores_and_a_tier_that_hides_the_failure_is_caught(workers):
    """tier_store_fail_p: a store job to the file tier fails with ENOSPC in its I/O thread
    (side/tier_faults.py); vLLM unpins the primary chunks the cascade read and the run drains
    clean, no chunk pinned; a tier that never reports the failed job (planted
    failed_store_never_reported) leaves them pinned (lifecycle:tier_chunks_pinned)."""
    defect = BY_NAME["failed_store_never_reported"]
    env, w = workers(defect.release)
    res, kinds = _run(w, defect.release, defect.layout, n=200)
    assert kinds == set(), kinds
    assert res["stats"]["tier_failed_stores"] > 0 and res["stats"]["loads"] > 0, res["stats"]
    _, kinds = _run(w, defect.release, defect.layout, defect.name, n=200)
    assert set(defect.catches) <= kinds, kinds
    assert {"full-tiering-fs@shadow=false,tier_store_fail_p=0.3,kv_events=true",
            "full-tiering-fs@tier_store_fail_p=0.3,tier_backpressure=throttled"} <= set(SWEEP)


def test_slow_stores_need_a_detector():
    why = support("full-tiering-fs@tier_store_slow_p=0.3", "0.33.0")
    assert why.endswith("tier_store_slow_p slows what a backpressure detector measures; set tier_backpressure")


FAILED_STORES = FINDINGS / "0-29-0-full-tiering-fs-shadow-false-tier-store-fail-p-0-3-kv-events-true-liveness-stuck-request-39req.json"


@pytest.mark.parametrize("version,over,stuck", [
    ("0.29.0", {}, True),
    ("0.29.0", {"cpu_chunks": 256}, False),  # a primary tier larger than request 193's 36 chunks
    ("0.33.0", {}, True),
    ("0.25.1", {}, False),
])
def test_the_failed_store_point_reaches_the_hit_larger_livelock(version, over, stuck, workers):
    """CI's point full-tiering-fs@shadow=false,tier_store_fail_p=0.3,kv_events=true on 0.29.0, shrunk to
    39 requests: request 193 (36 chunks, a 32-chunk primary tier) deferred for ever on its own
    promotions, the hit-larger-than-primary livelock (docs/findings.md): on 0.27.0 - 0.33.0, not with a
    tier that holds the request."""
    f = TF.load(FAILED_STORES)
    env, w = workers(version)
    job = dict(f.segment, params=dict(f.segment["params"], **over))
    found, _ = R.check_result(version, f.layout, job, w.job(job))
    assert ("liveness:stuck_request" in {g.key() for g in found}) is stuck, [g.key() for g in found]
