"""The 0.26-0.31 async partial-tail finding, checked without kvbound trace (docs/findings.md):
scripts/repro_async_partial_tail.py drives the real AsyncScheduler and KVCacheManager (no
connector). Under async scheduling the producer's 208-token tail entry is registered again on its
live Mamba block after the copy-on-write moved it, the next copy carries the state after 209
tokens under the 208-token entry, and a consumer resumes from it; the Scheduler (sync) and 0.32.0
(whose boundary leaves one token to recompute) keep every entry's state."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, release_env_for

SCRIPT = ROOT / "scripts" / "repro_async_partial_tail.py"


def _run(version, *flags):
    env = release_env_for(version)
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), "--json", *flags], capture_output=True, text=True,
                       env=penv, timeout=600)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == (1 if res["stale_entries"] or res["wrong_reads"] else 0)
    return res


@pytest.mark.parametrize("version", ["0.27.0", "0.31.0"])
def test_async_producer_tail_entry_names_a_state_its_block_no_longer_holds(version):
    res = _run(version)
    assert res["vllm"] == version and res["async"]
    # after the first decode's forward, P's live block (and then the block copied from it) holds the
    # state after 209 tokens under the 208-token entry
    assert {(e["entry_tokens"], tuple(e["holds"])) for e in res["stale_entries"]} == {(208, ("P", 209))}
    assert [(r["request"], r["resumes_at"], tuple(r["reads"])) for r in res["wrong_reads"]] == [("C", 208, ("P", 209))]


def test_the_same_traffic_under_the_sync_scheduler_keeps_every_entry():
    res = _run("0.27.0", "--sync")
    assert not res["stale_entries"] and not res["wrong_reads"]
    assert [(r["request"], r["resumes_at"], tuple(r["reads"])) for r in res["reads"]] == [("C", 208, ("P", 208))]


def test_0_32_copies_the_tail_before_the_decode_and_registers_it_once():
    """0.32.0's tail boundary is one token short of the prompt (a 209-token P: 208), so the decode's
    caching, at 209 and on, never matches it again."""
    res = _run("0.32.0", "--prompt", "209")
    assert [tuple(c["carries"]) for c in res["copies"] if c["carries"] and c["carries"][0] == "P"] == [("P", 208)]
    assert not res["stale_entries"] and not res["wrong_reads"]


def test_a_release_without_partial_tails_is_refused_in_one_line():
    env = release_env_for("0.25.1")
    penv = dict(os.environ, PYTHONPATH=env.tree, VLLM_TARGET_DEVICE="cpu")
    p = subprocess.run([env.python, str(SCRIPT), "--json"], capture_output=True, text=True, env=penv, timeout=600)
    assert p.returncode == 2 and "{" not in p.stdout  # no result (stdout: vLLM's own log lines only)
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("repro_async_partial_tail:")]
    assert "no CacheConfig.prefix_match_unit" in line and "Traceback" not in p.stderr
