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
