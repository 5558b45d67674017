"""HiSparse beside the OffloadingConnector (layouts hisparse, hisparse-swa; side/hisparse.py): where
the release table runs them, vLLM's builder and HiSparse connector on CPU, the connector's loads
bounded by what its unoffloaded groups hold (data:load_past_unfilled_group, side/checks.py), a
connector that does not bound them (planted) caught on the latest release."""

from __future__ import annotations

from kvbound.side.defects import BY_NAME
from kvbound.trace import runner as R
from kvbound.trace.space import support

KIND = "data:load_past_unfilled_group"


def _run(w, version, point, mutant=None, n=200):
    job = R.make_job(point, (7, "hisparse"), n, 0, "sync", {"mutant": mutant} if mutant else None)
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    return res, {f.key() for f in found}


def test_hisparse_runs_where_the_table_says():
    assert support("hisparse", "0.31.0") is None and support("hisparse-swa", "0.30.0") is None
    assert "0.30.0 :64 needs another attention layer" in support("hisparse", "0.30.0")
    assert "arrived in 0.30" in support("hisparse-swa", "0.29.0")
    assert "shadow KV cannot follow HiSparse" in support("hisparse@shadow=true", "0.33.0")


def test_the_latest_release_bounds_its_loads_and_an_unbounded_connector_is_caught(workers):
    """0.33.0: the connector loads the indexer group (loads > 0) and never past the source pages the
    host pool still holds; with its bound gone (planted, as where every group is offloaded) a load
    runs past them and is caught, with the group and the tokens it has no KV for."""
    defect = BY_NAME["unbounded_load"]
    assert defect.layout == "hisparse"
    env, w = workers(defect.release)
    res, keys = _run(w, defect.release, "hisparse")
    assert res["ok"] and res["stats"]["loads"] > 0 and keys == set(), (res.get("error"), keys)
    res, keys = _run(w, defect.release, "hisparse", defect.name)
    assert res["ok"] and keys == {KIND}, (res.get("error"), keys)
    past = [v for v in res["violations"] if v["check"] == KIND]
    assert all("group 0, which the connector does not offload" in v["message"] for v in past), past[:2]


# A reads a document (its pages reach the host pool, then stay as free GPU copies), F fills the pool, B
# re-reads A's first 96 tokens and 9 of its own: its admission counts 17 blocks and re-pins 6 copies more
ADMISSION = [{"id": 0, "arrive": 0, "prompt": [["doc", 1, 0, 100]], "max_tokens": 6, "abort_after": None},
             {"id": 1, "arrive": 7, "prompt": [["uniq", 5, 350]], "max_tokens": 60, "abort_after": None},
             {"id": 2, "arrive": 14, "prompt": [["doc", 1, 0, 96], ["uniq", 7, 9]], "max_tokens": 2,
              "abort_after": None}]


def _scripted(w, version, point, requests):
    job = R.make_job(point, (7, "scripted"), 1, 0, "sync", {"abort_p": 0.0})
    job["requests"] = requests
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    return res, {f.key() for f in found}


def test_the_admission_that_pins_free_copies_is_found_where_vllm_had_it(workers):
    """0.30.0 (hisparse-swa): a host-prefix hit re-pins free GPU copies of its pages while the
    allocation admits it (0.30.0 v1/hisparse/coordinator.py:196, 259), which its reservation never
    counted, and the hot pages' get_new_blocks raises; 0.31.0 adopts the copies only after the
    admission (its cache_blocks; 0.31.0 coordinator.py:200-202) and serves the three requests."""
    res, keys = _scripted(workers("0.30.0")[1], "0.30.0", "hisparse-swa", ADMISSION)
    assert not res["ok"] and "Cannot get 4 free blocks" in res["error"], (res.get("error"), keys)
    res, keys = _scripted(workers("0.31.0")[1], "0.31.0", "hisparse-swa", ADMISSION)
    assert res["ok"] and keys == set() and res["stats"]["requests"] == 3, (res.get("error"), keys)


def _alone(prompt_tokens):
    """One request of ``prompt_tokens`` unique tokens and 4 to decode, alone."""
    return [{"id": 1, "arrive": 0, "prompt": [["uniq", 5, prompt_tokens]], "max_tokens": 4, "abort_after": None}]


def test_one_request_within_max_model_len_is_served_or_the_livelock_is_caught(workers):
    """0.33.0 takes max_model_len 448 for 72 GPU blocks (its start check, side/hisparse.py), serves a
    400-token prompt, and preempts a 430-token one forever: its second chunk needs the hot pages and
    the first chunk's resident pages, still pinned until their host writes end, together
    (liveness:no_progress; docs/findings.md)."""
    env, w = workers("0.33.0")
    res, keys = _scripted(w, "0.33.0", "hisparse-swa", _alone(400))
    assert res["ok"] and keys == set(), (res.get("error"), keys)
    res, keys = _scripted(w, "0.33.0", "hisparse-swa", _alone(430))
    assert res["ok"] and "liveness:no_progress" in keys, (res.get("error"), keys)
    assert res["stats"]["preemptions"] >= 999, res["stats"]


def test_an_async_segment_runs_with_vllms_async_budget(workers):
    """An AsyncScheduler segment runs on a config with async scheduling on, as on CUDA (vLLM's CPU
    platform turns it off while it builds the config, side/engine.py): HiSparse's Model Runner V2
    then keeps two batches in flight, the start check budgets two windows of resident pages and refuses
    hisparse-swa's max_model_len 448 on 72 blocks (estimate 352), which it takes under the synchronous
    scheduler; the MLA-only hisparse fits both, and its async segment serves."""
    env, w = workers("0.33.0")
    for sched, refused in (("sync", False), ("async", True)):
        job = R.make_job("hisparse-swa", (7, "async"), 1, 0, sched, {"abort_p": 0.0})
        job["requests"] = _alone(300)
        res = w.job(job)
        keys = {f.key() for f in R.check_result("0.33.0", "hisparse-swa", job, res)[0]}
        if refused:
            assert "estimated maximum model length is 352" in res.get("setup_error", ""), res.get("setup_error")
            assert keys == {"crash:engine_build@_check_enough_kv_cache_memory:raise ValueError("}, keys
        else:
            assert res["ok"] and keys == set(), (res.get("error"), keys)
    job = R.make_job("hisparse", (7, "async"), 1, 0, "async", {"abort_p": 0.0})
    job["requests"] = _alone(430)
    res = w.job(job)
    assert res["ok"] and R.check_result("0.33.0", "hisparse", job, res)[0] == [], res.get("error")
