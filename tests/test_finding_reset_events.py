"""The 0.22.1 - 0.33.0 reset / KV-event finding, checked without kvbound trace (docs/findings.md):
scripts/repro_reset_kv_events.py stores one request's 8 chunks on the CPU tier with KV cache
events on, resets the prefix cache with the connector, and looks the same prompt up again. The
tier answers no hit, yet no event removed the 8 blocks: a KV-event consumer still lists them.
On a copy of 0.33.0 with the upstream report's patch (docs/upstream/cpu-tier-reset-without-kv-event/)
the reset withdraws them, and the script's verdict clears."""

from __future__ import annotations

import json
import os
import subprocess

import shutil

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_reset_kv_events.py"
PATCH = ROOT / "docs" / "upstream" / "cpu-tier-reset-without-kv-event" / "patch.diff"


def _run(version, *flags, tree=None):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=tree or env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), "--json", *flags], capture_output=True, text=True,
                       env=penv, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", ["0.22.1", "0.33.0"])
def test_a_connector_reset_leaves_the_cpu_blocks_listed_by_events(version):
    res = _run(version)
    assert res["vllm"] == version and res["reset"]
    assert res["cpu_blocks_by_events_before_reset"] == 8
    assert res["connector_hit_tokens_after"] == 0  # the tier no longer holds the prompt
    assert res["cpu_blocks_by_events_after_reset"] == 8 and res["stale"]  # no event said so


def test_the_upstream_patch_withdraws_the_blocks_and_clears_the_verdict(tmp_path):
    """The check can pass: with the report's patch the reset publishes BlockRemoved (CPU) for the
    8 blocks, and the prompt's second run stores them again (8 listed at the end, truly held)."""
    env = release_env_for("0.33.0")
    shutil.copytree(os.path.join(env.tree, "vllm"), tmp_path / "vllm")
    p = subprocess.run(["git", "apply", str(PATCH)], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    res = _run("0.33.0", tree=str(tmp_path))
    assert res["cpu_blocks_by_events_before_reset"] == 8 and res["connector_hit_tokens_after"] == 0
    assert res["cpu_blocks_by_events_after_reset"] == 0 and not res["stale"]


def test_the_control_keeps_the_tier_and_its_events_agree():
    """The GPU prefix cache reset alone: the tier keeps the 8 blocks the events list, and the
    same prompt hits them whole."""
    res = _run("0.33.0", "--no-reset")
    assert res["connector_hit_tokens_after"] == 128 and res["cpu_blocks_by_events_after"] == 8
    assert not res["stale"]


def test_0_21_does_not_clear_the_tier_on_reset():
    res = _run("0.21.0")
    assert res["connector_hit_tokens_after"] == 128 and not res["stale"]
