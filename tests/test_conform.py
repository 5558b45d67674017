"""kvbound conform: assert naming, judging, matrix, faults; then the real releases if prepared."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import release_env_for
from kvbound.conform import compare as C
from kvbound.conform import prepare, runner
from kvbound.spec import load_cases

from conftest import DATA, EXAMPLES, ROOT

FACTS_CASE = EXAMPLES / "facts_fa_mamba_run.json"
SCHED = "/x/vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"


def site(stmt, function="update_state_after_alloc", line=1034):
    return {"file": SCHED, "line": line, "function": function, "statement": stmt}


# --- which assert fired --------------------------------------------------------------

@pytest.mark.parametrize("stmt,name", [
    ("assert len(group_blocks) >= num_gpu_blocks", "table_length"),
    ("assert num_locally_computed_tokens <= num_locally_computed_gpu_blocks * tokens_per_block", "boundary"),
    ("assert num_locally_computed_tokens <= num_locally_computed_gpu_blocks * gpu_block_size", "boundary"),
    ("assert num_locally_computed_tokens % tokens_per_block == 0", "alignment"),
    ("assert num_pending_gpu_blocks <= group_config.sliding_window_size_in_chunks"
     " * self.config.blocks_per_chunk + 1", "window_bound"),
    ("assert num_pending_gpu_blocks <= group_config.sliding_window_size_in_chunks"
     " * self.config.block_size_factor + 1", "window_bound"),
    ("assert num_pending_gpu_blocks <= group_config.sliding_window_size_in_chunks"
     " * self.config.blocks_per_chunk", "window_bound"),  # 0.26: no + 1
    ("assert len(offload_keys) >= end_chunk_idx", "keys_length"),
    ("assert len(offload_keys) >= num_chunks", "keys_length"),  # 0.26: every group
    ("assert partial_tail_boundary == num_cached_tokens", "partial_tail"),  # 0.28+
])
def test_assert_named_from_source_statement(stmt, name):
    assert C.classify_assert(site(stmt)) == name


def test_unknown_assert_is_other_with_its_line():
    got = C.classify_assert(site("assert not req_status.transfer_jobs", line=1088))
    assert got.startswith("other:vllm/distributed/") and ":1088 " in got and "transfer_jobs" in got
    # the same statement outside the function under study is not one of its asserts
    got = C.classify_assert(site("assert len(offload_keys) >= end_chunk_idx", function="_lookup"))
    assert got.startswith("other:")


# --- judging one result -----------------------------------------------------------------

def facts_case():
    (case,) = load_cases(FACTS_CASE)
    return case


def test_legacy_boundary_assert_agrees_with_spec():
    rec = C.judge(facts_case(), "0.29.0", {
        "outcome": "assertion_error", "phase": "update_state_after_alloc",
        "assert_site": site("assert num_locally_computed_tokens <= num_locally_computed_gpu_blocks"
                            " * tokens_per_block"),
        "lookup": {"num_external_tokens": 32}})
    assert rec["verdict"] == C.AGREE and rec["real"]["assertion"] == "boundary"
    assert rec["lookup_matches_case"]


def test_fixed_output_compared_field_by_field():
    ok = {"outcome": "ok", "phase": "done", "dst_block_ids": [3, 4, 12, 13], "group_sizes": [2, 2],
          "block_indices": [2, 2], "keys": [[0, 2], [0, 3], [1, 2], [1, 3]],
          "lookup": {"num_external_tokens": 32}, "sync_load_marked": False}
    assert C.judge(facts_case(), "0.33.0", ok)["verdict"] == C.AGREE
    bad = dict(ok, dst_block_ids=[3, 4, 11, 12], keys=[[0, 2]])
    rec = C.judge(facts_case(), "0.33.0", bad)
    assert rec["verdict"] == C.DISAGREE and rec["diff"] == ["dst_block_ids", "keys"]
    assert C.is_blocking(rec, "example") and not C.is_blocking(rec, "adversarial")


def test_faults_and_undriven_sync_are_not_verdicts():
    crash = C.judge(facts_case(), "0.33.0", {"outcome": "worker_crash", "exit_code": -11, "stderr_tail": "boom"})
    assert crash["verdict"] == C.FAULT and "fresh worker" in crash["fault"] and "boom" in crash["fault"]
    setup = C.judge(facts_case(), "0.33.0", {"outcome": "exception", "phase": "setup", "error": "TypeError: x"})
    assert setup["verdict"] == C.FAULT and "adapter" in setup["fault"]
    (sync,) = load_cases(EXAMPLES / "sync_load.json")
    rec = C.judge(sync, "0.33.0", {"outcome": "ok", "phase": "done", "sync_load_marked": False,
                                   "dst_block_ids": [3, 4], "group_sizes": [2], "block_indices": [2],
                                   "keys": [[0, 2], [0, 3]]})
    assert rec["verdict"] == C.UNDRIVEN and "sync load" in rec["why"]


def test_matrix_counts_and_renders_rows_per_release():
    case = facts_case()
    recs = []
    for rel, res in (("0.29.0", {"outcome": "assertion_error", "assert_site": site(
            "assert num_locally_computed_tokens <= num_locally_computed_gpu_blocks * tokens_per_block")}),
                     ("0.33.0", {"outcome": "ok", "dst_block_ids": [], "group_sizes": [], "block_indices": [],
                                 "keys": []})):
        r = C.judge(case, rel, res)
        r["row"] = C.row_of(case, "file", "example")
        recs.append(r)
    m = C.matrix(recs, ["0.29.0", "0.33.0"])
    assert m["example"]["0.29.0"]["agree"] == 1 and m["example"]["0.29.0"]["outcomes"] == {"boundary": 1}
    assert m["example"]["0.33.0"]["disagree"] == 1
    text = C.render_matrix(m, ["0.29.0", "0.33.0"])
    assert "vllm 0.29.0 (legacy)" in text and "vllm 0.33.0 (fixed-sync)" in text
    assert "1/1 agree | boundary:1" in text and "0/1 agree, 1 disagree" in text


def test_rows():
    case = facts_case()
    assert C.row_of(case, "generated", "realistic") == "realistic/mamba"
    assert C.row_of(case, "witness", "witness") == "witness"
    (pr,) = load_cases(EXAMPLES / "pr_case.json")
    assert C.row_of(pr, "file", "example") == "pr_case"


# --- preparation and worker faults ------------------------------------------------------

def test_lock_is_package_data_and_pins_cpu_torch():
    reqs = prepare.lock_requirements()
    assert "torch==2.13.0" in reqs and not any("+cpu" in r for r in reqs)
    assert len(reqs) > 50


def test_bad_version_and_no_network_explained(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBOUND_CACHE", str(tmp_path))
    with pytest.raises(prepare.PrepareError, match="released version like 0.29.0"):
        prepare.release_tree("latest", Path(sys.executable), progress=None)
    err = prepare._pip_failure("downloading vllm==0.29.0",
                               "WARNING: Retrying ... Failed to establish a new connection: [Errno 101]"
                               " Network is unreachable", "x")
    assert "no network" in str(err) and str(tmp_path) in str(err)


def test_import_failure_reported_with_what_to_do(tmp_path):
    tree = tmp_path / "tree" / "vllm"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("raise ImportError('No module named cbor2')\n")
    w = runner.Worker(prepare.ReleaseEnv("0.29.0", sys.executable, str(tree.parent)))
    with pytest.raises(runner.WorkerError, match="failed to import") as e:
        w.start()
    assert "vllm-import-deps.lock" in str(e.value)


def _starting_worker(tmp_path, monkeypatch, start: str):
    """A worker on the real protocol loop (``sidecar.serve``) whose release takes ``start``
    (Python source) to load, with a 1 s idle window and heartbeats every 0.1 s."""
    from dataclasses import replace

    fake = tmp_path / "worker.py"
    fake.write_text(textwrap.dedent("""
        import os, sys, time
        from kvbound.side import sidecar

        class Rel:
            version = "0.0.0"

        def load():
            %s
            return Rel()

        sys.exit(sidecar.serve(load, lambda rel, msg: {"outcome": "ok"}))
    """) % start)
    monkeypatch.setattr(runner, "WORKER", fake)
    monkeypatch.setattr(runner, "WORKERS", replace(runner.WORKERS, start_idle_s=1.0, heartbeat_s=0.1))
    return runner.Worker(prepare.ReleaseEnv("0.0.0", sys.executable, None))


def test_a_slow_start_that_makes_progress_is_waited_for(tmp_path, monkeypatch):
    """A loaded machine slows vLLM's import; it does not stop it: start waits past the idle
    window while the heartbeats show CPU spent (3 s here, the window 1 s)."""
    w = _starting_worker(tmp_path, monkeypatch, "t = time.process_time()\n"
                         "    while time.process_time() - t < 3: pass")
    try:
        assert w.start()["hello"] == 1
    finally:
        w.stop()


def test_a_start_that_stops_making_progress_says_what_it_waited_for(tmp_path, monkeypatch):
    w = _starting_worker(tmp_path, monkeypatch, "import json; sys.stderr.write('stuck here\\n'); time.sleep(60)")
    with pytest.raises(runner.WorkerError, match="made no progress for 1 s, importing vllm") as e:
        w.start()
    assert "stuck here" in str(e.value) and not w.alive


def test_a_worker_that_dies_in_its_start_gives_its_exit_code(tmp_path, monkeypatch):
    w = _starting_worker(tmp_path, monkeypatch, "time.sleep(0.3); sys.stderr.write('gone\\n'); sys.stderr.flush(); os._exit(7)")
    with pytest.raises(runner.WorkerError, match="exited with code 7") as e:
        w.start()
    assert "gone" in str(e.value)


def test_lines_are_read_whole_however_they_arrive(tmp_path, monkeypatch):
    """A heartbeat and the hello in one write, then a result of megabytes (a long segment's
    lookups): each is one message, read in time linear in its size."""
    fake = tmp_path / "worker.py"
    fake.write_text(textwrap.dedent("""
        import json, sys
        sys.stdout.write(json.dumps({"starting": "import", "cpu_s": 0.1, "modules": 9}) + "\\n"
                         + json.dumps({"hello": 1, "vllm": "0.0.0"}) + "\\n")
        sys.stdout.flush()
        for line in sys.stdin:
            msg = json.loads(line)
            print(json.dumps({"id": msg["id"], "outcome": "ok", "lookups": ["x" * 64] * 200000}), flush=True)
    """))
    monkeypatch.setattr(runner, "WORKER", fake)
    w = runner.Worker(prepare.ReleaseEnv("0.0.0", sys.executable, None))
    try:
        assert w.start()["hello"] == 1
        for i in range(3):
            res = w.run(i, {})
            assert res["id"] == i and len(res["lookups"]) == 200000
    finally:
        w.stop()


def test_one_crashing_case_never_stops_the_run(tmp_path, monkeypatch):
    fake = tmp_path / "worker.py"
    fake.write_text(textwrap.dedent("""
        import json, os, sys
        print(json.dumps({"hello": 1, "vllm": "0.0.0"}), flush=True)
        for line in sys.stdin:
            msg = json.loads(line)
            if msg["case"]["name"].endswith("crash"):
                os._exit(9)
            print(json.dumps({"id": msg["id"], "outcome": "ok", "phase": "done"}), flush=True)
    """))
    monkeypatch.setattr(runner, "WORKER", fake)
    case = facts_case()
    from dataclasses import replace

    cases = [replace(case, name="a"), replace(case, name="b-crash"), replace(case, name="c")]
    hello, res = runner.run_release(prepare.ReleaseEnv("0.0.0", sys.executable, None), cases)
    assert [r["outcome"] for r in res] == ["ok", "worker_crash", "ok"]
    assert res[1]["exit_code"] == 9


# --- the real releases (prepared by `kvbound conform --vllm X` or .ci/conform) -------------

def test_real_legacy_and_fixed_on_the_facts_case_and_a_bad_case():
    case = facts_case()
    from dataclasses import replace

    from kvbound.spec import Group, GroupConfig, GroupKind, parse_table

    # Two Mamba groups whose chunks differ: vLLM refuses the config (an assert at setup).
    bad = replace(case, name="two-mamba-sizes", groups=(
        case.groups[1], Group(GroupConfig(GroupKind.MAMBA, 32), parse_table("N U21 U22"))))
    for version, want in (("0.29.0", "boundary"), ("0.33.0", "ok")):
        env = release_env_for(version)
        hello, (r_bad, r) = runner.run_release(env, [bad, case])
        assert hello["vllm"] == version
        assert r_bad["outcome"] == "assertion_error" and r_bad["phase"] == "setup"
        assert C.judge(bad, version, r_bad)["verdict"] == C.UNSUPPORTED
        rec = C.judge(case, version, r)
        assert rec["verdict"] == C.AGREE, json.dumps(rec, indent=1)
        assert C.outcome_label(rec) == want
        if want == "ok":
            assert r["dst_block_ids"] == [3, 4, 12, 13] and r["group_sizes"] == [2, 2]


def test_missing_release_told_apart_from_unreachable_index():
    missing = prepare._download_failure("0.99.0", "ERROR: Could not find a version that satisfies the requirement"
                                        " vllm==0.99.0 (from versions: 0.28.0, 0.29.0, 0.33.0)\n"
                                        "ERROR: No matching distribution found for vllm==0.99.0")
    assert "not on the package index" in str(missing) and "0.33.0" in str(missing)
    offline = prepare._download_failure("0.31.0", "ERROR: Could not find a version that satisfies the"
                                        " requirement vllm==0.31.0 (from versions: none)")
    assert "no network" in str(offline)


def test_a_worker_that_always_dies_is_not_restarted_forever(tmp_path, monkeypatch):
    fake = tmp_path / "worker.py"
    fake.write_text("import json, os, sys\nprint(json.dumps({'hello': 1, 'vllm': '0.0.0'}), flush=True)\n"
                    "sys.stdin.readline()\nos._exit(7)\n")
    monkeypatch.setattr(runner, "WORKER", fake)
    from dataclasses import replace

    cases = [replace(facts_case(), name=f"c{i}") for i in range(6)]
    _, res = runner.run_release(prepare.ReleaseEnv("0.0.0", sys.executable, None), cases)
    assert [r["exit_code"] for r in res] == [7, 7, 7, None, None, None]
    assert "in a row" in res[-1]["stderr_tail"]


# --- capture: case files dumped from a running scheduler ------------------------------------

CAPTURE_DRIVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import worker  # kvbound/side/worker.py: the side package by path
sys.path.pop(0)
from kvbound_side import capture, conform_worker
rel = conform_worker.Release()
capture.install(sys.argv[2], rel.scheduler.OffloadingConnectorScheduler)
for line in sys.stdin:
    print(json.dumps(rel.run_case(json.loads(line))["phase"]))
"""


def test_capture_dumps_the_real_calls_as_case_files(tmp_path):
    """Drive real vLLM with capture installed: every call that reaches
    update_state_after_alloc comes back, in order, as exactly the case that produced it
    (the engine's own objects read back into the case format)."""
    import subprocess

    import kvbound.side
    from kvbound.spec import case_to_dict, load_cases
    from kvbound.spec.strategies import random_cases

    env = release_env_for("0.33.0")
    # v2: partial tails (EAGLE margins too), retained window tokens, a resumed request,
    # a group that is not offloaded, a non-align Mamba group
    v2 = load_cases(DATA / "conform_v2_cases.jsonl") + [c for c, rel, _ in issue9()[1] if rel == "0.33.0"]
    cases = [facts_case()] + v2 + list(random_cases(30, seed=11))
    out = tmp_path / "captured.jsonl"
    r = subprocess.run(
        [env.python, "-P", "-c", CAPTURE_DRIVER, os.path.dirname(kvbound.side.__file__), str(out)],
        input="".join(json.dumps(case_to_dict(c)) + "\n" for c in cases),
        env=dict(os.environ, PYTHONPATH=env.tree or "", VLLM_TARGET_DEVICE="cpu"),
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    phases = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(phases) == len(cases)
    reached = [c for c, ph in zip(cases, phases) if ph in ("update_state_after_alloc", "done")]
    assert len(reached) >= 10, phases
    got = load_cases(out)
    assert not (tmp_path / "captured.jsonl.errors").exists()

    def unnamed(case):
        return {k: v for k, v in case_to_dict(case).items() if k != "name"}

    assert [unnamed(c) for c in got] == [unnamed(c) for c in reached]
    assert all(c.name.startswith("captured-") for c in got)
    captured = {json.dumps(unnamed(c), sort_keys=True) for c in got}
    for c in v2:  # every v2 case reached the call and came back with all its fields
        assert json.dumps(unnamed(c), sort_keys=True) in captured, c.name
    fields = {k for c in got for k in case_to_dict(c)} | {k for c in got for g in case_to_dict(c)["groups"] for k in g}
    assert {"num_tokens", "partial_tail_boundary", "cache_hit_alignment_tokens", "extra_retained_tokens",
            "is_eagle_group", "offloaded", "mamba_cache_mode"} <= fields


# --- issue 9's three inputs: real outputs of 0.29.0 and 0.33.0, recorded ---------------------

ISSUE9 = DATA / "issue9_real.json"  # recorded by the "command" it holds


def issue9():
    from kvbound.spec import case_from_dict

    d = json.loads(ISSUE9.read_text())
    return d, [(case_from_dict(r["case"]), r["release"], r) for r in d["cases"]]


def test_issue9_recording_holds_what_the_issue_states():
    """The recorded real outputs are the issue's: a partial tail at 44 loads 3 blocks
    through chunk 1 of group 0 and one boundary key per group; the 10-token prompt loads 2
    blocks through 2 boundary keys; the retained window passes on 0.33 only."""
    d, recs = issue9()
    assert d["command"].startswith("kvbound conform --vllm 0.29.0 --vllm 0.33.0 ")
    real = {(c.name, rel): r["real"] for c, rel, r in recs}
    assert {rel for _, rel, _ in recs} == {"0.29.0", "0.33.0"} and len(recs) == 6
    for rel in ("0.29.0", "0.33.0"):
        tail = real["partial-tail-fa-mamba-45-tail-44", rel]
        assert tail["outcome"] == "ok" and len(tail["dst_block_ids"]) == 3
        assert tail["group_sizes"] == [2, 1] and tail["block_indices"] == [1, 2]
        assert tail["keys"] == [[0, 1], [0, "boundary", 44], [1, "boundary", 44]]
        short = real["partial-tail-short-prompt-10-tail-8", rel]
        assert short["outcome"] == "ok" and len(short["dst_block_ids"]) == 2
        assert short["keys"] == [[0, "boundary", 8], [1, "boundary", 8]]
    assert real["retained-window-mtp-3-pending", "0.33.0"]["outcome"] == "ok"
    assert real["retained-window-mtp-3-pending", "0.33.0"]["group_sizes"] == [3, 3]
    assert real["retained-window-mtp-3-pending", "0.29.0"]["assertion"] == "window_bound"
    # driven through vLLM's own lookup: it recorded the case's boundary and answered the case's M
    for c, rel, r in recs:
        assert r["worker"]["partial_tail_boundary"] == c.partial_tail_boundary
        assert r["lookup_matches_case"], (c.name, rel, r["lookup"])


def test_issue9_spec_gives_the_recorded_real_outputs():
    from kvbound.spec import plan_for_version

    _, recs = issue9()
    for c, rel, r in recs:
        spec = plan_for_version(c, rel).to_json(c.name)
        assert C.diff_fields(r["real"], spec) == [], (c.name, rel, spec, r["real"])
        assert C.config_mismatches(c, rel, r["worker"]["real_config"]) == {}


def test_issue9_impl_gives_the_recorded_real_outputs():
    from kvbound.impl import batch_from_cases, plan_batch, to_load_plans
    from kvbound.spec import variant_for_version

    _, recs = issue9()
    for c, rel, r in recs:
        batch = batch_from_cases([c])
        (plan,) = to_load_plans(batch, plan_batch(batch, variant_for_version(rel)))
        assert C.diff_fields(r["real"], plan.to_json(c.name)) == [], (c.name, rel)


def test_issue9_z3_model_forces_exactly_the_recorded_real_outputs():
    """check_plan: the encoding of the release's variant admits the real output and no
    other; a real output with one key changed is not forced (the check can fail)."""
    from kvbound.proofs.symbolic import check_plan
    from kvbound.spec import variant_for_version
    from kvbound.spec.verdicts import Verdict

    _, recs = issue9()
    for c, rel, r in recs:
        assert check_plan(c, variant_for_version(rel), r["real"]).verdict == Verdict.FORCED, (c.name, rel)
    c, rel, r = next(x for x in recs if x[0].name == "partial-tail-fa-mamba-45-tail-44")
    wrong = dict(r["real"], block_indices=[1, 1])
    assert check_plan(c, variant_for_version(rel), wrong).verdict == Verdict.NOT_FORCED


def test_issue9_replayed_on_the_real_releases_gives_the_recording():
    _, recs = issue9()
    for version in ("0.29.0", "0.33.0"):
        env = release_env_for(version)
        mine = [(c, r) for c, rel, r in recs if rel == version]
        _, results = runner.run_release(env, [c for c, _ in mine])
        for (c, r), res in zip(mine, results):
            assert C.real_plan_json(dict(res, name=c.name)) == r["real"], (c.name, version, res)
            assert res["partial_tail_boundary"] == c.partial_tail_boundary
            assert res["lookup"]["num_external_tokens"] == c.num_external_tokens
            assert res["real_config"] == r["worker"]["real_config"]
            assert C.judge(c, version, res)["verdict"] == C.AGREE


# --- judging the v2 fields ------------------------------------------------------------------

def test_a_partial_tail_the_lookup_did_not_record_is_undriven_and_blocks():
    _, recs = issue9()
    c, rel, r = next(x for x in recs if x[0].name == "partial-tail-short-prompt-10-tail-8")
    res = dict(r["worker"], partial_tail_boundary=None, lookup={"num_external_tokens": 0})
    rec = C.judge(c, rel, res)
    assert rec["verdict"] == C.UNDRIVEN and "recorded no partial tail" in rec["why"]
    assert C.is_blocking(rec, "partial_tail") and not C.is_blocking(rec, "adversarial")
    m = C.matrix([dict(rec, row="partial_tail")], [rel])
    assert m["partial_tail"][rel][C.UNDRIVEN] == 1
    assert "1 undriven" in C.render_matrix(m, [rel])


def test_config_derivation_is_compared_with_vllms_own():
    _, recs = issue9()
    c, rel, r = next(x for x in recs if x[0].name == "retained-window-mtp-3-pending" and x[1] == "0.33.0")
    assert r["worker"]["real_config"]["window_in_chunks"] == [None, 2]  # vLLM counted the retained tokens
    wrong = dict(r["worker"]["real_config"], window_in_chunks=[None, 1])
    rec = C.judge(c, rel, dict(r["worker"], real_config=wrong))
    assert rec["verdict"] == C.DISAGREE and rec["diff"] == ["config"]
    assert rec["config_mismatch"] == {"window_in_chunks": {"real": [None, 1], "spec": [None, 2]}}


def test_real_unsupported_agrees_only_with_a_spec_unsupported():
    from dataclasses import replace

    _, recs = issue9()
    c = next(x[0] for x in recs if x[0].name == "retained-window-mtp-3-pending")
    res = {"outcome": "unsupported", "phase": "features", "why": "SlidingWindowSpec has no extra_retained_tokens"}
    assert C.judge(c, "0.27.0", res)["verdict"] == C.AGREE  # the spec: the field arrived in 0.28
    assert C.judge(c, "0.33.0", res)["verdict"] == C.DISAGREE
    plain = replace(c, groups=(c.groups[0],))
    assert C.judge(plain, "0.27.0", res)["verdict"] == C.DISAGREE


# --- spec mutants (kvbound conform --spec-mutants) -----------------------------------------

def test_every_spec_mutant_applies_to_the_spec_and_reverts():
    from kvbound.conform import mutants as MUT

    for m in MUT.SPEC_MUTANTS:
        fn, code = MUT.mutated_code(m)
        original = fn.__code__
        with MUT.applied(m.name):
            assert fn.__code__ is not original and fn.__code__.co_code == code.co_code
            assert fn.__code__.co_filename == f"<spec mutant {m.name}: {m.target}>"
        assert fn.__code__ is original
    assert len({m.name for m in MUT.SPEC_MUTANTS}) == len(MUT.SPEC_MUTANTS)


def test_a_stale_or_unknown_mutant_is_an_error_never_a_survivor():
    from kvbound.conform import mutants as MUT

    stale = MUT.SpecMutant("scan-nulls", "kvbound.spec.plan:plan_load", "no such text", "x")
    with pytest.raises(MUT.MutantError, match="occurs 0 times"):
        MUT.mutated_code(stale)
    with pytest.raises(MUT.MutantError, match="unknown spec mutant"):
        with MUT.applied("no-such-mutant"):
            pass


def test_spec_mutants_are_the_catalogues():
    """One table of names (kvbound.proofs.mutants): every mutant the spec can express has a
    patch here, and every patch names a catalogue mutant."""
    from kvbound.conform import mutants as MUT
    from kvbound.proofs.mutants import BY_NAME, applicable

    assert MUT.missing_patches() == []
    assert set(MUT.BY_NAME) <= {m.name for m in applicable("spec")} <= set(BY_NAME)
    assert set(MUT.SPEC_EQUIVALENT) <= set(MUT.BY_NAME)


def test_mutation_score_against_recorded_real_results():
    """Judged against the recorded real outputs, the partial-tail mutants are killed by the
    partial-tail inputs and the retained-window mutant by 0.33's 3 pending blocks; a mutant
    no recorded input exercises survives and is listed by name."""
    from kvbound.conform import mutants as MUT

    _, recs = issue9()
    jobs = [(c, rel, r["worker"], r["verdict"]) for c, rel, r in recs]
    score = MUT.score(jobs, C.judge)
    assert score["checker"] == "spec" and score["total"] == len(MUT.SPEC_MUTANTS)
    assert score["killed_by"]["partial-tail-chunk"].startswith("partial-tail-")
    assert score["killed_by"]["window-retained"] == "retained-window-mtp-3-pending on vllm 0.33.0"
    assert "keys" in score["details"]["partial-tail-chunk"]["diff"]
    assert score["killed_by"]["group-iteration"] is None and "group-iteration" in score["survivors"]
    assert "group-iteration" in score["unexplained_survivors"]
    assert score["killed"] == score["total"] - len(score["survivors"]) and 0 < score["percent"] < 100


def test_conform_cli_fails_with_a_planted_spec_mutant(tmp_path):
    """End to end: the same real run passes with the spec and fails (exit 1, the
    differing fields named) with a spec mutant planted at runtime."""
    from conftest import kvbound

    release_env_for("0.33.0")
    args = ("conform", "--vllm", "0.33.0", ROOT / "tests" / "cases_v2" / "partial_tail_fa_mamba.json",
            "--no-witnesses")
    ok = kvbound(*args, "--json", tmp_path / "ok.json", timeout=600)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    bad = kvbound(*args, "--spec-mutant", "partial-tail-chunk", "--json", tmp_path / "bad.json", timeout=600)
    assert bad.returncode == 1, bad.stdout[-2000:]
    assert "differs in: outcome, assertion" in bad.stdout  # the mutant's extra chunk key runs out of keys
    rec = json.loads((tmp_path / "bad.json").read_text())
    assert rec["spec_mutant"] == "partial-tail-chunk" and rec["cases"][0]["verdict"] == "disagree"


def test_the_0_30_retained_window_witness_fires_window_bound_on_real_0_30():
    """safe-load.fixed.0.30's witness (a sliding window with extra_retained_tokens on a table the
    allocator builds, T a whole number of chunks) replayed on the real 0.30.0 scheduler: its window
    assert fires, as the spec of 0.30 says; the spec of 0.31 plans it (the window counts retained
    tokens). A witness the real release planned would fail the obligation's claim to be about 0.30."""
    from kvbound.proofs.obligations import OBLIGATIONS
    from kvbound.proofs.runner import run_obligation
    from kvbound.spec import plan_for_version

    ob = next(o for o in OBLIGATIONS if o.id == "safe-load.fixed.0.30")
    r = run_obligation(ob)
    assert r.met and r.replay is None
    case = r.witness
    sw = case.groups[0].config
    assert sw.extra_retained_tokens >= sw.tokens_per_block + 2 and case.num_cached_tokens % sw.tokens_per_block == 0
    env = release_env_for("0.30.0")
    _, (real,) = runner.run_release(env, [case])
    rec = C.judge(case, "0.30.0", real)
    assert rec["verdict"] == C.AGREE and C.outcome_label(rec) == "window_bound", json.dumps(rec, indent=1)
    assert plan_for_version(case, "0.31.0").ok


def test_capture_kinds_are_the_specs():
    """The side package runs inside vLLM's venv without kvbound, so its adapter keeps a stdlib
    copy of the kind names: it must be the spec's GroupKind, every one."""
    from kvbound.side import adapter
    from kvbound.spec import GroupKind

    assert sorted(kind for kind, _ in adapter.KINDS) == sorted(k.value for k in GroupKind)
