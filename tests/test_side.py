"""The side package (kvbound/side/): no module over 500 lines, no class over 250; the table of
planted trace defects (side/defects.py) is the one list of what the side plants."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import ROOT

SIDE = ROOT / "kvbound" / "side"


def test_no_side_module_over_500_lines_and_no_class_over_250():
    too_long = []
    for py in sorted(SIDE.glob("*.py")):
        src = py.read_text()
        if len(src.splitlines()) > 500:
            too_long.append(f"{py.name}: {len(src.splitlines())} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 250:
                too_long.append(f"{py.name}: class {node.name}, {node.end_lineno - node.lineno + 1} lines")
    assert len(list(SIDE.glob("*.py"))) > 10 and not too_long, too_long


def test_every_planted_defect_is_planted_where_its_row_says():
    """Each row of the table names a defect its module plants (the name stands in that
    module's source, compared with the job's ``mutant``), and the modules plant no other."""
    from kvbound.side.defects import DEFECTS

    for d in DEFECTS:
        assert f'"{d.name}"' in (SIDE / f"{d.module}.py").read_text(), d
    planted = set()
    for py in SIDE.glob("*.py"):
        if py.name != "defects.py":
            planted |= set(re.findall(r'mutant(?:\.startswith\(| [!=]= )"(\w+)"', py.read_text()))
    assert planted - {"lookup_"} <= {d.name for d in DEFECTS}, planted


def test_the_side_refuses_an_unknown_planted_defect():
    from kvbound.side.defects import planted

    assert planted(None) is None and planted("skip_fence") == "skip_fence"
    with pytest.raises(ValueError, match="unknown planted defect 'skip_fences'"):
        planted("skip_fences")
