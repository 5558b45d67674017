"""One self-contained HTML page for a reviewer: obligations, witnesses drawn, diff, conformance.

Inputs are the JSON files ``kvbound prove``, ``kvbound diff`` and ``kvbound conform``
write, read back through their typed records (``kvbound.records``). A file that is
missing a field or is not JSON becomes a red box in its own section naming the file
and the field; the rest of the page still renders. The page uses no scripts, fonts or
images from the network: CSS and SVG are inline.

Escaping is a rule, not a habit: every fragment is a ``markupsafe.Markup`` built with
``Markup(template).format(...)``, which escapes each argument that is not itself
``Markup``. Text from a JSON file (a case name, a caption, a cell) can only reach the
page escaped; the SVG from ``kvbound.svg`` (which escapes its own text) is the one
markup taken as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup

from kvbound import __version__
from kvbound.draw import case_header, describe_plan, draw_case, draw_witness
from kvbound.errors import CaseError, ReportInputError
from kvbound.records import ConformRecord, DiffRecord, ProveRecord
from kvbound.spec import Case, Variant, case_from_dict, plan_load
from kvbound.spec.strategies import ADVERSARIAL_FAMILIES
from kvbound.spec.verdicts import CONFORM_VERDICTS, Verdict
from kvbound.svg import case_svgs, legend_svg

MAX_DRAWN = 12  # disagreements drawn per section; the rest are counted
MAX_JSON_CHARS = 4000  # a record shown as JSON beside its drawing is cut here


@dataclass
class Section:
    """A titled piece of the page; ``error`` replaces the body when its input was unreadable."""

    anchor: str
    title: str
    body: Markup = Markup()
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


def parsed(parse, d, where: str, what: str):
    """``parse(d)`` (a case or witness reader); a malformed input names its field, one line."""
    try:
        return parse(d)
    except CaseError as e:
        raise ReportInputError(f"{where}: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ReportInputError(f"{where}: not {what}: {e}") from None


def case_of(d, where: str):
    """A witness / disagreement case dict as a Case."""
    return parsed(case_from_dict, d, where, "a case")


# --------------------------------------------------------------------------- markup


def html(template: str, *args, **kwargs) -> Markup:
    """``template`` (trusted markup) with each argument escaped unless it is Markup."""
    return Markup(template).format(*args, **kwargs)


def join(parts) -> Markup:
    return Markup("").join(parts)


def mono(text) -> Markup:
    return html('<span class="mono">{}</span>', text)


def drawn_case(case, plans: dict | None = None, caption: Markup | str = "") -> Markup:
    """A case as SVG tables, the header line, and the terminal drawing folded away."""
    plans = plans or {v: plan_load(case, v) for v in Variant}
    outcome = join(html('<li>{} <span class="{}">{}</span></li>', mono(v.value), "ok" if p.ok else "bad",
                        describe_plan(p)) for v, p in plans.items())
    return html(
        '<figure class="case">{}<div class="mono small">{}</div>{}<ul class="outcomes">{}</ul>'
        "<details><summary>as text (kvbound explain)</summary><pre>{}</pre></details></figure>",
        html("<figcaption>{}</figcaption>", caption) if caption else "",
        case_header(case),
        join(html('<div class="svgwrap">{}</div>', Markup(s)) for s in case_svgs(case, plans=plans)),
        outcome,
        draw_case(case, plans=plans, legend=False),
    )


def _table(headers, rows, cls="") -> Markup:
    head = join(html("<th>{}</th>", h) for h in headers)
    body = join(html("<tr>{}</tr>", join(html("<td>{}</td>", c) for c in r)) for r in rows)
    return html('<table class="{}"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', cls, head, body)


def _badge(text, good: bool | None) -> Markup:
    cls = "neutral" if good is None else ("good" if good else "badb")
    return html('<span class="badge {}">{}</span>', cls, str(text))


def _json_pre(obj) -> Markup:
    return html("<pre>{}</pre>", json.dumps(obj, indent=1)[:MAX_JSON_CHARS])


# --------------------------------------------------------------------------- sections


def cases_section(paths) -> Section:
    from kvbound.spec import load_case_paths

    sec = Section("cases", "Cases", source=", ".join(map(str, paths)))
    try:
        cases = load_case_paths([str(p) for p in paths])
    except CaseError as e:
        sec.error = str(e)
        return sec
    sec.body = join(drawn_case(c, caption=html("<b>{}</b>", c.name)) for c in cases)
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


def render_page(sections: list, title: str = "kvbound report", about: Markup | None = None,
                legend: Markup | None = None, css: str = "") -> str:
    """The page: title, a line saying what the page judges (``about``; default: the load
    boundary the prove / diff / conform report is about), the legend (default: the block
    glyphs), one card per section, the sections. ``css`` adds rules of the caller's own."""
    cards = join(
        html('<div class="card"><a href="#{}"><b>{}</b>{}</a></div>', s.anchor, s.title,
             Markup('<span class="bad">unreadable input</span>') if s.error
             else html('<span class="{}">{}</span>', "bad" if s.failed else "", s.summary))
        for s in sections
    )
    body = [
        html('<section id="{}"><h2>{}</h2>{}{}</section>', s.anchor, s.title,
             html('<div class="small">from {}</div>', mono(s.source)) if s.source else "",
             html('<div class="error">{}</div>', s.error) if s.error else s.body)
        for s in sections
    ]
    if not sections:
        body.append(Markup("<section><h2>Nothing to report</h2><p>Give --prove, --diff, --conform or --case.</p></section>"))
    return str(html(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{css}</style>'
        "</head><body><main><h1>{title}</h1>"
        '<div class="small">kvbound {version} · {about}</div>'
        '<div class="legendbox">{legend}</div><div class="overview">{cards}</div>{body}</main></body></html>\n',
        title=title, css=Markup(CSS + css), version=__version__,
        about=html("vLLM KV-offload load boundary ({})", mono("update_state_after_alloc")) if about is None else about,
        legend=Markup(legend_svg()) if legend is None else legend, cards=cards, body=join(body),
    ))


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


def _mutation(rec: ProveRecord) -> tuple[str, bool | None, list]:
    """(summary, all killed?, rows (mutant, killer or None))."""
    if rec.mutants is None:
        return "mutants not run", None, []
    rows = list(rec.mutants.items())
    killed = sum(k is not None for _, k in rows)
    return f"mutation score {killed}/{len(rows)}", killed == len(rows), rows


def prove_section(data) -> Section:
    from kvbound.proofs.witnesses import witness_from_dict

    rec = ProveRecord.from_json(data)
    where = "prove JSON"
    sec = Section("obligations", "")
    rows, witnesses = [], []
    for i, o in enumerate(rec.obligations):
        wlink = Markup()
        if o.witness is not None:
            kind = o.witness.get("witness")  # none: a load case; else allocate_slots, lookup, store
            w = parsed(witness_from_dict, o.witness, f"{where}.obligations[{i}].witness",
                       f"a {kind} witness" if kind else "a case")
            witnesses.append((o, w))
            wlink = html('<a href="#w-{}">drawn below</a>', o.id)
        problems = [x for x in (o.replay_failure, o.vacuity if o.verdict == Verdict.PROVED and not o.met else None) if x]
        rows.append([
            html('<b class="mono">{}</b>', o.id),
            html('{}<div class="math">{}</div>', o.statement, o.math),
            o.premise,
            html("{}{}", _badge(o.verdict, o.met),
                 "" if o.met else html('<div class="bad">expected {}</div>', o.expected)),
            o.expected,
            f"{o.seconds:.2f} s",
            (o.bound or {}).get("text", "unbounded"),
            html("{}{}", wlink, join(html('<div class="bad">{}</div>', p) for p in problems)),
        ])
    n_met = sum(o.met for o in rec.obligations)
    mut_summary, mut_ok, mut_rows = _mutation(rec)
    unknown = sum(o.verdict == Verdict.UNKNOWN for o in rec.obligations)
    sec.failed = n_met != len(rec.obligations) or mut_ok is False
    sec.summary = (f"{n_met}/{len(rec.obligations)} obligations met their expected verdict"
                   + (f", {unknown} unknown (never counted as proved)" if unknown else "") + f"; {mut_summary}")
    out = [html("<p>{}</p>", _badge(sec.summary, not sec.failed)),
           _table(["obligation", "statement (words, mathematics)", "premise it rests on", "verdict", "expected",
                   "time", "bound", "witness"], rows, "obligations")]
    if mut_rows:
        out.append(Markup("<h3>Mutants of the scan and plan: which proved obligation kills each</h3>"))
        out.append(_table(["mutant", "killed by"], [
            [mono(n), _badge(k, True) if k is not None else _badge("SURVIVED", False)] for n, k in mut_rows]))
    if witnesses:
        out.append(Markup("<h3>Witnesses (refutations), drawn and replayed through the spec</h3>"))
        for o, case in witnesses:
            caption = html('<b class="mono">{}</b> — {}', o.id, o.statement)
            if not isinstance(case, Case):  # an allocate_slots or lookup witness: drawn as text
                out.append(html('<div id="w-{}"></div><figure class="case"><figcaption>{}</figcaption><pre>{}</pre>'
                                '</figure>', o.id, caption, draw_witness(case)))
                continue
            out.append(html('<div id="w-{}"></div>{}', o.id, drawn_case(case, caption=caption)))
    sec.body = join(out)
    return sec


def diff_section(data) -> Section:
    rec = DiffRecord.from_json(data)
    where = "diff JSON"
    sec = Section("diff", "")
    survivors = (rec.mutants or {}).get("survivors") or []
    sec.failed = bool(rec.disagreements) or rec.result != Verdict.AGREE or bool(survivors)
    sec.summary = (f"{len(rec.disagreements)} disagreement(s), {len(rec.inconclusive)} inconclusive over "
                   f"{rec.cases} cases (seed {rec.seed}, {rec.device}, against {', '.join(rec.against)}): {rec.result}")
    if rec.mutants is not None:
        sec.summary += (f"; impl mutation score {rec.mutants.get('killed')}/{rec.mutants.get('total')}"
                        + (f", SURVIVED: {', '.join(survivors)}" if survivors else ""))
    figures = [("cases", rec.cases), ("seed", rec.seed), ("device", rec.device), ("against", ", ".join(rec.against)),
               ("spec checks per minute", rec.spec_checks_per_min), ("elapsed", f"{rec.elapsed_s:.1f} s"),
               ("result", rec.result)]
    out = [html("<p>{}</p>", _badge(sec.summary, not sec.failed)),
           _table(["figure", "value"], [[mono(k), str(v)] for k, v in figures])]
    if rec.variants:
        out.append(Markup("<h3>Per variant</h3>"))
        out.append(_table(["variant", "checks", "outcomes", "disagreements"], [
            [mono(v), str(d.get("checks", "")), " ".join(f"{k}:{n}" for k, n in (d.get("outcomes") or {}).items()),
             str(d.get("disagreements", ""))] for v, d in rec.variants.items()]))
    if rec.symbolic:
        out.append(Markup("<h3>Against the symbolic model</h3>"))
        out.append(_table(["", "value"], [[mono(k), str(v)] for k, v in rec.symbolic.items()]))
    for i, d in enumerate(rec.disagreements[:MAX_DRAWN]):
        case = case_of(d.case, f"{where}.disagreements[{i}].case")
        out.append(drawn_case(case, caption=html("<b>disagreement {}</b>: {} ({}, impl vs {})", i + 1, case.name,
                                                 d.variant, d.against))
                   + _json_pre({"detail": d.detail, "spec": d.spec, "impl": d.impl}))
    if len(rec.disagreements) > MAX_DRAWN:
        out.append(html("<p>{} more: see the JSON file</p>", len(rec.disagreements) - MAX_DRAWN))
    sec.body = join(out)
    return sec


def _short(path: str) -> str:
    i = (path or "").rfind("vllm/")
    return path[i:] if i >= 0 else (path or "?")


def _real_label(rec) -> str:
    """The real side in a few words: ok / assert name at file:line / fault."""
    real = rec.real or {}
    if rec.verdict == Verdict.FAULT:
        return f"fault: {real.get('outcome', '?')}"
    if real.get("outcome") == "assertion_error":
        site = rec.extra.get("real_assert_site") or {}
        where = f" at {_short(site.get('file'))}:{site.get('line')}" if site else ""
        return f"AssertionError ({real.get('assertion')}){where}"
    if real.get("outcome") == "ok":
        return f"ok: dst_block_ids={real.get('dst_block_ids')}"
    return str(real.get("outcome"))


def _spec_label(rec) -> str:
    spec = rec.spec or {}
    if spec.get("outcome") == "assertion_error":
        return f"AssertionError ({spec.get('assertion')})"
    return f"ok: dst_block_ids={spec.get('dst_block_ids')}"


# How the summary names each conform verdict, in the order `kvbound conform` prints them.
CONFORM_WORDS = {Verdict.AGREE: "agree", Verdict.DISAGREE: "disagree", Verdict.FAULT: "fault",
                 Verdict.UNDRIVEN: "not driven", Verdict.UNSUPPORTED: "refused by the release's config"}
NAMED_ROWS = ("pr_case", "example", "witness")  # matrix rows whose cases are shown one by one


def conform_section(data) -> Section:
    from kvbound.conform.compare import ROW_ORDER

    rec = ConformRecord.from_json(data)
    where = "conform JSON"
    records, rels, matrix = rec.cases, list(rec.releases), rec.matrix
    sec = Section("conform", "")
    counts = {v: sum(r.verdict == v for r in records) for v in CONFORM_VERDICTS}
    sec.failed = bool(rec.blocking or rec.not_prepared)
    sec.summary = (
        ", ".join(f"{counts[v]} {word}" for v, word in CONFORM_WORDS.items())
        + f" over {len(rels)} release(s); {rec.blocking} blocking"
        + (f"; NOT PREPARED: {', '.join(rec.not_prepared)}" if rec.not_prepared else "")
    )
    out = [html("<p>{}</p>", _badge(sec.summary, not sec.failed))]
    if rec.not_prepared:
        out.append(html('<div class="error">could not prepare or start: {}</div>', ", ".join(rec.not_prepared)))
    out.append(Markup("<h3>Releases (real vLLM scheduler code, offload tier faked)</h3>"))
    out.append(_table(
        ["vLLM", "spec variant", "python", "seconds", "scheduler file"],
        [[v, mono(_variant_of(v)), str(h.get("python", "")), str(h.get("seconds", "")),
          html('<span class="mono small">{}</span>', _short(h.get("scheduler_file", "")))]
         for v, h in rec.releases.items()]))
    out.append(Markup("<h3>Version matrix: agree / total per case family, and the real outcomes</h3>"))
    rows = [r for r in ROW_ORDER if r in matrix] + sorted(r for r in matrix if r not in ROW_ORDER)
    mrows = []
    for row in rows:
        cells = [mono(row)]
        for rel in rels:
            c = matrix[row].get(rel) if isinstance(matrix[row], dict) else None
            if not c:
                cells.append("–")
                continue
            bad = c.get(Verdict.DISAGREE, 0) + c.get(Verdict.FAULT, 0)
            extra = "".join(f", {c[k]} {k}" for k in CONFORM_VERDICTS if k != Verdict.AGREE and c.get(k))
            outs = " ".join(f"{k}:{v}" for k, v in sorted((c.get("outcomes") or {}).items()))
            cells.append(html('{}<div class="small mono">{}</div>',
                              _badge(f"{c.get(Verdict.AGREE, 0)}/{c.get('total', 0)} agree{extra}",
                                     not bad if row not in ADVERSARIAL_FAMILIES else (None if bad else True)), outs))
        mrows.append(cells)
    out.append(_table(["family"] + [f"vllm {r} ({_variant_of(r)})" for r in rels], mrows))
    named = [r for r in records if r.row in NAMED_ROWS]
    if named:
        out.append(Markup("<h3>Case files and proof witnesses: real outcome vs the spec, per release</h3>"))
        by_name: dict = {}
        for r in named:
            by_name.setdefault(r.name, {})[r.release] = r
        trows = []
        for name, per in by_name.items():
            cells = [mono(name)]
            for rel in rels:
                r = per.get(rel)
                if r is None:
                    cells.append("–")
                    continue
                cells.append(html('{}<div>real: {}</div><div class="small">spec {}: {}</div>',
                                  _badge(r.verdict, r.verdict.holds), _real_label(r), r.variant, _spec_label(r)))
            trows.append(cells)
        out.append(_table(["case"] + [f"vllm {r}" for r in rels], trows))
        first = next((r for r in named if r.row == "pr_case"), None)
        if first is not None and first.case is not None:
            case = case_of(first.case, f"{where}.cases[{records.index(first)}].case")
            vs = [Variant(r.variant) for r in named if r.name == first.name]
            out.append(drawn_case(case, {v: plan_load(case, v) for v in dict.fromkeys(vs)},
                                  caption=html("<b>{}</b> drawn with the variants of the releases above", case.name)))
    bad = [r for r in records if r.verdict in (Verdict.DISAGREE, Verdict.FAULT)]
    if bad:
        out.append(html("<h3>{} disagreement(s) / fault(s)</h3>", len(bad)))
        for r in bad[:MAX_DRAWN]:
            head = html("<b>{}</b>: {} on vllm {} ({}), family {}", r.verdict, mono(r.name), r.release, r.variant, r.row)
            if r.verdict == Verdict.FAULT or r.case is None:
                out.append(html('<figure class="case"><figcaption>{}</figcaption><pre>{}</pre></figure>',
                                head, str(r.extra.get("fault", ""))))
                continue
            case = case_of(r.case, f"{where}.cases[{records.index(r)}].case")
            detail = html("<div>differs in: <b>{}</b></div><pre>real vllm {}: {}\nspec {}: {}</pre>",
                          ", ".join(r.extra.get("diff") or []), r.release, json.dumps(r.real), r.variant,
                          json.dumps(r.spec))
            out.append(drawn_case(case, {Variant(r.variant): plan_load(case, Variant(r.variant))}, caption=head) + detail)
        if len(bad) > MAX_DRAWN:
            out.append(html("<p>{} more: see the JSON file</p>", len(bad) - MAX_DRAWN))
    sec.body = join(out)
    return sec


def _variant_of(version: str) -> str:
    from kvbound.errors import UnsupportedVersion
    from kvbound.spec import variant_for_version

    try:
        return variant_for_version(version).value
    except UnsupportedVersion:  # an unknown release string in the file: show it, do not fail the page
        return "?"
