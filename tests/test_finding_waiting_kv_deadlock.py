"""The waiting-KV deadlock of 0.21.0 - 0.30.0 (docs/findings.md), checked without kvbound trace:
scripts/repro_waiting_kv_deadlock.py drives a release's real Scheduler with a minimal connector
of its own (A: a 64-token async hit whose load finishes at once; B: "ask again" once) and the model
runner's output built by hand. A deadlocks behind B on 0.30.0; 0.31.0 drains requests holding KV
blocks first and both finish. (The trace's own 82-request file, found on an async segment, stopped
reproducing once async segments ran on vLLM's async config at the tenth stop: the deadlock needs no
async scheduling, and this reproducer shows it on the release that has it.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_waiting_kv_deadlock.py"


@pytest.mark.parametrize("version,deadlock", [("0.30.0", True), ("0.31.0", False)])
def test_a_loaded_request_behind_a_deferred_one_deadlocks_where_vllm_had_it(version, deadlock):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu", VLLM_CONFIGURE_LOGGING="0")  # logs off stdout
    p = subprocess.run([env.python, str(SCRIPT), "--json"], capture_output=True, text=True, env=penv, timeout=600)
    assert p.returncode == (1 if deadlock else 0), p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert res["vllm"] == version and res["deadlock"] is deadlock, res
    if deadlock:  # A, its load done, never leaves the waiting queue, nor does B ahead of it
        assert len(res["left"]) == 2 and res["steps"] >= 50, res
