"""Every command takes every case kind (issue 24 items 5 and 6): load, lookup and store cases, side
by side in one directory, and a trace finding file through the case it names. A store case is one
``_build_store_jobs`` call (spec/store_case.py, docs/case-format.md "Store cases")."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, kvbound

from kvbound.errors import CaseError
from kvbound.spec.case_kinds import load_any_case_paths
from kvbound.spec.store_case import StoreCase, plan_store, store_case_from_dict, store_case_to_dict

STORE = ROOT / "tests" / "cases_store"
KEYED = STORE / "keyed_cap_running.json"
FINISHED = STORE / "finished_past_computed_029.json"
CASE_COMMANDS = ("plan", "explain", "premises")  # every command that reads case files
MIXED = ROOT / "tests" / "cases_v2" / "lookup_mixed_chunk_grids.json"


def plan_lines(*args):
    r = kvbound("plan", *args)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_the_keyed_cap_record_advances_as_each_release_does():
    """Issue 24's record: running, P=8, T=9, C=8, S=0, 4-token chunks, 2 allocated, 1 keyed: 0.33.0
    advanced 0 -> 1 (the case records it); 0.30+ cap at the keyed chunks, 0.26-0.29 do not."""
    (line,) = plan_lines(KEYED)
    assert line["kind"] == "store" and line["outcome"] == "ok" and line["vllm_version"] == "0.33.0"
    assert line["horizon"] == 8 and line["next_stored_chunk_idx"] == {"before": 0, "after": 1}
    assert line["stored_chunks"] == [0] and line["within_computed"] is True
    assert line["observed_after"] == 1 and line["agrees"] is True
    for release, after in (("0.30.0", 1), ("0.32.0", 1), ("0.29.0", 2), ("0.27.0", 2), ("0.26.0", 2)):
        (line,) = plan_lines("--vllm-version", release, KEYED)
        assert line["next_stored_chunk_idx"]["after"] == after, release
        assert "agrees" not in line and line["observed_on"] == "0.33.0"  # observed on another release
    (line,) = plan_lines("--vllm-version", "0.25.1", KEYED)
    assert line["outcome"] == "unsupported" and "starts at 0.26.0" in line["reason"]


def test_a_finished_request_stores_past_its_computed_tokens_before_the_clamp():
    """store.computed's refuted 0.27-0.29 finished witness as a case: the stored chunk ends past the
    tokens the forward computed; 0.30's clamp stores nothing."""
    (line,) = plan_lines(FINISHED)
    assert line["stored_chunks"] == [0] and line["computed_tokens"] == 15 and line["within_computed"] is False
    (line,) = plan_lines("--vllm-version", "0.30.0", FINISHED)
    assert line["stored_chunks"] == [] and line["horizon"] == 15 and line["within_computed"] is True


def test_0_26_asserts_where_more_chunks_than_allocated_blocks():
    d = json.loads(KEYED.read_text())
    d["store"].update(release="0.26.0", num_allocated_chunks=1)
    p = plan_store(store_case_from_dict(d))
    assert p.outcome == "assertion_error" and p.after is None and "len(offload_keys)" in p.reason
    d["store"]["release"] = "0.27.0"
    assert plan_store(store_case_from_dict(d)).after == 1  # 0.27 caps at the allocated chunk instead


def test_a_refused_store_advances_nothing():
    d = json.loads(KEYED.read_text())
    d["store"].update(refused=True, next_stored_chunk_idx_after=0)
    p = plan_store(store_case_from_dict(d))
    assert p.after == 0 and p.stored == () and "refused" in p.reason


def test_a_store_case_round_trips():
    case = load_any_case_paths([KEYED])[0]
    assert isinstance(case, StoreCase)
    assert store_case_from_dict(json.loads(json.dumps(store_case_to_dict(case)))) == case


@pytest.mark.parametrize("field,value,rule", [
    ("status", "paused", "must be one of running, finished, aborted"),
    ("release", "0.18.0", "store.release"),
    ("release", 33, "must be a vLLM release string"),
    ("num_tokens", 7, "must be >= num_prompt_tokens=8"),
    ("num_computed_tokens", -1, "must be an integer >= 0"),
    ("scheduler", "eager", "must be one of sync, async"),
    ("tokens_per_block", 0, "must be an integer >= 1"),
    ("num_keyed_chunks", -1, "must be an integer >= 0"),
    ("num_allocated_chunks", True, "must be an integer >= 0"),
    ("offload_prompt_only", "yes", "must be true or false"),
    ("max_offload_tokens", "8", "must be an integer >= 0 or null"),
    ("format", 2, "reads store case format 1"),
    ("next_stored_chunk_idx_before", 0, "unknown field"),
])
def test_a_bad_store_field_is_one_line_naming_case_field_rule(tmp_path, field, value, rule):
    d = json.loads(KEYED.read_text())
    d["store"][field] = value
    with pytest.raises(CaseError) as e:
        store_case_from_dict(d)
    assert e.value.case == "store-keyed-cap-running" and e.value.field.startswith("store.")
    assert rule in str(e.value)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    for cmd in CASE_COMMANDS:
        r = kvbound(cmd, p)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (cmd, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "case 'store-keyed-cap-running': store." in r.stderr
        assert rule in r.stderr


def test_a_missing_store_field_is_named(tmp_path):
    d = json.loads(KEYED.read_text())
    del d["store"]["num_keyed_chunks"]
    with pytest.raises(CaseError, match="store.num_keyed_chunks: missing required field"):
        store_case_from_dict(d)


def test_every_kind_side_by_side_in_one_directory(tmp_path):
    for src in (KEYED, MIXED, ROOT / "examples" / "pr_case.json"):
        (tmp_path / src.name).write_text(src.read_text())
    lines = {x["name"]: x for x in plan_lines(tmp_path)}
    assert lines["store-keyed-cap-running"]["next_stored_chunk_idx"]["after"] == 1
    assert lines["lookup-mixed-chunk-grids"]["hit"] == 32
    assert lines["pr-recurrent-unhashed-below-boundary"]["dst_block_ids"] == [22, 34]


def test_diff_says_one_line_per_case_it_does_not_diff():
    """kvbound diff compares load plans: a lookup or store case among its files is one line each."""
    r = kvbound("diff", ROOT / "tests" / "cases_v2", STORE, "--workers", "1", "--against", "spec")
    assert r.returncode == 0, r.stderr
    skipped = [x for x in r.stderr.splitlines() if "kvbound diff compares load plans only" in x]
    lookups = [f for f in (ROOT / "tests" / "cases_v2").glob("*.json") if "lookup" in json.loads(f.read_text())]
    assert len(skipped) == len(lookups) + len(list(STORE.glob("*.json")))
    assert any(x.startswith("store-keyed-cap-running: a store case") for x in skipped)
    assert "4 case(s)" in r.stdout  # the four load cases of cases_v2


def explain(*args) -> str:
    r = kvbound("explain", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_explain_draws_a_lookup_case_per_group_on_its_own_grid():
    """The mixed-grid input (issue 24 item 3): group 0's 12-token chunks 4-6 HIT, group 1's 16-token
    chunks 3-4 HIT; the hit ends at 80, inside group 0's chunk 6 and at the end of group 1's chunk 4."""
    out = explain(MIXED)
    g0, g1 = out.split("group 0 ")[1].split("group 1 ")
    assert "tokens_per_chunk=12" in g0 and "[H]  [H]  [H]   |" in g0
    assert "boundary 80: inside chunk 6 [72, 84); reads chunks 4:HIT, 5:HIT, 6:HIT" in g0
    assert "tokens_per_chunk=16" in g1 and "boundary 80: the end of chunk 4; reads chunks 3:HIT, 4:HIT" in g1
    assert "vLLM 0.33.0  hit 32 tokens (boundary 80); asked 0:4, 0:5, 0:6, 1:3, 1:4" in out
    for clause in ("no false hit: ✓", "no lost hit: ✓", "no needless deferral: ✓ not deferred"):
        assert clause in out


def test_explain_names_the_clause_a_lookup_breaks():
    """A Mamba group on a 12-token grid beside a 16-token one: the hit at 80 is off the state's grid."""
    out = explain(ROOT / "tests" / "cases_v2" / "lookup_mixed_grids_mamba.json")
    assert "cannot support it" in out and "no false hit: ✗ hit 32 tokens (boundary 80)" in out
    assert "no lost hit: ✓" in out


def test_explain_draws_a_store_case_per_release():
    out = explain(KEYED)
    assert "computed    [c]  [c]  [.]" in out.replace("computed         ", "computed    ")
    lines = {x[:17].strip(): " ".join(x[17:].split()) for x in out.splitlines() if x.startswith("  0.")}
    assert lines["0.27.0 – 0.29.0"].startswith("[S] [S] · next_stored_chunk_idx 0 -> 2: stores chunks 0..1")
    assert lines["0.30.0 – 0.33.0"].startswith("[S] · · next_stored_chunk_idx 0 -> 1: stores chunk 0 ✓")
    assert "observed on 0.33.0: next_stored_chunk_idx 0 -> 1 ✓ the spec agrees" in out
    fin = explain(FINISHED)
    assert "✗ chunk 0 ends at 16 > 15 computed" in fin and "stores nothing ✓" in fin
    one = explain("--vllm-version", "0.29.0", KEYED)
    assert "  0.29.0" in one and "0.30.0 – 0.33.0" not in one
    assert "✗ the spec of 0.33.0" not in one  # the observation is judged by its own release


def test_premises_fold_the_lookup_facts_on_a_lookup_case():
    """The load premises about the lookup's answer, per group on its own chunk: the mixed-grid hit of
    32 tokens is within each group's keys."""
    r = kvbound("premises", MIXED)
    assert r.returncode == 0, r.stdout + r.stderr
    for gi in (0, 1):
        for pid in ("keys-cover-hit",):
            assert any(x.startswith(f"lookup-mixed-chunk-grids  group {gi} ") and pid in x and x.endswith("holds")
                       for x in r.stdout.splitlines()), (gi, pid)


def test_a_lookup_fact_fails_on_a_hit_past_the_keys():
    """The same fold can fail: a hit of 40 tokens runs past group 1's keys."""
    from kvbound.proofs.case_premises import lookup_terms
    from kvbound.proofs.premises import BY_ID

    case = load_any_case_paths([MIXED])[0]
    assert BY_ID["keys-cover-hit"].check_terms(lookup_terms(case, 1, 32, None)) is None
    why = BY_ID["keys-cover-hit"].check_terms(lookup_terms(case, 1, 40, None))  # T=88 > 5 keys * 16
    assert why and "5 offload keys" in why


def test_premises_fold_the_store_premises_on_a_store_case(tmp_path):
    r = kvbound("premises", KEYED)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "store-running-scheduled" in r.stdout and "store-allocated-scheduled" in r.stdout
    assert "premises: 2/2 checks hold on 1 case(s)" in r.stdout
    d = json.loads(KEYED.read_text())
    d["store"].update(num_computed_tokens=8, num_scheduled_tokens=5)  # scheduled past its tokens
    p = tmp_path / "over.json"
    p.write_text(json.dumps(d))
    r = kvbound("premises", p)
    assert r.returncode == 1
    assert "store-running-scheduled  FAILS" in r.stdout and "C=8 S=5" in r.stdout
    d["store"].update(scheduler="async", num_output_placeholders=5)  # async: placeholders are scheduled too
    p.write_text(json.dumps(d))
    r = kvbound("premises", p)
    assert "store-running-scheduled  holds" in r.stdout


def test_a_store_finding_carries_a_replayable_store_case(workers):
    """A trace store finding names its call as a store case (``detail.store_case``): on the planted
    window_frontier_ahead (0.33.0 swa: a sliding-window group's frontier one chunk ahead) the case's
    plan disagrees with what the planted release did, and on the same point clean every captured
    call's every group, as a store case, agrees with its spec."""
    from kvbound.side.defects import BY_NAME
    from kvbound.trace import runner as R
    from kvbound.trace.storecheck import group_verdicts, segment_calls, store_case_of

    defect = BY_NAME["window_frontier_ahead"]
    env, w = workers(defect.release)

    def run(overrides=None):
        job = R.make_job(defect.layout, (3, "mut"), 40, 0, "sync", overrides)
        job["max_steps"] = 3000
        res = w.job(job)
        assert res.get("ok", True), res.get("error")
        return job, res, R.check_result(defect.release, defect.layout, job, res)[0]

    job, res, found = run()
    assert not [f for f in found if f.kind == "store:spec_disagreement"]
    verdicts = list(group_verdicts(defect.release, job, res))
    assert len(verdicts) > 100
    for v in verdicts[::7]:
        case = store_case_from_dict(store_case_of(defect.release, job, v["call"], v["group"], v["spec_draft"]))
        p = plan_store(case)
        assert p.after == v["spec"] == case.next_stored_chunk_idx_after, (v, case)
    job, res, found = run({"mutant": defect.name})
    (f,) = [f for f in found if f.kind == "store:spec_disagreement"]
    case = store_case_from_dict(f.detail["store_case"])
    assert case.release == "0.33.0" and plan_store(case).after == f.detail["spec"] != case.next_stored_chunk_idx_after
    line = plan_store(case).to_json(case)
    assert line["agrees"] is False and line["observed_after"] == f.detail["real"]
    assert segment_calls(defect.release, job, res)[0]


def test_a_trace_finding_file_gives_the_case_it_names():
    found = ROOT / "docs" / "trace-findings"
    (line,) = plan_lines(found / "0-29-0-swa-scripted-lookup-needless-deferral-deferred-on-sliding-window-hit-pending-14req.json")
    assert line["vllm_version"] == "0.29.0" and line["deferred"] is True  # its lookup case, as its release
    out = explain(found / "0-29-0-swa-scripted-lookup-needless-deferral-deferred-on-sliding-window-hit-pending-14req.json")
    assert "no needless deferral: ✗ deferred" in out
    r = kvbound("plan", found / "0-26-0-mamba-eagle-scripted-data-copy-of-uncomputed-tokens-2req.json")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "names no case" in r.stderr
