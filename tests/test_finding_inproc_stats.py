"""The suspected 0.21.0 - 0.23.0 stats defect (docs/findings.md), checked without kvbound trace:
scripts/repro_inproc_stats_reduce.py hands one load's transfer stats to the release's
KVConnectorLogging through vLLM's msgpack encoder and decoder (the multiprocess engine) and as
objects (an in-process engine core). 0.23.0 logs the first and asserts in reduce on the second;
0.33.0's flat counters log both."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_inproc_stats_reduce.py"


def _run(version):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu", VLLM_CONFIGURE_LOGGING="0")
    p = subprocess.run([env.python, str(SCRIPT), "--json"], capture_output=True, text=True, env=penv, timeout=300)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version,fails", [("0.23.0", True), ("0.33.0", False)])
def test_stats_handed_on_as_objects_assert_in_reduce_before_the_flat_counters(version, fails):
    rc, res = _run(version)
    assert res["vllm"] == version and res["multiprocess"]["logged"], res
    if fails:
        assert rc == 1 and res["in_process"]["at"].endswith("offloading/metrics.py:59 assert isinstance(op, dict)"), res
        assert "CPU_to_GPU_total_bytes=4096" in res["multiprocess"]["logged"][0]
    else:
        assert rc == 0 and res["in_process"] == res["multiprocess"], res
