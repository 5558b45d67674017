"""One self-contained HTML page for a reviewer: obligations, witnesses drawn, diff, conformance.

Inputs are the JSON files ``kvbound prove``, ``kvbound diff`` and ``kvbound conform``
write. A file that is missing a field or is not JSON becomes a red box in its own
section naming the file and the field; the rest of the page still renders. The page
uses no scripts, fonts or images from the network: CSS and SVG are inline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from kvbound import __version__
from kvbound.draw import case_header, describe_plan, draw_case
from kvbound.errors import CaseError, ReportInputError
from kvbound.spec import Variant, case_from_dict, plan_load
from kvbound.spec.verdicts import CONFORM_VERDICTS, Verdict
from kvbound.svg import case_svgs, legend_svg




@dataclass
class Section:
    """A titled piece of the page; ``error`` replaces the body when its input was unreadable."""

    anchor: str
    title: str
    body: str = ""
    source: str = ""
    error: str = ""
    summary: str = ""  # one line for the overview at the top
    failed: bool = False
    extra: list = field(default_factory=list)


# --------------------------------------------------------------------------- input


def read_json(path) -> object:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ReportInputError(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportInputError(f"{p}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


def need(obj, key: str, where: str, types=None):
    """``obj[key]``, or a ReportInputError naming where the field was expected."""
    if not isinstance(obj, dict):
        raise ReportInputError(f"{where}: expected an object, found {type(obj).__name__}")
    if key not in obj:
        raise ReportInputError(f"{where}: missing field '{key}'")
    v = obj[key]
    if types is not None and not isinstance(v, types):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise ReportInputError(f"{where}.{key}: expected {names}, found {type(v).__name__}")
    return v


def case_of(d, where: str):
    """A witness / disagreement case dict as a Case; a malformed one names its field."""
    try:
        return case_from_dict(d)
    except CaseError as e:
        raise ReportInputError(f"{where}: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ReportInputError(f"{where}: not a case: {e}") from None


# --------------------------------------------------------------------------- drawing


def drawn_case(case, plans: dict | None = None, caption: str = "") -> str:
    """A case as SVG tables, the header line, and the terminal drawing folded away."""
    plans = plans or {v: plan_load(case, v) for v in Variant}
    outcome = "".join(
        f'<li><span class="mono">{escape(v.value)}</span> '
        f'<span class="{"bad" if not p.ok else "ok"}">{escape(describe_plan(p))}</span></li>'
        for v, p in plans.items()
    )
    return (
        '<figure class="case">'
        + (f"<figcaption>{caption}</figcaption>" if caption else "")
        + f'<div class="mono small">{escape(case_header(case))}</div>'
        + "".join(f'<div class="svgwrap">{s}</div>' for s in case_svgs(case, plans=plans))
        + f'<ul class="outcomes">{outcome}</ul>'
        + "<details><summary>as text (kvbound explain)</summary>"
        + f'<pre>{escape(draw_case(case, plans=plans, legend=False))}</pre></details>'
        + "</figure>"
    )


def _table(headers, rows, cls="") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _badge(text: str, good: bool | None) -> str:
    cls = "neutral" if good is None else ("good" if good else "badb")
    return f'<span class="badge {cls}">{escape(str(text))}</span>'


# --------------------------------------------------------------------------- sections


def cases_section(paths) -> Section:
    from kvbound.spec import load_case_paths

    sec = Section("cases", "Cases", source=", ".join(map(str, paths)))
    try:
        cases = load_case_paths([str(p) for p in paths])
    except CaseError as e:
        sec.error = str(e)
        return sec
    sec.body = "".join(drawn_case(c, caption=f"<b>{escape(c.name)}</b>") for c in cases)
    sec.summary = f"{len(cases)} case(s) drawn with every variant"
    return sec


# --------------------------------------------------------------------------- page

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1320px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:26px;margin:8px 0 4px} h2{font-size:20px;margin:0 0 10px;border-bottom:2px solid #d0d7de;padding-bottom:6px}
h3{font-size:16px;margin:18px 0 6px}
section{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:16px 20px;margin:18px 0}
.mono,pre,code{font-family:ui-monospace,Menlo,Consolas,monospace} .small{font-size:12px;color:#57606a}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:10px;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
th,td{border:1px solid #d0d7de;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f6} tr:nth-child(even) td{background:#fafbfc}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap}
.good{background:#dafbe1;color:#116329} .badb{background:#ffebe9;color:#a40e26} .neutral{background:#eaeef2;color:#424a53}
.ok{color:#116329} .bad{color:#a40e26;font-weight:600}
.error{background:#ffebe9;border:1px solid #ff8182;color:#82071e;padding:10px 12px;border-radius:6px;font-family:ui-monospace,monospace;font-size:13px}
.overview{display:flex;flex-wrap:wrap;gap:12px} .card{flex:1 1 220px;background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:10px 14px}
.card b{display:block;font-size:13px;color:#57606a;margin-bottom:4px} .card a{color:inherit;text-decoration:none}
figure.case{margin:12px 0 22px;padding:10px 12px;border:1px solid #e1e4e8;border-radius:6px;background:#fcfcfd}
figcaption{font-size:14px;margin-bottom:6px} .svgwrap{overflow-x:auto;margin:8px 0}
ul.outcomes{font-size:13px;margin:6px 0;padding-left:18px} details summary{cursor:pointer;font-size:12px;color:#57606a}
.math{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;color:#0a3069}
.legendbox{margin:6px 0 2px}
"""


def render_page(sections: list, title: str = "kvbound report") -> str:
    cards = "".join(
        f'<div class="card"><a href="#{s.anchor}"><b>{escape(s.title)}</b>'
        + ('<span class="bad">unreadable input</span>' if s.error else (
            f'<span class="{"bad" if s.failed else ""}">{escape(s.summary)}</span>'))
        + "</a></div>"
        for s in sections
    )
    body = []
    for s in sections:
        src = f'<div class="small">from <span class="mono">{escape(s.source)}</span></div>' if s.source else ""
        inner = f'<div class="error">{escape(s.error)}</div>' if s.error else s.body
        body.append(f'<section id="{s.anchor}"><h2>{escape(s.title)}</h2>{src}{inner}</section>')
    if not sections:
        body.append("<section><h2>Nothing to report</h2><p>Give --prove, --diff, --conform or --case.</p></section>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{escape(title)}</h1>"
        f'<div class="small">kvbound {escape(__version__)} · vLLM KV-offload load boundary '
        "(<span class=\"mono\">update_state_after_alloc</span>)</div>"
        f'<div class="legendbox">{legend_svg()}</div>'
        f'<div class="overview">{cards}</div>'
        + "".join(body)
        + "</main></body></html>\n"
    )


def _section(builder, path, anchor: str, title: str) -> Section:
    """Read ``path`` and build its section; any shape error becomes the section's red box."""
    try:
        sec = builder(read_json(path))
    except ReportInputError as e:
        msg = str(e)
        if not msg.startswith(str(path)):
            msg = f"{path}: {msg}"
        sec = Section(anchor, title, error=msg)
    sec.anchor, sec.title, sec.source = anchor, title, str(path)
    return sec


def build_report(prove=None, diff=None, conform=None, cases=(), title="kvbound report"):
    """The page and its sections (the caller reports unreadable ones)."""
    sections = []
    if prove:
        sections.append(_section(prove_section, prove, "obligations", "Proof obligations"))
    if diff:
        sections.append(_section(diff_section, diff, "diff", "Differential check: impl vs spec"))
    if conform:
        sections.append(_section(conform_section, conform, "conform", "Conformance against real vLLM"))
    if cases:
        sections.append(cases_section(cases))
    return render_page(sections, title), sections


def _obligation_fields(oid: str) -> dict:
    """math and premise from the obligation object itself when the JSON leaves them out."""
    try:
        from kvbound.proofs.obligations import OBLIGATIONS
    except ImportError:
        return {}
    o = next((o for o in OBLIGATIONS if o.id == oid), None)
    return {} if o is None else {"math": o.math, "premise": o.premise, "statement": o.statement}


def _mutation(data) -> tuple[str, bool | None, list]:
    """(summary, all killed?, rows) from whichever of mutants / mutation_score the JSON has."""
    muts = data.get("mutants")
    rows = []
    if isinstance(muts, dict):
        for name, v in muts.items():
            killer = v.get("killed_by") if isinstance(v, dict) else v
            rows.append((name, killer))
    elif isinstance(muts, list):
        for i, m in enumerate(muts):
            rows.append((need(m, "name", f"prove JSON.mutants[{i}]"), m.get("killed_by")))
    score = data.get("mutation_score")
    if rows:
        killed = sum(k is not None for _, k in rows)
        return f"mutation score {killed}/{len(rows)}", killed == len(rows), rows
    if isinstance(score, dict) and "killed" in score and "total" in score:
        return f"mutation score {score['killed']}/{score['total']}", score["killed"] == score["total"], rows
    if isinstance(score, (list, tuple)) and len(score) == 2:
        return f"mutation score {score[0]}/{score[1]}", score[0] == score[1], rows
    if score is not None:
        return f"mutation score {score}", None, rows
    return "mutants not run", None, rows


def prove_section(data) -> Section:
    where = "prove JSON"
    if isinstance(data, list):
        data = {"obligations": data}
    obs = need(data, "obligations", where, list)
    sec = Section("obligations", "")
    rows, witnesses, n_met = [], [], 0
    for i, o in enumerate(obs):
        at = f"{where}.obligations[{i}]"
        oid = need(o, "id", at, str)
        expected = need(o, "expected", at, str)
        verdict = need(o, "verdict", at, str)
        fields = {**_obligation_fields(oid), **{k: o[k] for k in ("statement", "math", "premise") if o.get(k)}}
        met = o.get("met", verdict == expected)
        n_met += bool(met)
        secs = o.get("seconds")
        witness = o.get("witness")
        wlink = ""
        if witness is not None:
            case = case_of(witness, f"{at}.witness")
            witnesses.append((oid, o, case))
            wlink = f'<a href="#w-{escape(oid)}">drawn below</a>'
        rows.append([
            f'<b class="mono">{escape(oid)}</b>',
            escape(fields.get("statement", "")) + (f'<div class="math">{escape(fields["math"])}</div>'
                                                  if fields.get("math") else ""),
            escape(fields.get("premise", "")),
            _badge(verdict, bool(met)) + ("" if met else f'<div class="bad">expected {escape(expected)}</div>'),
            escape(expected),
            escape(f"{secs:.2f} s" if isinstance(secs, (int, float)) else str(secs or "")),
            escape(str(o.get("bound") or "unbounded")),
            wlink + "".join(f'<div class="bad">{escape(str(o[k]))}</div>' for k in ("replay", "replay_failure")
                            if o.get(k))
            + (f'<div class="small">{escape(str(o["detail"]))}</div>' if o.get("detail") else ""),
        ])
    mut_summary, mut_ok, mut_rows = _mutation(data)
    unknown = sum(o.get("verdict") == "unknown" for o in obs)
    sec.failed = n_met != len(obs) or mut_ok is False
    sec.summary = (f"{n_met}/{len(obs)} obligations met their expected verdict"
                   + (f", {unknown} unknown (never counted as proved)" if unknown else "") + f"; {mut_summary}")
    out = [f"<p>{_badge(sec.summary, not sec.failed)}</p>",
           _table(["obligation", "statement (words, mathematics)", "premise it rests on", "verdict", "expected",
                   "time", "bound", "witness"], rows, "obligations")]
    if mut_rows:
        out.append("<h3>Mutants of the scan and plan: which proved obligation kills each</h3>")
        out.append(_table(["mutant", "killed by"], [
            [f'<span class="mono">{escape(n)}</span>',
             _badge(k, True) if k is not None else _badge("SURVIVED", False)] for n, k in mut_rows]))
    if witnesses:
        out.append("<h3>Witnesses (refutations), drawn and replayed through the spec</h3>")
        for oid, o, case in witnesses:
            out.append(f'<div id="w-{escape(oid)}"></div>' + drawn_case(
                case, caption=f'<b class="mono">{escape(oid)}</b> — {escape(_obligation_fields(oid).get("statement") or o.get("statement", ""))}'))
    sec.body = "".join(out)
    return sec


def diff_section(data) -> Section:
    """Read generically: the scalar figures as a table, any disagreement carrying a case drawn."""
    where = "diff JSON"
    if not isinstance(data, dict):
        raise ReportInputError(f"{where}: expected an object, found {type(data).__name__}")
    dis = None
    for key in ("disagreements", "mismatches", "failures"):
        if key in data:
            dis = need(data, key, where, list)
            break
    sec = Section("diff", "")
    scalars = [(k, v) for k, v in data.items() if isinstance(v, (int, float, str, bool)) or v is None]
    sec.failed = bool(dis)
    figures = ", ".join(f"{k}={v}" for k, v in scalars[:4])
    sec.summary = (f"{len(dis)} disagreement(s)" if dis is not None else "no disagreement list") + (
        f"; {figures}" if figures else "")
    out = [f"<p>{_badge(sec.summary, not sec.failed if dis is not None else None)}</p>"]
    if scalars:
        out.append(_table(["figure", "value"], [[f'<span class="mono">{escape(k)}</span>', escape(str(v))]
                                               for k, v in scalars]))
    for k, v in data.items():
        if isinstance(v, dict) and all(isinstance(x, (int, float, str, bool)) for x in v.values()):
            out.append(f"<h3>{escape(k)}</h3>" + _table(["", "value"], [
                [f'<span class="mono">{escape(str(a))}</span>', escape(str(b))] for a, b in v.items()]))
    for i, d in enumerate((dis or [])[:MAX_DRAWN]):
        at = f"{where}.disagreements[{i}]"
        if not isinstance(d, dict) or "case" not in d:
            out.append(f"<pre>{escape(json.dumps(d, indent=1)[:2000])}</pre>")
            continue
        case = case_of(d["case"], f"{at}.case")
        rest = {k: v for k, v in d.items() if k != "case"}
        out.append(drawn_case(case, caption=f"<b>disagreement {i + 1}</b>: {escape(case.name)}")
                   + f"<pre>{escape(json.dumps(rest, indent=1)[:4000])}</pre>")
    sec.body = "".join(out)
    return sec


def _short(path: str) -> str:
    i = (path or "").rfind("vllm/")
    return path[i:] if i >= 0 else (path or "?")


def _real_label(rec: dict) -> str:
    """The real side in a few words: ok / assert name at file:line / fault."""
    if rec.get("verdict") == "fault":
        return f"fault: {(rec.get('real') or {}).get('outcome', '?')}"
    real = rec.get("real") or {}
    if real.get("outcome") == "assertion_error":
        site = rec.get("real_assert_site") or {}
        where = f" at {_short(site.get('file'))}:{site.get('line')}" if site else ""
        return f"AssertionError ({real.get('assertion')}){where}"
    if real.get("outcome") == "ok":
        return f"ok: dst_block_ids={real.get('dst_block_ids')}"
    return str(real.get("outcome"))


def _spec_label(rec: dict) -> str:
    spec = rec.get("spec") or {}
    if spec.get("outcome") == "assertion_error":
        return f"AssertionError ({spec.get('assertion')})"
    return f"ok: dst_block_ids={spec.get('dst_block_ids')}"


# How the summary names each conform verdict, in the order `kvbound conform` prints them.
CONFORM_WORDS = {Verdict.AGREE: "agree", Verdict.DISAGREE: "disagree", Verdict.FAULT: "fault",
                 Verdict.UNDRIVEN: "not driven", Verdict.UNSUPPORTED: "refused by the release's config"}


def conform_section(data) -> Section:
    where = "conform JSON"
    releases = need(data, "releases", where, dict)
    records = need(data, "cases", where, list)
    matrix = need(data, "matrix", where, dict)
    not_prepared = data.get("not_prepared") or []
    blocking = need(data, "blocking", where, int)
    rels = list(releases)
    for i, r in enumerate(records):
        for key in ("name", "release", "variant", "verdict", "row"):
            need(r, key, f"{where}.cases[{i}]")
        if r["verdict"] not in CONFORM_VERDICTS:
            raise ReportInputError(f"{where}.cases[{i}].verdict: {r['verdict']!r} is not one of "
                                   f"{', '.join(CONFORM_VERDICTS)}")
    sec = Section("conform", "")
    counts = {v: sum(r["verdict"] == v for r in records) for v in CONFORM_VERDICTS}
    sec.failed = bool(blocking or not_prepared)
    sec.summary = (
        ", ".join(f"{counts[v]} {word}" for v, word in CONFORM_WORDS.items())
        + f" over {len(rels)} release(s); {blocking} blocking"
        + (f"; NOT PREPARED: {', '.join(not_prepared)}" if not_prepared else "")
    )
    out = [f"<p>{_badge(sec.summary, not sec.failed)}</p>"]
    if not_prepared:
        out.append(f'<div class="error">could not prepare or start: {escape(", ".join(not_prepared))}</div>')
    out.append("<h3>Releases (real vLLM scheduler code, offload tier faked)</h3>")
    out.append(_table(
        ["vLLM", "spec variant", "python", "seconds", "scheduler file"],
        [[escape(v), f'<span class="mono">{escape(_variant_of(v))}</span>',
          escape(str(h.get("python", ""))), escape(str(h.get("seconds", ""))),
          f'<span class="mono small">{escape(_short(h.get("scheduler_file", "")))}</span>']
         for v, h in releases.items()]))
    out.append("<h3>Version matrix: agree / total per case family, and the real outcomes</h3>")
    try:
        from kvbound.conform.compare import ROW_ORDER
    except ImportError:
        ROW_ORDER = ()
    rows = [r for r in ROW_ORDER if r in matrix] + sorted(r for r in matrix if r not in ROW_ORDER)
    mrows = []
    for row in rows:
        cells = [f'<span class="mono">{escape(row)}</span>']
        for rel in rels:
            c = matrix[row].get(rel) if isinstance(matrix[row], dict) else None
            if not c:
                cells.append("–")
                continue
            bad = c.get("disagree", 0) + c.get("fault", 0)
            extra = "".join(f", {c[k]} {k}" for k in CONFORM_VERDICTS if k != Verdict.AGREE and c.get(k))
            outs = " ".join(f"{k}:{v}" for k, v in sorted((c.get("outcomes") or {}).items()))
            cells.append(_badge(f"{c.get('agree', 0)}/{c.get('total', 0)} agree{extra}",
                                not bad if row != "adversarial" else (None if bad else True))
                         + f'<div class="small mono">{escape(outs)}</div>')
        mrows.append(cells)
    out.append(_table(["family"] + [f"vllm {r} ({_variant_of(r)})" for r in rels], mrows))
    if data.get("witness_note"):
        out.append(f'<p class="small">note: {escape(str(data["witness_note"]))}</p>')
    named = [r for r in records if r["row"] in ("pr_case", "example", "witness")]
    if named:
        out.append("<h3>Case files and proof witnesses: real outcome vs the spec, per release</h3>")
        by_name: dict = {}
        for r in named:
            by_name.setdefault(r["name"], {})[r["release"]] = r
        trows = []
        for name, per in by_name.items():
            cells = [f'<span class="mono">{escape(name)}</span>']
            for rel in rels:
                r = per.get(rel)
                if r is None:
                    cells.append("–")
                    continue
                mark = _badge(r["verdict"], Verdict(r["verdict"]).holds)
                cells.append(f"{mark}<div>real: {escape(_real_label(r))}</div>"
                             f'<div class="small">spec {escape(r["variant"])}: {escape(_spec_label(r))}</div>')
            trows.append(cells)
        out.append(_table(["case"] + [f"vllm {r}" for r in rels], trows))
        first = next((r for r in named if r["row"] == "pr_case"), None)
        if first is not None and "case" in first:
            case = case_of(first["case"], f"{where}.cases[{records.index(first)}].case")
            vs = [Variant(r["variant"]) for r in named if r["name"] == first["name"]]
            out.append(drawn_case(case, {v: plan_load(case, v) for v in dict.fromkeys(vs)},
                                  caption=f"<b>{escape(case.name)}</b> drawn with the variants of the releases above"))
    bad = [r for r in records if r["verdict"] in ("disagree", "fault")]
    if bad:
        out.append(f"<h3>{len(bad)} disagreement(s) / fault(s)</h3>")
        for i, r in enumerate(bad[:MAX_DRAWN]):
            head = (f"<b>{escape(r['verdict'])}</b>: <span class=\"mono\">{escape(r['name'])}</span> on vllm "
                    f"{escape(r['release'])} ({escape(r['variant'])}), family {escape(r['row'])}")
            if r["verdict"] == "fault" or "case" not in r:
                out.append(f'<figure class="case"><figcaption>{head}</figcaption>'
                           f"<pre>{escape(str(r.get('fault', '')))}</pre></figure>")
                continue
            case = case_of(r["case"], f"{where}.cases[{records.index(r)}].case")
            v = Variant(r["variant"])
            detail = (f"<div>differs in: <b>{escape(', '.join(r.get('diff') or []))}</b></div>"
                      f'<pre>real vllm {escape(r["release"])}: {escape(json.dumps(r.get("real")))}\n'
                      f'spec {escape(r["variant"])}: {escape(json.dumps(r.get("spec")))}</pre>')
            out.append(drawn_case(case, {v: plan_load(case, v)}, caption=head) + detail)
        if len(bad) > MAX_DRAWN:
            out.append(f"<p>{len(bad) - MAX_DRAWN} more: see {escape('the JSON file')}</p>")
    sec.body = "".join(out)
    return sec


def _variant_of(version: str) -> str:
    from kvbound.spec import variant_for_version

    try:
        return variant_for_version(version).value
    except Exception:  # an unknown release string in the file: show it, do not fail the page
        return "?"


MAX_DRAWN = 12
