"""The 0.33.0 finding, checked independently of kvbound trace (docs/findings.md):
scripts/repro_0_33_sync_mamba.py drives vLLM 0.33.0's real KVCacheManager with the
arguments Scheduler.schedule() passes for a sync connector load on a full-attention +
Mamba(align) hybrid. The check must flip when the fix is planted at runtime."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_0_33_sync_mamba.py"
VERSION = "0.33.0"


def _run(*flags) -> dict:
    env = release_env_for(VERSION)
    penv = dict(os.environ, PYTHONPATH=env.tree)
    p = subprocess.run([env.python, str(SCRIPT), "--json", *flags], capture_output=True, text=True,
                       env=penv, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def over_allocation_problems(res: dict) -> list[str]:
    """Empty when the result shows the finding: one sync-loading request takes one block
    more than admission reserved, and with exactly the reserved blocks free the real
    allocation raises from the block pool."""
    problems = []
    roomy, tight = res["roomy"], res["tight"]
    if not (roomy["taken"] == roomy["reserved"] + 1 == 7):
        problems.append("roomy pool: reserved %d, taken %d (expected 6, 7)" % (roomy["reserved"], roomy["taken"]))
    n, reserved, taken = res["local_hit"]["running"]
    if not (n == 128 and taken == reserved + 1):
        problems.append("local hit held by a running request: reserved %d, taken %d" % (reserved, taken))
    if roomy["reserved_per_group"] != [5, 1]:
        problems.append("per-group reservation %s (expected FA 5, Mamba 1)" % roomy["reserved_per_group"])
    err = tight["error"] or ""
    if "Cannot get 1 free blocks from the pool" not in err or "block_pool.py" not in err:
        problems.append("tight pool: %r (expected block_pool ValueError)" % (tight["error"] or tight["result"]))
    return problems


def test_sync_load_on_mamba_hybrid_over_allocates_on_real_0_33():
    res = _run()
    assert res["vllm"] == VERSION
    assert over_allocation_problems(res) == []
    # the allocation path is the finding's: MambaManager.allocate_new_blocks, after the
    # external block of allocate_external_computed_blocks
    assert "single_type_kv_cache_manager.py:1879 allocate_new_blocks" in res["tight"]["error"]
    # control: the same hit loaded asynchronously is reserved exactly (2 then 5 blocks)
    assert [tuple(x) for x in res["async_control"]] == [(2, 2), (5, 5)]
    # with the local Mamba hit block evictable, admission counts that block although the
    # load skips past it: the count comes out right by accident (9 = 9)
    assert res["local_hit"]["evictable"] == [128, 9, 9]


def test_the_check_flips_when_the_fix_is_planted():
    """Planting the suggested fix (count the loaded-state block in admission) at runtime:
    reserved == taken, the tight pool allocates, and the check above reports problems."""
    res = _run("--plant-fix")
    assert res["planted_fix"] is True
    assert res["roomy"]["reserved"] == res["roomy"]["taken"] == 7
    assert res["tight"]["error"] is None and res["tight"]["result"] == "blocks"
    assert res["local_hit"]["running"] == [128, 7, 7]
    assert len(over_allocation_problems(res)) == 4
