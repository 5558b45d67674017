"""The 0.27-0.33 same-step copy-on-write finding, read off vLLM's own SchedulerOutput
(docs/findings.md): scripts/repro_cow_same_step.py replays the saved requests and reports a
KVCacheBlockCopy that carries tokens no owner of its source had computed before the step
(the source is cached, and written, by a request scheduled in the same step). 0.29.0 makes
no such copy on the same requests."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_cow_same_step.py"
FILE = ROOT / "docs" / "trace-findings" / "0-33-0-mamba-eagle-untagged-data-wrong-kv-4req.json"


@pytest.mark.parametrize("version,defect", [("0.33.0", True), ("0.29.0", False)])
def test_a_partial_hit_copies_a_block_computed_in_the_same_step(version, defect):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), str(FILE)], capture_output=True, text=True, env=penv,
                       timeout=600)
    assert p.returncode == (1 if defect else 0), p.stderr[-3000:]
    assert f"vllm {version}: {1 if defect else 0} copy(ies)" in p.stdout
    if defect:
        assert ('"reader": "378", "group": 0, "copied_tokens": [128, 144], "src_owners": {"375":'
                ' {"computed_before_step": 128, "scheduled_this_step": 64}}') in p.stdout


def test_the_trace_checks_every_block_copy(workers):
    """data:copy_of_uncomputed_tokens, the contract the finding breaks, checked on vLLM's own
    SchedulerOutput at every step (shadow KV or not): it fires on the saved 0.33.0 requests
    and not on a clean run whose Mamba copy-on-write copies only computed states."""
    from kvbound.trace import runner as R
    from kvbound.trace import tracefile as TF

    f = TF.load(FILE)
    env, w = workers("0.33.0")
    found, _ = R.check_result("0.33.0", f.layout, f.segment, w.job(dict(f.segment, max_steps=3000)))
    copies = [g for g in found if g.kind == "data:copy_of_uncomputed_tokens"]
    assert copies and "block copy 11 -> 18 (request 378, group 0, tokens [128, 144))" in copies[0].detail["message"]
    job = R.make_job("mamba", (0, "copies"), 120, 0, "sync")
    res = w.job(job)
    found, _ = R.check_result("0.33.0", "mamba", job, res)
    assert "data:copy_of_uncomputed_tokens" not in {g.kind for g in found}
    assert res["stats"].get("block_copies", 0) > 0


CHAINED = ROOT / "docs" / "trace-findings" / "0-33-0-mamba-eagle-untagged-data-wrong-kv-chained-copy-3req.json"


@pytest.mark.parametrize("version,chained", [("0.33.0", True), ("0.29.0", False)])
def test_a_copy_from_a_copy_destination_of_the_same_step_carries_zeros(version, chained, workers):
    """The chained shape (docs/findings.md): a seeding read of 171 tokens, then two requests in one
    step; request 258 partial-hits the seed's last block and gets a private copy of it, which its
    forward fills and the scheduler caches; request 260 hits that private block, trimmed to the
    Mamba hit inside it, and gets a copy of the copy. vLLM runs a step's copies at once (0.33.0
    v1/worker/utils.py:909-955), so 260's block gets the zeroed private block: the copy check
    names the chain and shadow KV reads the zeros. On 0.29.0 the same requests reach the plain
    same-step shape (no private copy for 258), which both checks report without a chain."""
    from kvbound.trace import runner as R
    from kvbound.trace import tracefile as TF

    f = TF.load(CHAINED)
    env, w = workers(version)
    found, _ = R.check_result(version, f.layout, f.segment, w.job(dict(f.segment, max_steps=3000)))
    copies = [g.detail["message"] for g in found if g.kind == "data:copy_of_uncomputed_tokens"]
    reads = [g.detail.get("provenance") or "" for g in found if g.kind == "data:wrong_kv"]
    assert copies and reads
    assert any("itself the destination of one of this step's copies" in m for m in copies) == chained
    assert any("itself a destination of this step's copies" in p for p in reads) == chained
