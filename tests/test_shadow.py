"""Shadow KV in kvbound trace: the content model's pure parts, and real runs where every
data/store check fires on a planted defect, stays quiet on a clean run, and reports the
0.26-0.29 finished-request store horizon (offload_prompt_only=False) that 0.30.0 fixed."""

from __future__ import annotations

import collections
import random
import types

import pytest

from kvbound.side import content as C
from kvbound.side import tier as T
from kvbound.side.defects import DEFECTS
from kvbound.trace import runner as R
from kvbound.trace.layouts import LAYOUTS



# --- the parts, built from plain objects ------------------------------------------------------

def _req(rid, tokens, computed):
    return types.SimpleNamespace(request_id=rid, num_prompt_tokens=len(tokens), prompt_token_ids=tokens,
                                 num_computed_tokens=computed)


def _content(tables, requests, violations):
    """One full-attention group of 4-token blocks; ``tables``: request id -> its block ids."""
    blocks = {rid: [types.SimpleNamespace(block_id=b, is_null=b == 0) for b in ids] for rid, ids in tables.items()}
    manager = types.SimpleNamespace(block_size=4, req_to_blocks=blocks, get_num_skipped_tokens=lambda n: 0)
    sched = types.SimpleNamespace(requests={r.request_id: r for r in requests})
    return C.ContentModel([manager], ["full_attention"], sched, C.Report(violations, lambda: 1), {})


def _step(model, scheduled):
    model.forward(types.SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens={}))


def test_a_request_reads_a_sharing_prefix_s_kv_and_no_other():
    """Prefix identities are request-independent: B, sharing A's first block of tokens, reads
    the block A's forward wrote; C, whose first token differs, reading the same block is
    data:wrong_kv, named by who, where and what it found."""
    a = _req("1", [5, 6, 7, 8, 9, 10, 11, 12], 8)
    b = _req("2", [5, 6, 7, 8, 30, 31], 6)
    c = _req("3", [4, 6, 7, 8, 30, 31], 6)
    violations = []
    model = _content({"1": [1, 2], "2": [1, 3], "3": [1, 4]}, [a, b, c], violations)
    _step(model, {"1": 8})  # A computes tokens 0..7 into blocks 1 and 2
    _step(model, {"2": 2})  # B computes 4..5 on top of A's block 1: reads 0..3 there
    assert violations == []
    _step(model, {"3": 2})
    (v,) = violations
    assert (v["check"], v["request"], v["group"], v["block_id"], v["position"]) == ("data:wrong_kv", "3", 0, 1, 0)
    assert v["found"][2:] == ["1", 0]  # request 1's KV of position 0
    assert model.stats["shadow_writes"] == 12


def test_a_page_reallocated_in_another_block_size_holds_nothing_of_the_new_group():
    """Groups of different block sizes draw on one pool of pages (DeepSeek V4's shape, layout
    ``swa-mixed``): a page group 1 wrote as a 4-token block, freed and reallocated to group 0's
    8-token blocks, is laid out afresh when group 0's forward writes it, and read unwritten by a
    group-0 reader that finds it as group 1 left it (it once failed with an IndexError, a harness
    fault)."""
    def table(ids):
        return [types.SimpleNamespace(block_id=b, is_null=b == 0) for b in ids]

    g0 = types.SimpleNamespace(block_size=8, req_to_blocks={}, get_num_skipped_tokens=lambda n: 0)
    g1 = types.SimpleNamespace(block_size=4, req_to_blocks={}, get_num_skipped_tokens=lambda n: 0)
    a = _req("1", list(range(10, 18)), 8)
    b = _req("2", list(range(20, 28)), 8)
    c = _req("3", list(range(10, 18)), 5)
    violations = []
    model = C.ContentModel([g0, g1], ["full_attention", "full_attention"],
                           types.SimpleNamespace(requests={r.request_id: r for r in (a, b, c)}),
                           C.Report(violations, lambda: 1), {})
    g0.req_to_blocks.update({"1": table([1]), "2": table([2]), "3": table([3])})
    g1.req_to_blocks.update({"1": table([2, 3]), "2": table([4, 5]), "3": table([6, 7])})
    _step(model, {"1": 8})  # A: block 1 as 8 slots (group 0), blocks 2 and 3 as 4 slots (group 1)
    assert [len(model.gpu[i]) for i in (1, 2, 3)] == [8, 4, 4]
    _step(model, {"2": 8})  # B: block 2, group 1's page before, now group 0's 8 slots
    assert violations == [] and len(model.gpu[2]) == 8 and model.stats["shadow_relaid"] == 1
    _step(model, {"3": 1})  # C reads positions 0..3 of block 3 in group 0: a page of group 1's
    got = [v for v in violations if v["group"] == 0]
    assert got and (got[0]["check"], got[0]["block_id"], got[0]["found"]) == ("data:wrong_kv", 3, None)


def _copy(src, dst):
    return types.SimpleNamespace(src_block_id=src, dst_block_id=dst)


def test_a_step_s_block_copies_run_at_once():
    """The model runner gathers every source before it writes any destination (0.33.0
    v1/worker/utils.py:909-955): in a chain 1 -> 2, 2 -> 3 of one step, block 3 gets what block
    2 held before the step's copies (zeroed: it is new), not block 1's KV, and the request
    reading block 3 reads data:wrong_kv whose provenance names the chain. Applied one after
    another, as the content model did before, block 3 would hold A's KV and read clean."""
    a = _req("1", [5, 6, 7, 8], 4)
    b = _req("2", [5, 6, 7, 8, 9], 2)
    c = _req("3", [5, 6, 7, 8, 9], 2)
    violations = []
    model = _content({"1": [1], "2": [2], "3": [3]}, [a, b, c], violations)
    _step(model, {"1": 4})  # A computes tokens 0..3 into block 1
    model.update_states(types.SimpleNamespace(new_block_ids_to_zero=[2, 3],
                                              kv_cache_block_copies=[_copy(1, 2), _copy(2, 3)]))
    assert model.gpu[2] == model.gpu[1] and 3 not in model.gpu
    _step(model, {"2": 1, "3": 1})  # both read tokens 0..1 of their copy
    (v,) = violations
    assert (v["check"], v["request"], v["block_id"], v["found"]) == ("data:wrong_kv", "3", 3, None)
    assert v["provenance"] == "copied from block 2 (itself a destination of this step's copies)"


def _copy_step(computed, scheduled, tables, copies, zero=()):
    """A scheduler after schedule(): one full-attention group of 4-token blocks."""
    blocks = {rid: [types.SimpleNamespace(block_id=b, is_null=False) for b in ids] for rid, ids in tables.items()}
    manager = types.SimpleNamespace(block_size=4, req_to_blocks=blocks)
    sched = types.SimpleNamespace(
        requests={rid: types.SimpleNamespace(num_computed_tokens=c + scheduled.get(rid, 0))
                  for rid, c in computed.items()},
        kv_cache_manager=types.SimpleNamespace(coordinator=types.SimpleNamespace(single_type_managers=[manager])))
    so = types.SimpleNamespace(num_scheduled_tokens=scheduled, kv_cache_block_copies=copies,
                               new_block_ids_to_zero=list(zero))
    return sched, so


def test_a_copy_from_a_same_step_copy_destination_carries_nothing():
    """checks.uncomputed_copies, the chained shape: request 1 partial-hits block 9 (cached, its
    writer gone) and gets the private copy 9 -> 5; request 2, in the same step, partial-hits
    block 5 and gets 5 -> 6. Request 1 counts 7 tokens computed before the step, more than the
    6 request 2 needs, yet block 5 holds none of them until the copies run, and they run at
    once: the second copy carries zeros. Without the chain (block 5 filled a step earlier) the
    same copy is clean."""
    from kvbound.side.checks import _empty_source, uncomputed_copies

    tables = {"1": [4, 5], "2": [4, 6]}
    sched, so = _copy_step({"1": 7, "2": 6}, {"1": 1, "2": 2}, tables, [_copy(9, 5), _copy(5, 6)], zero=[5, 6])
    (r,) = uncomputed_copies(sched, so)
    assert (r["src_block_id"], r["dst_block_id"], r["reader"], r["copied_tokens"]) == (5, 6, "2", [4, 6])
    assert r["src_copied_this_step"] and r["src_owners"] == {"1": {"computed_before_step": 7,
                                                                    "scheduled_this_step": 1}}
    assert "itself the destination of one of this step's copies" in _empty_source(r)
    sched, so = _copy_step({"1": 7, "2": 6}, {"1": 1, "2": 2}, tables, [_copy(5, 6)], zero=[6])
    assert uncomputed_copies(sched, so) == []


def test_job_pairs_follow_the_cpu_worker_mapping():
    """transfer_async: per group, GPU blocks onto CPU sub-blocks from block_indices % bpc."""
    spec = types.SimpleNamespace(block_ids=[7, 8, 9, 4], group_sizes=[3, 1], block_indices=[1, 2])
    # group 0 starts at sub-block 1 of CPU block 100; group 1 at sub-block 0 of 200
    assert T.job_pairs(spec, [100, 101, 200], 2) == [(0, 7, 100, 1), (0, 8, 101, 0), (0, 9, 101, 1), (1, 4, 200, 0)]
    spec1 = types.SimpleNamespace(block_ids=[3, 5], group_sizes=[2], block_indices=[4])
    assert T.job_pairs(spec1, [10, 11], 1) == [(0, 3, 10, 0), (0, 5, 11, 0)]


class _NoContract:
    """A store contract that covers nothing and checks nothing (the tier's copies alone)."""

    def coverage(self, job):
        return {}

    def check_store(self, job):
        pass


def test_a_load_brings_back_what_a_store_copied_and_a_failed_load_nothing():
    a = _req("1", [5, 6, 7, 8], 4)
    violations = []
    model = _content({"1": [1]}, [a], violations)
    _step(model, {"1": 4})
    tier = T.TierTransfers(1, model, _NoContract(), model.report, random.Random(0), model.stats)
    gpu = lambda *ids: types.SimpleNamespace(block_ids=list(ids), group_sizes=[len(ids)], block_indices=[0])
    cpu = lambda *ids: types.SimpleNamespace(block_ids=list(ids))
    tier.store_req[1] = "1"
    tier.submit("store", 1, gpu(1), cpu(100), 0, True)  # delay 0: copies at submission
    tier.complete(1)
    tier.submit("load", 2, cpu(100), gpu(7), 0, True)
    tier.submit("load", 3, cpu(100), gpu(9), 0, False)
    assert model.gpu[7] == model.gpu[1] and 9 not in model.gpu
    assert "load job 2" in model.gpu_via[7] and "store job 1 of request 1" in model.gpu_via[7]
    assert model.stats["shadow_copies"] == 2 and violations == []


# --- real vLLM ----------------------------------------------------------------------------

def _kinds(w, version, layout, overrides=None, n=100, seed=3):
    job = R.make_job(layout, (seed, "mut"), n, 0, "sync", overrides)
    job["max_steps"] = 3000
    found, _ = R.check_result(version, layout, job, w.job(job))
    return collections.Counter(f.kind for f in found), found


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.module == "tier"], ids=lambda d: d.name)
def test_shadow_checks_fire_on_a_planted_defect(defect, workers):
    env, w = workers(defect.release)
    got, found = _kinds(w, defect.release, defect.layout, {"mutant": defect.name})
    assert set(defect.catches) <= set(got), dict(got)
    wrong = [f for f in found if f.kind == "data:wrong_kv"]
    for f in wrong[:3]:  # a read finding names who and where, and where the content came from
        assert {"request", "group", "block_id", "position", "expected", "found"} <= set(f.detail)


def test_shadow_clean_run_reports_nothing(workers):
    env, w = workers("0.30.0")
    got, _ = _kinds(w, "0.30.0", "full-store-all", n=150)
    assert not got, dict(got)


def test_store_obligations_per_release():
    """Z3: refuted where the release stores what the forward never computed (0.26-0.29
    finished with offload_prompt_only=False; 0.26 aborted), proved where it is fixed."""
    from kvbound.proofs.runner import run_obligation
    from kvbound.proofs.store import OBLIGATIONS
    from kvbound.spec.verdicts import Verdict

    results = [run_obligation(o) for o in OBLIGATIONS]
    assert all(r.met for r in results), [(r.obligation.id, r.verdict, r.replay) for r in results]
    refuted = {r.obligation.id for r in results if r.verdict == Verdict.REFUTED}
    assert "store.computed[0.27.0+,finished,prompt_only=False,sync/async/spec]" in refuted
    # 0.30+: proved under sync scheduling, async scheduling and speculative decoding (sync scheduler); under
    # speculative decoding with async scheduling only a finished request is refuted (preempted, lookahead)
    assert {i for i in refuted if "0.30.0" in i} == {
        "store.computed[0.30.0+,finished,prompt_only=True,async+spec]",
        "store.computed[0.30.0+,finished,prompt_only=False,async+spec]"}
    w = next(r for r in results if r.obligation.id == "store.computed[0.27.0+,finished,prompt_only=False,sync/async/spec]")
    assert "never forwarded" in w.witness.draw()
    a = next(r for r in results if r.obligation.id == "store.computed[0.30.0+,finished,prompt_only=False,async+spec]")
    # the witness: a finished request preempted meanwhile (C = 0) stores a chunk past those it stored before
    assert a.witness.C == 0 and a.witness.is_async and a.witness.N0 < a.witness.stored_chunks


def test_store_premises_restated_per_mode():
    """Each store premise folds on the numbers vLLM hands _build_store_jobs in each mode, as measured
    on vLLM 0.33.0's own offloading-connector unit tests (issue 24): async scheduling's placeholder
    (C + S = T + 1), two drafts under async (C + S = T + 3), a finished async request (C = T), and
    speculative decoding's lookahead slots; and breaks past them."""
    from kvbound.proofs.store_premises import RELEASE_LINES, STORE_BY_ID, STORE_PREMISES, StoreTerms, check_store_call

    def t(C, S, T, A=0, Ph=0, K=0, L=0, is_async=False, P=None, B=16, N0=0, horizon=None):
        P = T - 1 if P is None else P
        h = min(C + S, T) if horizon is None else horizon
        return StoreTerms(P, T - P, C, S, A, B, T, C + S, h, Ph, K, L, is_async, N0)

    run = STORE_BY_ID["store-running-scheduled"].term
    assert run(t(142, 1, 142, Ph=1, is_async=True)) is True  # a placeholder: C + S = T + 1
    assert run(t(140, 3, 140, Ph=1, K=2, is_async=True)) is True  # C + S = T + 3
    assert run(t(40, 3, 41, K=2)) is True  # sync, two drafts
    assert run(t(142, 1, 142)) is False  # no placeholder, no draft: past T
    fin = STORE_BY_ID["store-finished-by-sampling"].term
    assert fin(t(45, 0, 46)) is True and fin(t(46, 0, 46, is_async=True)) is True  # C = T - 1; async C = T
    assert fin(t(0, 0, 307, is_async=True)) is True and fin(t(0, 0, 307)) is False  # preempted: async only
    assert fin(t(44, 0, 46)) is False
    alloc = STORE_BY_ID["store-allocated-scheduled"].term
    assert alloc(t(45, 0, 46, A=4, L=2)) is True  # drafts rejected since the allocation (0.33.0 eagle, sync)
    assert alloc(t(45, 0, 46, A=4)) is False
    assert alloc(t(0, 0, 307, A=20, is_async=True)) is True  # a preempted request's blocks, still held
    # ... under sync scheduling too: preempted, then aborted before its next lookup (0.33.0
    # mamba@cpu_chunks=32, tests/data/trace/0-33-0-mamba-cpu-chunks-32-preempted-then-aborted-10req.json)
    assert alloc(t(0, 0, 279, A=4, B=64)) is True
    assert not check_store_call(t(0, 0, 279, A=4, B=64, P=279, N0=4, horizon=0), "aborted", True)
    assert alloc(t(0, 64, 307, A=20)) is False  # scheduled again: its lookup cleared the stale block_ids
    kept = STORE_BY_ID["store-preempted-stored"].term  # ... from which it stores nothing new
    # 0.33.0 full async: a finished request's horizon max(P, T - 1) = 306, 19 chunks, all stored before
    assert kept(t(0, 0, 307, A=20, is_async=True, N0=19, horizon=306)) is True
    assert kept(t(0, 0, 307, A=20, is_async=True, N0=18, horizon=306)) is False  # chunk 18 from a freed block
    assert kept(t(45, 0, 46, A=4, N0=0)) is True
    assert not check_store_call(t(142, 1, 142, A=9, Ph=1, is_async=True), "running", True)
    (p, detail), = check_store_call(t(142, 1, 142, A=9), "running", True)
    assert p.id == "store-running-scheduled" and "Ph=0" in detail
    for p in STORE_PREMISES[:5]:  # each cites its lines in every release the store spec covers
        assert {s.split()[1] for s in p.sources} == set(RELEASE_LINES), p.id


def test_finished_request_store_horizon_0_29(workers):
    """The Z3 witness of 0.27-0.29's finish path, replayed on the real 0.29.0: a finished
    request stores the chunk that ends at its final sampled token, never forwarded (0.30.0
    clamps the horizon to num_tokens - 1); 0.30.0 stores nothing of the kind."""
    from kvbound.proofs.runner import run_obligation
    from kvbound.proofs.store import OBLIGATIONS

    ob = next(o for o in OBLIGATIONS if o.id == "store.computed[0.27.0+,finished,prompt_only=False,sync/async/spec]")
    w = run_obligation(ob).witness
    assert w.B == 16
    req = {"id": 7, "arrive": 0, "prompt": [["uniq", 7, w.P]], "max_tokens": w.O, "abort_after": None}
    for version, expect in (("0.29.0", True), ("0.30.0", False)):
        env, wk = workers(version)
        job = {"layout": LAYOUTS["full-store-all"].job_layout(),
               "params": dict(LAYOUTS["full-store-all"].params(), seed="0", **{"async": False}), "requests": [req]}
        found, _ = R.check_result(version, "full-store-all", job, wk.job(job))
        stores = [f for f in found if f.kind in ("store:unwritten_source", "store:foreign_source")]
        assert bool(stores) == expect, [f.kind for f in found]
        if expect:
            assert stores[0].detail["position"] == w.T - 1


def test_aborted_mid_prefill_store_0_26(workers):
    """The 0.26 aborted-request witness (refuted by proofs/store.py), replayed on the real
    0.26.0 with the default offload_prompt_only=True: two prompts share a 256-token step,
    the longer one (165 tokens, 156 computed) is aborted and 0.26 stores its chunk
    [144, 160) with 156..159 never computed (0.27.0 stores up to num_computed_tokens)."""
    env, w = workers("0.26.0")
    reqs = [{"id": 1, "arrive": 0, "prompt": [["uniq", 1, 100]], "max_tokens": 4, "abort_after": None},
            {"id": 2, "arrive": 0, "prompt": [["uniq", 2, 165]], "max_tokens": 4, "abort_after": 1}]
    job = {"layout": LAYOUTS["full"].job_layout(),
           "params": dict(LAYOUTS["full"].params(), seed="0", **{"async": False}), "requests": reqs}
    found, _ = R.check_result("0.26.0", "full", job, w.job(job))
    f = [f for f in found if f.kind == "store:unwritten_source"]
    assert f and f[0].detail["position"] == 156, [g.kind for g in found]


def test_store_spec_rows_and_judge():
    from kvbound.spec import store as ST
    from kvbound.trace.storecheck import judge_store_calls

    # finished, store-all: 0.29 stores through num_tokens, 0.30 up to num_tokens - 1
    assert ST.store_horizon("0.29.0", ST.FINISHED, 1, 16, 15, 0, False) == 16
    assert ST.store_horizon("0.30.0", ST.FINISHED, 1, 16, 15, 0, False) == 15
    assert ST.store_horizon("0.30.0", ST.FINISHED, 1, 16, 15, 0, True) == 1
    assert ST.store_horizon("0.26.0", ST.ABORTED, 165, 165, 156) == 165
    assert ST.store_horizon("0.27.0", ST.ABORTED, 165, 165, 156) == 156
    assert ST.next_stored_chunk_idx(0, 165, 16, 10, caps_at_allocated=False) == 10  # the wrong chunk 9
    assert ST.next_stored_chunk_idx(0, 600, 16, 10, caps_at_allocated=False) is None  # 0.26 asserts
    job = {"layout": {"groups": [{"tokens_per_block": 16}], "blocks_per_chunk": 1},
           "params": {"offload_prompt_only": False}}
    ok = [[3, "7", "finished", 1, 16, 15, 0, None, 1, 1, 0, 0, False]]  # 0.30: chunk 0 not stored
    assert judge_store_calls("0.30.0", job, {"store_calls": ok}) == ([], 1)
    bad, n = judge_store_calls("0.29.0", job, {"store_calls": ok})  # 0.29 would have stored it
    assert n == 1 and bad[0]["check"] == "store:spec_disagreement" and bad[0]["spec"] == 1


def test_store_spec_caps_at_the_keyed_chunks():
    """Issue 24's input: a running request, P=8, T=9, C=8, S=0, 4-token chunks, 2 allocated, 1 keyed
    (its second block hash not yet arrived). 0.30+'s storable_chunks caps at the keyed chunks
    (0.33.0 offloading/scheduler.py:472-473): vLLM advances next_stored_chunk_idx 0 -> 1, and so does
    the spec; 0.29's caps at the allocated ones only (:382-408), so there the spec says 2. A release
    that stores past its keys (the record advancing to 2) is a disagreement."""
    from kvbound.spec import store as ST
    from kvbound.trace.storecheck import judge_store_calls

    assert ST.next_stored_chunk_idx(0, 8, 4, 2, num_keyed_chunks=1) == 1
    assert ST.next_stored_chunk_idx(0, 8, 4, 2) == 2
    job = {"layout": {"groups": [{"tokens_per_block": 4}], "blocks_per_chunk": 1},
           "params": {"offload_prompt_only": True}}
    # step, rid, status, P, T, C, S, max_offload_tokens, allocated, keyed, before, after, refused
    call = [7, "0", "running", 8, 9, 8, 0, None, 2, 1, 0]
    for v in ("0.30.0", "0.33.0"):
        assert judge_store_calls(v, job, {"store_calls": [call + [1, False]]}) == ([], 1), v
        (bad,), _ = judge_store_calls(v, job, {"store_calls": [call + [2, False]]})
        assert bad["spec"] == 1 and "1 keyed" in bad["message"], v
    (old,), _ = judge_store_calls("0.29.0", job, {"store_calls": [call + [1, False]]})
    assert old["spec"] == 2
    assert judge_store_calls("0.29.0", job, {"store_calls": [call + [2, False]]}) == ([], 1)


def test_draw_content_marks_what_the_reader_does_not_own():
    from kvbound.draw import draw_content

    table = {"group": 0, "request": "113", "block_size": 16, "position": 319, "rows": [
        {"index": 19, "block_id": 29, "tokens": [304, 320], "via": "load job 6",
         "runs": [["own", 304, 319, None, None], ["unwritten", 319, 320, None, None]]}]}
    out = draw_content(table)
    assert "own KV 304..318 ok" in out and "unwritten 319 !!" in out and "<-" in out and "load job 6" in out


def test_chunk_size_reaches_every_release():
    """The chunk size goes in the extra-config key every release reads (``block_size``,
    tokens per chunk); ``blocks_per_chunk`` only where the groups' block sizes differ (a
    key only 0.26+ reads); nothing for one block per chunk (every release's default)."""
    from kvbound.side.compose import chunk_size_config

    assert chunk_size_config(LAYOUTS["bpc2"].job_layout()) == {"block_size": 32}
    assert chunk_size_config(LAYOUTS["full"].job_layout()) == {}
    mixed = {"groups": [{"tokens_per_block": 16}, {"tokens_per_block": 32}], "blocks_per_chunk": 2}
    assert chunk_size_config(mixed) == {"blocks_per_chunk": 2}


# One request of 280 tokens (the shrunk reproducer of what 0.21-0.25 once reported on bpc2).
_BPC2_ONE = [{"id": 199, "arrive": 0, "prompt": [["doc", 0, 0, 243], ["uniq", 194, 1], ["uniq", 199, 36]],
              "max_tokens": 4, "abort_after": None}]


def _bpc2_job(requests, **params):
    return {"layout": LAYOUTS["bpc2"].job_layout(),
            "params": dict(LAYOUTS["bpc2"].params(), seed="0", **dict({"async": False}, **params)),
            "requests": requests}


def test_bpc2_runs_two_blocks_per_chunk_before_0_26(workers):
    """0.21-0.25 read the chunk size only from ``block_size`` (0.25.1
    v1/kv_offload/base.py:554); given ``blocks_per_chunk`` they ran one block per chunk while
    the shadow mapped two, and every multi-chunk store read as store:wrong_key /
    store:foreign_source. Now the connector runs two (the engine refuses a layout whose
    chunk size did not take), one request's store is clean, and a planted load shift still
    reads wrong."""
    env, w = workers("0.25.1")
    res = w.job(_bpc2_job(_BPC2_ONE))
    assert res.get("ok"), res.get("setup_error") or res.get("error")
    found, _ = R.check_result("0.25.1", "bpc2", _bpc2_job(_BPC2_ONE), res)
    assert not found, [(f.kind, f.detail.get("message")) for f in found]
    assert res["stats"]["shadow_copies"] > 0
    got, _ = _kinds(w, "0.25.1", "bpc2", {"mutant": "load_dst_shift"}, n=150)
    assert "data:wrong_kv" in got, dict(got)


def test_groups_of_two_block_sizes_run_clean_and_a_planted_shift_reads_wrong(workers):
    """``swa-mixed`` (full attention on 64-token blocks beside a window on 16-token blocks) on
    0.33.0: pages move between the two block sizes (``shadow_relaid``), loads and stores copy
    them, and the run finds nothing (a hit under full attention's first chunk included); a load
    that lands one block off reads wrong."""
    env, w = workers("0.33.0")
    job = R.make_job("swa-mixed", (3, "mut"), 100, 0, "sync")
    res = w.job(job)
    assert res.get("ok"), res.get("setup_error") or res.get("error")
    found, _ = R.check_result("0.33.0", "swa-mixed", job, res)
    assert not found, [(f.kind, f.detail.get("message")) for f in found]
    st = res["stats"]
    assert st["shadow_relaid"] > 0 and st["shadow_copies"] > 0 and st["shadow_reads"] > 0, st
    got, _ = _kinds(w, "0.33.0", "swa-mixed", {"mutant": "load_dst_shift"}, n=100)
    assert "data:wrong_kv" in got, dict(got)


def test_partial_swa_chunk_store_0_30(workers):
    """docs/findings.md, 0.30.0 - 0.32.0: B's GPU hit leaves sliding-window block 2 null and
    block 3 a hit; B stores chunk 1 (blocks 2-3) with sub-block 0 unwritten under the whole
    chunk's key (the store tests only a chunk's last block, 0.30.0 offloading/scheduler.py:1596);
    C loads the whole chunk and reads position 33 from the unwritten sub-block. 0.33.0 skips
    a chunk with a reachable null block (offloading/scheduler.py:1971-1981)."""
    doc = [["doc", 1, 0, 121], ["uniq", 0, 40]]
    reqs = [{"id": 0, "arrive": 0, "prompt": doc, "max_tokens": 1, "abort_after": None},
            {"id": 1, "arrive": 0, "prompt": [["doc", 1, 0, 116], ["uniq", 1, 12]], "max_tokens": 1,
             "abort_after": None},
            {"id": 3, "arrive": 4, "prompt": [["uniq", 3, 300]], "max_tokens": 1, "abort_after": None},
            {"id": 8, "arrive": 12, "prompt": [["doc", 1, 0, 124], ["uniq", 8, 45]], "max_tokens": 1,
             "abort_after": None}]
    for version, expect in (("0.30.0", True), ("0.33.0", False)):
        env, w = workers(version)
        job = _bpc2_job(reqs, num_gpu_blocks=49, abort_p=0)
        found, _ = R.check_result(version, "bpc2", job, w.job(job))
        assert all(f.kind == "data:wrong_kv" for f in found), [f.kind for f in found]
        assert bool(found) == expect, [f.detail.get("message") for f in found]
        if expect:
            d = found[0].detail
            assert (d["request"], d["group"], d["position"]) == ("8", 1, 33)
            assert "written by store job 1 of request 1" in d["provenance"]


def test_stalled_write_is_not_a_lost_chunk(workers):
    """``full-stalled``'s tier never makes some completed stores readable, on purpose
    (``stall_p``): the connector stored the chunk, so it is not ``store:lost_chunk`` (the
    shrunk 1-request finding of the 0.30.0 run, seed 0, reported it). A chunk the connector
    never offers (planted ``drop_store``) still is."""
    env, w = workers("0.30.0")
    req = [{"id": 199, "arrive": 0, "prompt": [["doc", 5, 0, 211], ["uniq", 189, 4], ["uniq", 199, 1]],
            "max_tokens": 16, "abort_after": None}]
    job = {"layout": LAYOUTS["full-stalled"].job_layout(),
           "params": dict(LAYOUTS["full-stalled"].params(), seed="(0, 'full-stalled', 0)", **{"async": False}),
           "requests": req}
    res = w.job(job)
    assert res["stats"].get("tier_stalled", 0) > 0  # the script did stall a write of this request
    found, _ = R.check_result("0.30.0", "full-stalled", job, res)
    assert not [f for f in found if f.kind == "store:lost_chunk"], [f.detail["message"] for f in found]
    got, _ = _kinds(w, "0.30.0", "full-stalled", {"mutant": "drop_store"})
    assert "store:lost_chunk" in got, dict(got)


# --- the store spec, group by group (every group kind, drafter groups) -----------------------

def _verdicts(w, version, point, overrides=None, n=100):
    from kvbound.trace.storecheck import group_verdicts

    job = R.make_job(point, (3, "mut"), n, 0, "sync", overrides)
    job["max_steps"] = 3000
    res = w.job(job)
    assert res.get("ok", True), res.get("error")
    found, _ = R.check_result(version, point, job, res)
    return list(group_verdicts(version, job, res)), collections.Counter(f.kind for f in found)


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.module == "store_contract"], ids=lambda d: d.name)
def test_store_spec_finds_a_planted_frontier_defect_per_group(defect, workers):
    """Each planted frontier defect (a drafter group's trailing chunk held back at finish; a sliding
    window's frontier one chunk ahead) is a store:spec_disagreement on the group it plants, and the
    clean run of the same point judges every group of every call and finds none."""
    env, w = workers(defect.release)
    clean, got = _verdicts(w, defect.release, defect.layout)
    assert clean and all(v["ok"] for v in clean) and "store:spec_disagreement" not in got, dict(got)
    bad, got = _verdicts(w, defect.release, defect.layout, {"mutant": defect.name})
    assert set(defect.catches) <= set(got), dict(got)
    wrong = [v for v in bad if not v["ok"]]
    if defect.name == "drafter_skips_trailing":
        assert wrong and all(v["draft"] and v["status"] != "running" and v["after"] == v["spec"] - 1 for v in wrong)
    else:
        assert wrong and all(v["kind"] == "sliding_window" and v["after"] == v["spec"] + 1 for v in wrong)


def test_drafter_trailing_chunk_per_release(workers):
    """On real runs of EAGLE with decoded tokens offloaded, the drafter group holds its trailing chunk
    back while decoding on every release, and at finish only before 0.30 (store_drafter_tail_at_finish):
    every group verdict agrees, and the held-back calls are there to judge."""
    for version in ("0.29.0", "0.30.0"):
        env, w = workers(version)
        vs, got = _verdicts(w, version, "eagle@offload_prompt_only=false")
        assert all(v["ok"] for v in vs), [v for v in vs if not v["ok"]][:2]
        assert {v["kind"] for v in vs} == {"full_attention"} and {v["draft"] for v in vs} == {True, False}
        held = [v for v in vs if v["holds_tail"]]
        assert held and all(v["draft"] for v in held)
        at_finish = [v for v in held if v["status"] != "running"]
        assert bool(at_finish) == (version == "0.29.0"), version


def test_untagged_speculation_makes_every_group_a_drafter_before_0_30(workers):
    """Speculative decoding with no group tagged is_eagle_group: 0.29's connector makes every group a
    drafter's, 0.30's none (untagged_groups_non_draft); the spec's is_drafter_group agrees with the
    connector on every group of every captured call, each group kind judged."""
    for version, draft in (("0.29.0", True), ("0.30.0", False)):
        env, w = workers(version)
        vs, got = _verdicts(w, version, "mamba-eagle-untagged")
        assert vs and all(v["ok"] for v in vs), [v for v in vs if not v["ok"]][:2]
        assert {v["draft"] for v in vs} == {draft} and {v["kind"] for v in vs} == {"full_attention", "mamba"}


def test_store_judge_per_group_by_hand():
    """A record with every group: the judge holds each to its own tokens per chunk and caps, and the
    connector's drafter decision to is_drafter_group."""
    from kvbound.spec.store import FINISHED, GROUP_STORE_COLUMNS, group_frontier
    from kvbound.spec.versions import first_release
    from kvbound.trace.storecheck import judge_store_calls

    # the per-group columns, each written once at its first release
    assert {c: first_release(lambda f, c=c: getattr(f, c)) for c in GROUP_STORE_COLUMNS} == {
        "store_drafter_tail_at_finish": "0.30.0", "untagged_groups_non_draft": "0.30.0", "store_skips_cow_source": "0.29.0"}

    # a finished decode (P=64, T=101; horizon 101, from 0.30 100): a drafter group's sixth chunk [80, 96)
    # held back on 0.29, stored from 0.30; a non-draft group stores it on both; a refused store advances nothing
    fin = (FINISHED, 64, 101, 100, 0, 16, 7, 7, 4)
    assert group_frontier("0.29.0", *fin, offload_prompt_only=False, drafter=True) == (101, True, 5)
    assert group_frontier("0.30.0", *fin, offload_prompt_only=False, drafter=True) == (100, False, 6)
    assert group_frontier("0.29.0", *fin, offload_prompt_only=False) == (101, False, 6)
    assert group_frontier("0.30.0", *fin, offload_prompt_only=False, refused=True, drafter=True) == (None, False, 4)
    job = {"layout": {"groups": [{"tokens_per_block": 16}, {"tokens_per_block": 32}], "blocks_per_chunk": 1},
           "params": {"offload_prompt_only": False}}
    # group: index, kind, tagged, draft, allocated, keyed, before, after. Running, decoding: 100 tokens.
    def call(groups, spec=False):
        return [4, "9", "running", 64, 101, 96, 4, None, 7, 6, 0, groups[0][-1], False,
                {"placeholders": 0, "drafts": 0, "lookahead": 0, "groups": groups, "eagle_speculation": spec}]
    fa = [0, "full_attention", False, False, 7, 6, 0, 6]  # 100 // 16 = 6
    swa = [1, "sliding_window", False, False, 4, 3, 0, 3]  # 100 // 32 = 3
    assert judge_store_calls("0.33.0", job, {"store_calls": [call([fa, swa])]}) == ([], 1)
    (bad,), _ = judge_store_calls("0.33.0", job, {"store_calls": [call([fa, swa[:-1] + [4]])]})
    assert bad["group"] == 1 and bad["kind"] == "sliding_window" and bad["spec"] == 3
    draft = [1, "sliding_window", True, True, 4, 3, 0, 2]  # tagged: the trailing chunk held back
    assert judge_store_calls("0.33.0", job, {"store_calls": [call([fa, draft])]}) == ([], 1)
    # speculation on, nothing tagged: 0.29 makes every group a drafter's, 0.30 none
    untagged = [fa[:3] + [True] + fa[4:7] + [5], swa[:3] + [True] + swa[4:7] + [2]]
    assert judge_store_calls("0.29.0", job, {"store_calls": [call(untagged, True)]})[0] == []
    (bad,), _ = judge_store_calls("0.30.0", job, {"store_calls": [call(untagged, True)]})
    assert bad["real_draft"] is True and bad["spec_draft"] is False and "drafter" in bad["message"]


def test_what_each_group_offers_the_tier(workers):
    """On real 0.30.0 runs every group's offer to prepare_store is bounded by its frontier and skips
    null blocks; a full-attention group offers every non-null chunk it passes, a window fewer, a Mamba
    copy-on-write source group none; and a chunk the tier is never offered (planted drop_store) is a
    store:spec_disagreement on the full-attention group."""
    env, w = workers("0.30.0")
    offered = collections.Counter()
    for point in ("swa", "mamba-eagle"):
        vs, got = _verdicts(w, "0.30.0", point)
        assert vs and all(v["ok"] for v in vs) and "store:spec_disagreement" not in got, dict(got)
        for v in vs:
            offered[v["kind"]] += len(v["offered"])
    assert 0 < offered["sliding_window"] < offered["full_attention"] and offered["mamba"] == 0, dict(offered)
    vs, got = _verdicts(w, "0.30.0", "full", {"mutant": "drop_store"})
    wrong = [v for v in vs if not v["ok"]]
    assert "store:spec_disagreement" in got and wrong and all(v["kind"] == "full_attention" and v["offer"] for v in wrong)
    assert all(v["after"] == v["spec"] for v in wrong)  # the frontier advanced as the spec says: the offer lost it
    assert all(v["after"] == v["spec"] for v in wrong)  # the frontier advanced as the spec says: the offer lost it


def test_a_copy_on_write_source_group_stores_its_chunks_before_0_29(workers):
    """0.28.0 has requires_cow_source (offloading/scheduler.py:96, :263-266) but its _build_store_jobs
    still offers the Mamba align group's chunks from the block table (:1278-1287); 0.29.0 skips the
    group (:1359-1360). On a real 0.28.0 mamba run the Mamba group offers chunks and the judge,
    reading column store_skips_cow_source, finds no store:spec_disagreement; the 0.29+ rule still
    flags the same offer (issue 24: the 23-request mamba528 file on 0.28.0 was a false one)."""
    from kvbound.spec.store import offer_violations

    env, w = workers("0.28.0")
    vs, got = _verdicts(w, "0.28.0", "mamba")
    cow_offers = [v for v in vs if v["kind"] == "mamba" and v["offered"]]
    assert cow_offers, "0.28.0 offers no Mamba chunk"
    assert all(v["ok"] for v in vs) and "store:spec_disagreement" not in got, dict(got)
    assert offer_violations("0.28.0", "mamba", True, 0, 3, [2], [], []) == []
    assert offer_violations("0.29.0", "mamba", True, 0, 3, [2], [], []) == [
        "a copy-on-write source group offered chunk(s) [2]"]
