"""The 0.26-0.33 reset finding (docs/findings.md, "after a connector cache reset"): after
reset_prefix_cache(reset_connector=True) a sliding-window request re-offloads from chunk 0 and
stores window blocks its own table no longer holds. Read off vLLM's own state
(scripts/reset_window_blocks.py: the connector's store jobs against the core KVCacheManager's
tables) and by the trace's store contract; the same requests without resets give neither."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "reset_window_blocks.py"
FILE = ROOT / "docs" / "trace-findings" / "0-33-0-swa-reset-p-0-1-store-foreign-source-4req.json"


def test_the_store_reads_a_window_block_its_table_no_longer_holds():
    env = release_env_for("0.33.0")
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), str(FILE)], capture_output=True, text=True, env=penv, timeout=600)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "store job 12 request 189 group 1 reads block 10, not in its table; held by ['197']" in p.stdout
    p = subprocess.run([env.python, str(SCRIPT), str(FILE), "--no-reset"], capture_output=True, text=True,
                       env=penv, timeout=600)
    assert p.returncode == 0 and "resets 0 stale reads 0" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


def test_the_trace_reports_it_and_not_without_resets(workers):
    from kvbound.trace import runner as R

    seg = json.loads(FILE.read_text())["segment"]
    env, w = workers("0.33.0")
    found, _ = R.check_result("0.33.0", "swa@reset_p=0.1", seg, w.job(dict(seg, max_steps=3000)))
    assert "store:foreign_source" in {f.kind for f in found}
    clean = dict(seg, params={k: v for k, v in seg["params"].items() if k != "reset_p"}, max_steps=3000)
    found, _ = R.check_result("0.33.0", "swa", clean, w.job(clean))
    assert not found, [f.kind for f in found]


def test_a_release_without_the_reset_refuses_the_replay_in_one_line():
    # 0.21.0 has no connector reset (the reset_p column): the replay says so before it starts
    # (or prepares) anything, exit 2, instead of a clean rerun that reads as "not reproduced"
    from conftest import kvbound

    p = kvbound("trace", "--replay", FILE, "--vllm", "0.21.0")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "cannot replay" in p.stderr and "vllm 0.21.0 cannot run layout swa@reset_p=0.1" in p.stderr
