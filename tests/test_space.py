"""The configuration space (kvbound/trace/space.py): a point is a named layout with a value on
every axis; its name round-trips to the Layout record the worker builds; a release or layout that
cannot take a value is one line; a bad axis or value is a UsageError naming what is allowed; the
points a command line names are planned without a clock."""

from __future__ import annotations

import pytest

from kvbound.errors import UsageError
from kvbound.trace import runner as R
from kvbound.trace import space as S
from kvbound.trace.layouts import LAYOUTS


def test_a_named_layout_is_the_point_with_its_own_values():
    for name, lay in LAYOUTS.items():
        assert S.point_name(name, {a.name: a.value_of(lay) for a in S.AXES}) == name
        got = S.resolve(name)
        assert (got.job_layout(), got.params(), got.needs) == (lay.job_layout(), lay.params(), lay.needs)


def test_a_point_name_round_trips_to_its_job():
    name = S.point_name("mamba-eagle-untagged", {"prefix_burst_p": "0.5", "blocks_per_chunk": "2"})
    assert name == "mamba-eagle-untagged@blocks_per_chunk=2,prefix_burst_p=0.5"
    lay = S.resolve(name)
    assert lay.blocks_per_chunk == 2 and lay.params()["prefix_burst_p"] == 0.5 and lay.name == name
    job = R.make_job(name, 0, 5, 0, "sync")
    assert job["layout"]["name"] == name and job["layout"]["blocks_per_chunk"] == 2
    assert job["params"]["prefix_burst_p"] == 0.5


def test_an_axis_value_a_release_or_layout_lacks_is_one_line():
    # 0.21 - 0.22 have no prompt clamp: store-all runs there, prompt-only does not
    line = S.support("full-store-all@offload_prompt_only=true", "0.22.1")
    assert line and "offload_prompt_only" in line and "0.23.0" in line and "\n" not in line
    assert S.support("full-store-all@offload_prompt_only=true", "0.23.0") is None
    assert S.support("full@offload_prompt_only=false", "0.22.1") is None
    assert S.support("full-store-all", "0.21.0") is None
    line = S.support("full@mamba_cache_mode=all", "0.29.0")
    assert line == "point full@mamba_cache_mode=all: mamba_cache_mode applies to Mamba layouts only"
    assert "CPU spec" in S.support("full-tiering-fs@evict_p=0.1", "0.33.0")


@pytest.mark.parametrize("item,says", [
    ("nope=1", "K one of blocks_per_chunk"), ("blocks_per_chunk=3", "blocks_per_chunk takes 1, 2, 4"),
    ("composition", "expected K=V"), ("abort_p=", "abort_p takes"),
])
def test_a_bad_axis_or_value_names_what_is_allowed(item, says):
    with pytest.raises(UsageError, match=says):
        S.parse_axis(item)


def test_bad_point_names_are_refused():
    with pytest.raises(UsageError, match="layout 'nolayout' is not one of"):
        S.resolve("nolayout@abort_p=0.0")
    with pytest.raises(UsageError, match=r"point 'full@abort_p=0.0,0.2': '0.2' is not an axis value K=V \(K one of"):
        S.resolve("full@abort_p=0.0,0.2")
    with pytest.raises(UsageError, match=r"'abort_p=0.3' is not an axis value K=V \(abort_p takes 0.04, 0.0, 0.2\)"):
        S.resolve("full@abort_p=0.3")


def test_pinned_axes_multiply_the_layouts_and_explore_is_seeded():
    pts = S.points(["full", "mamba"], {"blocks_per_chunk": ("1", "2"), "prefix_burst_p": ("0.5",)})
    assert pts == ["full@prefix_burst_p=0.5", "full@blocks_per_chunk=2,prefix_burst_p=0.5",
                   "mamba@prefix_burst_p=0.5", "mamba@blocks_per_chunk=2,prefix_burst_p=0.5"]
    a, b = S.explore(LAYOUTS, 30, 7), S.explore(LAYOUTS, 30, 7)
    assert a == b and a != S.explore(LAYOUTS, 30, 8)
    assert all(S.split(p)[0] in LAYOUTS for p in a) and any("@" in p for p in a)
    for p in a:  # every drawn value is one its layout takes
        base, moved = S.split(p)
        assert all(S.BY_NAME[k].applies(LAYOUTS[base]) for k in moved)


def test_the_commands_take_axes_points_and_draws(capsys):
    from kvbound.cli import main

    assert main(["trace", "--vllm", "0.33.0", "--axis", "blocks_per_chunk=3"]) == 2
    assert "blocks_per_chunk takes 1, 2, 4" in capsys.readouterr().err
    assert main(["campaign", "--vllm", "0.33.0", "--point", "full@nope=1"]) == 2
    assert "K one of" in capsys.readouterr().err


def test_the_sweep_puts_every_axis_value_in_the_default_campaign():
    """Every SWEEP entry is a point as point_name spells it that some campaign release runs, and
    every value of every axis is held by a named layout or a SWEEP point, unless no campaign
    release runs it on any layout it applies to (support says why: a failed transfer)."""
    from kvbound.spec.versions import CAMPAIGN_RELEASES

    runs = S.runnable_on(CAMPAIGN_RELEASES)
    assert len(set(S.SWEEP)) == len(S.SWEEP)
    for p in S.SWEEP:
        assert S.point_name(*S.split(p)) == p and p not in LAYOUTS and runs(p), p
    held = {(a.name, a.value_of(S.resolve(p))) for p in list(LAYOUTS) + list(S.SWEEP) for a in S.AXES}
    unswept = []
    for a in S.AXES:
        for v in a.values:
            if (a.name, v) in held:
                continue
            tried = [S.point_name(b, {a.name: v}) for b, lay in LAYOUTS.items() if a.applies(lay)]
            assert not any(runs(t) for t in tried), f"{a.name}={v} runs on some release but no default point has it"
            unswept.append(f"{a.name}={v}")
    assert unswept == ["fail_p=0.05", "store_fail_p=0.05"]
    assert "no release takes failed loads or stores" in S.support("full@fail_p=0.05", "0.33.0")


def test_the_default_campaign_runs_the_layouts_then_the_sweep_and_explore_draws_runnable_points():
    import argparse

    def args(**kw):
        return argparse.Namespace(**dict(dict(layout=[], point=[], axis=[], explore=0, seed=0), **kw))

    assert S.chosen(args(), sweep=True) == list(LAYOUTS) + list(S.SWEEP)
    assert S.chosen(args()) == list(LAYOUTS)  # kvbound trace: the named layouts
    assert S.chosen(args(layout=["full"]), sweep=True) == ["full"]
    assert S.chosen(args(point=["mamba@abort_p=0.2"]), sweep=True) == ["mamba@abort_p=0.2"]
    assert S.chosen(args(axis=["abort_p=0.2"]), sweep=True) == [f"{l}@abort_p=0.2" for l in LAYOUTS]
    # without a test of what runs, the first draw of each (unchanged); with one, a draw it refuses is drawn again
    free = S.explore(LAYOUTS, 40, 3)
    only_0_21 = S.runnable_on(["0.21.0"])
    assert not all(only_0_21(p) for p in free)
    kept = S.explore(LAYOUTS, 40, 3, only_0_21)
    assert kept and all(only_0_21(p) for p in kept) and kept == S.explore(LAYOUTS, 40, 3, only_0_21)
    assert S.explore(LAYOUTS, 3, 3, lambda p: False) == []
