"""The findings table: every kind an emitter names is a row of it, an unknown kind is
refused, and a finding's key and class come from its row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvbound.records import current_key, current_kind
from kvbound.side import findings as F
from kvbound.trace import runner as R

ROOT = Path(__file__).resolve().parents[1] / "kvbound"
# a literal that reads as a finding kind: a class of the table, a colon, a name
KIND_LITERAL = re.compile(r"^(%s):[a-z][a-z0-9_-]*$" % "|".join(F.CLASSES))


def _kind_literals():
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and KIND_LITERAL.match(node.value):
                yield path.relative_to(ROOT.parent), node.lineno, node.value


def test_every_kind_an_emitter_names_is_in_the_table():
    """Host and side sources alike: a '<class>:<what>' literal the table lacks fails here."""
    found = list(_kind_literals())
    assert len({k for _, _, k in found}) >= 25  # the scan does see the emitters
    unknown = []
    for path, line, kind in found:
        try:
            F.row(kind)
        except ValueError:
            unknown.append(f"{path}:{line}: {kind}")
    assert unknown == []


@pytest.mark.parametrize("kind", ["vllm-exception", "lifecycle:no_such_check", "premise:", "bogus:x", "data"])
def test_a_kind_not_in_the_table_is_refused(kind):
    with pytest.raises(ValueError, match="not in the findings table"):
        F.row(kind)
    with pytest.raises(ValueError):
        R.Finding(kind, "0.33.0", "full", {}, {})


def test_a_worker_that_reports_an_unknown_kind_is_a_harness_fault():
    res = {"ok": True, "violations": [{"check": "not_drained", "step": 1, "request": None, "message": "m"}]}
    (f,) = R.check_result("0.33.0", "full", {"layout": {}, "params": {}, "requests": []}, res)[0]
    assert f.kind == "harness:exception" and "not_drained" in f.detail["error"]


def test_the_side_worker_refuses_an_unknown_kind():
    """The worker itself never reports an undeclared kind: the job becomes a harness fault
    naming it, the declared violations stay, and the host reports exactly that."""
    from kvbound.side import trace_worker

    good = {"check": "lifecycle:not_drained", "step": 3, "request": None, "message": "m"}
    res = trace_worker.refuse_unknown_kinds({"ok": True, "violations": [good, dict(good, check="not_drained")]}, 7)
    assert res["ok"] is False and res["harness_fault"] and res["step"] == 7
    assert "'not_drained'" in res["error"] and res["violations"] == [good]
    kinds = {f.kind for f in R.check_result("0.33.0", "full", {"layout": {}, "params": {}, "requests": []}, res)[0]}
    assert kinds == {"harness:exception", "lifecycle:not_drained"}
    clean = {"ok": True, "violations": [good]}
    assert trace_worker.refuse_unknown_kinds(dict(clean), 7) == clean


def test_a_premise_is_a_row_of_the_premise_family():
    from kvbound.proofs.premises import PREMISES

    for p in PREMISES:
        assert F.row("premise:" + p.id).finding_class == "premise"


def test_the_key_is_the_rows_shape():
    seg = {"layout": {"groups": [{"kind": "full_attention"}, {"kind": "mamba"}]}}
    site = {"assert_site": {"function": "f", "statement": "assert x"}, "error": "AssertionError"}
    assert R.Finding("crash:exception", "r", "l", site, seg).key() == "crash:exception@f:assert x"
    assert R.Finding("crash:exception", "r", "l", {"error": "E"}, seg).key() == "crash:exception@None:E"
    read = {"group": 1, "found": None, "provenance": "load job 3"}
    assert R.Finding("data:wrong_kv", "r", "l", read, seg).key() == "data:wrong_kv[mamba: unwritten, arrived by a load]"
    defer = {"deferred_on": ["mamba RETRY 1:2", "full_attention HIT_PENDING 0:1", "mamba RETRY 1:3"]}
    assert R.Finding("lookup:needless_deferral", "r", "l", defer, seg).key() == \
        "lookup:needless_deferral[deferred on full_attention HIT_PENDING, mamba RETRY]"
    assert R.Finding("lookup:needless_deferral", "r", "l", {}, seg).key() == "lookup:needless_deferral"
    # a kind whose row names no shape: one key whatever its detail
    assert R.Finding("store:lost_chunk", "r", "l", site, seg).key() == "store:lost_chunk"


def test_class_and_effect_come_from_the_row():
    f = R.Finding("lookup:lost_hit", "r", "l", {}, {})
    assert (f.finding_class, f.safety) == ("lookup", False)
    assert (R.Finding("lookup:false_hit", "r", "l", {}, {}).safety, F.row("premise:aligned").safety) == (True, True)


def test_old_names_map_onto_the_table_where_old_files_are_read():
    assert current_kind("vllm-exception") == "crash:exception"
    assert current_kind("spec-disagreement") == "plan:spec_disagreement"
    assert current_key("vllm-exception@prepare_load:assert block is not None") == \
        "crash:exception@prepare_load:assert block is not None"
    assert current_key("spec-disagreement") == "plan:spec_disagreement"
    assert current_key("data:wrong_kv[mamba: unwritten]") == "data:wrong_kv[mamba: unwritten]"
    for old, new in {"vllm-exception": "crash:exception", "spec-disagreement": "plan:spec_disagreement"}.items():
        F.row(new)
        with pytest.raises(ValueError):
            F.row(old)


def test_the_findings_table_is_standard_library_only():
    """The side package loads it by path in the release's venv, where kvbound is not installed."""
    tree = ast.parse((ROOT / "side" / "findings.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "dataclasses"}


def test_every_planted_defect_is_caught_by_kinds_of_the_table():
    """A planted trace defect names the findings that must catch it: each a row of the table, so
    a renamed kind cannot leave a defect that nothing can report."""
    from kvbound.side.defects import DEFECTS

    for d in DEFECTS:
        for kind in d.catches:
            assert F.row(kind).kind in (kind, kind.split(":", 1)[0] + ":"), (d.name, kind)
