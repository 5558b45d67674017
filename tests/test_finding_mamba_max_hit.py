"""The 0.24-0.26 Mamba-hybrid finding, checked without kvbound trace (docs/findings.md):
scripts/repro_mamba_connector_max_hit.py drives the real Scheduler with a connector that
never has a token. With the connector, 0.24.0 starts request B at the attention hit (320)
with its Mamba state block null; without it, and on 0.27.0, B starts at 0."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_mamba_connector_max_hit.py"


def _run(version, *flags):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), "--json", *flags], capture_output=True, text=True,
                       env=penv, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return json.loads(p.stdout[p.stdout.index("{"):])


@pytest.mark.parametrize("version,flags,defect", [
    ("0.24.0", (), True),
    ("0.24.0", ("--no-connector",), False),
    ("0.27.0", (), False),
])
def test_connector_starts_mamba_hybrid_past_its_state(version, flags, defect):
    res = _run(version, *flags)
    assert res["vllm"] == version
    assert res["defect"] == defect, res["B"]
    if defect:
        assert res["B"]["starts_at"] == 320 and res["B"]["tables"][1][4] == 0
