"""The 0.28.0 - 0.29.0 lookup-cache defect (docs/findings.md; reached through the engine by the fault
tier_lookup_late_p, tests/test_trace_axes.py), checked here without kvbound trace: scripts/repro_async_lookup_cleanup_race.py drives the file tier's AsyncLookupManager with
the calls its tier makes (lookup, flush, a finishing request's cleanup), its lookup thread held so
the order is fixed. 0.29.0 asserts on the late answer; 0.33.0, whose probes carry generations,
does not."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_async_lookup_cleanup_race.py"


@pytest.mark.parametrize("version,fails", [("0.29.0", True), ("0.33.0", False)])
def test_a_late_lookup_answer_after_cleanup_asserts_before_probe_generations(version, fails, tmp_path):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    p = subprocess.run([env.python, str(SCRIPT)], capture_output=True, text=True, env=penv, timeout=120,
                       cwd=tmp_path)
    line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-2000:]
    if fails:
        assert p.returncode == 1 and line.startswith(f"FAIL: vllm {version}") and "second lookup result" in line, line
    else:
        assert p.returncode == 0 and line.startswith(f"ok: vllm {version}"), line
