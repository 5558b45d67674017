"""The side package (kvbound/side/) stays readable: no module over 500 lines, no class over 250."""

from __future__ import annotations

import ast

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
