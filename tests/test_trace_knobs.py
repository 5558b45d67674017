"""The axes of issue 25 item 1 that turn the connector's and the CPU tier's knobs, the scheduler's
stats and the request-level traffic (kvbound/trace/space.py AXES): the CPU tier's cache policy
(ARC) and store threshold, log_stats (hits by tier), the retention interval, requests with a tier
filter or asking prompt logprobs, and prefix-cache resets mid-run. Each moved value runs on a real
release with a planted defect found, and clean on the same point without it; a release without
what the value needs is one line."""

from __future__ import annotations

import pytest

from kvbound.side.defects import BY_NAME
from kvbound.trace import runner as R
from kvbound.trace import space as S
from kvbound.trace import workload as W


def _run(w, version, point, mutant=None, n=80):
    job = R.make_job(point, (5, "knob"), n, 0, "sync", {"mutant": mutant} if mutant else None)
    job["max_steps"] = 3000
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    return job, res, {f.kind for f in found}


@pytest.mark.parametrize("point,version,defect,expect", [
    ("full@eviction_policy=arc", "0.33.0", "drop_store", None),
    # a small CPU tier evicts (pool pressure): an evicted chunk is not lost, a dropped store still is
    # (32 chunks hold about two prompts: a load comes in 200 requests, not in 80)
    ("full@cpu_chunks=32", "0.33.0", "drop_store", None),
    # a tier smaller than a prompt refuses stores it cannot evict for: a refused chunk is not lost either
    ("full@cpu_chunks=4", "0.33.0", "drop_store", None),
    ("full@store_threshold=2", "0.33.0", "drop_store", None),
    ("full@log_stats=true", "0.33.0", "lookup_extra_chunk", None),
    # a sliding window's stores: the store one chunk past the horizon reads a block not yet written
    ("swa@retention_interval=dense", "0.33.0", "store_past_horizon", ("store:foreign_source",)),
    ("full-tiering-fs@load_tiers_p=0.3", "0.33.0", "promote_reversed_keys", None),
    ("full@prompt_logprobs_p=0.1", "0.33.0", "lookup_extra_chunk", None),
    ("full@load_limit_p=0.3", "0.33.0", "lookup_extra_chunk", None),
    # a capped request's chunks past its max_offload_tokens are not lost; a dropped store still is
    ("full@offload_limit_p=0.3", "0.33.0", "drop_store", None),
    # the chunks a reset dropped are exempt until the tier is given them again: a chunk never offered is not
    ("full@reset_p=0.1", "0.33.0", "drop_store", None),
])
def test_a_knob_finds_its_planted_defect_and_its_clean_point_none(point, version, defect, expect, workers):
    env, w = workers(version)
    n = 200 if "cpu_chunks" in point else 80
    job, res, kinds = _run(w, version, point, n=n)
    assert kinds == set(), kinds
    assert res["stats"]["stores"] > 0 and res["stats"]["loads"] > 0
    for axis, value in S.split(point)[1].items():  # the value reaches the job
        assert str(job["params"][axis]).lower() == value
    assert (res["stats"]["resets"] > 0) == ("reset_p" in job["params"])
    _, _, kinds = _run(w, version, point, defect, n=n)
    assert set(expect or BY_NAME[defect].catches) <= kinds, kinds


@pytest.mark.parametrize("version,point,chunks", [
    ("0.23.0", "full@cpu_chunks=4", 4),  # a chunk's bytes unaligned (BLOCK_SIZE_ALIGNMENT 1)
    ("0.23.0", "bpc2@cpu_chunks=32", 32),
    ("0.33.0", "full@cpu_chunks=4", 4),  # rounded up to the host's page (mmap.PAGESIZE)
    ("0.33.0", "swa@cpu_chunks=32", 32),
    ("0.33.0", "bpc2", 256),
    ("0.33.0", "mamba", 256),  # a hybrid's pages of two sizes
    ("0.33.0", "full-tiering-fs", 32),  # the tiering spec's primary tier
    ("0.24.0", "full-tiering-fs@shadow=false", 32),  # its alignment the host page while the CPU spec's is 1
])
def test_cpu_chunks_is_the_capacity_of_the_tier_vllm_builds(version, point, chunks, workers):
    """``cpu_chunks`` is the number of chunks the release's CPU tier holds, whatever a chunk's
    bytes and the release's alignment (side/compose.py ``cpu_bytes_to_use``; before, 256 KiB of
    slack made a tier of "4" hold 65 chunks on 0.33.0 and 260 on 0.23.0)."""
    env, w = workers(version)
    job, res, kinds = _run(w, version, point, n=30)
    assert res["stats"]["tier_chunks"] == chunks and kinds == set(), (res["stats"], kinds)


def test_the_request_level_traffic_leaves_the_organic_stream_as_it_was():
    lay = S.resolve("full").job_layout()
    base = R.make_job("full", 3, 120, 0, "sync")
    moved = R.make_job("full@load_tiers_p=0.3,prompt_logprobs_p=0.1", 3, 120, 0, "sync")
    strip = [{k: v for k, v in r.items() if k not in ("kv_transfer_params", "prompt_logprobs")}
             for r in moved["requests"]]
    assert strip == base["requests"] and "kv_transfer_params" not in str(base["requests"])
    tiers = [r["kv_transfer_params"]["kv_load_tiers"] for r in moved["requests"] if "kv_transfer_params" in r]
    assert 20 < len(tiers) < 60 and all(t in W.LOAD_TIERS for t in tiers)
    assert 3 < sum("prompt_logprobs" in r for r in moved["requests"]) < 30
    assert lay == moved["layout"] | {"name": "full"}


@pytest.mark.parametrize("point,version,says", [
    ("full@reset_p=0.1", "0.21.0", "0.22.1 kv_connector/v1/offloading_connector.py:177-180"),
    ("full@load_tiers_p=0.3", "0.26.0", "0.27.0 offloading/scheduler.py:61,387"),
    ("swa@retention_interval=dense", "0.29.0", "0.30.0 offloading/scheduler.py:176"),
    ("full@load_limit_p=0.3", "0.30.0", "0.31.0 offloading/scheduler.py:367,391-393"),
    ("full@offload_limit_p=0.3", "0.22.1", "0.23.0 offloading/scheduler.py:183,197-207"),
    ("full-tiering-fs", "0.29.0", "TransferJob(keys, chunk_ids), which arrived in 0.30"),  # shadow KV's need
    ("full-tiering-fs@shadow=false", "0.21.0", "0.22.1 v1/kv_offload/tiering/spec.py"),
    ("full-tiering-fs@shadow=false,tier_lookup_late_p=0.5", "0.23.0",
     "0.24.0 v1/kv_offload/tiering/fs/manager.py:45,133"),
])
def test_a_release_without_the_knob_is_one_line(point, version, says):
    line = S.support(point, version)
    assert line.startswith(f"vllm {version} cannot run layout {point}: ") and says in line and "\n" not in line
    assert S.support(point, "0.33.0") is None


def test_shadow_off_runs_the_tiering_spec_where_shadow_kv_cannot_follow_it():
    """Shadow KV follows the file tier by the chunk ids its jobs carry (0.30+); with shadow off the
    tiering spec runs wherever it exists (0.22.1+): its file tier's pool is held on the step clock by
    vLLM's drain_jobs from 0.24.0, by kvbound's wait for the jobs it enqueued before."""
    assert S.support("full-tiering-fs@shadow=false", "0.22.1") is None
    assert S.support("full-tiering-fs@shadow=false", "0.24.0") is None
    assert S.support("full-tiering-fs@shadow=false", "0.29.0") is None
    assert S.support("full-tiering-fs", "0.30.0") is None and S.support("full-tiering-fs", "0.29.0")
