"""The installed kvbound holds every module of the source tree and its package data.

In a checkout (editable install) this checks the layer remapping; in CI's clean venv,
where the built wheel is installed, it is the check that the wheel is complete: a
package that setup.py fails to find is a module ``find_spec`` cannot locate here.
"""

from __future__ import annotations

import importlib.util
from importlib import resources

from conftest import ROOT, kvbound

# source directory -> the package it installs as (setup.py LAYERS, plus the tool itself)
TREES = {"kvbound": "kvbound", "spec": "kvbound.spec", "proofs": "kvbound.proofs", "impl": "kvbound.impl"}


def source_modules() -> list[str]:
    names = []
    for directory, package in TREES.items():
        for py in sorted((ROOT / directory).rglob("*.py")):
            rel = py.relative_to(ROOT / directory).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            names.append(".".join([package, *parts]))
    return names


def test_every_source_module_is_installed():
    names = source_modules()
    assert "kvbound.commands.plan" in names and "kvbound.spec.vocab" in names
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    assert not missing, f"not in the installed package: {missing}"


def test_package_data_is_found_from_the_installed_package():
    lock = resources.files("kvbound.conform").joinpath("vllm-import-deps.lock")
    assert lock.is_file() and "==" in lock.read_text()


def test_the_console_script_lists_every_command():
    from kvbound.cli import COMMANDS

    r = kvbound("--help")
    assert r.returncode == 0, r.stderr
    for name in COMMANDS:
        assert name in r.stdout
