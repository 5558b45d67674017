"""The release table (spec/versions.py): every behaviour holds from its first release on, the
release-order API, and no module of kvbound but spec/versions.py compares releases."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kvbound.proofs import OBLIGATIONS
from kvbound.proofs.allocator import allocator_code
from kvbound.errors import UnsupportedVersion
from kvbound.spec.versions import (ARRIVALS, CAMPAIGN_RELEASES, LATEST, PATCHES, RELEASES, REPRESENTATIVE, STEPS, Span,
                                   between,
                                   expand_releases, first_release, release_features, spans)

ROWS = [f.release for f in RELEASES]
ROOT = Path(__file__).resolve().parents[1]


def test_each_arrival_holds_from_its_first_release_on_and_not_before():
    for column, (first, source) in ARRIVALS.items():
        having = [r for r in ROWS if getattr(release_features(r), column)]
        assert having == ROWS[ROWS.index(first):], column  # arrives at ``first`` and stays
        assert ROWS.index(first) > 0, column  # the first row lacks it: an arrival, not a constant
        assert source.strip(), column


def test_a_patched_row_is_its_release_row_with_the_patch_columns_only():
    """``"<release>+<patch>"`` runs the release's row with the columns ``PATCHES`` names, each a
    column of the table and a value no release has; any other release, or a name the table lacks,
    is one line naming it."""
    for name, (release, values, source) in PATCHES.items():
        row = release_features(f"{release}+{name}")
        assert row == replace(release_features(release), **values, release=f"{release}+{name}"), name
        for column, value in values.items():
            assert column in STEPS or column in ARRIVALS, column
            assert value not in {getattr(f, column) for f in RELEASES}, (name, column)
        assert (ROOT / source.split(":")[0]).exists(), source
        other = next(r for r in ROWS if release_features(r) is not release_features(release))
        with pytest.raises(UnsupportedVersion, match=f"modelled on vLLM {release}'s code"):
            release_features(f"{other}+{name}")
    # any other label is a PEP 440 local version, a build of the release (vLLM's 0.29.0+cu130 wheels)
    assert release_features(f"{LATEST}+nope") is release_features(LATEST)
    for name, (release, _, _) in PATCHES.items():  # a local build of the release, patched
        assert release_features(f"{release}+cu130+{name}") == release_features(f"{release}+{name}")


def test_each_step_holds_until_the_next_and_changes_the_value():
    for column, steps in STEPS.items():
        ends = [ROWS.index(s[0]) for s in steps[1:]] + [len(ROWS)]
        assert steps[0][0] == ROWS[0], column
        for (first, value, _), end in zip(steps, ends):
            assert {getattr(f, column) for f in RELEASES[ROWS.index(first):end]} == {value}, (column, first)
        assert all(a[1] != b[1] for a, b in zip(steps, steps[1:])), column


def test_every_row_is_the_first_release_of_a_change():
    for before, row in zip(RELEASES, RELEASES[1:]):
        assert replace(before, release=row.release, allocator=row.allocator) != row, row.release


def test_a_release_runs_the_last_row_at_or_before_it():
    for r in CAMPAIGN_RELEASES + ("0.32.1", "0.34.0rc1", "v0.29.0+cu130"):
        row = release_features(r)
        later = [f for f in RELEASES if f.release in between(row.release, r, ROWS)]
        assert later == [row], r
    assert release_features("0.99.0").release == LATEST


def test_each_allocator_code_is_named_by_its_first_release():
    codes = [allocator_code(r) for r in ROWS if release_features(r).allocator]
    assert codes[0].release == first_release(lambda f: f.allocator_relocation)
    for a, b in zip(codes, codes[1:]):
        assert (a == b) == (a.release == b.release)  # a new name exactly where the model's code changes
    with pytest.raises(ValueError, match="0.28.0 and later"):
        allocator_code("0.27.0")


def test_each_variant_is_modelled_as_its_last_release():
    for variant, r in REPRESENTATIVE.items():
        later = [f.variant for f in RELEASES if f.release in between(r, LATEST, ROWS)]
        assert later[0] is variant and variant not in later[1:]


def test_spans_are_the_maximal_runs_of_equal_columns():
    runs = spans(("variant", "window_slack"))
    assert [s.first for s in runs][0] == ROWS[0] and runs[-1].last == LATEST
    for a, b in zip(runs, runs[1:]):
        assert ROWS.index(b.first) == ROWS.index(a.last) + 1
        assert (a.features.variant, a.features.window_slack) != (b.features.variant, b.features.window_slack)
    for s in runs:
        inside = {(f.variant, f.window_slack) for f in RELEASES if f.release in between(s.first, s.last, ROWS)}
        assert len(inside) == 1
    assert [str(s) for s in spans(("variant",))] == ["0.20.0 – 0.29.0", "0.30.0 – 0.32.0", "0.33.0"]


def test_a_span_is_of_known_releases_in_order():
    assert str(Span("0.28.0", "0.33.0")) == "0.28.0 – 0.33.0" and str(Span("0.33.0")) == "0.33.0"
    with pytest.raises(ValueError, match="backwards"):
        Span("0.33.0", "0.28.0")
    with pytest.raises(ValueError, match="neither"):
        Span("0.3.0")
    assert between("0.25.0", "0.27.0") == ["0.25.1", "0.26.0", "0.27.0"]
    assert between("0.25.0", "0.27.0", ROWS) == ["0.25.0", "0.26.0", "0.27.0"]
    assert expand_releases(["0.31.0..0.33.0,0.29.0"]) == ["0.31.0", "0.32.0", "0.33.0", "0.29.0"]


def test_every_obligation_states_its_releases_as_a_span_of_the_table():
    for ob in OBLIGATIONS:
        assert isinstance(ob.span, Span), ob.id
        assert ob.release_range.startswith(str(ob.span)), ob.id
    latest = [ob.id for ob in OBLIGATIONS if ob.span.last == LATEST]
    assert "alignment" in latest and "reservation.full-attention" in latest


# --- release comparisons live in spec/versions.py only ----------------------------------

# What runs in a release's venv (loaded by path; it may probe the vLLM it runs in).
SIDE = "kvbound/side/"
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_VERSION_TEXT = re.compile(r"v?\d+\.\d+(\.\d+)?([a-z+.].*)?")


def _is_release(node) -> bool:
    """A literal release: (0, 29), (0, 29, 1) or "0.29.0" (vLLM's minors with a connector are >= 19)."""
    if isinstance(node, ast.Tuple):
        vals = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
        return 2 <= len(vals) <= 3 and all(type(v) is int for v in vals) and vals[0] == 0 and vals[1] >= 10
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_VERSION_TEXT.fullmatch(node.value))


def _names_a_version(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "version" in name.lower()


def release_comparisons(tree) -> list[str]:
    """Where a module parses or compares releases."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "parse_version" or \
                isinstance(node, ast.Attribute) and node.attr == "parse_version" or \
                isinstance(node, ast.alias) and node.name == "parse_version":
            out.append(f"{getattr(node, 'lineno', '?')}: parse_version")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            ordered = any(isinstance(op, _ORDER) for op in node.ops)
            if any(_is_release(s) for s in sides) or ordered and any(_names_a_version(s) for s in sides):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def _host_modules():
    for top in ("spec", "proofs", "impl", "kvbound"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(SIDE) and rel != "spec/versions.py":
                yield rel, path


def test_no_module_but_versions_compares_releases():
    found = {rel: hits for rel, path in _host_modules() if (hits := release_comparisons(ast.parse(path.read_text())))}
    assert not found, f"compare releases through kvbound.spec.versions (Span, between, spans, release_features): {found}"


def test_the_release_comparison_scan_sees_each_form():
    code = ("from kvbound.spec.versions import parse_version\n"
            "a = v >= (0, 29)\nb = (0, 30) <= v < (0, 32)\nc = feats.release == '0.33.0'\nd = vllm_version < x\n")
    assert len(release_comparisons(ast.parse(code))) == 5
    assert release_comparisons(ast.parse("e = n >= 0\nf = key == (0, 1, 2)\ng = name == 'x.y'\n")) == []
