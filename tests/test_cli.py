"""The console script as a user runs it: real subprocesses, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import EXAMPLES, kvbound


def test_plan_prints_one_json_line_per_case():
    r = kvbound("plan", EXAMPLES)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == len(list(EXAMPLES.glob("*.json")))
    for line in lines:
        assert set(line) >= {"name", "outcome", "assertion", "dst_block_ids", "group_sizes", "block_indices", "keys"}
    pr = next(x for x in lines if x["name"] == "pr-recurrent-unhashed-below-boundary")
    assert pr["outcome"] == "ok" and pr["dst_block_ids"] == [22, 34]


def test_plan_with_vllm_version_picks_the_legacy_scan():
    r = kvbound("plan", "--vllm-version", "0.29.0", EXAMPLES / "pr_case.json")
    line = json.loads(r.stdout)
    assert line["outcome"] == "assertion_error" and line["assertion"] == "boundary" and line["variant"] == "legacy"


def test_explain_draws_the_pr_table():
    r = kvbound("explain", EXAMPLES / "pr_case.json")
    assert r.returncode == 0, r.stderr
    assert "[H]  [H]  [·]  [U]  [·]" in r.stdout
    assert "start=3  ✗ boundary" in r.stdout
    assert "fixed      ok: dst_block_ids=[22, 34]" in r.stdout


def test_bad_case_file_is_one_line_exit_2(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"name": "b", "blocks_per_chunk": 1, "tokens_per_hash": 16, "num_prompt_tokens": 1,
                             "num_locally_computed_tokens": 0, "num_external_tokens": 16, "sync_load": False,
                             "groups": [{"kind": "mamba", "tokens_per_block": 16, "blocks": ["Q1"]}]}))
    for cmd in ("plan", "explain"):
        r = kvbound(cmd, p)
        assert r.returncode == 2
        assert "Traceback" not in r.stderr
        assert "case 'b': groups[0].blocks[0]: 'Q1' is not a block token" in r.stderr


def test_unknown_version_is_exit_2():
    r = kvbound("plan", "--vllm-version", "0.18.0", EXAMPLES / "pr_case.json")
    assert r.returncode == 2 and "no offloading connector" in r.stderr and "Traceback" not in r.stderr


def test_python_m_kvbound_cli_reports_a_usage_error_as_one_line(tmp_path):
    """``python -m kvbound.cli`` runs cli.py as __main__; the commands' errors must still be caught
    (they come from kvbound.errors, not from a second copy of kvbound.cli)."""
    r = subprocess.run([sys.executable, "-P", "-m", "kvbound.cli", "conform", "--no-witnesses"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == ("kvbound conform: error: nothing to replay: give case files/directories, "
                                "--cases N, or keep the witnesses")


def _deliberate_errors():
    import kvbound.conform.mutants
    import kvbound.conform.prepare
    import kvbound.conform.runner
    import kvbound.impl
    import kvbound.impl.exhaustive
    import kvbound.report
    import kvbound.spec
    import kvbound.trace.runner
    from kvbound import errors

    return (kvbound.spec.CaseError, kvbound.spec.UnsupportedVersion, kvbound.impl.BatchError,
            kvbound.report.ReportInputError, kvbound.conform.prepare.PrepareError,
            kvbound.conform.runner.WorkerError, errors.UsageError, kvbound.impl.exhaustive.ScopeError,
            kvbound.trace.runner.TraceError, kvbound.conform.mutants.MutantError, errors.SolverUnknown)


@pytest.mark.parametrize("cls", _deliberate_errors(), ids=lambda c: c.__name__)
def test_every_deliberate_error_is_one_line_and_exit_2(cls, monkeypatch, capsys):
    """Each error a command raises on purpose, from wherever a command imports it, reaches the
    user as one line naming the command, with exit 2 and no traceback."""
    from kvbound.cli import main
    from kvbound.commands import explain

    import inspect

    n_args = len(inspect.signature(cls.__init__).parameters) - 1 if "__init__" in vars(cls) else 1
    error = cls(*(["x"] * n_args))

    def fails(args):
        raise error

    monkeypatch.setattr(explain, "run", fails)
    assert main(["explain", str(EXAMPLES / "pr_case.json")]) == 2
    assert capsys.readouterr().err == f"kvbound explain: error: {error}\n"
