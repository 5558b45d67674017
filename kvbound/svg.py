"""Block tables as inline SVG for the HTML report: the picture ``draw_case`` prints.

The columns, glyphs, f, k, per-variant starts and verdict lines all come from
``kvbound.draw`` (``group_layout``, ``block_glyph``, ``_verdict``), and a shadow-KV
finding's slot contents from ``draw.content_rows``, so the page and the terminal can
never disagree about a table. Cell kinds differ by
colour *and* glyph, so the picture survives greyscale printing and colour blindness.
"""

from __future__ import annotations

from html import escape

from kvbound.draw import (_verdict, block_glyph, content_head, content_rows, group_head, group_layout, lookup_rows,
                          tail_mark)
from kvbound.spec import Case, Variant, plan_load

CELL, GAP = 34, 4  # cell width and spacing, px
LABEL_W = 96  # left column: row labels
CHAR_W = 7.8  # width of one 12px monospace character, for sizing notes
ROW = 22

# glyph -> (fill, stroke, text colour, meaning)
STYLE = {
    "[H]": ("#3b6ea8", "#24476e", "#ffffff", "hashed (full and cached)"),
    "[·]": ("#eeeeee", "#9a9a9a", "#555555", "null placeholder"),
    "[U]": ("#e8590c", "#9c3a06", "#ffffff", "non-null, unhashed, below f"),
    "[F]": ("#2f9e44", "#1d6b2d", "#ffffff", "fresh (non-null, unhashed, at/after f)"),
}
LETTER = {"[H]": "H", "[·]": "·", "[U]": "U", "[F]": "F"}
OK, BAD, MUTED = "#1d6b2d", "#c92a2a", "#666666"


def _t(x, y, text, size=12, anchor="start", fill="#222", weight="normal", mono=True) -> str:
    fam = "ui-monospace,Menlo,Consolas,monospace" if mono else "system-ui,sans-serif"
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-family="{fam}" font-size="{size}" text-anchor="{anchor}" '
        f'fill="{fill}" font-weight="{weight}">{escape(str(text))}</text>'
    )


def _cell(x, y, glyph, block_id=None) -> str:
    fill, stroke, ink, meaning = STYLE[glyph]
    dash = ' stroke-dasharray="3 2"' if glyph == "[·]" else ""
    out = [
        f'<g><title>{escape(meaning)}{"" if block_id is None else f" — block_id {block_id}"}</title>',
        f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" rx="4" fill="{fill}" stroke="{stroke}" '
        f'stroke-width="1.5"{dash}/>',
        _t(x + CELL / 2, y + (19 if glyph == "[·]" else 15), LETTER[glyph], 24 if glyph == "[·]" else 14,
           "middle", ink, "bold"),
    ]
    if block_id is not None:
        out.append(_t(x + CELL / 2, y + 29, block_id, 10, "middle", ink))
    out.append("</g>")
    return "".join(out)


def legend_svg() -> str:
    parts, x = [], 0
    for glyph, (_, _, _, meaning) in STYLE.items():
        parts.append(_cell(x, 2, glyph))
        parts.append(_t(x + CELL + 6, 23, meaning, 13, mono=False))
        x += CELL + 14 + int(len(meaning) * 7.2)
    return (
        f'<svg class="legend" xmlns="http://www.w3.org/2000/svg" width="{x}" height="{CELL + 4}" '
        f'role="img" aria-label="legend">{"".join(parts)}</svg>'
    )


def group_svg(case: Case, gi: int, plans: dict) -> str:
    g, cfg, b, N, T, f, k, starts, cols = group_layout(case, gi, plans)
    step = CELL + GAP
    x0 = LABEL_W

    def cx(pos: int) -> float:
        return x0 + pos * step

    pos = {c: p for p, c in enumerate(cols) if c is not None}
    grid_w = len(cols) * step

    head = group_head(case, gi, " · ")

    notes = {
        "f": f"f = cdiv(N={N}, b={b}) = {f}   first fresh block",
        "k": f"k = cdiv(T={T}, b={b}) = {k}   end of the load region (exclusive)",
    }
    rows = []  # (label, marker cells {col: kind}, note, note colour)
    rows.append(("f", {f: "caret"}, notes["f"], MUTED))
    rows.append(("k", {k: "caret"}, notes["k"], MUTED))
    tail = tail_mark(case, gi, plans)
    if tail is not None:
        rows.append(("tail", {tail[0]: "caret"}, tail[1], BAD if "✗" in tail[1] else MUTED))
    for v, plan in (plans.items() if cfg.offloaded else ()):
        s = starts[v]
        if s is None:
            rows.append((v.value, {}, "table shorter than k", BAD))
            continue
        text = _verdict(plan, gi, s, k)
        colour = BAD if "✗" in text else (MUTED if "not reached" in text else OK)
        rows.append((v.value, {"region": (s, k)}, text, colour))

    y = 18
    body = [_t(0, y - 4, head, 13, weight="bold", mono=False)]
    y += 6
    # index ruler
    for p, c in enumerate(cols):
        body.append(_t(cx(p) + CELL / 2, y + 12, "…" if c is None else c, 11, "middle", MUTED))
    body.append(_t(0, y + 12, "idx", 12, fill=MUTED))
    y += 18
    table_top = y
    body.append(_t(0, y + 22, "blocks", 12, fill=MUTED))
    for p, c in enumerate(cols):
        if c is None:
            body.append(_t(cx(p) + CELL / 2, y + 22, "…", 16, "middle", MUTED))
        elif c < len(g.blocks):
            blk = g.blocks[c]
            body.append(_cell(cx(p), y, block_glyph(blk, c, f), None if blk.is_null else blk.block_id))
        elif c == len(g.blocks):
            body.append(
                f'<line x1="{cx(p) + 2}" y1="{y - 2}" x2="{cx(p) + 2}" y2="{y + CELL + 2}" stroke="#222" '
                'stroke-width="2"/>'
            )
            body.append(_t(cx(p) + 6, y + 22, "end", 10, fill=MUTED))
    y += CELL + 8
    note_x = x0 + grid_w + 12
    for label, at, note, colour in rows:
        body.append(_t(0, y + 15, label, 12, fill="#222", weight="bold"))
        if "region" in at:
            s, e = at["region"]
            ps = pos.get(s)
            pe = pos.get(e - 1, ps) if e > s else ps
            if ps is not None and e <= s:  # start == k: nothing to load, only the caret
                body.append(_caret(cx(ps) + CELL / 2, y + 4, colour))
            elif ps is not None:
                left, right = cx(ps), cx(pe) + CELL
                body.append(
                    f'<rect x="{left}" y="{y + 4}" width="{max(right - left, CELL)}" height="14" rx="3" '
                    f'fill="{colour}" fill-opacity="0.18" stroke="{colour}" stroke-width="1.2"/>'
                )
                body.append(_caret(cx(ps) + CELL / 2, y + 4, colour))
        else:
            for c in at:
                if c in pos:
                    body.append(_caret(cx(pos[c]) + CELL / 2, y + 4, MUTED))
        body.append(_t(note_x, y + 15, note, 12, fill=colour, weight="bold" if colour == BAD else "normal"))
        y += ROW
    # f and k as dashed lines down through table and markers
    for c, label, colour in ((f, "f", "#1d6b2d"), (k, "k", "#222")):
        if c in pos:
            x = cx(pos[c]) - GAP / 2
            body.append(
                f'<line x1="{x}" y1="{table_top - 4}" x2="{x}" y2="{y - 2}" stroke="{colour}" '
                'stroke-width="1.2" stroke-dasharray="4 3"/>'
            )
    width = int(note_x + max(len(r[2]) for r in rows) * CHAR_W + 16)
    height = int(y + 6)
    return (
        f'<svg class="group" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(head)}">{"".join(body)}</svg>'
    )


def _caret(x, y, colour) -> str:
    return f'<path d="M{x - 6},{y + 14} L{x},{y + 2} L{x + 6},{y + 14} Z" fill="{colour}"/>'


def case_svgs(case: Case, variants=tuple(Variant), plans: dict | None = None) -> list:
    """One SVG per group, the same tables ``draw_case`` prints."""
    plans = plans or {Variant(v): plan_load(case, v) for v in variants}
    return [group_svg(case, gi, plans) for gi in range(len(case.groups))]


# what a slot holds (draw.content_rows) -> (fill, stroke, text colour, meaning)
CONTENT = {
    "own": ("#2f9e44", "#1d6b2d", "#ffffff", "this request's own prefix KV"),
    "foreign": ("#c92a2a", "#8a1c1c", "#ffffff", "another request's KV"),
    "unwritten": ("#f1f3f5", "#868e96", "#495057", "never written"),
}
SLOTS_W = 512  # px for one block's slots


def _run_label(run) -> str:
    return {"own": "own", "unwritten": "unwritten"}.get(run.what, f"req {run.who} @{run.at}")


def _swatch(x, y, what, w, h, label="") -> str:
    fill, stroke, ink, _ = CONTENT[what]
    dash = ' stroke-dasharray="3 2"' if what == "unwritten" else ""
    out = (f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{fill}" stroke="{stroke}"'
           f' stroke-width="1"{dash}/>')
    if label and len(label) * 6.6 + 6 <= w:
        out += _t(x + w / 2, y + h / 2 + 4, label, 11, "middle", ink)
    return out


def content_legend_svg() -> str:
    parts, x = [], 0
    for what, (_, _, _, meaning) in CONTENT.items():
        parts.append(_swatch(x, 6, what, 28, 18))
        parts.append(_t(x + 34, 20, f"{what}: {meaning}", 13, mono=False))
        x += 48 + int((len(what) + len(meaning)) * 7.2)
    return (f'<svg class="legend" xmlns="http://www.w3.org/2000/svg" width="{x}" height="28" role="img"'
            f' aria-label="slot legend">{"".join(parts)}</svg>')


def content_svg(table: dict) -> str:
    """A shadow-KV finding's block table (``draw.draw_content``'s picture): one row per
    block, its slots as runs coloured by what they hold, the finding's position marked."""
    rows = content_rows(table)
    B, p = table["block_size"], table["position"]
    slot = max(1.0, min(20.0, SLOTS_W / B))
    x_bar = 190
    bar_w = slot * B
    note_x = x_bar + bar_w + 12
    head = content_head(table)
    body = [_t(0, 14, head, 13, weight="bold", mono=False)]
    y = 24
    for label, x in (("idx", 0), ("block", 40), ("tokens", 96), ("slots: what each holds", x_bar)):
        body.append(_t(x, y + 12, label, 11, fill=MUTED))
    y += 20
    right = [len(head) * 7.6]  # how far each text reaches, px
    for r in rows:
        a, b = r.tokens
        body.append(f'<g class="block-row" data-block="{r.block_id}">')
        body += [_t(0, y + 17, r.index, 12), _t(40, y + 17, r.block_id, 12), _t(96, y + 17, f"[{a},{b})", 12)]
        for run in r.runs:
            swatch = _swatch(x_bar + (run.lo - a) * slot, y, run.what, (run.hi - run.lo) * slot, 24, _run_label(run))
            body.append(f"<g><title>{escape(run.words)}</title>{swatch}</g>")
        note = " | ".join(run.words for run in r.runs)
        bad = not all(run.ok for run in r.runs)
        if r.at_position:
            px = x_bar + (p - a) * slot
            body.append(f'<rect x="{px:.1f}" y="{y - 2}" width="{max(slot, 2):.1f}" height="28" fill="none" '
                        f'stroke="#111" stroke-width="2"/>')
            body.append(_caret(px + slot / 2, y + 24, "#111"))
            note += f"   <- position {p}"
        body.append(_t(note_x, y + 17, note, 12, fill=BAD if bad else OK, weight="bold" if bad else "normal"))
        right.append(note_x + len(note) * CHAR_W)
        y += 42 if r.at_position else 30
        if r.via:
            via = f"content arrived: {r.via}"
            body.append(_t(x_bar, y + 2, via, 11, fill=MUTED))
            right.append(x_bar + len(via) * 7.0)
            y += 16
        body.append("</g>")
    width = int(max(right) + 16)
    height = int(y + 4)
    return (f'<svg class="content" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(head)}">{"".join(body)}</svg>')


# a tier's answer to a key (spec/lookup_case.py Answer) -> (fill, text colour, letter)
ANSWER = {"HIT": ("#2f9e44", "#ffffff", "H"), "HIT_PENDING": ("#f08c00", "#ffffff", "P"),
          "RETRY": ("#7048e8", "#ffffff", "R"), "MISS": ("#dee2e6", "#495057", "M")}
KEY_W = 30


def lookup_legend() -> str:
    return "  ".join(f"{letter} {answer}" for answer, (_, _, letter) in ANSWER.items()) + \
        "  · not in the tier; numbers: the order the lookup asked; red frame: the deferral hangs on it"


def lookup_svg(detail: dict) -> str:
    """A lookup finding: per group, each offload key with the tier's answer, when the real
    lookup asked it, and the keys its deferral hung on (``draw.lookup_rows``)."""
    lk = detail["lookup_case"]["lookup"]
    real = detail.get("real") or {}
    hit = real.get("hit")
    head = (f"get_num_new_matched_tokens: num_computed_tokens={lk.get('num_computed_tokens')}"
            f" num_tokens={lk.get('num_tokens')} tokens_per_hash={lk.get('tokens_per_hash')}: vLLM answered "
            + ("deferred (None)" if hit is None else f"{hit} tokens") + f"; the tier held {detail.get('tokens')} ready")
    body = [_t(0, 14, head, 13, weight="bold", mono=False), _t(0, 32, lookup_legend(), 11, fill=MUTED)]
    y, x0, widest = 44, 250, 0
    for g, keys in lookup_rows(detail):
        label = f"group {g['group_idx']} {g['kind']}" + (" EAGLE" if g.get("eagle") else "")
        body.append(_t(0, y + 30, label, 12, weight="bold"))
        body.append(_t(0, y + 44, f"{g['tokens_per_chunk']} tokens/chunk", 11, fill=MUTED))
        for i, k in enumerate(keys):
            x = x0 + i * (KEY_W + 3)
            fill, ink, letter = ANSWER.get(k.answers[-1], ("#ffffff", "#495057", "?")) if k.answers \
                else ("#ffffff", "#adb5bd", "·")
            text = "".join(ANSWER.get(a, ("", "", "?"))[2] for a in k.answers) or letter
            stroke, sw = (BAD, 3) if k.deferred else ("#adb5bd", 1)
            said = ", ".join(k.answers) or "not in the tier"
            asked = "; asked " + ", ".join(map(str, k.asked)) if k.asked else "; not asked"
            body.append(f'<g class="lookup-key"><title>key {escape(k.name)}: {escape(said + asked)}</title>')
            body.append(_t(x + KEY_W / 2, y + 12, k.name.split(":", 1)[1], 10, "middle", MUTED))
            body.append(f'<rect x="{x}" y="{y + 16}" width="{KEY_W}" height="24" rx="3" fill="{fill}" '
                        f'stroke="{stroke}" stroke-width="{sw}"/>')
            body.append(_t(x + KEY_W / 2, y + 33, text[:3], 12, "middle", ink, "bold"))
            if k.asked:
                body.append(_t(x + KEY_W / 2, y + 52, ",".join(map(str, k.asked)), 9, "middle", "#222"))
            body.append("</g>")
        widest = max(widest, x0 + len(keys) * (KEY_W + 3))
        y += 62
    width = int(max(widest + 8, len(head) * 7.8, len(lookup_legend()) * 7.0))
    return (f'<svg class="lookup" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
            f'viewBox="0 0 {width} {y}" role="img" aria-label="{escape(head)}">{"".join(body)}</svg>')
