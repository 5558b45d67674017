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
