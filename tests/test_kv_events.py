"""The axis kv_events and the check of the offload tier's KV events (side/kv_events.py,
docs/trace.md "KV events"): a consumer that applies the connector's BlockStored / BlockRemoved /
AllBlocksCleared in order holds exactly the CPU tier's ready chunks each time the events are
taken (store:stale_event). The view on its own, then real runs: the planted event_drop_removed
found and its clean point none, and the connector reset that empties the tier without an event
(docs/findings.md, 0.22.1 - 0.33.0) found by the trace."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvbound.side import findings as F
from kvbound.side.defects import DEFECTS
from kvbound.side.kv_events import EventView, policy_chunks
from kvbound.trace import layouts as L
from kvbound.trace import runner as R
from kvbound.trace import space as S
from kvbound.trace import tracefile as TF

FINDINGS = Path(__file__).resolve().parent.parent / "docs" / "trace-findings"


@dataclass
class Stored:
    block_hashes: list
    medium: str
    group_idx: int | None = None


@dataclass
class Removed:
    block_hashes: list
    medium: str
    group_idx: int | None = None


class Cleared:
    pass


def _view(*events):
    v = EventView((Stored, Removed, Cleared), lambda h: h)
    for ev in events:
        v.apply(ev)
    return v


def test_the_view_counts_announcements_per_medium_group_and_hash():
    v = _view(Stored([b"a", b"b"], "CPU", 0), Stored([b"a"], "CPU", 1), Stored([b"a"], "STORAGE", 0),
              Removed([b"a"], "CPU", 0), Removed([b"z"], "CPU", 0))
    assert v.group_named and v.counts == collections.Counter({("CPU", 0, b"b"): 1, ("CPU", 1, b"a"): 1,
                                                              ("STORAGE", 0, b"a"): 1})
    v.apply(Cleared())  # no medium named: every medium
    assert not v.counts


def test_events_that_name_no_group_are_compared_by_hash_with_counts():
    """Before 0.24 an event carries hashes and a medium only: two groups' chunks of one hash are two
    announcements of it, and one removal leaves one."""
    v = _view(Stored([b"h"], "CPU"), Stored([b"h"], "CPU"), Removed([b"h"], "CPU"))
    assert not v.group_named and v.counts == collections.Counter({("CPU", None, b"h"): 1})
    held = collections.Counter({("CPU", 0, b"h"): 1})  # the tier: group 0 still holds its chunk
    assert v.project(held) == v.project(v.counts)


def test_the_tier_table_is_every_policy_table_that_holds_chunks():
    class LRU:
        chunks = {b"k": "ready"}

    class ARC:
        t1, t2, b1 = {b"x": 1}, {b"y": 2}, {b"ghost": None}

    assert dict(policy_chunks(LRU())) == {b"k": "ready"} and dict(policy_chunks(ARC())) == {b"x": 1, b"y": 2}


def test_the_axis_is_off_on_every_named_layout_and_the_kind_is_in_the_table():
    assert S.BY_NAME["kv_events"].values == ("false", "true")
    assert all("kv_events" not in lay.params() for lay in L.LAYOUTS.values())  # the baseline's cells unchanged
    assert S.resolve("full@kv_events=true").params()["kv_events"] is True
    row = F.row("store:stale_event")
    assert not row.safety and row.key("store:stale_event", {"medium": "CPU", "view": "stale", "left_by": "reset"}) \
        == "store:stale_event[CPU: stale, dropped by a reset]"
    # every release the trace runs publishes the tier's events: no release table column, no support line
    assert all(S.support("full@kv_events=true", v) is None for v in ("0.21.0", "0.24.0", "0.33.0"))


def _run(w, version, point, mutant=None, n=200):
    job = R.make_job(point, (5, "ev"), n, 0, "sync", {"mutant": mutant} if mutant else None)
    job["max_steps"] = 5000
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    _run.found = found
    return res, collections.Counter(f.key() for f in found)


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.module == "kv_events"], ids=lambda d: d.name)
def test_a_planted_event_defect_is_found_and_its_clean_point_is_not(defect, workers):
    """full@cpu_chunks=32: the small tier evicts, so removal events flow; the clean run applies every
    one and agrees with the tier at each take; a tier that drops one removal (the view goes stale) or
    one stored event (the view misses blocks) is caught at once. The file tier with failed stores:
    the clean run's storage medium agrees with what landed on disk; a tier that announces its failed
    stores leaves blocks listed that no file holds."""
    env, w = workers(defect.release)
    res, got = _run(w, defect.release, defect.layout)
    # vLLM's own finding at the failed-store point: the blocks a part-failed job wrote go unannounced
    # (docs/findings.md); nothing else, and nothing the planted defect adds
    assert res.get("ok", True) and set(got) <= ({"store:stale_event[STORAGE: missing]"} if
                                                defect.name == "failed_store_announced" else set()), got
    assert res["stats"]["kv_events"] > 100 and res["stats"]["stores"] > 0
    _, got = _run(w, defect.release, defect.layout, defect.name)
    if defect.name == "failed_store_announced":  # vLLM's own finding there stays, beside the planted one
        got = collections.Counter({k: n for k, n in got.items() if k != "store:stale_event[STORAGE: missing]"})
    assert set(defect.catches) <= {k.split("[")[0] for k in got}, got
    medium, view = {"event_drop_removed": ("CPU", "stale"), "event_drop_stored": ("CPU", "missing"),
                    "failed_store_announced": ("STORAGE", "stale")}[defect.name]
    if medium == "CPU":
        assert got == {f"store:stale_event[CPU: {view}]": 1}, got  # one dropped event, reported once
    else:  # each failed store announced, reported at the take that lists it
        assert set(got) == {f"store:stale_event[STORAGE: {view}]"} and got[f"store:stale_event[STORAGE: {view}]"] > 1, got
        assert res["stats"]["tier_failed_stores"] > 0 and res["stats"]["kv_events_disk_keys"] > 100, res["stats"]


@pytest.mark.parametrize("version,point,announces", [
    ("0.25.1", "full-tiering-fs@shadow=false,kv_events=true", False),
    ("0.29.0", "full-tiering-fs@shadow=false,kv_events=true", True),
    ("0.33.0", "full-tiering-fs@tier_lose_p=0.1,kv_events=true", True)])
def test_the_file_tier_announces_what_landed_on_disk(version, point, announces, workers):
    """From 0.26 the file tier announces its stores on the storage medium when KV events are on
    (compose asks it), and the check compares them with the files on disk: clean on real traffic,
    lost files (tier_lose_p) included; before 0.26 the tier has no events to ask for."""
    assert S.support(point, version) is None
    env, w = workers(version)
    res, got = _run(w, version, point)
    assert not {k for k in got if k.startswith("store:stale_event")}, got
    st = res["stats"]
    if announces:
        assert st["kv_events_disk_keys"] > 100 and st.get("tier_lost_files", 1) > 0, st
    else:
        assert "kv_events_disk_keys" not in st and st["kv_events"] > 0 and st["stores"] > 0, st


@pytest.mark.parametrize("version,groups_named", [("0.22.1", False), ("0.33.0", True)])
def test_a_connector_reset_leaves_stale_blocks_in_the_event_view(version, groups_named, workers):
    """The known defect (docs/findings.md, scripts/repro_reset_kv_events.py), found by the general
    check: with KV events on, every reset that drops ready chunks leaves them listed."""
    env, w = workers(version)
    # (0.22.1 - 0.25.1 may crash first in _build_store_jobs on a job the reset dropped: docs/findings.md)
    res, got = _run(w, version, "full@kv_events=true,reset_p=0.1")
    assert res["stats"]["resets"] > 0
    stale = got.pop("store:stale_event[CPU: stale, dropped by a reset]", 0)
    assert stale > 0 and not {k for k in got if k.startswith("store:stale_event")}, got
    groups = {g for f in _run.found if f.kind == "store:stale_event" for g, *_ in f.detail["keys"]}
    assert groups == ({0} if groups_named else {None})  # before 0.24 compared by hash alone
    res, got = _run(w, version, "full@kv_events=true")  # the same traffic without resets: none
    assert not got and res["stats"]["kv_events"] > 0, got


def test_events_without_group_names_agree_on_a_two_group_layout(workers):
    """0.23.0's events name no group: a window and full attention of one block size share every
    hash, and the view counted by hash still agrees with the tier under evictions."""
    env, w = workers("0.23.0")
    res, got = _run(w, "0.23.0", "swa@cpu_chunks=32,kv_events=true")
    assert not got and res["stats"]["kv_events"] > 50, got


@pytest.mark.parametrize("version,found", [("0.33.0", True), ("0.29.0", True), ("0.25.1", False)])
def test_a_part_failed_store_leaves_blocks_served_and_unannounced(version, found, workers):
    """The 2-request reproducer (docs/findings.md, docs/upstream/fs-tier-failed-store-unannounced): a
    store job that fails after its first block leaves those blocks on disk, where the file tier's
    lookup serves them, and its KV events name none of them (0.26.0 - 0.33.0; 0.25.1's tier has no
    events). Replayed with shadow off, as on every release of the range."""
    f = TF.load(FINDINGS / "0-33-0-full-tiering-fs-tier-store-fail-p-0-3-kv-events-true-store-stale-event-storage-missing-2req.json")
    env, w = workers(version)
    job = dict(f.segment, params=dict(f.segment["params"], shadow=False))
    got = {g.key() for g in R.check_result(version, f.layout, job, w.job(job))[0]}
    assert ("store:stale_event[STORAGE: missing]" in got) is found, got
    job = dict(job, params=dict(job["params"], tier_store_fail_p=0.0))  # no failed store: none
    assert not R.check_result(version, f.layout, job, w.job(job))[0]
