"""kvbound trace: the workload, the premises, the checks, shrinking, trace files,
and real runs of vLLM 0.29.0 / 0.33.0 (with planted defects the checks must report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbound.cli import main
from kvbound.conform import compare as C
from kvbound.side.defects import DEFECTS
from kvbound.spec import case_from_dict
from kvbound.trace import runner as R
from kvbound.trace import shrink as S
from kvbound.trace import tracefile as TF
from kvbound.options import ShrinkOptions
from kvbound.trace.layouts import LAYOUTS, max_prompt_tokens
from kvbound.trace.workload import prompt_len, truncate, workload


# --- the workload -------------------------------------------------------------------

def test_workload_is_seeded_and_walks_block_offsets():
    lay, eng = LAYOUTS["full"].job_layout(), LAYOUTS["full"].params()
    a, b = workload(300, 7, lay, eng), workload(300, 7, lay, eng)
    assert a == b
    assert workload(300, 8, lay, eng) != a
    cap = max_prompt_tokens(lay, eng)
    lens = [prompt_len(r["prompt"]) for r in a]
    assert all(1 <= n <= cap for n in lens)
    # organically varied: the prompt end lands on every offset within a 16-token block
    assert len({n % 16 for n in lens}) == 16
    kinds = {s[0] for r in a for s in r["prompt"]}
    assert kinds == {"doc", "out", "uniq"}  # shared documents, multi-turn follow-ups, fillers
    assert any(r["abort_after"] is not None for r in a)
    arrivals = [r["arrive"] for r in a]
    assert arrivals == sorted(arrivals) and len(set(arrivals)) < len(arrivals)  # bursts


def test_prefix_bursts_leave_the_organic_stream_and_share_a_seed():
    """prefix_burst_p: off, the workload is what it was (the organic stream draws nothing more);
    on, a burst is a seeding read and, a few steps later, 2..5 readers arriving in one step that
    re-read the seed's document to nearby depths."""
    lay = LAYOUTS["mamba-eagle-untagged"].job_layout()
    eng = LAYOUTS["mamba-eagle-untagged"].params()
    assert workload(200, 3, lay, dict(eng, prefix_burst_p=0.0)) == workload(200, 3, lay, eng)
    reqs = workload(200, 3, lay, dict(eng, prefix_burst_p=0.3))
    assert reqs == workload(200, 3, lay, dict(eng, prefix_burst_p=0.3))
    by_step = {}
    for r in reqs:
        by_step.setdefault(r["arrive"], []).append(r)
    bursts = 0
    for rs in by_step.values():
        docs = [r["prompt"][0] for r in rs if r["prompt"][0][0] == "doc"]
        for d in {x[1] for x in docs}:
            depths = [x[3] for x in docs if x[1] == d]
            if len(depths) >= 2 and len(set(depths)) >= 2 and max(depths) - min(depths) <= 3 * 64:
                bursts += 1
    assert bursts >= 5


def test_truncate_keeps_a_prefix():
    p = [["doc", 1, 0, 10], ["out", 3, 5], ["uniq", 4, 7]]
    assert truncate(p, 12) == [["doc", 1, 0, 10], ["out", 3, 2]]
    assert prompt_len(truncate(p, 100)) == 22


FA = lambda blocks: {"kind": "full_attention", "tokens_per_block": 16, "blocks": blocks}  # noqa: E731


# --- the host-side checks on a worker result ------------------------------------------

def _res(case, **kw):
    out = {"case": case, "step": 3, "outcome": "ok", "lookup": {"num_external_tokens": case["num_external_tokens"]},
           "sync_load_marked": False, "partial_tail_boundary": None}
    out.update(kw)
    return {"ok": True, "stats": {}, "violations": [], "cases": [out]}


GOOD = {"name": "c", "blocks_per_chunk": 1, "tokens_per_hash": 16, "num_prompt_tokens": 65,
        "num_locally_computed_tokens": 32, "num_external_tokens": 32, "sync_load": False,
        "groups": [FA(["H1", "H2", "U3", "U4"])]}
JOB = {"layout": {"name": "full"}, "params": {}, "requests": []}


def test_check_result_agrees_when_real_matches_the_spec():
    res = _res(GOOD, dst_block_ids=[3, 4], group_sizes=[2], block_indices=[2], keys=[[0, 2], [0, 3]])
    findings, tally = R.check_result("0.33.0", "full", JOB, res)
    assert findings == [] and tally == {"captured_calls": 1, "spec_agree": 1, "not_judged": 0}


def test_check_result_reports_disagreement_premise_lifecycle_and_exception():
    res = _res(GOOD, dst_block_ids=[4, 5], group_sizes=[2], block_indices=[2], keys=[[0, 2], [0, 3]])
    res["violations"] = [{"check": "lifecycle:load_into_null_block", "step": 2, "request": "1", "message": "m"}]
    res["ok"] = False
    res["error"] = "AssertionError: "
    bad = dict(GOOD, groups=[FA(["H1", "U2", "U3", "U4"])])
    res["cases"].append(_res(bad, dst_block_ids=[2, 3, 4], group_sizes=[3], block_indices=[1],
                             keys=[[0, 1], [0, 2], [0, 3]])["cases"][0])
    kinds = {f.kind for f in R.check_result("0.33.0", "full", JOB, res)[0]}
    assert {"plan:spec_disagreement", "lifecycle:load_into_null_block", "crash:exception",
            "premise:computed-hashed"} <= kinds


def test_a_chunk_aligned_boundary_key_is_that_chunks_key():
    """An EAGLE group's partial-tail proof key at 192 tokens (block 64) is the hash of the
    first 192 tokens: chunk 2's key. Names that differ only so are one key; others are not."""
    fa64 = lambda a, b: {"kind": "full_attention", "tokens_per_block": 64, "blocks": [f"H{a}", f"U{b}"]}  # noqa: E731
    case = case_from_dict(dict(GOOD, num_prompt_tokens=129, num_locally_computed_tokens=64, num_external_tokens=64,
                               groups=[fa64(1, 2), fa64(3, 4), fa64(5, 6)]), "edge")
    assert C.same_keys(case, [[0, "boundary", 176], [2, 2]], [[0, "boundary", 176], [2, "boundary", 192]])
    assert not C.same_keys(case, [[2, 1]], [[2, "boundary", 192]])
    assert not C.same_keys(case, [[2, 2]], [[2, "boundary", 176]])
    assert not C.same_keys(case, [[2, 2]], [[2, 2], [2, 3]])
    real = {"dst_block_ids": [30], "group_sizes": [1], "block_indices": [2], "keys": [[0, 2]]}
    res = _res(GOOD, **dict(real, keys=[[0, 1]]))  # GOOD's keys are chunks 2 and 3: a real disagreement
    assert [f.kind for f in R.check_result("0.33.0", "full", JOB, res)[0]] == ["plan:spec_disagreement"]


def test_a_setup_error_is_a_harness_fault_in_kvbound_and_a_crash_in_vllm():
    """An engine that cannot be built for a layout the release table supports: raised in
    kvbound's adapter it is harness:setup (never a vLLM finding); raised in vLLM's own
    validation it is crash:engine_build, a finding to investigate. Neither raises."""
    got, _ = R.check_result("0.33.0", "full", JOB, {"ok": False, "setup_error": "TypeError: x",
                                                     "harness_fault": True, "traceback": "tb"})
    assert [(f.kind, f.finding_class) for f in got] == [("harness:setup", "harness")]
    assert got[0].detail["traceback"] == "tb"
    got, _ = R.check_result("0.33.0", "full", JOB, {"ok": False, "setup_error": "AssertionError: y",
                                                     "harness_fault": False})
    assert [(f.kind, f.finding_class) for f in got] == [("crash:engine_build", "crash")]


def test_a_call_that_is_no_valid_case_is_a_finding_not_a_host_error():
    bad = json.loads(json.dumps(GOOD))
    bad["groups"][0]["blocks"] = ["H1", "H2", "U3", "U3"]  # block 3 in two places
    got, tally = R.check_result("0.33.0", "full", JOB, _res(bad))
    assert [f.kind for f in got] == ["premise:valid-call"] and tally["captured_calls"] == 1


def test_each_need_of_a_layout_is_a_release_table_column():
    from kvbound.spec.vocab import ReleaseFeatures

    assert all(need.column in ReleaseFeatures.__dataclass_fields__ for lay in LAYOUTS.values() for need in lay.needs)


@pytest.mark.parametrize("layout,version,why", [
    ("mamba-block", "0.22.1", "scheduler.py:286"),
    ("mamba", "0.25.1", "prefix_match_unit"),
    ("chunked", "0.27.0", "offloading/scheduler.py:118"),
    ("eagle", "0.28.0", "kv_cache_coordinator.py:682"),
    ("full-scripted", "0.22.1", "on_schedule_end"),
    ("swa-sync", "0.32.0", "sync_load_budget_bytes"),
    ("mamba-all", "0.32.0", "vllm/config/cache.py:63"),
    ("full-tiering-fs", "0.21.0", "tiering"),
    ("full-tiering-fs", "0.29.0", "chunk_ids"),
    ("full-tiering-fs@shadow=false,tier_lookup_late_p=0.5", "0.22.1", "tiering/fs/manager.py:45,133"),
])
def test_a_layout_the_release_cannot_run_is_one_line_with_the_vllm_lines(layout, version, why):
    from kvbound.trace.space import support

    line = support(layout, version)
    assert line and why in line and "\n" not in line and line.startswith(f"vllm {version} cannot run")


def test_every_layout_runs_on_033_and_the_first_supporting_release_of_each_need():
    from kvbound.trace.space import support

    assert all(support(name, "0.33.0") is None for name in LAYOUTS if name != "mamba-all")  # "all" left in 0.32
    assert support("mamba-block", "0.23.0") is None and support("mamba", "0.26.0") is None
    assert support("chunked", "0.28.0") is None and support("eagle", "0.29.0") is None
    # 0.21 - 0.22 have no offload_prompt_only and store decoded tokens: the store-all layouts run there
    assert [n for n in LAYOUTS if support(n, "0.21.0") is None] == ["full", "swa", "full-store-all", "swa-store-all",
                                                                          "full-multi-pd", "swa-multi-pd", "swa-mixed",
                                                                          "bpc2"]


def test_run_trace_skips_an_unsupported_layout_before_starting_an_engine():
    from kvbound.errors import LayoutUnsupported

    class _NoWorker:
        def job(self, job):
            raise AssertionError("no job may run")

    env = R.ReleaseEnv("0.25.1", "python", None)
    with pytest.raises(LayoutUnsupported, match="prefix_match_unit"):
        R.run_trace(env, ["mamba"], 10, worker=_NoWorker())


# --- shrinking: ddmin finds the two requests that together make the finding -------------

class _FakeWorker:
    def __init__(self, culprits):
        self.culprits, self.calls = set(culprits), 0

    def job(self, job):
        self.calls += 1
        ids = {r["id"] for r in job["requests"]}
        viol = [{"check": "lifecycle:blocks_not_freed", "step": 1, "request": None, "message": "x"}] \
            if self.culprits <= ids else []
        return {"ok": True, "stats": {}, "violations": viol, "cases": []}


def test_shrink_finds_the_minimal_pair():
    reqs = [{"id": i, "arrive": i} for i in range(40)]
    f = R.Finding("lifecycle:blocks_not_freed", "0.33.0", "full", {}, dict(JOB, requests=reqs))
    w = _FakeWorker({7, 23})
    got, runs = S.shrink(w, f, ShrinkOptions(budget=60))
    assert [r["id"] for r in got] == [7, 23]
    assert runs == w.calls <= 60


def test_shrinking_one_finding_leaves_the_pool_of_another_of_its_segment():
    """Two findings of one segment share its job; the smaller pool one shrink finds is that
    finding's own, so the next shrink (and its saved file) starts from the segment's pool."""
    job = dict(JOB, params={"num_gpu_blocks": 64}, requests=[{"id": i, "arrive": i} for i in range(40)])
    first = R.Finding("lifecycle:blocks_not_freed", "0.33.0", "full", {}, job)
    second = R.Finding("lifecycle:not_drained", "0.33.0", "full", {}, job)
    S.shrink(_FakeWorker({7, 23}), first, ShrinkOptions(budget=60))
    assert first.segment["params"]["num_gpu_blocks"] < 64
    assert second.segment["params"] == job["params"] == {"num_gpu_blocks": 64}


def test_tracefile_round_trip_and_bad_file(tmp_path):
    f = R.Finding("premise:aligned", "0.33.0", "mamba", {"detail": "x"}, dict(JOB, requests=[{"id": 1}]), GOOD)
    p = TF.save(f, tmp_path, shrunk_from=9, reruns=3)
    g = TF.load(p)
    assert (g.kind, g.release, g.layout, g.case, g.segment) == (f.kind, f.release, f.layout, f.case, f.segment)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "nope"}))
    assert main(["trace", "--replay", str(bad)]) == 2


def test_trace_needs_a_release(capsys):
    assert main(["trace"]) == 2
    assert "--vllm" in capsys.readouterr().err


# --- real vLLM ---------------------------------------------------------------------------

REAL = ("0.29.0", "0.33.0")
# Real vLLM efficiency findings of the lookup on drafter and scripted-tier layouts (a
# deferral on a chunk the EAGLE pop or a sibling group rules out; the EAGLE pop of 0.24-0.29
# losing a chunk, #52735): docs/lookup.md lists them; the checks here are about the rest.
LOOKUP_EFFICIENCY = ("lookup:lost_hit", "lookup:needless_deferral")


@pytest.mark.parametrize("version", REAL)
def test_real_trace_is_clean_and_loads(version, workers):
    env, w = workers(version)
    summaries, findings = R.run_trace(env, ["full", "mamba"], 120, seed=1, segment=60, worker=w)
    assert findings == [], [f.key() for f in findings]
    for s in summaries:
        assert s.stats["requests"] == 120
        assert s.stats["loads"] > 0 and s.captured_calls == s.stats["loads"]
        assert s.spec_agree == s.captured_calls and s.not_judged == 0  # every captured call equals the release's spec
    assert sum(s.stats["partial_hits"] for s in summaries) > 0


def test_real_trace_eagle_drafter_layouts(workers):
    """0.33.0 with an EAGLE drafter group (is_eagle_group, a speculative config): the fake
    drafter's tokens are scheduled and accepted, and on the Mamba hybrid partial tails
    load the drafter group at its proof margin; every check holds."""
    env, w = workers("0.33.0")
    summaries, findings = R.run_trace(env, ["eagle", "mamba-eagle", "mamba-eagle-untagged"], 120, seed=1,
                                      segment=60, worker=w)
    findings = [f for f in findings if f.kind not in LOOKUP_EFFICIENCY]
    assert findings == [], [f.key() for f in findings]
    by = {s.layout: s for s in summaries}
    for s in summaries:
        assert s.stats["requests"] == 120 and s.stats["loads"] > 0
        assert 0 < s.stats["accepted"] < s.stats["drafts"]
        assert s.spec_agree == s.captured_calls and s.not_judged == 0
    assert by["mamba-eagle"].stats["partial_tails"] > 0
    # the drafter group (2) of a partial tail is loaded by its proof key, past the boundary
    job = R.make_job("mamba-eagle", (1, "sync"), 120, 0, "sync")
    res = w.job(job)
    tails = [c for c in res["cases"] if c["partial_tail_boundary"] is not None and c.get("keys")]
    assert tails
    for c in tails:
        b = c["partial_tail_boundary"]
        assert [0, "boundary", b] in c["keys"] and [1, "boundary", b] in c["keys"]
        assert ([2, "boundary", b + 16] in c["keys"] or [2, (b + 16) // 64 - 1] in c["keys"])


def test_the_scripted_tier_answers_a_key_the_same_within_a_step(workers):
    """A tier's state holds within a scheduling pass (fakes.script_tier): at every captured lookup
    of the scripted layouts, a key asked more than once (the convergence loop, the partial-tail
    search) gets the same answer each time; HIT_PENDING and RETRY are still answered. (Before, a
    re-ask drew again: HIT then HIT_PENDING for one ready chunk, which the lookup contract took for
    a false hit of the patched lookup, docs/upstream/lookup-defers-on-unusable-pending-chunk.)"""
    env, w = workers("0.33.0")
    for layout in ("mamba-eagle-scripted", "swa-scripted"):
        res = w.job(R.make_job(layout, (1, "answers"), 80, 0, "sync", {}))
        tiers = [c["case"]["lookup"]["tier"] for c in res["lookups"]]
        repeated = [a for t in tiers for a in t.values() if len(a) > 1]
        assert repeated and all(len(set(a)) == 1 for a in repeated), layout
        assert any({"HIT_PENDING", "RETRY"} & set(a) for t in tiers for a in t.values()), layout


def test_real_trace_scripted_tier(workers):
    """0.33.0 with the scripted tier loaded by vLLM's spec factory (spec_name /
    spec_module_path): lookups answered HIT_PENDING and RETRY, chunks a lookup confirmed
    evicted before the request's next step; every check holds and loads still happen."""
    env, w = workers("0.33.0")
    summaries, findings = R.run_trace(env, ["full-scripted", "mamba-eagle-scripted"], 120, seed=1,
                                      segment=60, worker=w)
    findings = [f for f in findings if f.kind not in LOOKUP_EFFICIENCY]
    assert findings == [], [f.key() for f in findings]
    for s in summaries:
        assert s.stats["requests"] == 120 and s.stats["loads"] > 0
        assert min(s.stats["tier_pending"], s.stats["tier_retry"], s.stats["tier_evicted"]) > 0
        assert s.spec_agree == s.captured_calls and s.not_judged == 0
    plain, _ = R.run_trace(env, ["full"], 60, seed=1, segment=60, worker=w)
    assert plain[0].stats["tier_pending"] == plain[0].stats["tier_evicted"] == 0  # off unless scripted


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.module in ("engine", "fakes")], ids=lambda d: d.name)
def test_real_trace_reports_a_planted_defect(defect, workers):
    env, w = workers(defect.release)
    job = R.make_job(defect.layout, (3, "mut"), 80, 0, "sync", {"mutant": defect.name})
    job["max_steps"] = 3000
    found, _ = R.check_result(defect.release, defect.layout, job, w.job(job))
    assert set(defect.catches) <= {f.kind for f in found}


FINDINGS = Path(__file__).resolve().parents[1] / "docs" / "trace-findings"


@pytest.mark.parametrize("name,site", [
    ("0-26-0-mamba-vllm-exception-build-store-jobs-1req.json", "_build_store_jobs"),
    ("0-26-0-mamba-vllm-exception-update-state-after-alloc-5req.json", "update_state_after_alloc"),
    ("0-33-0-mamba-block-sync-vllm-exception-get-new-blocks-8req.json", "get_new_blocks"),
    ("0-33-0-mamba-block-sync-lifecycle-allocation-exceeds-reservation-3req.json", None),
    # issue 18: the waiting-queue deadlock (0.21-0.30) and 0.27's lagging-Mamba truncation
    ("0-27-0-mamba-eagle-untagged-vllm-exception-truncate-computed-blocks-7req.json", "truncate_computed_blocks"),
    ("0-26-0-mamba-eagle-vllm-exception-apply-cow-2req.json", "_apply_cow"),
    # a sliding-window chunk stored with its first sub-block unwritten, loaded whole (0.30-0.32)
    ("0-30-0-bpc2-data-wrong-kv-5req.json", None),
    # with a connector, 0.24-0.26 start a Mamba hybrid at the attention hit without its state
    ("0-24-0-mamba-block-data-wrong-kv-3req.json", None),
    # 0.21-0.23: an earlier group's external blocks are a later group's untouched hits
    ("0-21-0-bpc2-premise-valid-call-14req.json", None),
    # the calibration of the lookup checks: a HIT_PENDING right of a gap defers (docs/lookup.md)
    ("0-29-0-swa-scripted-lookup-needless-deferral-deferred-on-sliding-window-hit-pending-14req.json", None),
    # a multi-module MTP window (extra_retained_tokens): 0.28-0.30 load a window chunk the lookup
    # never confirmed (docs/findings.md); the tier then lacks it and prepare_load asserts
    ("0-29-0-swa-mtp-lifecycle-load-key-not-confirmed-3req.json", None),
    ("0-30-0-swa-mtp-vllm-exception-prepare-load-4req.json", "prepare_load"),
    # 0.26-0.33: a partial prefix hit copies (CoW) a block another request caches in the same step
    ("0-33-0-mamba-eagle-untagged-data-wrong-kv-4req.json", None),
    ("0-28-0-mamba-eagle-scripted-data-wrong-kv-5req.json", None),
    ("0-26-0-mamba-eagle-scripted-data-copy-of-uncomputed-tokens-2req.json", None),
    # 0.21-0.25.1 under async: a finished request's last chunk is never stored (docs/findings.md)
    ("0-23-0-full-store-all-store-lost-chunk-1req.json", None),
    # 0.21.0: the engine idles with a store in flight, never confirmed (flushed from 0.22.1)
    ("0-21-0-full-abort-p-0-0-lifecycle-transfer-not-finished-1req.json", None),
    # mamba-all (cache mode "all") on 0.24-0.26: the max(per_group_hits) start, the state block
    # holding another request's state instead of the null block
    ("0-26-0-mamba-all-data-wrong-kv-mamba-another-prefix-8req.json", None),
    # 0.27-0.28: a Mamba copy-on-write rewrites an in-flight store's source block (fenced in 0.29)
    ("0-27-0-mamba528-data-wrong-kv-mamba-unwritten-arrived-by-a-load-23req.json", None),
    ("0-28-0-mamba-store-source-rewritten-13req.json", None),  # the same defect on 0.28.0 (`mamba`)
    # 0.23.0: a whole-prompt hit on a Mamba (align) hybrid resumes at 447 on the state after 448
    ("0-23-0-mamba-block-data-wrong-kv-mamba-unwritten-arrived-by-a-load-2req.json", None),
    # 0.28-0.29 with no group tagged EAGLE: every group is EAGLE, none re-verified (lookup:false_hit)
    ("0-28-0-mamba-eagle-untagged-lookup-false-hit-19req.json", None),
    ("0-29-0-mamba-eagle-untagged-lookup-false-hit-24req.json", None),
    # the same-step partial-hit copy, reached on 0.29.0 without EAGLE tags
    ("0-29-0-mamba-eagle-untagged-data-copy-of-uncomputed-tokens-4req.json", None),
    # 0.26-0.33: the lookup defers on a pending chunk the EAGLE pop discards (docs/upstream/
    # lookup-defers-on-unusable-pending-chunk)
    ("0-33-0-eagle-lookup-needless-deferral-deferred-on-full-attention-hit-pending-2req.json", None),
    ("0-33-0-swa-scripted-lookup-needless-deferral-deferred-on-full-attention-hit-pending-48req.json", None),
    # 0.28-0.33: a request capping its offload below its partial-tail boundary asserts the cap
    ("0-33-0-mamba528-offload-limit-p-0-3-crash-exception-build-partial-tail-store-jobs-1req.json",
     "_build_partial_tail_store_jobs"),
    # 0.26-0.31 async: a producer's partial-tail entry registered again on its live Mamba block
    ("0-27-0-mamba528-data-wrong-kv-mamba-unwritten-3req.json", None),
    # 0.30-0.32, tiering: a promotion fills a primary chunk a connector reset freed while a store
    # the reset flushed still writes it (held until the flush from 0.33.0, docs/findings.md)
    ("0-32-0-full-tiering-fs-log-stats-true-reset-p-0-1-load-tiers-p-0-3-data-wrong-kv-full-attention-"
     "another-prefix-arrived-by-a-load-24req.json", None),
    # 0.26-0.28: the sliding-window reset re-offload reaching a Mamba (align) group
    ("0-28-0-mamba-reset-p-0-1-store-foreign-source-10req.json", None),
    # 0.33.0, tiering: a promotion into the full primary tier evicts the waiting request's own chunks
    # (the LRU's request rank), so its lookup defers it for ever (docs/upstream/tiering-promotion-evicts-own-chunks)
    ("0-33-0-full-tiering-fs-liveness-stuck-request-13req.json", None),
    ("0-33-0-full-tiering-fs-shadow-false-liveness-stuck-request-13req.json", None),  # ... with shadow off
    ("0-33-0-full-offload-spec-tiering-example-shadow-false-cpu-chunks-32-liveness-stuck-request-5req.json", None),  # ... behind the example tier
    # 0.26.0, tiering: a finished request's last store asks the tiering manager for a state it dropped
    ("0-26-0-full-tiering-fs-shadow-false-prefix-burst-p-0-5-abort-p-0-2-tier-lookup-late-p-0-5-crash-exception-"
     "prepare-store-2req.json", "prepare_store"),
    # 0.28-0.29, tiering: the lookup cache's assert on a late answer after its request's cleanup
    ("0-29-0-full-tiering-fs-shadow-false-prefix-burst-p-0-5-abort-p-0-2-tier-lookup-late-p-0-5-crash-exception-"
     "drain-results-3req.json", "drain_results"),
    # 0.30-0.33, tiering: a hit larger than the primary tier, whose promotions evict its own head every step
    # (docs/upstream/tiering-hit-larger-than-primary-tier)
    ("0-32-0-full-tiering-fs-liveness-stuck-request-5req.json", None),
    # ... the same on 0.22.1 behind the example tier, shadow off (reproduced through the engine on 0.22.1 - 0.33.0)
    ("0-22-1-full-offload-spec-tiering-example-shadow-false-cpu-chunks-32-liveness-stuck-request-4req.json", None),
])
def test_saved_findings_replay(name, site, workers):
    """The shrunk reproducers in docs/trace-findings still fail on their real vLLM release."""
    f = TF.load(FINDINGS / name)
    env, w = workers(f.release)
    got = [g for g in R.rerun(w, env.version, f, f.segment["requests"]) if g.key() == f.key()]
    assert got
    if site:
        assert got[0].detail["assert_site"]["function"] == site


@pytest.mark.parametrize("version,lost", [("0.21.0", True), ("0.22.1", True), ("0.26.0", False)])
def test_lost_last_chunk_before_the_prompt_clamp(version, lost, workers):
    """0.21 - 0.22 have no offload_prompt_only and no prompt clamp: they offload decoded tokens,
    so a finished request's decoded chunk that async scheduling never stored is lost there too
    (the store contract once took the missing option for prompt-only and saw nothing); 0.26.0
    stores a finished request's last chunk (offloading/scheduler.py:932-942)."""
    f = TF.load(FINDINGS / "0-23-0-full-store-all-store-lost-chunk-1req.json")
    env, w = workers(version)
    keys = {g.key() for g in R.rerun(w, env.version, f, f.segment["requests"])}
    assert ("store:lost_chunk" in keys) is lost


@pytest.mark.parametrize("version,left", [("0.21.0", True), ("0.22.1", False), ("0.24.0", False)])
def test_idle_engine_with_a_store_in_flight(version, left, workers):
    """0.21.0's engine stops stepping once its last request has finished and gone out
    (v1/engine/core.py:415-416), so the store that request's last step built is never confirmed:
    the connector keeps its state, the tier its chunks unready. 0.22.1 flushes every job once all
    tracked requests have finished (offloading/scheduler.py:849-855); 0.24.0 keeps the engine
    stepping while the connector has jobs (has_pending_push_work, :1053-1059)."""
    f = TF.load(FINDINGS / "0-21-0-full-abort-p-0-0-lifecycle-transfer-not-finished-1req.json")
    env, w = workers(version)
    keys = {g.key() for g in R.rerun(w, env.version, f, f.segment["requests"])}
    want = {"lifecycle:connector_state_left", "lifecycle:transfer_not_finished", "store:lost_chunk"}
    assert (want <= keys) if left else not (want & keys), keys


@pytest.mark.parametrize("version,scheduler,found", [
    ("0.31.0", "async", True), ("0.32.0", "async", False), ("0.27.0", "sync", False)])
def test_async_partial_tail_entry_range(version, scheduler, found, workers):
    """The 3-request partial-tail file: the last release it reproduces on (0.31.0), the first it
    does not (0.32.0: the tail boundary is one token short of the prompt's end), and its own
    release under the sync Scheduler (the re-registration needs the async placeholder)."""
    f = TF.load(FINDINGS / "0-27-0-mamba528-data-wrong-kv-mamba-unwritten-3req.json")
    f.segment = dict(f.segment, params=dict(f.segment["params"], **{"async": scheduler == "async"}))
    env, w = workers(version)
    keys = {g.key() for g in R.rerun(w, env.version, f, f.segment["requests"])}
    assert (f.key() in keys) is found


def test_engine_overrides_are_checked(capsys):
    assert main(["trace", "--vllm", "0.33.0", "--engine", "bogus=1"]) == 2
    assert "num_gpu_blocks" in capsys.readouterr().err
    assert main(["trace", "--vllm", "0.33.0", "--engine", "shadow=maybe"]) == 2
    assert "shadow must be a true/false" in capsys.readouterr().err
    assert main(["trace", "--vllm", "0.33.0", "--engine", "max_model_len=1"]) == 2  # below 64 tokens: one line


def test_an_engine_override_reaches_every_layouts_job():
    from kvbound.trace.layouts import parse_override

    over = dict([parse_override("abort_p=0"), parse_override("shadow=false"), parse_override("pending_p=0.5")])
    assert over == {"abort_p": 0.0, "shadow": False, "pending_p": 0.5}
    for name in LAYOUTS:
        job = R.make_job(name, 0, 50, 0, "sync", over)
        assert all(r["abort_after"] is None for r in job["requests"])  # abort_p=0: no request aborts
        assert {k: job["params"][k] for k in over} == over


def test_vllm_src_runs_a_checkout(tmp_path, prepared):
    """--vllm-src DIR runs a checkout's vllm/ (here the prepared 0.33.0 tree), judged by --vllm's spec."""
    env = prepared("0.33.0")
    out = tmp_path / "t.json"
    rc = main(["trace", "--vllm-src", env.tree, "--vllm", "0.33.0", "--layout", "full", "--requests", "40",
               "--quiet", "--json", str(out), "--out", str(tmp_path / "f")])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["layouts"][0]["requests"] == 40 and doc["layouts"][0]["loads"] > 0
    assert main(["trace", "--vllm-src", str(tmp_path), "--vllm", "0.33.0"]) == 2  # no vllm/ there


def test_mtp_retained_window_on_real_tables(workers):
    """Layout swa-mtp: a multi-module MTP drafter makes the window retain 2 tokens more
    (extra_retained_tokens, set the way the planner sets it). On real 0.33.0 every captured
    table carries it, every premise (window-skipped-null among them) holds on those tables and
    the shadow reads only the attended positions: no finding. On 0.30.0 the load takes a
    window chunk the lookup never confirmed (its window ignores the retained tokens)."""
    env, w = workers("0.33.0")
    job = R.make_job("swa-mtp", (0, "mtp"), 100, 0, "sync", {})
    res = w.job(job)
    found, tally = R.check_result("0.33.0", "swa-mtp", job, res)
    assert found == [], [f.key() for f in found]
    windows = [g for c in res["cases"] for g in c["case"]["groups"] if g.get("kind") == "sliding_window"]
    assert tally["captured_calls"] > 10 and windows and {g.get("extra_retained_tokens") for g in windows} == {2}
    env30, w30 = workers("0.30.0")
    found, _ = R.check_result("0.30.0", "swa-mtp", job, w30.job(job))
    assert "lifecycle:load_key_not_confirmed" in {f.kind for f in found}
