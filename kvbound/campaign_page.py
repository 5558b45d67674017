"""The campaign's HTML page (``kvbound campaign --html``): the matrix at a glance, the
findings by class, every distinct finding drawn, and the coverage of the connector's code.

A campaign steps the real scheduler and OffloadingConnector of each release on CPU under
generated traffic and judges every step with the trace checks (docs/trace.md); this page
is its document (``kvbound.records.CampaignRecord``) drawn for a reviewer:

* the matrix: a cell per layout and release, coloured by what it found (a safety finding,
  efficiency only, a harness fault, clean, not supported, the worker died), its findings
  numbered and linked to their drawings;
* every finding: its kind's row of the findings table (``kvbound.side.findings``), its
  message, where it was found (first, last release, where it stops), each cell's shrunk
  size and its ``kvbound trace --replay`` command, and its drawing: the block tables with
  each slot's content and provenance for a shadow-KV finding (``svg.content_svg``, read by
  ``draw.content_rows`` like the terminal's ``draw_content``), the load's block tables for
  a plan finding (``report.drawn_case``), the requests that reproduce it; the JSON folded away;
* coverage per release and file (the document's ``coverage``), what was never reached and why;
* a guided campaign's rounds (the document's ``guided``): each run, where the planner got it, the
  statements it reached first and those reached after each round.

The same document gives the same bytes: everything is drawn in the document's own order.
"""

from __future__ import annotations

from markupsafe import Markup

from kvbound.records import CampaignFinding, CampaignRecord
from kvbound.trace.coverage import GPU_ONLY, NEEDS_EXTERNAL, NOT_ON_RELEASE, NOT_YET, percent_reachable, reachable
from kvbound.report import Section, _badge, _json_pre, _table, drawn_case, html, join, mono, render_page

ABOUT = ("the real vLLM scheduler and OffloadingConnector of each release, stepped on CPU under generated "
         "traffic, every step judged by the trace checks (data, store, lookup, lifecycle, liveness, plan)")
# matrix cell -> (CSS class, words for the legend)
CELL_KINDS = {"safety": ("m-safety", "a safety finding (something wrong was read, stored or served, or vLLM "
                         "crashed)"),
              "efficiency": ("m-eff", "efficiency findings only (work lost, nothing wrong served)"),
              "harness": ("m-harness", "a harness fault (kvbound's own, never vLLM's)"),
              "ok": ("m-ok", "ran clean"),
              "na": ("m-na", "n/a: the release lacks what the layout needs"),
              "fail": ("m-fail", "FAIL: the worker died")}
COVER_GOOD, COVER_FAIR = 95.0, 80.0  # a file's statement coverage: green at or above, amber, else red
UNREACHED = {GPU_ONLY: "GPU-only", NEEDS_EXTERNAL: "needs a library or service this host lacks",
             NOT_ON_RELEASE: "not reachable on this release", NOT_YET: "not yet reached"}
CSS = """
table.matrix td,table.matrix th{text-align:center;padding:3px 6px} table.matrix td:first-child{text-align:left}
table.matrix td.m-safety{background:#ffc9c9} table.matrix td.m-eff{background:#ffec99}
table.matrix td.m-harness{background:#d0bfff} table.matrix td.m-ok{background:#d3f9d8}
table.matrix td.m-na{background:#f1f3f5;color:#868e96} table.matrix td.m-fail{background:#c92a2a;color:#fff}
.swatch{display:inline-block;width:14px;height:14px;border:1px solid #adb5bd;vertical-align:-2px;margin:0 4px 0 10px}
span.m-safety{background:#ffc9c9} span.m-eff{background:#ffec99} span.m-harness{background:#d0bfff}
span.m-ok{background:#d3f9d8} span.m-na{background:#f1f3f5} span.m-fail{background:#c92a2a}
table.matrix a{margin:0 2px;color:#1f2328;font-weight:600}
figure.finding{margin:14px 0 26px;padding:10px 14px;border:1px solid #d0d7de;border-left:5px solid #c92a2a;
border-radius:6px;background:#fcfcfd} figure.finding.efficiency{border-left-color:#f08c00}
figure.finding figcaption{font-size:15px} .fnum{font-weight:700;color:#57606a;margin-right:6px}
.message{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;background:#fff5f5;border:1px solid #ffc9c9;
border-radius:6px;padding:8px 10px;white-space:pre-wrap} .replay{user-select:all}
.kinddoc{color:#57606a;font-size:13px;margin:4px 0} p.where{font-size:14px;margin:8px 0 4px} p.site{font-size:13px}
table.matrix{width:auto;min-width:50%}
.cov{display:inline-block;width:120px;height:10px;background:#ffc9c9;border-radius:3px;vertical-align:middle}
.cov span{display:block;height:10px;background:#2f9e44;border-radius:3px}
.cov.guided{background:#e9ecef} .cov.guided span{background:#1c7ed6}
table.coverage td.c-good{background:#d3f9d8} table.coverage td.c-fair{background:#ffec99}
table.coverage td.c-poor{background:#ffc9c9} span.covrun{white-space:nowrap}
.ranges{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11.5px;color:#57606a}
"""


def _numbers(doc: CampaignRecord) -> dict:
    """Each finding's key -> its number on the page (the document's order, from 1)."""
    return {f.key: i for i, f in enumerate(doc.findings, 1)}


def _cell_kind(cell, by_key: dict) -> str:
    if cell["outcome"] == "unsupported":
        return "na"
    if cell["outcome"] != "ran":
        return "fail"
    found = [by_key[k] for k in cell["findings"] if k in by_key]
    if not cell["findings"]:
        return "ok"
    if any(f.finding_class == "harness" for f in found):
        return "harness"
    return "safety" if any(f.safety for f in found) or len(found) < len(cell["findings"]) else "efficiency"


def _cell_title(cell) -> str:
    if cell["outcome"] != "ran":
        return cell.get("why") or cell["outcome"]
    stats = cell.get("stats") or {}
    return ", ".join(f"{stats[k]} {k}" for k in ("requests", "steps", "loads", "stores", "preemptions")
                     if k in stats)


def matrix_section(doc: CampaignRecord, numbers: dict) -> Section:
    by_key = {f.key: f for f in doc.findings}
    layouts = sorted({l for c in doc.matrix.values() for l in c})
    counts: dict = {}
    rows = []
    for l in layouts:
        cells = [("", mono(l))]  # (the td's CSS class, its content)
        for c in doc.columns:
            cell = doc.matrix.get(c, {}).get(l)
            if cell is None:
                cells.append(("", Markup("–")))
                continue
            kind = _cell_kind(cell, by_key)
            counts[kind] = counts.get(kind, 0) + 1
            text = join(html('<a href="#f{}" title="{}">{}</a>', numbers[k], k, numbers[k])
                        for k in cell["findings"] if k in numbers) if cell["findings"] else \
                {"ok": "ok", "na": "n/a", "fail": "FAIL"}.get(kind, "")
            cells.append((CELL_KINDS[kind][0], html('<span title="{}">{}</span>', _cell_title(cell), text)))
        rows.append(cells)
    head = join(html("<th>{}</th>", h) for h in ["layout", *(f"vllm {c}" for c in doc.columns)])
    body = join(html("<tr>{}</tr>", join(html('<td class="{}">{}</td>', cls, c) for cls, c in r)) for r in rows)
    legend = join(html('<span class="swatch {}"></span>{}', cls, words) for cls, words in CELL_KINDS.values())
    table = html('<table class="matrix"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, body)
    summary = ", ".join(f"{counts[k]} {k if k != 'na' else 'n/a'}" for k in CELL_KINDS if counts.get(k))
    return Section("matrix", "Releases × layouts at a glance", html(
        '<p class="small">Each cell: one layout traced on one release; the numbers are its distinct findings,'
        ' linked to their drawings below; hover for the cell\'s traffic.</p>{}<p class="small">{}</p>',
        table, legend), summary=f"{len(layouts)} layouts × {len(doc.columns)} releases: {summary}",
        failed=bool(counts.get("safety") or counts.get("fail") or counts.get("harness")))


def classes_section(doc: CampaignRecord, numbers: dict) -> Section:
    from kvbound.side.findings import CLASSES

    per_class: dict = {k: [] for k in CLASSES}
    for f in doc.findings:
        per_class.setdefault(f.finding_class, []).append(f)
    rows = [[html("<b>{}</b>", k), *(str(doc.by_class.get(c, {}).get(k, 0)) for c in doc.columns),
             join(html('<div><a href="#f{}">#{}</a> <span class="mono">{}</span></div>', numbers[f.key],
                       numbers[f.key], f.key) for f in fs)]
            for k, fs in per_class.items() if fs]
    summary = " · ".join(f"{len(fs)} {k}" for k, fs in per_class.items() if fs) or "no finding"
    heads = ["class", *(f"vllm {c}: finding × layout" for c in doc.columns), "distinct findings"]
    body = _table(heads, rows) if rows else Markup("<p>No finding on any release.</p>")
    quiet = [k for k, fs in per_class.items() if not fs]
    if quiet:
        body += html('<p class="small">No finding of class {}.</p>', ", ".join(quiet))
    return Section("classes", "Findings by class", body, summary=summary, failed=bool(doc.findings))


# --------------------------------------------------------------------------- one finding


def _shrunk(f: CampaignFinding) -> str:
    ex = f.example or {}
    n = len((ex.get("segment") or {}).get("requests") or ())
    return f"{n} request(s)" + (f", shrunk from {ex['shrunk_from']}" if ex.get("shrunk_from") else "")


def _cells_table(f: CampaignFinding, findings_dir: str) -> Markup:
    rows = [[c[0], mono(c[1]), str(c[2]), f"{c[3]} request(s)",
             html('<code class="replay">kvbound trace --replay {}/{}</code>', findings_dir, c[4]) if c[4]
             else Markup('<span class="small">not saved</span>')] for c in f.cells]
    return _table(["vllm", "layout", "times seen", "shrunk to", "replay (re-runs it on its release)"], rows)


def _prompt(prompt) -> str:
    parts = []
    for seg in prompt:
        if seg[0] == "doc":
            parts.append(f"doc {seg[1]} [{seg[2]},{seg[2] + seg[3]})")
        else:
            parts.append(f"{seg[2]} {'output tokens of' if seg[0] == 'out' else 'unique tokens of'} #{seg[1]}")
    return " + ".join(parts)


def _requests(ex: dict) -> Markup:
    from kvbound.trace.workload import prompt_len

    reqs = (ex.get("segment") or {}).get("requests") or []
    rows = [[f"#{r['id']}", str(r["arrive"]), str(prompt_len(r["prompt"])), _prompt(r["prompt"]), str(r["max_tokens"]),
             "" if r.get("abort_after") is None else f"after {r['abort_after']} step(s)"] for r in reqs]
    return html("<details><summary>the {} request(s) that reproduce it (layout {})</summary>{}</details>", len(rows),
                ex.get("layout", "?"), _table(["request", "arrives at step", "prompt tokens", "prompt", "max_tokens",
                                               "aborted"], rows))


def _drawing(ex: dict) -> Markup:
    """The finding's picture: the slots' contents, the load's tables, or nothing to draw."""
    from kvbound.errors import KvboundError
    from kvbound.spec import case_from_dict, plan_for_version
    from kvbound.svg import content_svg, lookup_svg

    detail = ex.get("detail") or {}
    out = []
    site = detail.get("assert_site")
    if isinstance(site, dict):
        out.append(html('<p class="site">raised at <code>{}:{}</code> in <code>{}</code>: <code>{}</code></p>', site.get("file"),
                        site.get("line"), site.get("function"), site.get("statement") or detail.get("error")))
    if isinstance(detail.get("lookup_case"), dict):
        out.append(html('<div class="svgwrap">{}</div>', Markup(lookup_svg(detail))))
    table = detail.get("table")
    if isinstance(table, dict):
        if table.get("rows"):
            out.append(html('<div class="svgwrap">{}</div>', Markup(content_svg(table))))
        else:
            out.append(html('<p class="small">request {} holds no block of group {} when this runs (its table is'
                            ' empty); the block the message names is block {}</p>', table.get("request"),
                            table.get("group"), detail.get("block_id", "?")))
    if ex.get("case"):
        try:
            case = case_from_dict(ex["case"], ex["case"].get("name", "?"))
            p = plan_for_version(case, ex["release"])
            out.append(drawn_case(case, {p.variant: p}, caption=html("the call vLLM {} made", ex["release"])))
        except (KvboundError, ValueError):  # premise:valid-call: the call is no valid case; its groups as given
            out.append(html("<pre>{}</pre>", "\n".join(
                f"group {i} {g.get('kind')}: {' '.join(map(str, g.get('blocks', [])))}"
                for i, g in enumerate(ex["case"].get("groups", [])))))
    return join(out)


def _message(detail: dict, release: str) -> str:
    """What the finding says: its message, the error raised, or a plan's real outcome against the spec's."""
    if detail.get("message") or detail.get("error"):
        return detail.get("message") or detail.get("error")
    real, spec = detail.get("real"), detail.get("spec")
    if not (isinstance(real, dict) and isinstance(spec, dict)):
        return ""
    said = lambda d: d.get("assertion") or f"ok, dst_block_ids={d.get('dst_block_ids')}"  # noqa: E731
    return (f"vLLM {release}: {said(real)}\nthe spec: {said(spec)}\ndiffers in: {', '.join(detail.get('diff') or [])}")


def finding_figure(f: CampaignFinding, number: int, total_columns: int, findings_dir: str) -> Markup:
    from kvbound.side.findings import row

    ex = f.example or {}
    detail = ex.get("detail") or {}
    try:
        doc = row(f.kind).doc
    except ValueError:  # a kind this kvbound's table lacks: the key says what it is
        doc = ""
    where = (f"on vllm {f.first}" + (f" .. {f.last}" if f.last != f.first else "")
             + f" ({len(f.columns)} of {total_columns} release(s) traced)"
             + (f"; absent from {f.stops_at}" if f.stops_at else ""))
    detect = f.detect  # the traffic before it was first seen, where measured
    if detect:
        where += (f"; first seen at {detect.get('point')} after {detect.get('requests')} request(s),"
                  f" {detect.get('cpu_s')} CPU-s of traffic")
    example = (f"the example below: vllm {ex.get('release', '?')}, layout {ex.get('layout', '?')}, step"
               f" {detail.get('step', '?')}, {_shrunk(f)}")
    return html(
        '<figure class="finding{}" id="f{}" data-class="{}"><figcaption><span class="fnum">#{}</span>'
        '<b class="mono">{}</b> {} {}</figcaption><p class="kinddoc">{}</p>{}<p class="where">{}</p>{}'
        '<p class="small">{}</p>'
        '{}{}<details><summary>the finding as JSON</summary>{}</details></figure>',
        "" if f.safety else " efficiency", number, f.finding_class, number, f.key, _badge(f.finding_class, None),
        _badge("safety" if f.safety else "efficiency", False if f.safety else None), doc,
        html('<div class="message">{}</div>', _message(detail, ex.get("release", "?")) or f.key),
        where, _cells_table(f, findings_dir), example, _drawing(ex), _requests(ex),
        _json_pre({k: v for k, v in ex.items() if k != "segment"}))


# --------------------------------------------------------------------------- coverage


def _lines(ranges) -> int:
    return sum(b - a + 1 for a, b in ranges)


def _ranges(ranges) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _grade(pct: float) -> str:
    return "c-good" if pct >= COVER_GOOD else "c-fair" if pct >= COVER_FAIR else "c-poor"


def coverage_section(coverage: dict | None, columns: list) -> Section:
    if not coverage:
        return Section("coverage", "Coverage of the connector's code",
                       Markup("<p>coverage not measured (this campaign document has no <code>coverage</code>).</p>"),
                       summary="coverage not measured")
    releases = [c for c in columns if c in coverage] + sorted(c for c in coverage if c not in columns)
    files = sorted({p for r in releases for p in coverage[r]})
    head = join(html("<th>{}</th>", h) for h in ["file", *(f"vllm {r}" for r in releases)])
    rows = []
    for p in files:
        cells = [html("<td>{}</td>", mono(p))]
        for r in releases:
            f = coverage[r].get(p)
            cells.append(Markup("<td>–</td>") if f is None else html(
                '<td class="{}">{:.0f}%<div class="small">{} of {}</div></td>', _grade(percent_reachable(f)), percent_reachable(f),
                f["executed"], reachable(f)))
        rows.append(html("<tr>{}</tr>", join(cells)))
    glance = html('<table class="coverage"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, join(rows))
    per_release = []
    for r in releases:
        rrows = []
        for p in sorted(coverage[r]):
            f = coverage[r][p]
            un = f.get("unreached") or {}
            why = join(html('<div><b>{}</b>: {} line(s) <span class="ranges">{}</span></div>', UNREACHED.get(k, k),
                            _lines(un[k]), _ranges(un[k])) for k in [*UNREACHED, *sorted(set(un) - set(UNREACHED))]
                       if un.get(k))
            rrows.append([mono(p), html('<span class="covrun"><span class="cov"><span style="width:{:.1f}%"></span>'
                                        '</span> {:.1f}%</span>',
                                        percent_reachable(f), percent_reachable(f)),
                          f"{f['executed']} / {reachable(f)}" + (
                              f" ({f['statements']} in all)" if f.get("unreachable_here") else ""),
                          html('<span class="ranges">{}</span>', _ranges(f.get("missing") or [])) or "none",
                          why])
        per_release.append(html("<details><summary>vllm {}: {} file(s), every statement never run and why</summary>"
                                "{}</details>", r, len(coverage[r]), _table(
                                    ["file", "statements run", "run / reachable here", "never run (lines)",
                                     "why not reached"], rrows)))
    total = sum(reachable(f) for r in releases for f in coverage[r].values())
    run = sum(f["executed"] for r in releases for f in coverage[r].values())
    low = min(((percent_reachable(coverage[r][p]), p, r) for r in releases for p in coverage[r]), default=None)
    summary = (f"{100.0 * run / total if total else 100.0:.0f}% of {total:,} statements reachable here over {len(files)} file(s) ×"
               f" {len(releases)} release(s)" + (f"; lowest {low[0]:.0f}% {low[1].rsplit('/', 1)[-1]} on {low[2]}"
                                                 if low else ""))
    return Section("coverage", "Coverage of the connector's code", html(
        '<p class="small">Statements of each file run by the campaign\'s traffic, of those reachable on this host'
        ' (less the code declared GPU-only or needing a library or service the host lacks), per release'
        ' (green ≥ {:.0f}%, amber ≥ {:.0f}%); below, per release, the lines never run and why.</p>{}{}',
        COVER_GOOD, COVER_FAIR,
        glance, join(per_release)), summary=summary, failed=bool(low and low[0] < COVER_GOOD))


# --------------------------------------------------------------------------- guided rounds

MUTATION_WORDS = {"chosen": "named on the command line", "move": "axes moved", "reseed": "traffic re-seeded",
                  "swap": "axes put on another layout", "fresh": "a uniform draw (the corpus was spent)"}


def guided_section(guided: list | None, columns: list) -> Section | None:
    """A guided campaign's rounds (``kvbound/trace/guide.py`` ``Planner.record``): per round each
    run with where the planner got it (its mutation, parent and the axes moved) and the statements
    it reached first, per release; the corpus and the statements reached after the round. None for
    a campaign that was not guided."""
    if guided is None:
        return None
    cols = [c for c in columns if any(c in r.get("executed", {}) for r in guided)] + sorted(
        {c for r in guided for c in r.get("executed", {})} - set(columns))
    top = max((r["executed"].get(c, 0) for r in guided for c in cols), default=0) or 1
    rows = []
    for r in guided:
        runs = join(html('<div><span class="mono">{}</span> <span class="small">{}{}{}</span></div>', e["point"],
                         MUTATION_WORDS.get(e["mutation"], e["mutation"]),
                         html(" of <span class=\"mono\">{}</span>", e["parent"]) if e.get("parent") else "",
                         html(" ({})", ", ".join(e["moved"])) if e.get("moved") else "")
                    for e in r["runs"]) or Markup('<span class="small">no run could be drawn</span>')
        new = join(html("<div>{}</div>", " · ".join(f"+{e['new_lines'].get(c, 0)}" for c in cols))
                   for e in r["runs"])
        reached = join(html('<div><span class="covrun"><span class="cov guided"><span style="width:{:.1f}%"></span>'
                            '</span> {:,}</span></div>', 100.0 * r["executed"].get(c, 0) / top,
                            r["executed"].get(c, 0)) for c in cols)
        rows.append([str(r["round"]), runs, new, str(r["corpus"]), reached])
    last = guided[-1]["executed"] if guided else {}
    summary = (f"{len(guided)} round(s), {sum(len(r['runs']) for r in guided)} run(s); reached "
               + ", ".join(f"{last.get(c, 0):,} on {c}" for c in cols))
    return Section("guided", "Coverage-guided rounds", html(
        '<p class="small">Round 0 runs the points named; each later round draws its runs from the corpus (the runs'
        ' that reached statements no earlier run had), weighted by those new statements. New statements and'
        ' statements reached are per release ({}).</p>{}', ", ".join(f"vllm {c}" for c in cols),
        _table(["round", "runs: point, and where the planner got it", "new statements per run", "corpus",
                "statements reached after the round"], rows, cls="guided")), summary=summary)


# --------------------------------------------------------------------------- the page


def review_section(base: str, patched: str, review: dict, doc: CampaignRecord, cov: dict | None) -> Section:
    """``kvbound review``'s verdict, above the campaign page of both trees (``doc``): the
    finding keys gone, new and kept, linked to their drawings, and the coverage change."""
    numbers = _numbers(doc)
    rows = [[html("<b>{}</b>", what), str(len(review[what])),
             join(html('<div><a href="#f{}">#{}</a> <span class="mono">{}</span></div>', numbers[k], numbers[k], k)
                  for k in review[what])] for what in ("gone", "new", "kept")]
    body = html('<p class="small">The same points, traffic and seeds on vllm {} and on {} (the patch applied to a'
                ' copy of it); findings compared by key. A trace file of {} replays on the patched tree only:'
                ' <code>kvbound review --keep-tree DIR</code> keeps it, then <code>kvbound trace --vllm-src DIR'
                ' --replay FILE</code>.</p>{}', base, patched, patched, _table(["", "findings", "keys"], rows))
    if cov is not None:
        side = lambda x: "absent" if x is None else f"{x[0]} / {x[1]}"  # noqa: E731
        body += _table(["file", f"vllm {base}: run / statements", f"{patched}: run / statements"],
                       [[mono("all files"), side(cov["total"]["base"]), side(cov["total"]["patched"])]]
                       + [[mono(rel), side(f["base"]), side(f["patched"])] for rel, f in cov["files"].items()])
    summary = f"{len(review['gone'])} gone, {len(review['new'])} new, {len(review['kept'])} kept"
    return Section("review", "The patch: findings gone, new and kept", body, summary=summary,
                   failed=bool(review["new"]))


def html_page(doc: CampaignRecord, findings_dir: str, lead=()) -> str:
    """The page for ``doc``; replay commands name the trace files under ``findings_dir``
    (the campaign's ``--out``, as given); ``lead``: sections above the matrix (a review's)."""
    from kvbound.svg import content_legend_svg, legend_svg

    numbers = _numbers(doc)
    figures = [finding_figure(f, numbers[f.key], len(doc.columns), findings_dir) for f in doc.findings]
    n_safety = sum(f.safety for f in doc.findings)
    sections = [*lead, matrix_section(doc, numbers), classes_section(doc, numbers),
                Section("findings", "Distinct findings, drawn", join(figures) if figures else Markup("<p>none</p>"),
                        summary=f"{len(doc.findings)} distinct: {n_safety} safety,"
                                f" {len(doc.findings) - n_safety} efficiency", failed=bool(n_safety)),
                coverage_section(doc.coverage, doc.columns)]
    guided = guided_section(doc.guided, doc.columns)
    if guided is not None:
        sections.append(guided)
    legend = html('<div>slot contents (data and store findings): {}</div>', Markup(content_legend_svg()))
    if any((f.example or {}).get("case") for f in doc.findings):
        legend += html("<div>a load's block tables (plan findings): {}</div>", Markup(legend_svg()))
    return render_page(sections, title="kvbound campaign", about=ABOUT, legend=legend, css=CSS)
