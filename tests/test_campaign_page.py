"""The campaign's HTML page (``kvbound campaign --html``), from a real campaign document,
rendered by headless Chromium: every finding drawn, the class card filled, the matrix
coloured and linked, coverage per release and file.

The document is the one CI's command writes (``kvbound campaign --vllm 0.29.0,0.33.0
--requests 200 --seed 0 --shrink-budget 20 --workers 2 --json ...``, run on 507d4fe),
stored compact as ``tests/data/campaign/campaign-0.29.0-0.33.0.json``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest

from kvbound.campaign_page import coverage_section, html_page
from kvbound.draw import content_rows, lookup_rows
from kvbound.records import CampaignRecord

from conftest import DATA

DOC = DATA / "campaign" / "campaign-0.29.0-0.33.0.json"
SCHEDULER = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
MANAGER = "vllm/v1/kv_offload/cpu/manager.py"
# The rounds of a real guided campaign: ``kvbound campaign --vllm 0.33.0 --layout full --layout
# mamba-block-sync --requests 60 --seed 0 --shrink-budget 2 --workers 1 --guided 2 --explore 2``
# (its document's ``guided``, run on b17329a).
GUIDED = json.loads((DATA / "campaign" / "guided-rounds-0.33.0.json").read_text())
OUT = "campaign-findings"  # the campaign's --out, as the replay commands name it
# the brief's coverage schema: release -> file -> statements, executed, missing, unreached by reason
COVERAGE = {
    "0.29.0": {SCHEDULER: {"statements": 400, "executed": 300, "missing": [[10, 19], [50, 50]],
                           "unreached": {"gpu-only": [[10, 19]], "not-on-release": [], "not-yet": [[50, 50]]}}},
    "0.33.0": {SCHEDULER: {"statements": 1081, "executed": 1070, "missing": [[700, 710]],
                           "unreached": {"gpu-only": [], "not-on-release": [], "not-yet": [[700, 710]]}},
               MANAGER: {"statements": 200, "executed": 120, "missing": [[3, 4]],
                         "unreached": {"gpu-only": [], "not-on-release": [[3, 4]], "not-yet": []}}},
}


def _doc(coverage=None) -> CampaignRecord:
    doc = CampaignRecord.from_json(json.loads(DOC.read_text()), str(DOC))
    if coverage is not None:
        doc.coverage = coverage  # the field the coverage change adds to the record
    return doc


class Dom(HTMLParser):
    """The elements of a page, each with its classes, attributes and the finding figure it
    lies in, and the text of each overview card."""

    def __init__(self, text: str):
        super().__init__()
        self.elements, self.figures, self._cards = [], [], []
        self._figures = []  # open figures: their id if a finding's, else ""
        self._divs = 0  # open divs
        self._card = None  # the divs open outside the card being read
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = set((a.get("class") or "").split())
        if tag == "figure":
            self._figures.append(a.get("id", "") if "finding" in cls else "")
            if "finding" in cls:
                self.figures.append(a)
        if tag == "div":
            if "card" in cls:
                self._card = self._divs
                self._cards.append([])
            self._divs += 1
        self.elements.append((tag, cls, a, next((f for f in reversed(self._figures) if f), None)))

    def handle_endtag(self, tag):
        if tag == "figure" and self._figures:
            self._figures.pop()
        if tag == "div":
            self._divs -= 1
            if self._divs == self._card:
                self._card = None

    def handle_data(self, data):
        if self._card is not None:
            self._cards[-1].append(data)

    def count(self, tag, cls, figure=None) -> int:
        return sum(t == tag and cls in c and (figure is None or w == figure) for t, c, _, w in self.elements)

    def cards(self) -> list:
        return ["".join(buf).strip() for buf in self._cards]


def test_every_finding_is_drawn_with_its_tables_replay_and_size():
    doc = _doc()
    page = html_page(doc, OUT)
    dom = Dom(page)
    assert [f["id"] for f in dom.figures] == [f"f{i}" for i in range(1, len(doc.findings) + 1)]
    assert len(doc.findings) == 18
    for i, f in enumerate(doc.findings, 1):
        detail = f.example["detail"]
        fig = f"f{i}"
        table = detail.get("table")
        if table and table["rows"]:  # the slots' contents: one drawn row per block of the table
            assert dom.count("g", "block-row", fig) == len(content_rows(table)) > 0
        if "lookup_case" in detail:  # each offload key of each group the lookup walked
            assert dom.count("g", "lookup-key", fig) == sum(len(keys) for _, keys in lookup_rows(detail)) > 0
        if f.example.get("case"):  # the load's block tables
            assert dom.count("svg", "group", fig) == len(f.example["case"]["groups"])
        for cell in f.cells:  # each cell's replay command and shrunk size
            assert f"kvbound trace --replay {OUT}/{cell[4]}" in page
    wrong_kv = next(i for i, f in enumerate(doc.findings, 1) if f.kind == "data:wrong_kv")
    assert dom.count("g", "block-row", f"f{wrong_kv}") == 4
    # no raw JSON as the main view: every JSON dump is folded inside a details
    assert page.count("<pre>{") == page.count("<details><summary>the finding as JSON</summary><pre>{") == 18


def test_the_matrix_colours_each_cell_and_links_its_findings():
    doc = _doc()
    dom = Dom(html_page(doc, OUT))
    cells = [(c, a) for t, c, a, _ in dom.elements if t == "td" and any(k.startswith("m-") for k in c)]
    assert len(cells) == sum(len(col) for col in doc.matrix.values()) == 40
    kinds = {k for c, _ in cells for k in c}
    assert {"m-safety", "m-eff", "m-ok", "m-na"} <= kinds
    links = {a["href"] for t, _, a, _ in dom.elements if t == "a" and re.fullmatch(r"#f\d+", a.get("href", ""))}
    assert links == {f"#f{i}" for i in range(1, len(doc.findings) + 1)}


def test_same_document_same_bytes_and_the_other_pages_keep_their_header():
    from kvbound.report import render_page

    assert html_page(_doc(COVERAGE), OUT) == html_page(_doc(COVERAGE), OUT)
    assert "KV-offload load boundary" in render_page([])
    assert "KV-offload load boundary" not in html_page(_doc(), OUT)


def test_coverage_per_release_and_file_and_its_absence():
    sec = coverage_section(COVERAGE, ["0.29.0", "0.33.0"])
    body = str(sec.body)
    assert "75%" in body and "99%" in body and "60%" in body  # 300/400, 1070/1081, 120/200
    assert body.count("<details>") == 2  # one per release
    assert "GPU-only</b>: 10 line(s)" in body and "10-19" in body and "not reachable on this release</b>: 2" in body
    assert sec.failed and "lowest 60% manager.py on 0.33.0" in sec.summary
    assert coverage_section(None, ["0.33.0"]).summary == "coverage not measured"
    assert "coverage not measured" in html_page(_doc(), OUT)


def test_text_from_the_document_reaches_the_page_escaped():
    doc = _doc()
    doc.findings[0].example["detail"]["message"] = "<script>alert(1)</script>"
    page = html_page(doc, OUT)
    assert "<script>" not in page and "&lt;script&gt;alert(1)" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not CHROMIUM, reason="headless check needs Debian's chromium (apt-get install -y chromium)")
def test_the_page_renders_headless_with_every_finding_drawn(tmp_path):
    doc = _doc(COVERAGE)
    doc.guided = GUIDED
    page = tmp_path / "campaign.html"
    page.write_text(html_page(doc, OUT))
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Dom(r.stdout)  # the DOM as Chromium built it, not the bytes written
    assert len(dom.figures) == len(doc.findings) == 18
    assert dom.count("svg", "content") == 1 and dom.count("g", "block-row") == 4
    assert dom.count("g", "lookup-key") > 0 and dom.count("svg", "group") > 0
    h1 = next(i for i, (t, *_) in enumerate(dom.elements) if t == "h1")
    assert "kvbound campaign" in r.stdout and "the real vLLM scheduler and OffloadingConnector" in r.stdout
    assert "load boundary" not in r.stdout and h1 >= 0
    cards = dom.cards()
    assert len(cards) == 5
    assert any(c.startswith("Coverage-guided rounds") and "3 round(s)" in c for c in cards)
    assert dom.count("table", "guided") == 1
    classes = next(c for c in cards if c.startswith("Findings by class"))
    assert classes != "Findings by class" and "9 lookup" in classes and "1 data" in classes
    assert any(c.startswith("Coverage of the connector's code") and "lowest 60%" in c for c in cards)
    assert dom.count("table", "coverage") == 1


def test_time_to_detect_is_shown_where_the_document_has_it():
    doc = _doc()
    doc.findings[2].detect = {"point": "full-store-all", "requests": 113, "cpu_s": 4.2}  # the record's item-7 field
    page = html_page(doc, OUT)
    assert page.count("first seen at") == 1 and "first seen at full-store-all after 113 request(s), 4.2 CPU-s" in page


def test_guided_rounds_are_drawn_run_by_run_and_absent_when_not_guided():
    from kvbound.campaign_page import guided_section

    assert guided_section(None, ["0.33.0"]) is None
    assert 'id="guided"' not in html_page(_doc(), OUT)
    doc = _doc()
    doc.guided = GUIDED
    page = html_page(doc, OUT)
    assert page.count('id="guided"') == 1
    sec = guided_section(GUIDED, ["0.33.0"])
    body = str(sec.body)
    assert body.count("<tr>") == 1 + len(GUIDED)  # the header and one row per round
    for r in GUIDED:
        for e in r["runs"]:
            assert e["point"] in body and f"+{e['new_lines']['0.33.0']}" in body
            if e.get("parent"):
                assert f'of <span class="mono">{e["parent"]}</span>' in body
    assert "named on the command line" in body and "axes moved" in body and "axes put on another layout" in body
    last = GUIDED[-1]["executed"]["0.33.0"]
    assert f"{last:,}" in body and sec.summary == (f"{len(GUIDED)} round(s), "
                                                   f"{sum(len(r['runs']) for r in GUIDED)} run(s); reached "
                                                   f"{last:,} on 0.33.0")
    # the widest bar is the last round's (statements reached only grow)
    assert 'style="width:100.0%"' in body
