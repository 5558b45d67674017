"""The upstream reports (docs/upstream/<slug>/): each one's standalone reproducer and its
regression test, written for vLLM's own suite, run in the release's environment (the
prepared tree in the deps venv, no kvbound) on the release as prepared, where both must
fail, and on a copy of it with the report's patch.diff applied, where both must pass."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import ROOT, release_env_for

UPSTREAM = ROOT / "docs" / "upstream"
# slug -> (release, its regression test file)
REPORTS = {
    "copy-overwrites-inflight-store-source": ("0.28.0", "test_copy_overwrites_inflight_store_source.py"),
    "cpu-tier-reset-without-kv-event": ("0.33.0", "test_cpu_tier_reset_without_kv_event.py"),
    "fs-tier-failed-store-unannounced": ("0.33.0", "test_fs_tier_failed_store_unannounced.py"),
    "hisparse-chunked-prefill-self-preemption": ("0.33.0", "test_hisparse_chunked_prefill_self_preemption.py"),
    "lagging-group-cow-tail": ("0.26.0", "test_lagging_group_cow_tail.py"),
    "lookup-defers-on-unusable-pending-chunk": ("0.33.0", "test_lookup_defers_on_unusable_pending_chunk.py"),
    "offload-limit-partial-tail-assert": ("0.33.0", "test_offload_limit_partial_tail_assert.py"),
    "partial-hit-copy-same-step": ("0.33.0", "test_partial_hit_copy_same_step.py"),
    "swa-full-prompt-load-null-block": ("0.33.0", "test_swa_full_prompt_load_null_block.py"),
    "swa-reset-stale-window-blocks": ("0.33.0", "test_swa_reset_stale_window_blocks.py"),
    "tiering-hit-larger-than-primary-tier": ("0.33.0", "test_tiering_hit_larger_than_primary_tier.py"),
    "tiering-promotion-evicts-own-chunks": ("0.33.0", "test_tiering_promotion_evicts_own_chunks.py"),
}
# vLLM's tests need pytest, which the deps venv lacks: the interpreter's own, appended to
# sys.path after the deps venv's site-packages, so every other import resolves there
PYTEST_SITE = os.path.dirname(os.path.dirname(pytest.__file__))
RUN_PYTEST = ("import sys; sys.path.append(sys.argv[1]); import pytest; "
              "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-W', 'ignore', '--rootdir', '.',"
              " '-c', sys.argv[2], '--confcutdir', '.', sys.argv[3]]))")


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """slug -> {"release": tree, "patched": tree}: the prepared tree and a patched copy."""
    made = {}

    def get(slug):
        if slug not in made:
            env = release_env_for(REPORTS[slug][0])
            patched = tmp_path_factory.mktemp(slug)
            shutil.copytree(os.path.join(env.tree, "vllm"), patched / "vllm")
            p = subprocess.run(["git", "apply", str(UPSTREAM / slug / "patch.diff")], cwd=patched,
                               capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
            made[slug] = (env, {"release": env.tree, "patched": str(patched)})
        return made[slug]
    return get


def _run(env, tree, *argv):
    penv = dict(os.environ, PYTHONPATH=tree, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    return subprocess.run([env.python, *argv], capture_output=True, text=True, env=penv, timeout=600)


@pytest.mark.parametrize("slug", sorted(REPORTS))
@pytest.mark.parametrize("which", ["release", "patched"])
def test_reproducer_fails_on_the_release_and_passes_patched(trees, slug, which):
    env, t = trees(slug)
    p = _run(env, t[which], str(UPSTREAM / slug / "repro.py"))
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1, p.stdout + p.stderr[-3000:]
    if which == "release":
        assert p.returncode == 1 and lines[0].startswith(f"FAIL: vllm {env.version}"), p.stdout + p.stderr[-3000:]
    else:
        assert p.returncode == 0 and "ok" in lines[0], p.stdout + p.stderr[-3000:]


@pytest.mark.parametrize("slug", sorted(REPORTS))
@pytest.mark.parametrize("which", ["release", "patched"])
def test_regression_test_fails_on_the_release_and_passes_patched(trees, slug, which):
    env, t = trees(slug)
    d = UPSTREAM / slug
    penv = dict(os.environ, PYTHONPATH=t[which], VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    p = subprocess.run([env.python, "-c", RUN_PYTEST, PYTEST_SITE, os.devnull, REPORTS[slug][1]],
                       capture_output=True, text=True, env=penv, timeout=600, cwd=d)
    tail = p.stdout[-3000:] + p.stderr[-2000:]
    if which == "release":
        assert p.returncode == 1 and " failed" in p.stdout, tail  # 1: tests failed (not a collection error)
    else:
        assert p.returncode == 0 and " passed" in p.stdout, tail
