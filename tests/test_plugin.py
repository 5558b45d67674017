"""kvbound as a vLLM plugin (kvbound/plugin.py, docs/plugin.md): the entry point, the
no-op and no-connector paths, the live monitor's lines, and real vLLM 0.29.0 / 0.33.0
loading it through ``load_general_plugins`` and running it under the engine-core
scheduler."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sysconfig
from importlib.metadata import distributions, entry_points
from pathlib import Path

import pytest

from kvbound import plugin
from kvbound.spec import case_to_dict, load_cases, plan_for_version
from kvbound.trace import runner as R

from conftest import DATA

DRIVER = Path(__file__).with_name("vllm_plugin_driver.py")
REAL = ("0.29.0", "0.33.0")


@pytest.fixture(autouse=True)
def fresh_plugin_state(monkeypatch):
    monkeypatch.setattr(plugin, "_state", {"release": None, "handler": None, "installed": None})
    monkeypatch.delenv(plugin.CAPTURE_VAR, raising=False)
    monkeypatch.delenv(plugin.MONITOR_VAR, raising=False)


def test_the_entry_point_is_vllms_general_plugin_group():
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvbound"]
    assert ep.value == "kvbound.plugin:register" and ep.load() is plugin.register


def test_register_is_a_no_op_without_either_variable(monkeypatch, caplog):
    monkeypatch.setenv(plugin.MONITOR_VAR, "0")
    with caplog.at_level(logging.DEBUG, logger="kvbound"):
        plugin.register()
    assert caplog.records == [] and plugin._state["installed"] is None


def test_register_without_the_connector_is_one_line(monkeypatch, caplog, tmp_path):
    """Here vLLM is not installed: the import of the connector class fails, as in a
    release without it. One WARNING line, nothing raised, nothing written."""
    monkeypatch.setenv(plugin.CAPTURE_VAR, str(tmp_path / "calls.jsonl"))
    with caplog.at_level(logging.INFO, logger="kvbound"):
        plugin.register()
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING and "\n" not in rec.getMessage()
    assert "OffloadingConnectorScheduler is not importable" in rec.getMessage()
    assert not (tmp_path / "calls.jsonl").exists()


class _Req:
    request_id = "r1"


def _record(case, release):
    """The call as capture records it, with vLLM's plan equal to the spec's."""
    plan = plan_for_version(case, release).to_json(case.name)
    return dict({k: plan[k] for k in ("dst_block_ids", "group_sizes", "block_indices", "keys")},
                case=case_to_dict(case), outcome=plan["outcome"], sync_load_marked=case.sync_load,
                partial_tail_boundary=case.partial_tail_boundary)


def test_monitor_logs_a_wrong_plan_as_one_line_and_a_right_one_not(monkeypatch, caplog):
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.33.0")
    case = next(c for c in load_cases(DATA / "conform_v2_cases.jsonl")
                if plan_for_version(c, "0.33.0").to_json(c.name)["dst_block_ids"])
    good = _record(case, "0.33.0")
    with caplog.at_level(logging.INFO, logger="kvbound"):
        plugin.monitor_call(None, _Req(), good, None)
        assert caplog.records == []
        bad = dict(good, dst_block_ids=[i + 1 for i in good["dst_block_ids"]])
        plugin.monitor_call(None, _Req(), bad, None)
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert rec.levelno == logging.WARNING and "\n" not in msg
    assert "plan:spec_disagreement" in msg and "dst_block_ids: vLLM %s" % bad["dst_block_ids"] in msg
    assert "vllm 0.33.0 request r1" in msg


def test_monitor_of_a_release_kvbound_has_no_spec_for_is_one_line(monkeypatch, caplog):
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.18.0")
    with caplog.at_level(logging.INFO, logger="kvbound"):
        assert plugin._monitored_release() is None
        assert plugin._monitored_release() is None  # said once
    (rec,) = caplog.records
    assert "not monitoring vllm 0.18.0" in rec.getMessage()


# --- real vLLM: load_general_plugins finds the entry point; the engine-core scheduler runs ---

def _site_with_kvbound() -> str:
    """The site directory this interpreter's kvbound is installed in (editable in a checkout,
    the wheel in CI's clean venv), with the dist-info that declares the entry point."""
    purelib = sysconfig.get_paths()["purelib"]
    dists = [d for d in distributions(path=[purelib]) if d.metadata["Name"] == "kvbound"]
    assert dists and any(e.group == "vllm.general_plugins" for e in dists[0].entry_points), (
        f"kvbound's dist-info in {purelib} declares no vllm.general_plugins entry point:"
        " reinstall kvbound (pip install -e .)")
    return purelib


def _unnamed(case: dict) -> dict:
    return {k: v for k, v in case.items() if k != "name"}


@pytest.mark.parametrize("version", REAL)
def test_real_vllm_loads_the_plugin_which_captures_and_monitors(version, prepared, tmp_path):
    env = prepared(version)
    job = R.make_job("full", (5, "plugin"), 40, 0, "sync", {"shadow": False})
    (tmp_path / "job.json").write_text(json.dumps(job))
    calls = tmp_path / "calls.jsonl"
    r = subprocess.run(
        [env.python, "-P", str(DRIVER), _site_with_kvbound(), str(tmp_path / "job.json")],
        env=dict(os.environ, PYTHONPATH=env.tree or "", VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR",
                 VLLM_PLUGINS="kvbound", KVBOUND_CAPTURE=str(calls), KVBOUND_MONITOR="1",
                 HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.splitlines()[-1].removeprefix("KVBOUND-RESULT "))
    log = r.stderr
    head, rest = log.split("=== run clean\n", 1)
    clean_log, rest = rest.split("=== run defect\n", 1)
    defect_log = rest.split("=== done\n", 1)[0]

    # vLLM's load_general_plugins called register (twice: once said, nothing doubled)
    assert head.count("[kvbound] kvbound: capturing loading calls to %s and monitoring them" % calls) == 1
    # every loading call of both runs is in the capture file, once, in order
    clean, defect = result["clean"], result["defect"]
    for run in (clean, defect):
        assert run["requests"] == 40 and run["left"] == 0  # vLLM ran to the end
        assert run["loads"] > 0
    got = [json.loads(x) for x in calls.read_text().splitlines()]
    assert [_unnamed(c) for c in got] == [_unnamed(c) for c in clean["cases"] + defect["cases"]]
    assert all(c["name"].startswith("captured-") for c in got)
    assert not Path(str(calls) + ".errors").exists()
    # a clean run logs nothing; the planted wrong plan is one line per load, and vLLM goes on
    assert "kvbound monitor:" not in clean_log, clean_log[-2000:]
    lines = [x for x in defect_log.splitlines() if "kvbound monitor:" in x]
    assert len(lines) == defect["loads"], defect_log[-2000:]
    assert all("plan:spec_disagreement: dst_block_ids: vLLM" in x and "vllm %s request" % version in x
               for x in lines)
    assert "Traceback" not in log


def test_monitor_logs_a_premise_the_call_breaks(monkeypatch, caplog):
    """A call whose locally computed block is unhashed breaks a premise of the proofs."""
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.33.0")
    case = next(c for c in load_cases(DATA / "conform_v2_cases.jsonl")
                if c.num_locally_computed_tokens and c.groups[0].blocks[0].state.name == "HASHED")
    rec = _record(case, "0.33.0")
    blocks = rec["case"]["groups"][0]["blocks"]
    rec["case"] = dict(rec["case"], groups=[dict(rec["case"]["groups"][0], blocks=["U" + blocks[0][1:]] + blocks[1:])]
                       + rec["case"]["groups"][1:])
    with caplog.at_level(logging.INFO, logger="kvbound"):
        plugin.monitor_call(None, _Req(), rec, None)
    assert any("premise:" in r.getMessage() and "group 0" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
