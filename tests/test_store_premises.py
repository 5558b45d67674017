"""The store premises (proofs/store_premises.py) on real vLLM: folded on every captured
``_build_store_jobs`` call of a trace segment (``premise:<id>``), they hold under async scheduling
and under speculative decoding on 0.30.0-0.33.0, and the check fires on a planted allocator
that reserves past the lookahead slots (side/defects.py ``allocate_past_lookahead``)."""

from __future__ import annotations

import pytest

from kvbound.side.defects import BY_NAME
from kvbound.trace import runner as R
from kvbound.trace.storecheck import check_store_premises


def _run(w, version, layout, sched, n, overrides=None, seed=0):
    job = R.make_job(layout, (seed, "storeprem"), n, 0, sched, overrides)
    job["max_steps"] = 3000
    res = w.job(job)
    found, _ = R.check_result(version, layout, job, res)
    _, checked = check_store_premises(version, job, res)
    return [f for f in found if f.kind.startswith("premise:store-")], checked, found


@pytest.mark.parametrize("version", ["0.30.0", "0.31.0", "0.32.0", "0.33.0"])
def test_store_premises_hold_under_async_scheduling_and_speculative_decoding(version, workers):
    """Async scheduling (placeholders in num_computed_tokens, requests preempted and finished by a
    stale output) and speculative decoding (drafts, lookahead slots: an MTP drafter of 3 tokens) on
    the real release: every store premise holds on every captured store call."""
    env, w = workers(version)
    for layout, sched in (("full", "async"), ("swa-mtp", "sync")):
        bad, checked, found = _run(w, version, layout, sched, 200)
        assert checked > 0, (layout, sched, [f.kind for f in found])
        assert not bad, (layout, sched, [f.detail for f in bad])


def test_store_premises_hold_under_an_eagle_drafter_0_33(workers):
    env, w = workers("0.33.0")
    bad, checked, _ = _run(w, "0.33.0", "eagle", "sync", 200)
    assert checked > 300 and not bad, [f.detail for f in bad]


def test_the_store_premise_check_fires_on_an_allocator_past_the_lookahead(workers):
    """The planted allocator holds blocks no scheduled token needs: store-allocated-scheduled
    breaks on the calls that see them; the same point clean reports no store premise."""
    d = BY_NAME["allocate_past_lookahead"]
    env, w = workers(d.release)
    bad, checked, _ = _run(w, d.release, d.layout, "sync", 100, {"mutant": d.name})
    assert set(d.catches) <= {f.kind for f in bad}, [f.kind for f in bad]
    f = next(f for f in bad if f.kind == "premise:store-allocated-scheduled")
    assert f.detail["count"] >= 1 and "A·B < C + S + 2L + B" in f.detail["detail"]
    clean, checked_clean, _ = _run(w, d.release, d.layout, "sync", 100)
    assert checked_clean > 0 and not clean, [f.detail for f in clean]


def test_store_calls_are_captured_and_judged_under_async_speculative_decoding_0_33(workers):
    """Async scheduling with speculative decoding, where the shadow KV is off (engine.py): the store
    calls are still recorded (store_contract.record_store_calls), every one is judged by the store spec
    and folded with every store premise (drafts scheduled, lookahead slots, placeholders), none breaks;
    the planted allocator past the lookahead breaks store-allocated-scheduled on the same point."""
    from kvbound.trace.storecheck import judge_store_calls

    env, w = workers("0.33.0")
    for layout in ("eagle", "swa-mtp", "mamba-eagle"):
        job = R.make_job(layout, (0, "storeprem"), 60, 0, "async", None)
        job["max_steps"] = 3000
        res = w.job(job)
        assert job["params"]["async"] and job["layout"].get("speculative"), layout
        calls = res["store_calls"]
        assert any(c[-1]["drafts"] > 0 and c[-1]["lookahead"] > 0 for c in calls), layout  # drafts reached it
        disagree, judged = judge_store_calls("0.33.0", job, res)
        prem, checked = check_store_premises("0.33.0", job, res)
        assert judged == len({(c[0], c[1]) for c in calls}) > 300 and checked == len(calls), (layout, judged, checked)
        assert not disagree and not prem, (layout, disagree, prem)
    bad, checked, _ = _run(w, "0.33.0", "eagle", "async", 60, {"mutant": "allocate_past_lookahead"})
    assert checked > 300 and "premise:store-allocated-scheduled" in {f.kind for f in bad}, [f.kind for f in bad]


def test_store_premises_hold_on_a_request_preempted_then_aborted_0_33(workers):
    """Sync scheduling: a request preempted (_preempt_request: num_computed_tokens = 0, its blocks freed)
    and aborted before its next lookup reaches _build_store_jobs with C = S = 0 while the connector still
    holds the block_ids it had at the preemption (only get_num_new_matched_tokens clears them, 0.33.0
    offloading/scheduler.py:1243). The shrunk reproducer (0.33.0 mamba@cpu_chunks=32, request 187: 256
    tokens scheduled, preempted at step 246, aborted) reaches that call; store-allocated-scheduled once
    broke on it (A = 4 > cdiv(C + S, B) = 0), though the call stores nothing (horizon C = 0)."""
    from pathlib import Path

    from kvbound.trace import tracefile as TF

    f = TF.load(Path(__file__).parent / "data" / "trace" / "0-33-0-mamba-cpu-chunks-32-preempted-then-aborted-10req.json")
    env, w = workers(f.release)
    job = dict(f.segment)
    assert not job["params"]["async"]
    res = w.job(job)
    reached = [c for c in res["store_calls"] if c[2] == "aborted" and c[5] == 0 and c[6] == 0 and c[8] > 0]
    assert reached and res["stats"]["preemptions"] >= 1, res["stats"]
    prem, checked = check_store_premises(f.release, job, res)
    assert checked > 0 and not prem, prem
    assert all(c[10] == c[11] for c in reached)  # next_stored_chunk_idx unchanged: it stores nothing


def test_store_preempted_stored_is_not_held_after_a_refused_store_0_33():
    """The premise holds only when every store of the request was accepted (its text): request 440
    of this 0.33.0 full-tiering-fs run (a 32-chunk primary tier, async, seed 1, shrunk to 34
    requests) had its stores refused by the full tier, was preempted and finished by a stale output
    with C = 0 and N0 = 0 while its horizon reaches 34 chunks. Once reported as
    premise:store-preempted-stored; the call is refused too, so it stores nothing from the freed
    blocks. The same calls with the refusals taken back break the premise again.
    Judged on the run's recorded calls (a Jepsen-style history): the run was made before the tenth
    stop, when kvbound's async segments ran on vLLM's synchronous in-flight budget; with async
    scheduling on (side/engine.py) the same requests are not preempted, and 12 seeded runs of 400
    requests have not yet given the shape again."""
    import json
    from pathlib import Path

    from kvbound.trace import tracefile as TF

    data = Path(__file__).parent / "data" / "trace"
    f = TF.load(data / "0-33-0-full-tiering-fs-refused-then-preempted-34req.json")
    job = dict(f.segment)
    recorded = data / "0-33-0-full-tiering-fs-refused-then-preempted-34req.store-calls.json"
    res = {"store_calls": json.loads(recorded.read_text())["store_calls"]}
    calls = [c for c in res["store_calls"] if c[1] == "440"]
    assert any(c[12] for c in calls) and any(c[2] == "finished" and c[5] == 0 for c in calls), calls[-3:]
    prem, checked = check_store_premises(f.release, job, res)
    assert checked > 0 and not prem, prem
    # the same calls with every refusal taken back: the finished call breaks the premise again
    accepted = dict(res, store_calls=[c[:12] + [False] + c[13:] for c in res["store_calls"]])
    prem, _ = check_store_premises(f.release, job, accepted)
    assert [p["check"] for p in prem] == ["premise:store-preempted-stored"] and prem[0]["request"] == "440", prem
