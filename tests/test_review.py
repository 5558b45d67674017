"""``kvbound review``: a patch to vLLM against the tree it applies to (docs/trace.md, "kvbound review").

The patch applier (``kvbound.trace.patchfile``, pure Python) on small texts: what ``diff -u``
and ``git diff`` write, shifted hunks, new and deleted files, and every way a patch fails to
apply, each one line naming the patch, the file and the hunk. Then the command on the real
0.33.0 tree, each run one point and 40 requests:

* a genuine fix of the 0.33.0 reservation defect (``tests/data/review/0-33-0-mamba-sync-
  reservation-fix.diff``: ``MambaManager.get_num_blocks_to_allocate`` counts the block a
  connector-loaded state takes, docs/findings.md) reports ``allocation_exceeds_reservation``
  gone and nothing new, exit 0;
* a planted defect (``0-33-0-planted-load-skips-first-block.diff``: the load's scan starts one
  block past the first fresh one) reports new findings, exit 1;
* a patch that does not apply exits 2 with one line, and the prepared tree is never written;
* a patched tree whose vLLM does not import exits 2, never a review with the base's findings gone.

And ``--replay F`` on the real 0.26.0 tree, with the 5-request reproducer of the boundary assert
(docs/upstream/seed-pr-scan-from-boundary): the seed PR's scan from ``f`` alone turns the crash
into a read of a block nothing wrote (``data:wrong_kv[full_attention: unwritten]``, exit 1); with
the hit every group agrees on as the start as well, the crash is gone and nothing is new (exit 0).
Each upstream report's candidate patch (docs/upstream/<slug>/patch.diff) on the trace file of its
finding, in the same CI-sized form: the finding gone, nothing new, exit 0.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvbound.cli import main
from kvbound.errors import UsageError
from kvbound.trace.patchfile import apply_file, copy_and_apply, parse

from conftest import DATA, ROOT

PATCHES = DATA / "review"
FIX = PATCHES / "0-33-0-mamba-sync-reservation-fix.diff"
PLANTED = PATCHES / "0-33-0-planted-load-skips-first-block.diff"
UPSTREAM = ROOT / "docs" / "upstream"
SEED_PR = UPSTREAM / "seed-pr-scan-from-boundary"
BOUNDARY_5REQ = ROOT / "docs" / "trace-findings" / "0-26-0-mamba-vllm-exception-update-state-after-alloc-5req.json"
BOUNDARY = ("crash:exception@update_state_after_alloc:assert num_locally_computed_tokens <= "
            "num_locally_computed_gpu_blocks * tokens_per_block")
MANAGER = "vllm/v1/core/single_type_kv_cache_manager.py"
TEXT = "".join(f"line {i}\n" for i in range(1, 21))


def _apply(diff: str, text: str | None = TEXT) -> str | None:
    (fd,) = parse(diff, "p.diff")
    return apply_file(fd, text, "p.diff")


def test_a_git_diff_applies_with_its_prefixes_stripped():
    diff = ("diff --git a/vllm/x.py b/vllm/x.py\nindex 1..2 100644\n--- a/vllm/x.py\n+++ b/vllm/x.py\n"
            "@@ -4,3 +4,4 @@ def f():\n line 4\n-line 5\n+line five\n+line 5.5\n line 6\n")
    (fd,) = parse(diff, "p.diff")
    assert fd.path == "vllm/x.py"
    assert apply_file(fd, TEXT, "p.diff") == TEXT.replace("line 5\n", "line five\nline 5.5\n")


def test_a_shifted_hunk_applies_at_its_nearest_match_and_shifts_the_next():
    # diff -u style (timestamps after a tab, no prefixes); the file gained 2 lines above both hunks
    diff = ("--- vllm/x.py\t2026-01-01 00:00:00\n+++ vllm/x.py\t2026-01-01 00:00:01\n"
            "@@ -2,2 +2,2 @@\n line 2\n-line 3\n+line three\n@@ -10,1 +10,1 @@\n-line 10\n+line ten\n")
    text = "new a\nnew b\n" + TEXT
    assert _apply(diff, text) == text.replace("line 3\n", "line three\n").replace("line 10\n", "line ten\n")


def test_new_and_deleted_files_and_a_missing_final_newline():
    assert _apply("--- /dev/null\n+++ b/vllm/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n",
                  None) == "a\nb"
    assert _apply("--- a/vllm/n.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n", "a\nb\n") is None


@pytest.mark.parametrize("diff, text, says", [
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -5,2 +5,2 @@\n line 5\n-line 7\n+line seven\n", TEXT,
     "vllm/x.py hunk 1 (@@ -5,2 +5,2 @@) does not apply"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-line 1\n+one\n@@ -3,1 +3,1 @@\n-line 99\n+x\n", TEXT,
     "vllm/x.py hunk 2 (@@ -3,1 +3,1 @@) does not apply"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-line 1\n+one\n", None,
     "vllm/x.py hunk 1 (@@ -1,1 +1,1 @@) does not apply: no such file in the tree"),
    ("--- /dev/null\n+++ b/vllm/x.py\n@@ -0,0 +1,1 @@\n+one\n", TEXT, "creates a file that exists"),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n-line 1\n+one\n", TEXT,
     "its body has 1 old and 1 new line(s), the header says 3 and 3"),
    ("--- a/../etc/x\n+++ b/../etc/x\n@@ -1 +1 @@\n-a\n+b\n", TEXT, "must be relative to the tree's root"),
    ("--- a/vllm/x.py\n+++ b/vllm/y.py\n@@ -1 +1 @@\n-a\n+b\n", TEXT, "renames"),
    ("just prose\n", TEXT, "no file diff in it"),
])
def test_a_patch_that_does_not_apply_is_one_line_naming_the_file_and_the_hunk(diff, text, says):
    with pytest.raises(UsageError) as e:
        _apply(diff, text)
    assert says in str(e.value) and str(e.value).startswith("patch p.diff") and "\n" not in str(e.value)


def test_the_copy_is_patched_and_the_source_never_written(tmp_path):
    src = tmp_path / "src"
    (src / "vllm").mkdir(parents=True)
    (src / "vllm" / "x.py").write_text(TEXT)
    (src / "README").write_text("not copied")
    patch = tmp_path / "p.diff"
    patch.write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-line 1\n+one\n"
                     "--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1,1 +1,1 @@\n-a\n+b\n")
    changed, left_out = copy_and_apply(src, tmp_path / "dst", patch)
    assert (changed, left_out) == (["vllm/x.py"], ["tests/test_x.py"])  # a regression test outside vllm/: left out
    assert (tmp_path / "dst" / "vllm" / "x.py").read_text() == TEXT.replace("line 1\n", "one\n", 1)
    assert (src / "vllm" / "x.py").read_text() == TEXT
    outside = tmp_path / "outside.diff"  # paths below vllm/ (as if -p2): nothing a run imports would change
    outside.write_text("--- a/v1/x.py\n+++ b/v1/x.py\n@@ -1,1 +1,1 @@\n-line 1\n+one\n")
    with pytest.raises(UsageError, match="changes no file under vllm/"):
        copy_and_apply(src, tmp_path / "dst3", outside)
    bad = tmp_path / "bad.diff"
    bad.write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,1 @@\n-nope\n+one\n")
    with pytest.raises(UsageError):
        copy_and_apply(src, tmp_path / "dst2", bad)
    assert not (tmp_path / "dst2").exists()  # checked before anything is copied


# ------------------------------------------------------------------------------ on the real 0.33.0 tree


def _review(tmp_path, patch, point, *extra):
    out = tmp_path / "review.json"
    rc = main(["review", "--vllm", "0.33.0", "--patch", str(patch), "--point", point, "--requests", "40",
               "--shrink-budget", "0", "--workers", "2", "--quiet", "--out", str(tmp_path / "findings"),
               "--json", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_fix_of_the_0_33_reservation_defect_reports_it_gone_and_nothing_new(tmp_path, prepared, capsys):
    tree = Path(prepared("0.33.0").tree)
    before = _digest(tree / MANAGER)
    rc, doc = _review(tmp_path, FIX, "mamba-block-sync", "--html", str(tmp_path / "r.html"))
    out = capsys.readouterr().out
    assert rc == 0, out
    assert doc["gone"] == ["lifecycle:allocation_exceeds_reservation"] and doc["new"] == [], doc
    assert doc["patch"]["changed"] == [MANAGER]
    assert doc["base_doc"]["columns"] == ["0.33.0"] and doc["patched_doc"]["columns"] == ["patched"]
    assert doc["patched_doc"]["findings"] == []
    assert "gone: 1\n  [lifecycle] lifecycle:allocation_exceeds_reservation" in out and "new: 0" in out
    text = json.dumps(doc)
    assert "kvbound-review-" not in text and "cpu_s" not in text  # no temporary path, no measurement
    page = (tmp_path / "r.html").read_text()
    assert "findings gone, new and kept" in page and "vllm patched" in page
    assert _digest(tree / MANAGER) == before  # the prepared tree is only read


def test_a_planted_load_that_skips_a_block_reports_a_new_finding_and_exits_1(tmp_path, prepared, capsys):
    prepared("0.33.0")
    rc, doc = _review(tmp_path, PLANTED, "full")
    assert rc == 1, capsys.readouterr().out
    assert doc["base_doc"]["findings"] == []  # the point runs clean on 0.33.0 itself
    assert "plan:spec_disagreement" in doc["new"], doc["new"]
    assert doc["gone"] == [] and doc["kept"] == []


def test_a_patch_that_does_not_apply_exits_2_with_one_line(tmp_path, prepared, capsys):
    prepared("0.33.0")
    stale = tmp_path / "stale.diff"
    stale.write_text(FIX.read_text().replace(" physical_block_cap = 1 + int(has_partial_hit)",
                                             " physical_block_cap = 2 + int(has_partial_hit)"))
    rc, doc = _review(tmp_path, stale, "mamba-block-sync")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and doc is None
    assert len(err) == 1, err
    assert f"patch {stale}: {MANAGER} hunk 1 (@@ -1787,6 +1787,17 @@) does not apply" in err[0], err
    assert not (tmp_path / "findings").exists()


def test_bad_options_are_one_line(capsys):
    assert main(["review", "--patch", str(FIX)]) == 2
    assert main(["review", "--vllm", "0.29.0,0.33.0", "--patch", str(FIX)]) == 2
    assert main(["review", "--vllm", "0.33.0", "--base", "0.33.0", "--patch", str(FIX)]) == 2
    assert main(["review", "--vllm-src", "/nonexistent", "--base", "0.33.0", "--patch", str(FIX)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("kvbound review: error: ") for line in err), err


def test_a_patched_tree_that_does_not_import_is_exit_2_never_a_clean_review(tmp_path, prepared, capsys):
    """A point that did not run has no findings: none of the base's may count as gone."""
    tree = Path(prepared("0.33.0").tree)
    first = (tree / "vllm/v1/core/block_pool.py").read_text().splitlines()[0]
    broken = tmp_path / "broken.diff"
    broken.write_text(f"--- a/vllm/v1/core/block_pool.py\n+++ b/vllm/v1/core/block_pool.py\n@@ -1,1 +1,2 @@\n"
                      f" {first}\n+def broken(:\n")
    out = tmp_path / "review.json"
    rc = main(["review", "--vllm", "0.33.0", "--patch", str(broken), "--point", "full", "--requests", "5",
               "--shrink-budget", "0", "--quiet", "--out", str(tmp_path / "findings"), "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "full did not run on patched:" in err and "SyntaxError" in err, err


# ------------------------------------------------------------------------------ --replay, on the real 0.26.0 tree


def _replay(tmp_path, patch, *extra):
    out = tmp_path / "review.json"
    rc = main(["review", "--vllm", "0.26.0", "--patch", str(patch), "--replay", str(BOUNDARY_5REQ),
               "--json", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else None


def test_the_seed_pr_alone_turns_the_0_26_boundary_crash_into_a_read_of_unwritten_kv(tmp_path, prepared, capsys):
    prepared("0.26.0")
    keep = tmp_path / "tree"
    rc, doc = _replay(tmp_path, SEED_PR / "patch-0.26.0.diff", "--keep-tree", str(keep))
    out = capsys.readouterr().out
    assert rc == 1, out
    (r,) = doc["replay"]
    assert r["key"] == BOUNDARY and r["gone"] == [BOUNDARY], r
    assert "data:wrong_kv[full_attention: unwritten]" in r["new"], r
    # drawn: request 536 reads group 0 position 64 from a block below f that is neither hit nor loaded
    assert "group 0 of request 536 (block size 64), at position 64:" in out, out
    assert "unwritten 64..127 !!  <-" in out, out
    assert "kvbound-review-" not in json.dumps(doc)  # no temporary path in the document
    # the kept tree replays with kvbound trace, and the same requests are drawn as what they give now
    assert main(["trace", "--vllm-src", str(keep), "--vllm", "0.26.0", "--replay", str(BOUNDARY_5REQ),
                 "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("not reproduced on vllm 0.26.0: crash:exception (found instead: "
                          "data:wrong_kv[full_attention: unwritten]"), out
    assert "-- data:wrong_kv on vllm 0.26.0, layout mamba: 5 request(s)" in out and "unwritten 64..127 !!" in out


def test_the_seed_pr_with_the_agreed_start_cures_the_0_26_boundary_crash(tmp_path, prepared, capsys):
    prepared("0.26.0")
    rc, doc = _replay(tmp_path, SEED_PR / "patch-0.26.0-with-agreed-start.diff")
    assert rc == 0, capsys.readouterr().out
    (r,) = doc["replay"]
    assert BOUNDARY in r["gone"] and r["new"] == [], r


@pytest.mark.parametrize("version,patch,trace_file,keys", [
    # mamba-all on 0.26.0: the Mamba reads and the store of another state are the 0.24-0.26
    # max(per_group_hits) start; the agreed start alone (no scan change) removes them all
    ("0.26.0", SEED_PR / "patch-0.26.0-agreed-start-only.diff",
     "0-26-0-mamba-all-data-wrong-kv-mamba-another-prefix-8req.json", ["data:wrong_kv[mamba: another prefix]"]),
    # mamba528 on 0.27.0: a copy-on-write rewrites an in-flight store's source; 0.29.0's two lines
    # that fence a copy's destination (offloading/scheduler.py:1133-1134) remove the three findings
    ("0.27.0", ROOT / "docs" / "trace-findings" / "0-27-0-copy-fence-from-0-29-0.diff",
     "0-27-0-mamba528-data-wrong-kv-mamba-unwritten-arrived-by-a-load-23req.json",
     ["data:wrong_kv[mamba: unwritten, arrived by a load]", "store:source_rewritten", "store:unwritten_source"]),
    # full-tiering-fs on 0.32.0: a promotion into a chunk a reset freed, under a store the reset
    # flushed; 0.33.0's hold of promotions until the flush is reported (tiering/manager.py:640-641,
    # 1198-1202; offloading/scheduler.py:2266-2272, 2437-2448), backported, removes both findings
    ("0.32.0", ROOT / "docs" / "trace-findings" / "0-32-0-promotion-hold-from-0-33-0.diff",
     "0-32-0-full-tiering-fs-log-stats-true-reset-p-0-1-load-tiers-p-0-3-data-wrong-kv-full-attention-"
     "another-prefix-arrived-by-a-load-24req.json",
     ["data:wrong_kv[full_attention: another prefix, arrived by a load]", "store:foreign_source"]),
    # the upstream reports' candidate patches, each on the trace file of its finding
    # (docs/upstream/<slug>/README.md, "Candidate fix"): the 0.28.0 backport of that fence ...
    ("0.28.0", UPSTREAM / "copy-overwrites-inflight-store-source" / "patch.diff",
     "0-28-0-mamba-store-source-rewritten-13req.json", ["store:foreign_source", "store:source_rewritten"]),
    # ... the 0.33.0 zeroing of stale window block ids at a reset, on 0.28.0's Mamba (align) group,
    # which the connector treats as a one-chunk window (offloading/scheduler.py:121-123)
    ("0.28.0", UPSTREAM / "swa-reset-stale-window-blocks" / "patch.diff",
     "0-28-0-mamba-reset-p-0-1-store-foreign-source-10req.json", ["store:foreign_source", "store:unwritten_source"]),
    # ... and the 0.26.0 agreed hit when a lagging group would record a copy-on-write tail it lacks
    ("0.26.0", UPSTREAM / "lagging-group-cow-tail" / "patch.diff",
     "0-26-0-mamba-eagle-vllm-exception-apply-cow-2req.json",
     ["crash:exception@_apply_cow:assert block_idx < len(req_blocks)"]),
    # ... and the 0.33.0 skip of a partial-tail store past the request's max_offload_tokens
    ("0.33.0", UPSTREAM / "offload-limit-partial-tail-assert" / "patch.diff",
     "0-33-0-mamba528-offload-limit-p-0-3-crash-exception-build-partial-tail-store-jobs-1req.json",
     ["crash:exception@_build_partial_tail_store_jobs:assert boundary <= max_boundary"]),
    # full-tiering-fs on 0.33.0: a promotion evicts the waiting request's own chunks (the LRU's request
    # rank); the promoted chunk touched newest, as 0.32.0 ranked every insert, removes the livelock
    ("0.33.0", UPSTREAM / "tiering-promotion-evicts-own-chunks" / "patch.diff",
     "0-33-0-full-tiering-fs-liveness-stuck-request-13req.json", ["liveness:stuck_request"]),
    # ... and on 0.32.0 a hit larger than the primary tier: what the lookup found this step protected
    # (the upstream report's patch.diff, written against 0.33.0, in its 0.32.0 form)
    ("0.32.0", ROOT / "docs" / "trace-findings" / "0-32-0-tiering-protect-lookup-keys.diff",
     "0-32-0-full-tiering-fs-liveness-stuck-request-5req.json", ["liveness:stuck_request"]),
    # mamba528 on 0.27.0 async: a producer's partial-tail entry registered again on its live Mamba
    # block; registering it only while the chunk that ends there is computed removes it
    ("0.27.0", ROOT / "docs" / "trace-findings" / "0-27-0-partial-tail-register-while-computed.diff",
     "0-27-0-mamba528-data-wrong-kv-mamba-unwritten-3req.json", ["data:wrong_kv[mamba: unwritten]"]),
])
def test_a_fix_sketch_removes_the_settled_finding(version, patch, trace_file, keys, tmp_path, prepared, capsys):
    prepared(version)
    out = tmp_path / "review.json"
    rc = main(["review", "--vllm", version, "--patch", str(patch), "--replay",
               str(ROOT / "docs" / "trace-findings" / trace_file), "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    (r,) = json.loads(out.read_text())["replay"]
    assert sorted(r["gone"]) == keys and r["new"] == [] and r["kept"] == [], r


@pytest.mark.parametrize("patch", [
    ROOT / "docs" / "trace-findings" / "0-27-0-copy-fence-from-0-29-0.diff",
    UPSTREAM / "copy-overwrites-inflight-store-source" / "patch.diff"])
def test_the_copy_fence_keeps_the_partial_tail_entry_finding(patch, tmp_path, prepared, capsys):
    """Not the connector's reuse fence: with a copy's destination fenced (0.29.0's lines, or the
    upstream report's patch), the 3-request partial-tail file keeps its finding on 0.27.0."""
    prepared("0.27.0")
    out = tmp_path / "review.json"
    rc = main(["review", "--vllm", "0.27.0", "--patch", str(patch), "--replay",
               str(ROOT / "docs" / "trace-findings" / "0-27-0-mamba528-data-wrong-kv-mamba-unwritten-3req.json"),
               "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    (r,) = json.loads(out.read_text())["replay"]
    assert r["gone"] == [] and r["new"] == [] and r["kept"] == ["data:wrong_kv[mamba: unwritten]"], r


def test_replay_options_are_one_line(tmp_path, prepared, capsys):
    prepared("0.26.0")
    pr = str(SEED_PR / "patch-0.26.0.diff")
    assert main(["review", "--vllm", "0.26.0", "--patch", pr, "--replay", str(BOUNDARY_5REQ), "--layout",
                 "mamba"]) == 2
    other = ROOT / "docs" / "trace-findings" / "0-33-0-mamba-block-sync-vllm-exception-get-new-blocks-8req.json"
    assert main(["review", "--vllm", "0.26.0", "--patch", pr, "--replay", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("kvbound review: error: --replay") for line in err), err
    assert "release 0.33.0, but the patch is reviewed against 0.26.0" in err[1], err


def test_the_lookup_deferral_patch_removes_the_deferral_and_only_departs_from_the_release_spec(
        tmp_path, prepared, capsys):
    """docs/upstream/lookup-defers-on-unusable-pending-chunk: the deferral on a chunk the EAGLE pop
    discards is gone. The patched tree is judged by 0.33.0's spec, a model of the unpatched lookup,
    so the one new key is the change itself: that spec defers where the patched vLLM answers 0 (exit
    1); no contract clause (false hit, lost hit, needless deferral) finds anything."""
    prepared("0.33.0")
    out = tmp_path / "review.json"
    trace_file = ROOT / "docs" / "trace-findings" / (
        "0-33-0-eagle-lookup-needless-deferral-deferred-on-full-attention-hit-pending-2req.json")
    rc = main(["review", "--vllm", "0.33.0", "--patch",
               str(UPSTREAM / "lookup-defers-on-unusable-pending-chunk" / "patch.diff"),
               "--replay", str(trace_file), "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 1, printed
    (r,) = json.loads(out.read_text())["replay"]
    assert r["gone"] == ["lookup:needless_deferral[deferred on full_attention HIT_PENDING]"], r
    assert r["new"] == ["lookup:spec_disagreement"] and r["kept"] == [], r
    assert "the spec of 0.33.0's lookup gives None (boundary None), vLLM 0 (boundary None)" in printed, printed


LOOKUP_PATCH = UPSTREAM / "lookup-defers-on-unusable-pending-chunk" / "patch.diff"
CROSS_GROUP_48REQ = ROOT / "docs" / "trace-findings" / (
    "0-33-0-swa-scripted-lookup-needless-deferral-deferred-on-full-attention-hit-pending-48req.json")


def _models_replay(tmp_path, patch, trace_file, *extra):
    out = tmp_path / "review.json"
    rc = main(["review", "--vllm", "0.33.0", "--patch", str(patch), "--models",
               "lookup-defers-on-unusable-pending-chunk", "--replay", str(trace_file), "--json", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else None


def test_the_lookup_deferral_patch_judged_by_its_own_row_is_gone_and_nothing_new(tmp_path, prepared, capsys):
    """--models: the patched tree is judged as 0.33.0+lookup-defers-on-unusable-pending-chunk (the
    release table's PATCHES row, spec/lookup.py maximal_prefix_bound), so the change itself is no
    disagreement: on the 48-request cross-group file both deferrals are gone, nothing new (the
    spec's answers and the keys it asks agree with the patched vLLM's at every lookup)."""
    prepared("0.33.0")
    rc, doc = _models_replay(tmp_path, LOOKUP_PATCH, CROSS_GROUP_48REQ)
    assert rc == 0, capsys.readouterr().out
    assert doc["patched_judged_as"] == "0.33.0+lookup-defers-on-unusable-pending-chunk"
    (r,) = doc["replay"]
    assert r["gone"] == ["lookup:needless_deferral", "lookup:needless_deferral[deferred on full_attention HIT_PENDING]"]
    assert r["new"] == [] and r["kept"] == [], r


def test_a_patch_that_breaks_what_its_row_models_is_new(tmp_path, prepared, capsys):
    """Planted: the lookup patch without its `defer_lookup |= group_defers`, so a deferring group's
    pending chunks count as hits. Judged by the patch's row, the spec defers where that vLLM answers,
    and the contract sees a hit the tier does not hold ready: new, exit 1."""
    prepared("0.33.0")
    broken = tmp_path / "broken.diff"
    text = LOOKUP_PATCH.read_text()
    assert text.count("+                    defer_lookup |= group_defers\n") == 1
    broken.write_text(text.replace("+                    defer_lookup |= group_defers\n",
                                   "+                    pass  # planted: the deferral dropped\n"))
    rc, doc = _models_replay(tmp_path, broken, CROSS_GROUP_48REQ)
    assert rc == 1, capsys.readouterr().out
    (r,) = doc["replay"]
    assert {"lookup:spec_disagreement", "lookup:false_hit"} <= set(r["new"]), r


def test_models_names_a_patch_of_the_table_of_that_release(prepared, capsys):
    prepared("0.33.0")
    assert main(["review", "--vllm", "0.33.0", "--patch", str(LOOKUP_PATCH), "--models", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no patch 'nope' in the release table's PATCHES" in err[0], err
