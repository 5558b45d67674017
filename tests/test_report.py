"""kvbound report: SVG tables that say what draw_case says, a page that needs no network,
unreadable inputs as one line and a red box, and a real headless-Chromium render."""

from __future__ import annotations

import copy
import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvbound.report import ReportInputError, build_report, conform_section
from kvbound.spec import Variant, load_cases, plan_load
from kvbound.spec.verdicts import Verdict
from kvbound.svg import STYLE, case_svgs

from conftest import DATA, EXAMPLES, ROOT, kvbound

SVG_NS = "{http://www.w3.org/2000/svg}"


def pr_case():
    return load_cases(EXAMPLES / "pr_case.json")[0]


def cells(svg: str) -> list[tuple[str, str]]:
    """(letter, fill) of each drawn block cell, left to right."""
    root = ET.fromstring(svg)
    out = []
    for g in root.iter(f"{SVG_NS}g"):
        rect, texts = g.find(f"{SVG_NS}rect"), g.findall(f"{SVG_NS}text")
        out.append((texts[0].text, rect.get("fill")))
    return out


def test_pr_mamba_table_is_drawn_with_the_unhashed_block_below_f_and_legacy_assert():
    case = pr_case()
    svgs = case_svgs(case)
    assert len(svgs) == 2
    mamba = svgs[1]
    drawn = cells(mamba)  # folded like the text drawing: 0 1 2 3 4 … 20 21
    letters = [c[0] for c in drawn]
    assert letters == ["H", "H", "·", "U", "·", "·", "F"]
    fills = dict((c[0], c[1]) for c in drawn)
    assert len(set(fills.values())) == 4, "each block kind needs its own colour as well as its glyph"
    assert fills["U"] == STYLE["[U]"][0] and fills["F"] == STYLE["[F]"][0]
    text = "".join(ET.fromstring(mamba).itertext())
    assert "f = cdiv(N=336, b=16) = 21" in text and "k = cdiv(T=352, b=16) = 22" in text
    assert "start=3  ✗ boundary: num_locally_computed_tokens=336 > num_locally_computed_gpu_blocks=3" in text
    assert "start=21  ✓ loads [34]" in text
    # the full-attention group has no unhashed block below f: every variant agrees
    assert "✗" not in "".join(ET.fromstring(svgs[0]).itertext())


def test_svg_draws_plans_given_from_elsewhere():
    case = pr_case()
    only_fixed = {Variant.FIXED: plan_load(case, Variant.FIXED)}
    text = "".join(ET.fromstring(case_svgs(case, plans=only_fixed)[1]).itertext())
    assert "fixed" in text and "legacy" not in text


def test_report_page_is_self_contained_and_draws_the_case(tmp_path):
    out = tmp_path / "r.html"
    r = kvbound("report", "--case", EXAMPLES / "pr_case.json", "--conform", DATA / "conform_pr.json", "--html", out)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    # nothing fetched at view time: no external src/href/url(), no script
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "url(" not in html and "<script" not in html and "@import" not in html
    assert "<svg" in html and "pr-recurrent-unhashed-below-boundary" in html
    assert "AssertionError (boundary) at vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py:1034" \
        in html
    assert "2 agree, 0 disagree" in r.stdout


def test_conform_disagreement_is_drawn_and_counted():
    data = json.loads((DATA / "conform_pr.json").read_text())
    bad = copy.deepcopy(data)
    rec = next(r for r in bad["cases"] if r["release"] == "0.29.0")
    rec["real"] = dict(rec["spec"], outcome="ok", assertion=None, dst_block_ids=[22, 33])
    rec["verdict"], rec["diff"] = "disagree", ["outcome", "assertion", "dst_block_ids"]
    bad["blocking"] = 1
    sec = conform_section(bad)
    assert sec.failed and "1 disagree" in sec.summary and "1 blocking" in sec.summary
    assert "differs in: <b>outcome, assertion, dst_block_ids</b>" in sec.body
    assert sec.body.count("<svg") >= 4  # the pr case (2 groups) and the disagreement (2 groups)


@pytest.mark.parametrize("flag,content,needle", [
    ("--conform", "{not json", "not JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("--conform", json.dumps({"releases": {}, "not_prepared": [], "cases": []}), "conform JSON: missing field 'matrix'"),
    ("--conform", json.dumps({"releases": {}, "not_prepared": [], "matrix": {}, "blocking": 0,
                              "cases": [{"name": "x"}]}),
     "conform JSON.cases[0]: missing field 'release'"),
    ("--prove", json.dumps({"obligations": [{"id": "boundary"}]}), "prove JSON.obligations[0]: missing field 'statement'"),
    ("--diff", json.dumps({"cases": "many"}), "diff JSON.cases: expected int, found str"),
])
def test_malformed_input_is_one_line_and_a_red_box(tmp_path, flag, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "r.html"
    r = kvbound("report", flag, bad, "--case", EXAMPLES / "pr_case.json", "--html", out)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert needle in r.stderr and str(bad) in r.stderr
    html = out.read_text()
    assert 'class="error"' in html and "<svg" in html  # the rest of the page is still there


def test_missing_file_names_the_file(tmp_path):
    html, sections = build_report(conform=tmp_path / "nope.json")
    assert sections[0].error.startswith(f"{tmp_path / 'nope.json'}: cannot read")


def test_case_reader_names_the_bad_field():
    with pytest.raises(ReportInputError, match=r"conform JSON.cases\[0\].case: .*tokens_per_block"):
        data = json.loads((DATA / "conform_pr.json").read_text())
        data["cases"][0]["case"]["groups"][0]["tokens_per_block"] = 0
        conform_section(data)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                    reason="headless check needs Debian's chromium (apt-get install -y chromium)")
def test_page_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "r.html"
    assert kvbound("report", "--case", EXAMPLES / "pr_case.json", "--conform", DATA / "conform_pr.json",
                   "--html", page).returncode == 0
    png = tmp_path / "shot.png"
    r = subprocess.run([str(ROOT / "scripts" / "screenshot_report.sh"), page, png, "1400x1200"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert _png_size(png) == (1400, 1200)
    # a drawn page compresses far worse than a blank or error page (~8 KiB)
    assert png.stat().st_size > 60_000


def _prove_json(ids):
    """The file `kvbound prove --json` writes, from the real runner, for these obligations."""
    from kvbound.proofs.obligations import OBLIGATIONS
    from kvbound.proofs.runner import run_obligation
    from kvbound.records import ObligationRecord, ProveRecord

    obs = [ObligationRecord.of(run_obligation(o)) for o in OBLIGATIONS if o.id in ids]
    return ProveRecord(obs, None, None, 0.0, all(o.met for o in obs)).to_json()


def test_obligations_table_and_witness_drawn():
    from kvbound.report import prove_section

    sec = prove_section(_prove_json({"boundary", "legacy-refuted"}))
    assert not sec.failed and sec.summary.startswith("2/2 obligations met")
    assert "the scan starts at f = cdiv(N, b)" in sec.body  # premise, from the obligation object
    assert 'id="w-legacy-refuted"' in sec.body and "✗ boundary" in sec.body and "<svg" in sec.body


def test_missed_verdict_and_malformed_obligation():
    from kvbound.report import prove_section

    data = _prove_json({"boundary"})
    data["obligations"][0]["verdict"] = "unknown"
    with pytest.raises(ReportInputError, match=r"obligations\[0\].met: true, but verdict unknown"):
        prove_section(data)
    data["obligations"][0]["met"] = False  # as the runner writes an unknown
    sec = prove_section(data)
    assert sec.failed and "0/1 obligations met" in sec.summary and "1 unknown" in sec.summary
    del data["obligations"][0]["verdict"]
    with pytest.raises(ReportInputError, match=r"prove JSON.obligations\[0\]: missing field 'verdict'"):
        prove_section(data)


def test_conform_summary_counts_every_verdict_including_refused_configs():
    data = json.loads((DATA / "conform_pr.json").read_text())
    data["cases"][0]["verdict"] = "unsupported"
    sec = conform_section(data)
    assert "1 agree" in sec.summary and "1 refused by the release's config" in sec.summary
    data["cases"][0]["verdict"] = "agreed"
    with pytest.raises(ReportInputError, match=r"conform JSON.cases\[0\].verdict: 'agreed' is not one of"):
        conform_section(data)


def test_text_from_a_json_file_reaches_the_page_escaped(tmp_path):
    data = json.loads((DATA / "conform_pr.json").read_text())
    evil = "<script>alert(1)</script>"
    data["releases"]["0.29.0"]["python"] = evil
    data["cases"][0]["name"] = evil
    data["cases"][0]["row"] = "example"
    p = tmp_path / "c.json"
    p.write_text(json.dumps(data))
    html, sections = build_report(conform=p, title="<b>title</b>")
    assert not sections[0].error, sections[0].error
    assert "<script" not in html and "<b>title</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;title&lt;/b&gt;" in html


def test_the_files_the_commands_write_read_back_through_the_same_records(tmp_path):
    from kvbound.records import ConformRecord, DiffRecord, ProveRecord

    prove = tmp_path / "prove.json"
    assert kvbound("prove", "--only", "legacy-refuted", "--json", prove).returncode == 0
    rec = ProveRecord.from_json(json.loads(prove.read_text()))
    assert rec.obligations[0].id == "legacy-refuted" and rec.obligations[0].witness is not None
    assert ProveRecord.from_json(rec.to_json()) == rec
    diff = tmp_path / "diff.json"
    assert kvbound("diff", "--cases", "50", "--symbolic-cases", "5", "--no-save", "--json", diff).returncode == 0
    d = DiffRecord.from_json(json.loads(diff.read_text()))
    assert d.cases == 50 and d.result is Verdict.AGREE and DiffRecord.from_json(d.to_json()) == d
    c = ConformRecord.from_json(json.loads((DATA / "conform_pr.json").read_text()))
    assert ConformRecord.from_json(c.to_json()) == c
    html, sections = build_report(prove=prove, diff=diff)
    assert not any(s.error for s in sections) and "legacy-refuted" in html


def test_every_witness_kind_of_kvbound_prove_is_drawn():
    """A load case, an allocate_slots, a lookup and a store witness, as `kvbound prove --json` writes them."""
    from kvbound.report import prove_section

    ids = {"legacy-refuted", "reservation.mamba-align.sync-load", "lookup.window.no-needless-deferral.0.25.1",
           "store.computed[0.27.0+,finished,prompt_only=False,sync/async/spec]"}
    data = _prove_json(ids)
    assert {o["witness"].get("witness") for o in data["obligations"]} == {None, "allocate_slots", "lookup", "store"}
    sec = prove_section(data)
    assert not sec.failed and sec.summary.startswith("4/4 obligations met")
    assert "never forwarded" in sec.body  # the store witness, drawn
    for i in ids:
        assert f'id="w-{i}"' in sec.body
    assert "window group" in sec.body and "vLLM 0.25.1: deferred" in sec.body  # the lookup witness, drawn
    bad = next(o for o in data["obligations"] if o["witness"].get("witness") == "lookup")
    del bad["witness"]["release"]
    with pytest.raises(ReportInputError, match=r"witness: not a lookup witness"):
        prove_section(data)
