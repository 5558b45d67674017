"""Coverage-guided exploration (kvbound/trace/guide.py, ``kvbound campaign --guided R``): the
planner on synthetic coverage (pure host code: which runs join the corpus, how a round's draws
lean toward the runs that reached new lines, what a draw changes), its bad values, and a real
guided campaign on 0.33.0 that repeats itself byte for byte on the local pool and on Ray."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from kvbound.cli import main
from kvbound.records import reproducible
from kvbound.trace import guide as G
from kvbound.trace import space as S
from kvbound.trace.layouts import LAYOUTS

COL = "0.33.0"


def _cov(lines, statements=range(1000)):
    return {"f.py": {"statements": list(statements), "executed": list(lines), "declared": {}}}


def _round0(per_round=60, supported=None):
    """Round 0 of three layouts: A reaches 300 lines, B 3 more, C only lines A had."""
    a, b, c = "full", "mamba", "swa"
    pl = G.Planner(0, per_round, supported)
    runs = pl.first([a, b, c])
    rnd = pl.record(runs, {COL: {a: _cov(range(300)), b: _cov(range(300, 303)), c: _cov(range(50))}}, [COL])
    return pl, rnd, (a, b, c)


def test_a_run_joins_the_corpus_with_the_lines_no_earlier_run_reached():
    pl, rnd, (a, b, c) = _round0()
    assert [(e["point"], e["mutation"], e["new_lines"]) for e in rnd["runs"]] == [
        (a, "chosen", {COL: 300}), (b, "chosen", {COL: 3}), (c, "chosen", {COL: 0})]
    assert (rnd["round"], rnd["new_lines"], rnd["corpus"], rnd["executed"]) == (0, 303, 2, {COL: 303})
    assert [e[0] for e in pl.corpus] == [a, b]  # c added nothing: not a parent
    assert "round 0: 3 run(s), 2 reached new lines (+303 statements), corpus 2" in G.round_line(rnd)


def test_a_rounds_draws_lean_toward_the_runs_that_reached_new_lines():
    pl, _, (a, b, c) = _round0()
    w = pl.weights()
    assert set(w) == {a, b} and w[a] == pytest.approx(10 * w[b])  # sqrt(300) : sqrt(3)
    runs = pl.next()
    assert len(runs) == 60 and len({pl.label(r) for r in runs}) == 60
    parents = Counter(r.parent for r in runs)
    assert set(parents) <= {a, b} and parents[a] > 4 * parents[b], parents
    for r in runs:
        assert r.mutation in (G.MOVE, G.RESEED, G.SWAP)
        base, moved = S.split(r.point)
        pbase, pmoved = S.split(r.parent)
        if r.mutation == G.RESEED:  # the same point on new traffic
            assert (r.point, r.seed != 0, pl.label(r)) == (r.parent, True, f"{r.parent} seed {r.seed}")
        elif r.mutation == G.MOVE:  # one or two axes of the parent's layout, each to another value
            assert base == pbase and r.seed == 0 and 1 <= len(r.moved) <= 2
            lay = LAYOUTS[base]
            for k in r.moved:
                assert S.BY_NAME[k].applies(lay)
                assert moved.get(k, S.BY_NAME[k].value_of(lay)) != pmoved.get(k, S.BY_NAME[k].value_of(lay))
            assert {k for k in set(moved) | set(pmoved) if moved.get(k) != pmoved.get(k)} <= set(r.moved)
        else:  # the parent's axes on another layout
            assert base != pbase and r.moved == (base,)
    # a parent drawn in a round is halved in the next; the draws never repeat a run
    assert pl.weights()[a] == pytest.approx(w[a] / 2)
    assert not {pl.label(r) for r in pl.next()} & ({pl.label(r) for r in runs} | {a, b, c})


def test_the_plan_is_the_same_without_a_clock_and_only_of_supported_points(monkeypatch):
    import time

    def no_clock():
        raise AssertionError("the planner read a clock")

    monkeypatch.setattr(time, "monotonic", no_clock)
    monkeypatch.setattr(time, "time", no_clock)
    no_tier = lambda point: "tiering" not in point  # noqa: E731
    one, two = _round0(30, no_tier)[0], _round0(30, no_tier)[0]
    assert one.next() == two.next()
    assert all("tiering" not in r.point for r in one.next())
    # nothing reached a line: uniform draws, as --explore's
    empty = G.Planner(0, 5)
    empty.record(empty.first(["full"]), {COL: {"full": _cov([])}}, [COL])
    assert {r.mutation for r in empty.next()} == {G.FRESH}


def test_the_record_is_in_plan_order_whatever_order_shards_returned_in():
    pl1, pl2 = G.Planner(0, 1), G.Planner(0, 1)
    runs = pl1.first(["full", "mamba"])
    pl2.first(["full", "mamba"])
    got = {"0.29.0": {"mamba": _cov([1, 2]), "full": _cov([2, 3])}, COL: {"full": _cov([5])}}
    flipped = {COL: got[COL], "0.29.0": dict(reversed(got["0.29.0"].items()))}
    assert pl1.record(runs, got, ["0.29.0", COL]) == pl2.record(runs, flipped, ["0.29.0", COL])
    assert [e["new_lines"] for e in pl1.rounds[0]["runs"]] == [{"0.29.0": 2, COL: 1}, {"0.29.0": 1}]


def _parser():
    import argparse

    from kvbound.commands.campaign import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def test_guided_plans_round_0_from_the_points_named_with_coverage_on():
    from kvbound.commands.campaign import plan

    args = lambda *a: _parser().parse_args(["campaign", "--vllm", "0.33.0", "--layout", "full", *a])  # noqa: E731
    _, shards = plan(args("--guided", "2", "--explore", "3", "--requests", "100"))
    assert shards[0].layouts == ("full",) and shards[0].options.run.coverage  # --explore: per round, not here
    assert len(plan(args("--explore", "3", "--requests", "100"))[1][0].layouts) > 1
    assert plan(args("--requests", "100"))[1][0].options.run.coverage  # on by default (options.CAMPAIGN_COVERAGE)
    assert not plan(args("--requests", "100", "--no-coverage"))[1][0].options.run.coverage
    # --budget: the later rounds are costed too, so fewer requests per layout fit
    guided = plan(args("--guided", "2", "--explore", "3", "--budget", "600"))[1][0].options.run.requests
    assert guided < plan(args("--budget", "600"))[1][0].options.run.requests


@pytest.mark.parametrize("extra,says", [
    (["--guided", "-1", "--explore", "2"], "--guided -1: must be >= 0"),
    (["--guided", "2"], "--guided 2: needs --explore N >= 1"),
    (["--guided", "2", "--explore", "2", "--no-coverage"], "--guided 2: steers by coverage"),
])
def test_bad_guided_values_exit_2_with_one_line(capsys, extra, says):
    assert main(["campaign", "--vllm", "0.33.0", "--layout", "full", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and "Traceback" not in err


def test_a_guided_campaign_repeats_itself_on_the_pool_and_on_ray(tmp_path, prepared):
    """Two rounds after round 0, run at once on the local pool and on a local Ray instance:
    the same document, byte for byte but each detect's cpu_s; every run's new lines add up to
    the coverage the document reports."""
    pytest.importorskip("ray", reason="Ray is in the test extra; install kvbound[test]")
    from conftest import KVBOUND

    prepared(COL)
    cmd = [*KVBOUND, "campaign", "--vllm", COL, "--layout", "full", "--layout", "mamba-block-sync",
           "--requests", "60", "--seed", "2", "--shrink-budget", "4", "--guided", "2", "--explore", "1", "--quiet"]
    procs = {tag: subprocess.Popen([*cmd, *how, "--out", str(tmp_path / f"f-{tag}"), "--json",
                                    str(tmp_path / f"{tag}.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
             for tag, how in (("pool", ["--workers", "1"]), ("ray", ["--ray", "local", "--workers", "1"]))}
    outs = {tag: p.communicate(timeout=900) for tag, p in procs.items()}
    assert all(p.returncode in (0, 1) for p in procs.values()), outs
    pool, ray = (json.dumps(reproducible(json.loads((tmp_path / f"{t}.json").read_text())), indent=1,
                            sort_keys=True) for t in ("pool", "ray"))
    assert pool == ray
    doc = json.loads(pool)
    rounds = doc["guided"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert [(e["point"], e["mutation"]) for e in rounds[0]["runs"]] == [("full", "chosen"),
                                                                         ("mamba-block-sync", "chosen")]
    assert all(e["point"] in doc["matrix"][COL] and e["parent"] for r in rounds[1:] for e in r["runs"])
    reached = sum(f["executed"] for f in doc["coverage"][COL].values())
    assert sum(n for r in rounds for e in r["runs"] for n in e["new_lines"].values()) == reached
    assert rounds[-1]["executed"][COL] == reached
    assert "round 2: 1 run(s)" in outs["pool"][1] and "== guided rounds" in outs["pool"][0]


def test_rounds_are_barriers_through_one_executor():
    """campaign.guided hands each round's shards (one per column) to the executor at once and
    plans the next round from what all of them returned; the shards carry each run's seed."""
    from kvbound.options import RunOptions, ShrinkOptions, TraceOptions
    from kvbound.trace import campaign as C

    opts = TraceOptions(RunOptions(10, 0, coverage=True), ShrinkOptions(0))
    shards = [C.Shard(v, ("full", "mamba"), opts, column=v) for v in ("0.29.0", COL)]
    calls = []

    def execute(batch):  # a run's lines: a hash of its label, so every run adds some
        calls.append([(sh.column, sh.layouts, sh.seeds) for sh in batch])
        return [{"shard": sh.to_json(), "cells": [],
                 "point_coverage": {G.label(p, s, 0): _cov([sum(map(ord, G.label(p, s, 0))) % 997])
                                    for p, s in zip(sh.layouts, sh.seeds)}} for sh in reversed(batch)]

    pl = G.Planner(0, 3)
    seen = []
    results = C.guided(shards, pl, 2, execute, seen.append)
    assert len(calls) == 3 and all([c[0] for c in call] == ["0.29.0", COL] for call in calls)
    assert calls[0][0][1:] == (("full", "mamba"), (0, 0))
    assert all(len(call[0][1]) == 3 for call in calls[1:])  # --explore 3 per later round
    assert seen == pl.rounds and len(results) == 6
    # a round's points are drawn from the corpus the rounds before it built
    firsts = {e["point"] for e in pl.rounds[0]["runs"]}
    assert all(e["parent"] in firsts for e in pl.rounds[1]["runs"])
