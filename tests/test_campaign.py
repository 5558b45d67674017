"""kvbound campaign: the shard plan, the merged document, and real runs that repeat
themselves byte for byte, locally and on a local Ray instance of 2 CPUs."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from kvbound.cli import main
from kvbound.errors import UsageError
from kvbound.records import reproducible
from kvbound.spec.versions import CAMPAIGN_RELEASES, expand_releases
from kvbound.trace import campaign as C


def test_release_ranges_expand_from_the_campaign_list():
    assert expand_releases(["0.21.0..0.33.0"]) == list(CAMPAIGN_RELEASES)
    assert expand_releases(["0.28.0..0.30.0", "0.33.0,0.29.0"]) == ["0.28.0", "0.29.0", "0.30.0", "0.33.0"]
    with pytest.raises(UsageError, match="backwards"):
        expand_releases(["0.33.0..0.21.0"])
    with pytest.raises(UsageError, match="no release"):
        expand_releases(["0.40.0..0.41.0"])


def test_the_budget_plans_requests_without_a_clock(monkeypatch):
    """The same command plans the same traffic wherever and whenever it runs: no clock is read."""
    import time

    import kvbound.trace.session  # noqa: F401  importing (hypothesis reads a clock at import) is not planning
    from kvbound.commands.campaign import plan, register

    def no_clock():
        raise AssertionError("the plan read a clock")

    monkeypatch.setattr(time, "monotonic", no_clock)
    monkeypatch.setattr(time, "time", no_clock)
    parser = __import__("argparse").ArgumentParser()
    register(parser.add_subparsers())
    args = lambda *a: parser.parse_args(["campaign", "--vllm", "0.29.0,0.33.0", "--layout", "full", *a])  # noqa: E731
    _, shards = plan(args("--budget", "300", "--workers", "1"))
    n = shards[0].options.run.requests
    assert [s.options for s in plan(args("--budget", "300", "--workers", "1"))[1]] == [s.options for s in shards]
    assert plan(args("--budget", "600", "--workers", "1"))[1][0].options.run.requests > 2 * n  # fixed costs paid once
    assert plan(args("--budget", "300", "--workers", "2"))[1][0].options.run.requests > n  # two shards, two workers
    # a budget too small for any traffic still gives every cell a floor of traffic
    tiny = plan(args("--budget", "1", "--workers", "1"))[1][0].options.run.requests
    assert tiny == plan(args("--budget", "2", "--workers", "1"))[1][0].options.run.requests > 0
    with pytest.raises(UsageError, match="--budget"):
        plan(args("--budget", "0"))


def test_engine_settings_reach_every_shard_and_the_traffic_stays_within_max_model_len(capsys):
    """--engine K=V on a campaign (and a review, which shares its options): every shard runs
    with it, and a lower max_model_len bounds the traffic drawn (prompt and output within it),
    as vLLM refuses past it; a key that is no engine setting is one line, exit 2."""
    from kvbound.cli import build_parser
    from kvbound.commands.campaign import plan
    from kvbound.trace import runner as R
    from kvbound.trace.workload import prompt_len

    args = build_parser().parse_args(["campaign", "--vllm", "0.33.0", "--layout", "hisparse-swa", "--requests",
                                      "300", "--engine", "max_model_len=368"])
    _, shards = plan(args)
    assert [dict(sh.options.run.overrides) for sh in shards] == [{"max_model_len": 368}]
    for overrides, most in (({}, 448), ({"max_model_len": 368}, 368)):
        reqs = R.make_job("hisparse-swa", (0, "hisparse-swa", 0), 300, 0, "sync", overrides)["requests"]
        lens = [prompt_len(r["prompt"]) for r in reqs]
        assert max(n + r["max_tokens"] for n, r in zip(lens, reqs)) <= most
        assert max(lens) > most - 2 * 16  # one request in ten reads a document to near max_model_len
    assert main(["campaign", "--vllm", "0.33.0", "--engine", "max_len=1"]) == 2
    assert "--engine 'max_len=1': expected K=V" in capsys.readouterr().err
    assert main(["campaign", "--vllm", "0.33.0", "--engine", "max_model_len=10"]) == 2
    assert "max_model_len must be a whole number of at least 64 tokens" in capsys.readouterr().err
    assert main(["review", "--vllm", "0.33.0", "--patch", "p.diff", "--replay", "f.json", "--engine",
                 "abort_p=0"]) == 2
    assert "give no --layout, --requests, --engine or --html" in capsys.readouterr().err


def test_an_engine_setting_never_renames_a_point_nor_a_fixed_scheduler_moves():
    """A point that moves an engine axis keeps its value: an --engine of the same key makes it one
    line (its cell would carry a name its run does not have); hisparse-swa's scheduler is fixed (vLLM
    refuses its max_model_len under async scheduling), so a point moving it is one line too."""
    from kvbound.trace.space import runnable_on, support

    assert support("full@cpu_chunks=4", "0.33.0") is None
    assert "--engine cpu_chunks would replace the value" in support("full@cpu_chunks=4", "0.33.0", {"cpu_chunks": 32})
    assert support("full", "0.33.0", {"cpu_chunks": 32}) is None
    assert not runnable_on(["0.33.0"], {"cpu_chunks": 32})("full@cpu_chunks=4")
    assert "scheduler applies to layouts that leave it to the run" in support("hisparse-swa@scheduler=async", "0.33.0")
    assert support("hisparse-swa@scheduler=sync", "0.33.0") is None and support("hisparse@scheduler=async", "0.33.0") is None


def test_the_plan_is_the_budget():
    """The requests planned are the most whose planned seconds (worker starts, each layout at
    its family's rate, shrinking) fit the budget; a release's unsupported layouts cost nothing."""
    from kvbound.options import CAMPAIGN_PLAN as P

    shards = [["full_attention", "mamba", "sliding_window"], ["full_attention"]]
    for budget, workers in ((600, 1), (3600, 2), (20000, 2)):
        plan = replace(P, budget_s=budget)
        n = plan.requests_per_layout(shards, 20, workers)
        assert plan.seconds(shards, n, 20, workers) <= budget < plan.seconds(shards, n + 100, 20, workers)
    P = replace(P, budget_s=3600)
    assert P.requests_per_layout([["mamba"]], 20) > P.requests_per_layout([["mamba", "mamba"]], 20)


def test_without_a_budget_every_point_runs_at_the_floor_and_the_plan_says_its_seconds():
    """The default campaign: no budget, each point at min_requests; its first line gives the
    seconds the table plans it at (what the run takes, docs/benchmarks.md), and the plan grows
    with the releases run."""
    import argparse

    from kvbound.commands.campaign import plan, planned_seconds, register
    from kvbound.options import CAMPAIGN_PLAN as P

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = lambda *a: parser.parse_args(["campaign", *a])  # noqa: E731
    one, full = args("--vllm", "0.33.0"), args("--vllm", "0.21.0..0.33.0")
    (sh,) = plan(one)[1]
    assert sh.options.run.requests == P.min_requests and P.budget_s is None
    shards = plan(full)[1]
    assert all(s.options.run.requests == P.min_requests for s in shards)
    ((one_s,), (full_s,), (full_one_worker_s,)) = (planned_seconds(one, [sh], 2), planned_seconds(full, shards, 2),
                                                    planned_seconds(full, shards, 1))
    assert one_s < full_s < full_one_worker_s
    grown = plan(args("--vllm", "0.21.0..0.33.0", "--budget", "3600"))[1]
    assert grown[0].options.run.requests > P.min_requests


def test_the_plan_is_said_at_this_machines_pace_per_release_and_the_requests_stay_the_tables(tmp_path, monkeypatch,
                                                                                               capsys):
    """The seconds a campaign is said to take are the table's with each shard's two parts,
    running and shrinking, at its release's pace here: the median of what its last shards took
    over what the table planned them at, a release not run here at the median of those that
    were, a probe before any. A part too short to say is not kept, a broken history is started
    again, and the requests traced never move with the pace (kvbound.trace.pace)."""
    import argparse

    from dataclasses import replace

    from kvbound.commands.campaign import _families, at_pace, plan, planned_seconds, record_pace, register
    from kvbound.options import CAMPAIGN_PLAN as P
    from kvbound.trace import pace

    monkeypatch.setenv("KVBOUND_CACHE", str(tmp_path))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["campaign", "--vllm", "0.29.0,0.33.0", "--workers", "1"])
    shards = plan(args)[1]
    before = [sh.options for sh in shards]
    paces, how = pace.release_paces(P, ["0.29.0", "0.33.0"], 60)
    assert paces[0] == paces[1] and paces[0][0] == paces[0][1] > 0 and "probe" in how
    pace.record(P, [("0.33.0", 60, (P.pace_min_part_s / 2, P.pace_min_part_s / 2), (1000.0, 1000.0))])  # too short
    assert "probe" in pace.release_paces(P, ["0.33.0"], 60)[1]
    for run, shrink in [(3.0, 1.0), (1.8, 1.2), (2.0, 1.4), (2.1, 1.3), (2.5, 1.5), (1.9, 1.4)]:
        pace.record(P, [("0.33.0", 60, (100.0, 200.0), (100 * run, 200 * shrink))])
    pace.record(P, [("0.29.0", 60, (100.0, 100.0), (150.0, 50.0))])
    # the last five of 0.33.0: running 1.8 1.9 2.0 2.1 2.5, shrinking 1.2 1.3 1.4 1.4 1.5
    assert pace.release_paces(P, ["0.33.0", "0.29.0", "0.26.0"], 60) == (
        [(2.0, 1.4), (1.5, 0.5), (1.75, 0.95)],
        "what the last shards here took, 2 of 3 releases measured (both parts, shrinking at 60 reruns), a part not"
        " measured at the median of those measured")
    # shrinking is kept per shrink budget (not linear in it): at 20 reruns, none yet, the median of every
    # release's shrinking at any budget, until a shard at 20 is kept
    assert pace.release_paces(P, ["0.33.0"], 20)[0] == [(2.0, 0.95)]
    pace.record(P, [("0.33.0", 20, (100.0, 100.0), (200.0, 190.0))])
    assert pace.release_paces(P, ["0.33.0"], 20)[0] == [(2.0, 1.9)] and pace.release_paces(P, ["0.33.0"], 60)[0] == [(2.0, 1.4)]
    table_s, paced_s, said = at_pace(args, shards, 1)  # one process: the shards one after the other
    assert [table_s] == planned_seconds(args, shards, 1)
    (r29, s29), (r33, s33) = [P.covered().shard_parts(_families(sh.layouts, sh.release, {}), sh.options.run.requests,
                                                      sh.options.shrink.budget) for sh in shards]
    assert paced_s == pytest.approx(r29 * 1.5 + s29 * 0.5 + r33 * 2.0 + s33 * 1.4)
    assert said.startswith(f"planned at {paced_s:,.0f} s ({table_s:,.0f} s by the cost table x {paced_s / table_s:.2f}")
    assert [sh.options for sh in plan(args)[1]] == before
    budgeted = parser.parse_args(["campaign", "--vllm", "0.29.0,0.33.0", "--workers", "1", "--budget", "200"])
    at_pace(budgeted, plan(budgeted)[1], 1)
    assert "plans about 200 s here" in capsys.readouterr().err
    given = parser.parse_args(["campaign", "--vllm", "0.29.0,0.33.0", "--workers", "1", "--pace", "1.5"])
    assert at_pace(given, shards, 1)[1] == pytest.approx(1.5 * table_s)
    # what a campaign records: each shard's running and shrinking against the table's
    ran = [{"layout": l, "outcome": "ran"} for l in shards[0].layouts]
    record_pace(args, [{"shard": sh.to_json(), "cells": ran, "timings": {"seconds": 10 * (r + s), "shrink_seconds": 10 * s}}
                       for sh, (r, s) in zip(shards, [(r29, s29), (r33, s33)])])
    assert json.loads((tmp_path / "pace.json").read_text())["0.29.0"]["run"][-1] == [round(r29, 1), round(10 * r29, 1)]
    # a worker that did not start ran no cell: nothing kept of it; a shard that ran one point is costed as one
    before = (tmp_path / "pace.json").read_text()
    failed = [{"layout": l, "outcome": "worker_failed"} for l in shards[0].layouts]
    record_pace(args, [{"shard": shards[0].to_json(), "cells": failed, "timings": {"seconds": 2.0, "shrink_seconds": 0.0}}])
    assert (tmp_path / "pace.json").read_text() == before
    one_point = [dict(c, outcome="not_run") for c in ran[1:]] + ran[:1]
    record_pace(args, [{"shard": shards[0].to_json(), "cells": one_point,
                        "timings": {"seconds": 50.0, "shrink_seconds": 0.0}}])
    r1, _ = P.covered().shard_parts(_families(shards[0].layouts[:1], "0.29.0", {}), 200, shards[0].options.shrink.budget)
    # costed as its one point, the run part is too short to say (costed as every point, it would be kept)
    assert r1 < P.pace_min_part_s <= r29 and (tmp_path / "pace.json").read_text() == before
    (tmp_path / "pace.json").write_text("[{not ours}]")
    assert "probe" in pace.release_paces(P, ["0.33.0"], 60)[1]
    one = replace(P, pace_runs=1)
    for taken in (300, 500):
        pace.record(one, [("0.33.0", 60, (100.0, 100.0), (taken, taken))])
    assert pace.release_paces(one, ["0.33.0"], 60) == ([(5.0, 5.0)], "what this release's last shards here took")


def test_a_covered_campaign_is_planned_at_the_covered_rate():
    """Coverage is on by default, and a measured request costs 1/coverage_rate_kept of a plain
    one, a measuring worker's start coverage_start_factor of a plain one's (docs/benchmarks.md
    "Coverage"): the default plans fewer requests than --no-coverage, as PlanOptions.covered does."""
    import argparse

    from kvbound.commands.campaign import plan, register
    from kvbound.options import CAMPAIGN_PLAN as P
    from kvbound.options import CAMPAIGN_SHRINK

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = lambda *a: parser.parse_args(["campaign", "--vllm", "0.33.0", "--layout", "full", "--workers", "1", *a])  # noqa: E731
    covered = plan(args("--budget", "3600"))[1][0].options
    plain = plan(args("--budget", "3600", "--no-coverage"))[1][0].options
    assert covered.run.coverage and not plain.run.coverage
    shards = [["full_attention"]]
    P = replace(P, budget_s=3600)
    assert plain.run.requests == P.requests_per_layout(shards, CAMPAIGN_SHRINK.budget)
    assert covered.run.requests == P.covered().requests_per_layout(shards, CAMPAIGN_SHRINK.budget) < plain.run.requests
    c = P.covered()
    assert c.start_s == P.start_s * P.coverage_start_factor
    assert dict(c.seconds_per_request)["mamba"] == dict(P.seconds_per_request)["mamba"] / P.coverage_rate_kept


def _finding(kind, cls, n=2, release="0.29.0"):
    return {"kind": kind, "class": cls, "safety": True, "key": kind, "count": 3, "release": release,
            "segment": {"requests": [{}] * n}, "file": None}


def _shard(col, cells):
    return {"shard": {"column": col}, "cells": cells, "timings": {}}


def test_merge_names_each_finding_once_with_first_last_and_where_it_stops():
    ran = lambda layout, *fs: {"layout": layout, "outcome": "ran", "stats": {}, "findings": list(fs)}  # noqa: E731
    results = [
        _shard("0.27.0", [ran("full", _finding("crash:x", "crash")), ran("swa")]),
        _shard("0.28.0", [ran("full", _finding("crash:x", "crash", 1)), ran("swa", _finding("crash:x", "crash"))]),
        _shard("0.29.0", [ran("full"), {"layout": "swa", "outcome": "unsupported", "why": "w", "findings": []}]),
    ]
    doc = C.merge(["0.27.0", "0.28.0", "0.29.0"], results)
    (f,) = doc.findings
    assert (f.first, f.last, f.stops_at) == ("0.27.0", "0.28.0", "0.29.0")
    assert [c[:2] for c in f.cells] == [["0.27.0", "full"], ["0.28.0", "full"], ["0.28.0", "swa"]]
    assert doc.by_class["0.28.0"]["crash"] == 2 and doc.by_class["0.29.0"]["crash"] == 0
    assert doc.matrix["0.29.0"]["swa"]["outcome"] == "unsupported"
    # the order of the shards' results does not change the document
    assert C.merge(["0.27.0", "0.28.0", "0.29.0"], results[::-1]) == doc


def test_campaign_needs_a_release(capsys):
    assert main(["campaign"]) == 2
    assert "--vllm" in capsys.readouterr().err


@pytest.mark.parametrize("pace", ["0", "-1", "nan", "inf"])
def test_a_bad_pace_is_one_line_before_anything_runs(pace, capsys, tmp_path):
    assert main(["campaign", "--vllm", "0.33.0", "--pace", pace, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--pace {float(pace)}: must be a positive finite factor" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def _campaign(tmp_path, tag, *extra):
    """(exit code, the document's bytes less its measurements: records.reproducible)."""
    out = tmp_path / f"{tag}.json"
    rc = main(["campaign", "--vllm", "0.33.0", "--layout", "full", "--layout", "mamba-block-sync",
               "--requests", "150", "--seed", "2", "--shrink-budget", "8", "--quiet",
               "--out", str(tmp_path / f"f-{tag}"), "--json", str(out), *extra])
    return rc, json.dumps(reproducible(json.loads(out.read_text())), indent=1, sort_keys=True).encode()


def test_a_campaign_repeats_itself_and_finds_the_0_33_reservation_defect(tmp_path, prepared):
    prepared("0.33.0")
    rc1, a = _campaign(tmp_path, "a", "--workers", "2", "--html", str(tmp_path / "c.html"))
    rc2, b = _campaign(tmp_path, "b", "--workers", "1")
    assert a == b  # byte for byte but each detect's cpu_s, whatever the pool size
    doc = json.loads(a)
    assert rc1 == rc2 == 1
    assert all(f["detect"]["requests"] > 0 for f in doc["findings"])  # each finding's time to detect
    keys = {f["key"] for f in doc["findings"]}
    assert "lifecycle:allocation_exceeds_reservation" in keys, keys
    assert doc["matrix"]["0.33.0"]["full"]["findings"] == []
    assert "allocation_exceeds_reservation" in (tmp_path / "c.html").read_text()


def test_the_ray_path_gives_the_local_document(tmp_path, prepared):
    """The same shards on a local Ray instance of 2 CPUs: the same JSON as a local run."""
    pytest.importorskip("ray", reason="Ray is in the test extra; install kvbound[test]")
    prepared("0.33.0")
    _, local = _campaign(tmp_path, "local", "--workers", "1")
    _, on_ray = _campaign(tmp_path, "ray", "--ray", "local", "--workers", "2")
    assert on_ray == local


def _tree(pid: int) -> set:
    """The live descendants of ``pid`` (read from /proc)."""
    children: dict = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and _alive(int(d.name)):
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.update(kids)
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:  # a zombie has ended (nothing reaps it in some containers)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_kill_term_ends_the_pool_and_every_vllm_worker(tmp_path, prepared):
    """What `timeout` and CI runners send: SIGTERM to the campaign's main process ends its
    pool processes and the vLLM workers they started (none is left to init), exit 143."""
    import signal
    import subprocess
    import time

    from conftest import KVBOUND

    prepared("0.32.0")
    prepared("0.33.0")
    p = subprocess.Popen([*KVBOUND, "campaign", "--vllm", "0.32.0,0.33.0", "--layout", "full",
                          "--requests", "20000", "--workers", "2", "--quiet", "--out", str(tmp_path / "f")],
                         stdout=subprocess.DEVNULL, stderr=(tmp_path / "err").open("w"))
    tree: set = set()
    try:
        deadline = time.monotonic() + 600
        while True:  # until both shards' vLLM workers run (each a child of a pool process)
            tree = _tree(p.pid)
            workers = [q for q in tree if b"side/worker.py" in Path(f"/proc/{q}/cmdline").read_bytes()]
            if len(workers) == 2:
                break
            assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
            time.sleep(0.2)
        time.sleep(1.0)  # a worker past its start, importing vLLM
        p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while any(_alive(q) for q in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [Path(f"/proc/{q}/cmdline").read_bytes()[:120] for q in tree if _alive(q)]
        assert not left, f"left running after SIGTERM: {left}"
        assert p.wait(timeout=30) == 143
        assert "ended by SIGTERM" in (tmp_path / "err").read_text()
    finally:  # a failed run leaves nothing behind either
        for q in [p.pid, *tree]:
            if _alive(q):
                os.kill(q, signal.SIGKILL)


def test_a_seeded_trace_writes_the_same_json_twice(tmp_path, prepared):
    """The drift seen before (1,809 vs 1,808 lookups, 20 vs 26 preemptions on 0.33.0 mamba,
    seed 3) came from string hashing randomised per worker process: vLLM iterates sets of
    request ids. Workers now run with a fixed PYTHONHASHSEED; sync and async segments both."""
    prepared("0.33.0")
    docs = []
    for i in range(2):
        out = tmp_path / f"t{i}.json"
        rc = main(["trace", "--vllm", "0.33.0", "--layout", "mamba", "--layout", "swa", "--requests", "400",
                   "--segment", "200", "--seed", "3", "--quiet", "--no-shrink", "--out", str(tmp_path / "f"),
                   "--json", str(out)])
        assert rc == 0
        docs.append(out.read_bytes())
    assert docs[0] == docs[1]
    assert json.loads(docs[0])["layouts"][0]["preemptions"] > 0  # the traffic does preempt


def _doc(*found):
    """A campaign document over 0.29.0 and 0.33.0 holding ``found``: (key, columns) pairs."""
    return C.merge(["0.29.0", "0.33.0"], [_shard(col, [{"layout": "full", "outcome": "ran", "stats": {}, "findings": [
        dict(_finding(key.split("@")[0].split("[")[0], "crash"), key=key) for key, cols in found if col in cols]}])
        for col in ("0.29.0", "0.33.0")])


def test_a_baseline_fails_only_on_new_findings():
    from kvbound.commands import campaign as CC

    base = _doc(("crash:a", ["0.33.0"]), ("crash:b", ["0.29.0"]))
    now = _doc(("crash:a", ["0.33.0"]), ("crash:c", ["0.29.0"]))
    assert CC.against_baseline(now, base) == ([("crash:c", "0.29.0")], [("crash:b", "0.29.0")])
    assert CC.against_baseline(base, base) == ([], [])


def test_a_baseline_in_the_old_kind_names_holds_todays_findings(tmp_path):
    """A baseline written before the findings table renamed vllm-exception and spec-disagreement."""
    from kvbound.commands.campaign import _read_baseline, against_baseline

    now = _doc(("crash:exception@prepare_load:assert block is not None", ["0.29.0"]),
               ("plan:spec_disagreement", ["0.29.0", "0.33.0"]))
    old = json.loads(json.dumps(now.to_json()).replace("crash:exception", "vllm-exception")
                     .replace("plan:spec_disagreement", "spec-disagreement"))
    assert "vllm-exception@prepare_load:assert block is not None" in {f["key"] for f in old["findings"]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert against_baseline(now, _read_baseline(path)) == ([], [])


def test_the_committed_baseline_reads_in_todays_names():
    from kvbound.commands.campaign import _read_baseline
    from kvbound.side.findings import row

    base = _read_baseline(Path(__file__).resolve().parents[1] / "docs" / "campaign-baseline.json")
    assert base.findings and all(row(f.kind) for f in base.findings)
    assert all(f.key.split("@")[0].split("[")[0] == f.kind for f in base.findings)


@pytest.mark.parametrize("text,field", [("{}", "format"), ('{"format": "kvbound-trace/1"}', "format"),
                                        ('{"format": "kvbound-campaign/1", "matrix": {}}', "columns"), ("[", "readable")])
def test_a_bad_baseline_is_one_line(tmp_path, text, field):
    bad = tmp_path / "b.json"
    bad.write_text(text)
    from kvbound.commands.campaign import _read_baseline

    with pytest.raises(UsageError, match=field) as e:
        _read_baseline(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)
