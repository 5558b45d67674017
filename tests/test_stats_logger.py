"""The connector's transfer stats as the frontend's stat loggers read them (side/stats_logger.py,
docs/trace.md "Transfer stats"): with log_stats on, each step's SchedulerStats goes through vLLM's
msgpack encoder and decoder to the real KVConnectorLogging and KVConnectorProm; at the end of a
drained run the bytes and transfers they count are those the worker was told finished
(lifecycle:transfer_stats_mismatch). Clean runs agree with real traffic counted; the planted
stats_drop_interval is found and its clean point is not."""

from __future__ import annotations

import collections

import pytest

from kvbound.side import findings as F
from kvbound.side.defects import DEFECTS
from kvbound.trace import runner as R


def _run(w, version, point, mutant=None, n=200):
    job = R.make_job(point, (7, "stats"), n, 0, "sync", {"mutant": mutant} if mutant else None)
    job["max_steps"] = 5000
    res = w.job(job)
    found, _ = R.check_result(version, point, job, res)
    return res, collections.Counter(f.key() for f in found)


def test_the_kind_is_in_the_table_and_costs_no_kv():
    row = F.row("lifecycle:transfer_stats_mismatch")
    assert row.finding_class == "lifecycle" and not row.safety


@pytest.mark.parametrize("version,point", [
    ("0.33.0", "full@log_stats=true"), ("0.33.0", "full-multi-pd@log_stats=true"),
    ("0.29.0", "mamba@log_stats=true"), ("0.29.0", "full@log_stats=true,reset_p=0.1"),
    ("0.21.0", "full@log_stats=true"), ("0.23.0", "full@log_stats=true")])
def test_the_frontend_counts_every_finished_transfer(version, point, workers):
    """Real traffic: the frontend saw payloads and counted bytes both ways, and they agree."""
    env, w = workers(version)
    res, got = _run(w, version, point)
    assert not {k for k in got if k.startswith("lifecycle:transfer_stats")}, got
    st = res["stats"]
    assert st["frontend_payloads"] > 10 and st["frontend_load_bytes"] > 0 and st["frontend_store_bytes"] > 0, st


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d.module == "stats_logger"], ids=lambda d: d.name)
def test_a_planted_stats_defect_is_found_and_its_clean_point_is_not(defect, workers):
    env, w = workers(defect.release)
    res, got = _run(w, defect.release, defect.layout)
    assert res.get("ok", True) and not got, got
    _, got = _run(w, defect.release, defect.layout, defect.name)
    # the lost interval is missing from both loggers' counts: the logging logger's and Prometheus's
    assert set(defect.catches) <= set(got) and got["lifecycle:transfer_stats_mismatch"] == 2, got


def test_the_media_keyed_stats_lose_the_planted_interval(workers):
    """Before 0.24 the worker side hands the stats over, keyed by the transfer's media; the planted
    interval lost there is found (by the logging logger's bytes and Prometheus's), its clean point not."""
    defect = next(d for d in DEFECTS if d.name == "stats_drop_interval")
    env, w = workers("0.21.0")
    res, got = _run(w, "0.21.0", defect.layout)
    assert not got and res["stats"]["frontend_store_bytes"] > 0, (got, res["stats"])
    _, got = _run(w, "0.21.0", defect.layout, defect.name)
    assert got["lifecycle:transfer_stats_mismatch"] == 2, got


def test_the_stats_are_off_where_log_stats_is(workers):
    env, w = workers("0.33.0")
    res, got = _run(w, "0.33.0", "full")
    assert "frontend_payloads" not in res["stats"] and not got, got
