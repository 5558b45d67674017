"""The 0.28.0 - 0.33.0 offload-limit finding, checked without kvbound trace (docs/findings.md):
scripts/repro_offload_limit_tail.py runs one request with kv_transfer_params max_offload_tokens
528 on the mamba528 hybrid (a partial tail). The real connector asserts boundary <= max_boundary
in its boundary store; the same request with no cap, or a cap of its whole prompt, runs clean."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_offload_limit_tail.py"
ASSERT_LINE = {"0.28.0": 1176, "0.33.0": 1668}  # offloading/scheduler.py, `assert boundary <= max_boundary`


def _run(version, *flags):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), "--json", *flags], capture_output=True, text=True,
                       env=penv, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", sorted(ASSERT_LINE))
def test_a_capped_offload_past_a_partial_tail_asserts(version):
    res = _run(version)
    assert res["vllm"] == version
    want = f"kv_connector/v1/offloading/scheduler.py:{ASSERT_LINE[version]} assert boundary <= max_boundary"
    assert res["error"] and res["error"].endswith(want), res


@pytest.mark.parametrize("flags", [("--limit", "-1"), ("--limit", "848")])
def test_the_same_request_without_a_cap_below_its_boundary_runs_clean(flags):
    res = _run("0.33.0", *flags)
    assert res["error"] is None and res["stores"] > 0, res


def test_0_27_has_no_boundary_store_to_assert():
    assert _run("0.27.0")["error"] is None
