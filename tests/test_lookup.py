"""The lookup: its spec per release (spec/lookup.py), its contract
(spec/lookup_contract.py), and the checks at every lookup a real trace captures, each
shown to fire on a planted defect of the real lookup and not on a clean run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbound.side.defects import DEFECTS
from kvbound.spec.lookup import lookup_for_version
from kvbound.spec.lookup_case import lookup_case_from_dict, lookup_case_to_dict
from kvbound.spec.lookup_contract import check_lookup, contract_cap
from kvbound.spec.versions import release_features
from kvbound.trace import runner as R

from conftest import ROOT

FA = {"group_idx": 0, "kind": "full_attention", "tokens_per_chunk": 16, "num_keys": 12, "window": None}
SW = {"group_idx": 1, "kind": "sliding_window", "tokens_per_chunk": 16, "num_keys": 12, "window": 4,
      "sliding_window": 64}


def _case(tier, N=0, num_tokens=195):
    return lookup_case_from_dict({"name": "c", "lookup": {
        "num_computed_tokens": N, "num_tokens": num_tokens, "num_prompt_tokens": num_tokens,
        "groups": [FA, SW], "tokens_per_hash": 16, "num_block_hashes": num_tokens // 16, "tier": tier}})


# A window of 4 ready chunks (1:3..1:6), a MISS right of it (1:7) and a HIT_PENDING right
# of the MISS (1:8): the pending key cannot complete any window.
CALIBRATION = {**{f"0:{c}": "HIT" for c in range(12)}, **{f"1:{c}": "MISS" for c in range(12)},
               **{f"1:{c}": "HIT" for c in range(3, 7)}, "1:8": "HIT_PENDING"}


def test_sliding_window_pending_right_of_a_gap():
    """0.25-0.29 defer on it (0.29 offloading/scheduler.py:642-664); 0.30 clears the
    flag at the gap (:690-716) and loads the window; 0.21-0.24 break the run at it."""
    case = _case(CALIBRATION)
    for v in ("0.25.1", "0.26.0", "0.29.0"):
        assert lookup_for_version(case, v).hit is None, v
        (b,) = check_lookup(case, release_features(v), None, None)
        assert b.clause == "needless_deferral" and b.tokens == 112
    for v in ("0.30.0", "0.33.0"):
        got = lookup_for_version(case, v)
        assert got.hit == 112, v  # chunks 0..6: the window 3..6 ends at 112
        assert check_lookup(case, release_features(v), got.hit, None) == []


def test_the_lookup_deferral_patch_row_answers_where_waiting_cannot_pay():
    """versions.PATCHES "lookup-defers-on-unusable-pending-chunk": the EAGLE-pop lookup of the saved
    2-request file (0:5 and 1:5 pending, the drafter's pop discards chunk 5) defers on 0.33.0 and
    answers 0 on the patched row, with no contract clause broken; a pending chunk that ready chunks
    follow can pay, and both rows defer on it."""
    import json

    patched = "0.33.0+lookup-defers-on-unusable-pending-chunk"
    saved = json.loads((ROOT / "docs" / "trace-findings" / (
        "0-33-0-eagle-lookup-needless-deferral-deferred-on-full-attention-hit-pending-2req.json")).read_text())
    case = lookup_case_from_dict(saved["detail"]["lookup_case"], "eagle-pop")
    assert lookup_for_version(case, "0.33.0").hit is None
    got = lookup_for_version(case, patched)
    assert got.hit == 0 and check_lookup(case, release_features(patched), got.hit, None) == []
    can_pay = _case({**{f"0:{c}": "HIT" for c in range(12)}, "0:3": "HIT_PENDING", **{f"1:{c}": "HIT" for c in range(12)}})
    assert lookup_for_version(can_pay, "0.33.0").hit is None and lookup_for_version(can_pay, patched).hit is None
    ready = _case({**{f"0:{c}": "HIT" for c in range(12)}, **{f"1:{c}": "HIT" for c in range(12)}})
    assert lookup_for_version(ready, "0.33.0").hit == lookup_for_version(ready, patched).hit == 192


def test_contract_clauses():
    feats = release_features("0.33.0")
    ready = _case({**{f"0:{c}": "HIT" for c in range(12)}, **{f"1:{c}": "HIT" for c in range(12)}})
    assert lookup_for_version(ready, "0.33.0").hit == 192  # 12 whole chunks of keys
    assert check_lookup(ready, feats, 192, None) == []
    (lost,) = check_lookup(ready, feats, 176, None)
    assert lost.clause == "lost_hit" and lost.tokens == 16
    half = _case({**CALIBRATION, "0:5": "MISS"})
    (false,) = check_lookup(half, feats, 112, None)
    assert false.clause == "false_hit" and "0:5" in false.message
    # a pending key that can give more is a reason to wait
    wait = _case({**CALIBRATION, "1:7": "HIT_PENDING"})
    assert check_lookup(wait, feats, None, None) == []


def test_mixed_chunk_grids_judged_per_group():
    """Issue 24's input (tests/cases_v2/lookup_mixed_chunk_grids.json, replayed on real vLLM by
    .ci/conform): groups of 12- and 16-token chunks, N=48, T=85, keys 0:4..0:6 and 1:3..1:4 HIT.
    Every release's lookup hits 32 tokens (boundary 80, group 1's grid): inside group 0's ready
    chunk 6 [72, 84), which the load reads whole, so no false hit; a hit of 16 (boundary 64,
    inside group 0's chunk 5, on group 1's grid) loses 16 tokens; claiming 80 with 0:6 not
    ready is a false hit naming it."""
    from kvbound.spec.case_kinds import load_any_case_paths
    from kvbound.spec.lookup_contract import best_boundary

    (case,) = load_any_case_paths([ROOT / "tests" / "cases_v2" / "lookup_mixed_chunk_grids.json"])
    for v in ("0.21.0", "0.29.0", "0.33.0"):
        feats = release_features(v)
        got = lookup_for_version(case, v)
        assert (got.hit, got.queries) == (32, ["0:4", "0:5", "0:6", "1:3", "1:4"]), v
        assert best_boundary(case, feats) == 80 and check_lookup(case, feats, 32, None) == []
        (lost,) = check_lookup(case, feats, 16, None)
        assert lost.clause == "lost_hit" and lost.tokens == 16 and "boundary 80" in lost.message
    unready = lookup_case_from_dict({"name": "c", "lookup": dict(lookup_case_to_dict(case)["lookup"], tier={
        **{k: "HIT" for k in ("0:4", "0:5", "1:3", "1:4")}, "0:6": "HIT_PENDING"})})
    (false,) = check_lookup(unready, release_features("0.33.0"), 32, None)
    assert false.clause == "false_hit" and "0:6" in false.message
    assert best_boundary(unready, release_features("0.33.0")) == 72  # inside group 1's ready chunk 4


def test_no_hit_under_the_smallest_chunk():
    """No release returns a hit under every group's chunk (the lookup's last group step returns 0
    below its chunk, 0.29.0 offloading/scheduler.py:751-753): one group of 16-token chunks whose
    request may take 5 tokens (max_num_new_tokens) has nothing to wait for and nothing to hit, even
    with chunk 0 ready."""
    case = lookup_case_from_dict({"name": "c", "lookup": {
        "num_computed_tokens": 0, "num_tokens": 100, "num_prompt_tokens": 100, "max_num_new_tokens": 5,
        "groups": [{"group_idx": 0, "kind": "full_attention", "tokens_per_chunk": 16, "num_keys": 6, "window": None}],
        "tokens_per_hash": 16, "num_block_hashes": 6, "tier": {"0:0": "HIT"}}})
    feats = release_features("0.33.0")
    (needless,) = check_lookup(case, feats, None, None)
    assert needless.clause == "needless_deferral"
    (false,) = check_lookup(case, feats, 5, None)
    assert false.clause == "false_hit" and "under the smallest chunk" in false.message
    assert check_lookup(case, feats, 0, None) == []


def test_a_window_of_small_chunks_ends_the_hit_inside_full_attention_s_first_chunk():
    """DeepSeek V4's shape (layout ``swa-mixed``): full attention on 64-token chunks, a window of
    four 16-token chunks. Full attention's step caps the hit at its ready chunk 0 (64 tokens); the
    window's step then tightens it to 32 (chunks 1:0, 1:1) and full attention's under-a-chunk
    return (0.29.0 offloading/scheduler.py:750-752) is not asked again, so every release returns
    32. The load reads chunk 0:0 whole: no false hit. Not demanded (no hit under one chunk of any
    group is a give-away), so a lookup that answers 0 loses nothing; with 0:0 not ready, 32 is a
    false hit naming it; a deferral is needed while the window's chunks are pending, and needless
    while 32 is ready or nothing is."""
    from kvbound.spec.case_kinds import load_any_case_paths
    from kvbound.spec.lookup_contract import best_boundary

    # tests/cases_v2/lookup_window_inside_first_chunk.json: real 0.29.0 and 0.33.0 hit 32 (.ci/conform)
    (ready,) = load_any_case_paths([ROOT / "tests" / "cases_v2" / "lookup_window_inside_first_chunk.json"])

    def case(tier):
        return lookup_case_from_dict({"name": "c", "lookup": dict(lookup_case_to_dict(ready)["lookup"], tier=tier)})

    for v in ("0.21.0", "0.24.0", "0.29.0", "0.33.0"):
        feats = release_features(v)
        assert lookup_for_version(ready, v).hit == 32, v
        assert check_lookup(ready, feats, 32, None) == [] and check_lookup(ready, feats, 0, None) == []
        assert best_boundary(ready, feats) == 0 and best_boundary(ready, feats, demand=False) == 32
    feats = release_features("0.33.0")
    (false,) = check_lookup(case({"0:0": "HIT_PENDING", "1:0": "HIT", "1:1": "HIT"}), feats, 32, None)
    assert false.clause == "false_hit" and "0:0" in false.message
    assert check_lookup(case({"0:0": "HIT", "1:0": "HIT_PENDING", "1:1": "HIT_PENDING"}), feats, None, None) == []
    (needless,) = check_lookup(ready, feats, None, None)
    assert needless.clause == "needless_deferral" and "boundary 32" in needless.message
    (needless,) = check_lookup(case({"0:0": "HIT", "1:0": "MISS", "1:1": "MISS"}), feats, None, None)
    assert needless.clause == "needless_deferral"


def test_mixed_chunk_grids_recurrent_state_on_its_own_grid():
    """A Mamba group's chunk key holds the state at the chunk's end, so it supports a boundary on
    its own grid only (the connector rounds the hit to its chunk size, 0.33.0 offloading/
    scheduler.py:137-155). Beside a full-attention group of 16-token chunks, the lookup ends the
    hit at 80 (tests/cases_v2/lookup_mixed_grids_mamba.json; real 0.29.0 and 0.33.0 agree with the
    spec, .ci/conform), inside Mamba chunk 6 [72, 84): a false hit. The best boundary is 72 (0:3,
    0:4 and 1:5 ready), which vLLM does not take."""
    from kvbound.spec.case_kinds import load_any_case_paths
    from kvbound.spec.lookup_contract import best_boundary

    (case,) = load_any_case_paths([ROOT / "tests" / "cases_v2" / "lookup_mixed_grids_mamba.json"])
    for v in ("0.24.0", "0.29.0", "0.33.0"):
        feats = release_features(v)
        got = lookup_for_version(case, v)
        assert (got.hit, got.queries) == (32, ["0:3", "0:4", "1:6"]), v
        (false,) = check_lookup(case, feats, 32, None)
        assert false.clause == "false_hit" and "recurrent" in false.message
        assert best_boundary(case, feats) == 72 and check_lookup(case, feats, 24, None) == []


def test_trace_compares_the_keys_asked():
    """kvbound/trace/lookup_checks.py: a captured call whose answer is the spec's is also judged on
    the keys it asked, in order (the mixed-grid case: 0:4, 0:5, 0:6, 1:3, 1:4). Another order or
    another set is ``lookup:keys_disagreement``; a call whose tier answered no LookupResult (vLLM's
    test double answers ``False``: 0.33.0's ``match`` takes no branch and asks on, offloading/
    scheduler.py:786-802) is set aside, not judged."""
    import json

    from kvbound.trace.lookup_checks import check_lookups

    doc = json.loads((ROOT / "tests" / "cases_v2" / "lookup_mixed_chunk_grids.json").read_text())
    asked = ["0:4", "0:5", "0:6", "1:3", "1:4"]

    def judge(queries, **extra):
        rec = {"step": 1, "request": "0", "case": doc, "spec_hit_shift": None,
               "real": {"hit": 32, "partial_tail_boundary": None, "queries": queries}, **extra}
        found, tally = check_lookups("0.33.0", {"lookups": [rec]})
        return [(k, d) for k, d, _ in found], tally

    found, tally = judge(asked)
    assert found == [] and tally["lookup_keys_agree"] == 1
    (kind, d), = judge(asked[:3] + asked[:0:-1][:2])[0]  # 1:4 before 1:3
    assert kind == "lookup:keys_disagreement" and d["first_difference"] == 3 and "another order" in d["message"]
    (kind, d), = judge(["0:b:84"] + asked)[0]
    assert kind == "lookup:keys_disagreement" and d["only_real"] == ["0:b:84"] and d["first_difference"] == 0
    found, tally = judge(asked[:1], foreign_answers=["False"])
    assert found == [] and tally["lookup_not_judged"] == 1 and tally["lookup_keys_agree"] == 0


@st.composite
def _contract_cases(draw):
    """Lookup cases of one to three groups of mixed chunk sizes, windows, drafters, caps and
    Mamba alignment, with any answers: what ``best_boundary`` must search."""
    groups = []
    for gi in range(draw(st.integers(1, 3))):
        tpc = draw(st.sampled_from([4, 8, 12, 16]))
        window = draw(st.sampled_from([None, None, 1, 2, 3]))
        kind = "full_attention" if window is None else draw(st.sampled_from(["sliding_window", "mamba"]))
        window = 1 if kind == "mamba" else window
        groups.append({"group_idx": gi, "kind": kind,
                       "tokens_per_chunk": tpc, "num_keys": draw(st.integers(1, 10)), "window": window,
                       "sliding_window": None if window is None else window * tpc,
                       "eagle": draw(st.booleans())})
    num_tokens = draw(st.integers(1, 130))
    tier = {f"{g['group_idx']}:{c}": draw(st.sampled_from(["HIT", "HIT", "MISS", "HIT_PENDING", "RETRY"]))
            for g in groups for c in range(g["num_keys"])}
    lk = {"num_computed_tokens": draw(st.integers(0, num_tokens)), "num_tokens": num_tokens,
          "num_prompt_tokens": num_tokens, "groups": groups, "tokens_per_hash": 4,
          "num_block_hashes": num_tokens // 4, "tier": tier,
          "mamba_align_size": draw(st.sampled_from([None, 8, 24])),
          "max_num_new_tokens": draw(st.sampled_from([None, 5, 40])),
          "max_load_tokens": draw(st.sampled_from([None, 7, 64]))}
    return lookup_case_from_dict({"name": "c", "lookup": lk})


@settings(max_examples=400, deadline=None)
@given(_contract_cases(), st.sampled_from(["0.24.0", "0.30.0", "0.33.0"]))
def test_best_boundary_is_the_token_by_token_scan(case, release):
    """The search tries the cap and each group's chunk grid only; the answer is the scan's."""
    from kvbound.spec.lookup_contract import MAYBE, READY, best_boundary, demanded, supports

    feats = release_features(release)
    for ok in (READY, MAYBE):
        for demand in (True, False):
            scan = next((B for B in range(contract_cap(case), case.num_computed_tokens, -1)
                         if (not demand or demanded(case, B)) and supports(case, B, feats, ok)),
                        case.num_computed_tokens)
            assert best_boundary(case, feats, ok, demand=demand) == scan


def test_lookup_obligations_verdicts_and_witnesses():
    """proofs/lookup.py: no needless deferral refuted on 0.21-0.29 and proved on 0.30+ (its RETRY
    form refuted on 0.25+), no lost/false hit proved; each witness replays through the spec."""
    from kvbound.proofs.lookup import OBLIGATIONS
    from kvbound.proofs.runner import run_obligation

    got = {o.id: run_obligation(o) for o in OBLIGATIONS}
    assert all(r.met for r in got.values()), {i: r.verdict for i, r in got.items() if not r.met}
    assert got["lookup.window.no-needless-deferral.0.25.1"].verdict == "refuted"
    assert got["lookup.window.no-needless-deferral.0.30.0"].verdict == "proved"


def test_saved_calibration_case():
    """The shrunk 0.29.0 trace finding's lookup (docs/trace-findings): a window of 4 ready
    chunks (1:3-1:6) left of a MISS (1:7), a HIT_PENDING right of it (1:9). 0.29 defers; 0.30
    loads the 112 tokens."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "docs" / "trace-findings"
                      / "0-29-0-swa-scripted-lookup-needless-deferral-deferred-on-sliding-window-hit-pending-14req.json").read_text())
    case = lookup_case_from_dict(doc["detail"]["lookup_case"])
    assert lookup_for_version(case, "0.29.0").hit is None
    assert lookup_for_version(case, "0.30.0").hit == 112


LOAD_LIMIT_TRACES = ("0-31-0-mamba-load-limit-below-hash-1req.json", "0-31-0-mamba-load-limit-off-hash-grid-2req.json")


@pytest.mark.parametrize("name", LOAD_LIMIT_TRACES)
@pytest.mark.parametrize("release", ["0.31.0", "0.32.0"])
def test_load_limit_caps_the_partial_tail_search_before_the_hash_grid(name, release):
    """0.31 - 0.32 cap the partial-tail search at N + max_load_tokens, then round it down to the
    hash grid (0.31.0 offloading/scheduler.py:980-985, 0.32.0 :983-988), as 0.33 does
    (:1097-1102). The spec once rounded first and capped after, so it searched boundaries off the
    grid: with max_load_tokens 1 it asked 0:b:1 where vLLM asks nothing; with 40 it asked 0:b:40,
    0:b:24, 0:b:8 and lost the 16 tokens vLLM loads (boundary 16). The recorded real answers are
    the campaign's (mamba@load_limit_p=0.3, 0.31.0 and 0.32.0); the spec gives them."""
    import json

    doc = json.loads((ROOT / "tests" / "data" / "trace" / name).read_text())
    case = lookup_case_from_dict(doc["detail"]["lookup_case"])
    real = doc["detail"]["real"]
    got = lookup_for_version(case, release)
    assert (got.hit, got.partial_tail_boundary, got.queries) == (
        real["hit"], real["partial_tail_boundary"], real["queries"])


def test_load_limit_arrives_in_0_31():
    """kv_transfer_params max_load_tokens arrived in 0.31 (release table column max_load_tokens):
    0.30's lookup cannot take one, so the spec refuses such a case there."""
    from kvbound.spec.case_kinds import load_any_case_paths

    (case,) = load_any_case_paths([ROOT / "tests" / "cases_v2" / "lookup_load_limit_off_hash_grid.json"])
    assert lookup_for_version(case, "0.30.0").unsupported
    assert lookup_for_version(case, "0.31.0").hit == 16


def test_a_lookup_case_the_driver_cannot_set_up_is_undriven_and_blocks():
    """kvbound conform drives a fresh request: a trace-captured case naming transfers in flight or
    chunks being loaded is not replayed without them (the spec would judge another input)."""
    from kvbound.conform.compare import UNDRIVEN, is_blocking, judge_lookup

    case = _case(CALIBRATION)
    rec = judge_lookup(case, "0.33.0", {"outcome": "undriven", "why": "the lookup driver sets no transfer_jobs"})
    assert rec["verdict"] == UNDRIVEN and is_blocking(rec, "lookup") and "transfer_jobs" in rec["why"]


def test_lookup_case_round_trips():
    case = _case(CALIBRATION)
    assert lookup_case_from_dict(lookup_case_to_dict(case)) == case
    d = lookup_case_to_dict(case)
    d["lookup"].update(transfer_jobs=True, prior_partial_tail_boundary=736)
    assert lookup_case_from_dict(lookup_case_to_dict(lookup_case_from_dict(d))).prior_partial_tail_boundary == 736


def test_an_early_return_leaves_the_recorded_boundary():
    """Only _lookup resets partial_tail_boundary (0.33.0 offloading/scheduler.py:1074): a call that
    returns first, for transfers in flight, keeps the boundary an earlier lookup recorded."""
    d = lookup_case_to_dict(_case(CALIBRATION))
    d["lookup"]["prior_partial_tail_boundary"] = 736
    ran = lookup_for_version(lookup_case_from_dict(d), "0.33.0")
    assert ran.partial_tail_boundary != 736  # _lookup ran: reset, then its own answer
    d["lookup"]["transfer_jobs"] = True
    early = lookup_for_version(lookup_case_from_dict(d), "0.33.0")
    assert early.hit is None and early.partial_tail_boundary == 736


# --- real vLLM ------------------------------------------------------------------------

@pytest.fixture
def w033(workers):
    return workers("0.33.0")[1]


LOOKUP_CLASSES = ("lookup", "liveness")


def _kinds(w, layout, mutant=None, n=100, seed=(3, "lookup")):
    job = R.make_job(layout, seed, n, 0, "sync", {"mutant": mutant} if mutant else None)
    job["max_steps"] = 3000
    found, _ = R.check_result("0.33.0", layout, job, w.job(job))
    return {f.kind for f in found}


def test_real_lookup_clean_run_reports_nothing(w033):
    kinds = _kinds(w033, "full")
    assert not {k for k in kinds if k.split(":")[0] in LOOKUP_CLASSES}, kinds


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.module == "lookups"], ids=lambda d: d.name)
def test_real_lookup_planted_defect(defect, w033):
    assert defect.release == "0.33.0"
    assert set(defect.catches) <= _kinds(w033, defect.layout, defect.name)


def test_real_lookup_with_transfers_in_flight_keeps_its_boundary():
    """The segment where the spec once disagreed with real 0.33.0 (a deferral for in-flight
    transfers that keeps an earlier partial-tail boundary, 736): the capture records the prior
    boundary and the spec now gives vLLM's answer; a recorded answer moved off vLLM's is caught.
    Judged on the run's recorded lookup (a history): the run was made before the tenth stop, when
    kvbound's async segments ran on vLLM's synchronous in-flight budget; with async scheduling on
    (side/engine.py) the same requests no longer defer on a transfer with a prior boundary kept."""
    import copy
    import json

    from kvbound.trace import tracefile as TF

    data = ROOT / "tests" / "data" / "trace"
    f = TF.load(data / "0-33-0-mamba528-stale-partial-tail-boundary-29req.json")
    kept = json.loads((data / "0-33-0-mamba528-stale-partial-tail-boundary-29req.lookups.json").read_text())["lookups"]
    assert kept and all(c["case"]["lookup"]["transfer_jobs"] for c in kept)
    assert any(c["real"]["partial_tail_boundary"] is not None for c in kept)
    found, _ = R.check_result("0.33.0", f.layout, f.segment, {"lookups": kept})
    assert "lookup:spec_disagreement" not in {g.kind for g in found}
    moved = copy.deepcopy(kept)
    for c in moved:
        c["real"]["partial_tail_boundary"] = None if c["real"]["partial_tail_boundary"] is not None else 16
    found, _ = R.check_result("0.33.0", f.layout, f.segment, {"lookups": moved})
    assert "lookup:spec_disagreement" in {g.kind for g in found}


@pytest.mark.parametrize("name", LOAD_LIMIT_TRACES)
def test_real_load_limit_traces_agree_with_the_spec(name, workers):
    """The two mamba@load_limit_p=0.3 segments on real 0.31.0: every lookup agrees with the spec
    on the answer and on the keys asked."""
    from kvbound.trace import tracefile as TF

    f = TF.load(ROOT / "tests" / "data" / "trace" / name)
    res = workers("0.31.0")[1].job(dict(f.segment, max_steps=3000))
    assert any(c["case"]["lookup"]["max_load_tokens"] is not None for c in res["lookups"])
    found, _ = R.check_result("0.31.0", f.layout, f.segment, res)
    assert not {g.kind for g in found} & {"lookup:spec_disagreement", "lookup:keys_disagreement"}


def test_real_stalled_write_is_a_stuck_request(w033):
    """A tier write that never completes: 0.33's CPU tier answers HIT_PENDING for it with
    no deadline (v1/kv_offload/cpu/manager.py:199-205), so the lookup defers for ever."""
    assert "liveness:stuck_request" in _kinds(w033, "full-stalled", seed=(0, "dbg"), n=150)
