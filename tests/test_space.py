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
