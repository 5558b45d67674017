"""docs/invariants.md is generated from the obligation objects and must be current;
docs/walkthrough.md's pasted output must be what the commands print now."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from kvbound.spec import Case

from kvbound.catalogue import render
from kvbound.proofs.obligations import OBLIGATIONS
from kvbound.proofs.options import CATALOGUE
from kvbound.proofs.runner import run_obligation

from conftest import ROOT, kvbound


@pytest.fixture(scope="module")
def results():
    return [run_obligation(o, CATALOGUE) for o in OBLIGATIONS]


def test_committed_catalogue_is_current():
    """In a fresh process, as `kvbound catalogue` runs: Z3's models depend on what the
    process built before, so a witness found after other solver work may differ."""
    r = kvbound("catalogue", "--check")
    assert r.returncode == 0, "docs/invariants.md is stale: run `kvbound catalogue` and commit it\n" + r.stdout


def test_every_obligation_is_catalogued_from_its_own_fields(results):
    text = render(results)
    for o in OBLIGATIONS:
        assert f"## `{o.id}`" in text
        assert o.statement in text and o.math in text and o.premise in text
    for r in results:
        if r.witness is not None:  # a load's witness replays on the spec, another kind says where
            by = "the spec" if isinstance(r.witness, Case) else r.witness.replayed_on
            assert f"Witness `{r.witness.name}` ({by} reproduces the failure" in text
    assert "✗ boundary: num_locally_computed_tokens=" in text  # legacy-refuted's witness, drawn


def test_a_changed_obligation_changes_the_catalogue(results):
    r0 = results[0]
    changed = dataclasses.replace(r0, obligation=dataclasses.replace(r0.obligation, premise="something else"))
    assert render([changed] + results[1:]) != render(results)
    wrong = dataclasses.replace(r0, verdict="refuted" if r0.obligation.expected == "proved" else "proved")
    assert f"EXPECTED {r0.obligation.expected.upper()}" in render([wrong] + results[1:])


def test_catalogue_check_fails_on_a_stale_file_with_a_diff(tmp_path, monkeypatch, capsys, results):
    """The command's compare step, fed the real render (no second solver run)."""
    import argparse

    from kvbound.commands import catalogue as cmd

    monkeypatch.setattr(cmd, "generate", lambda: render(results))
    stale = tmp_path / "inv.md"
    stale.write_text(render(results).replace("## `boundary`", "## `boundry`"))
    assert cmd.run(argparse.Namespace(out=str(stale), check=True)) == 1
    out, err = capsys.readouterr()
    assert "is stale" in err and "+## `boundary`" in out
    assert cmd.run(argparse.Namespace(out=str(stale), check=False)) == 0
    assert cmd.run(argparse.Namespace(out=str(stale), check=True)) == 0


def test_walkthrough_output_is_what_the_commands_print_now():
    """The fast commands (explain, plan); conform's need prepared releases (.ci runs them)."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "walkthrough.py"), "--check", "--fast"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("same: ") >= 3


def test_the_walkthrough_check_ignores_timing_widths_not_values():
    """A slower machine prints a wider timing and pads its column less; that is no change.
    A changed verdict or count beside it still is."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("walkthrough", ROOT / "scripts" / "walkthrough.py")
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    fast = "boundary     proved    yes      0.19  0.30.0–0.32.0  groups 1\n"
    slow = "boundary     proved    yes     10.19  0.30.0–0.32.0  groups 1\n"
    assert w.masked(fast) == w.masked(slow)
    assert w.masked("total: 9.8 s wall (71 obligations)") == w.masked("total: 11.68 s wall (71 obligations)")
    assert w.masked(fast) != w.masked(fast.replace("proved    yes", "refuted   no "))
    assert w.masked("71 obligations, 24 mutants") != w.masked("70 obligations, 24 mutants")
