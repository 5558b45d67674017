"""Block tables drawn the way a reviewer thinks: ``[H][H][·][U][·]…[F]``.

Every witness, disagreement and ``explain`` goes through ``draw_case`` so they all
look alike: an index ruler, the table, block ids, the first-fresh block f, k, and
per variant the load start ``^`` and the load region ``~``.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from kvbound.spec import Case, LoadPlan, Variant, cdiv, plan_for_version, plan_load, variant_for_version
from kvbound.spec.plan import variant_load_start

W = 5  # column width
LEGEND = "legend  [H] hashed  [·] null  [U] non-null unhashed below f  [F] non-null unhashed at/after f (fresh)"


def block_glyph(block, idx: int, first_fresh: int) -> str:
    if block.is_null:
        return "[·]"
    if block.is_hashed:
        return "[H]"
    return "[F]" if idx >= first_fresh else "[U]"


def group_starts(case: Case, gi: int, variants) -> dict:
    """The load start each variant's scan picks in group gi (None when the table is short)."""
    g = case.groups[gi]
    b = g.config.tokens_per_block
    k = cdiv(case.num_cached_tokens, b)
    out = {}
    for v in variants:
        if len(g.blocks) < k:
            out[v] = None
            continue
        out[v] = variant_load_start(g.blocks, v, case.num_locally_computed_tokens, b, k, case.sync_load)
    return out


def fold(n: int, glyphs, marks) -> list:
    """Columns 0..n-1 to draw, ``None`` for "…": a run of >= 4 alike columns (``glyphs(i)``) with
    no mark folds into first, …, last (every drawing of a row of cells: tables, keys, chunks)."""
    cols: list = []
    i = 0
    while i < n:
        j = i
        while j < n and j not in marks and glyphs(j) == glyphs(i):
            j += 1
        if j - i >= 4:
            cols += [i, None, j - 1]
            i = j
        else:
            cols.append(i)
            i += 1
    return cols


def fold_columns(blocks, f: int, k: int, starts) -> list:
    """Indices to draw, ``None`` for "…": runs of >= 4 like blocks without a marker fold
    into first, …, last, so a 1000-block table stays one line (text and SVG alike)."""
    n = max(len(blocks), k + 1)
    marks = {f, k} | {s for s in starts if s is not None}
    # past the table (k beyond it) every column is its own
    return fold(n, lambda j: block_glyph(blocks[j], j, f) if j < len(blocks) else j, marks)


def plan_starts(case: Case, gi: int, plans: dict) -> dict:
    """Each plan's load start in group gi: its own where it planned the group (a plan
    from elsewhere, the impl or vLLM, marks where it started), else the spec's scan."""
    starts = group_starts(case, gi, plans)
    for v, plan in plans.items():
        gp = next((p for p in plan.groups if p.group_index == gi), None)
        if gp is not None:
            starts[v] = gp.load_start_gpu_block_idx
    return starts


class GroupLayout(NamedTuple):
    """What a drawing of group gi needs, text or SVG alike."""

    group: object
    config: object
    tokens_per_block: int
    N: int
    T: int
    f: int
    k: int
    starts: dict
    cols: list


def group_layout(case: Case, gi: int, plans: dict) -> GroupLayout:
    g = case.groups[gi]
    b = g.config.tokens_per_block
    N, T = case.num_locally_computed_tokens, case.num_cached_tokens
    f, k = cdiv(N, b), cdiv(T, b)
    starts = plan_starts(case, gi, plans)
    return GroupLayout(g, g.config, b, N, T, f, k, starts, fold_columns(g.blocks, f, k, starts.values()))


def group_head(case: Case, gi: int, sep: str = "  ") -> str:
    """The group's title line (text and SVG alike): kind, block size, window, and the v2
    facts that change its plan (retained tokens, EAGLE, not offloaded)."""
    cfg = case.groups[gi].config
    parts = [f"group {gi}", cfg.kind.value, f"tokens_per_block={cfg.tokens_per_block}"]
    window = cfg.sliding_window_size_in_chunks(case.blocks_per_chunk)
    if window is not None:
        parts.append(f"window={window} chunk(s)")
    if cfg.extra_retained_tokens:
        parts.append(f"extra_retained_tokens={cfg.extra_retained_tokens} (0.31+ window; 0.28-0.30: "
                     f"{cfg.sliding_window_size_in_chunks(case.blocks_per_chunk, False)})")
    if cfg.is_eagle_group:
        parts.append("EAGLE drafter group")
    if not cfg.offloaded:
        parts.append("not offloaded")
    return sep.join(parts)


def tail_mark(case: Case, gi: int, plans: dict):
    """Where a partial tail ends in group gi: ``(block index, note)``, or None without one.
    The block holding the boundary's last token loads through the group's boundary key."""
    boundary = case.partial_tail_boundary
    cfg = case.groups[gi].config
    if boundary is None or not cfg.offloaded:
        return None
    b, T = cfg.tokens_per_block, case.num_cached_tokens
    idx = (boundary - 1) // b
    held = boundary - idx * b
    keys = sorted({k for p in plans.values() if p.ok for gp in p.groups if gp.group_index == gi
                   for k in gp.keys if k[1] == "boundary"}, key=str)
    if keys:
        margin = keys[0][2] - boundary
        key = f"key {json.dumps(list(keys[0]))}" + (f" (boundary + EAGLE proof margin {margin})" if margin else "")
    else:
        key = "its boundary key"
    note = f"partial tail: boundary {boundary} holds {held} of block {idx}'s {b} tokens; loaded through {key}"
    if boundary != T:
        note += f"  ✗ partial_tail: boundary {boundary} != T={T}"
    return idx, note


def draw_group(case: Case, gi: int, plans: dict) -> str:
    g, cfg, b, N, T, f, k, starts, cols = group_layout(case, gi, plans)
    pos = {c: x for x, c in enumerate(cols) if c is not None}

    def row(label: str, cells: list) -> str:
        return (f"  {label:<11}" + "".join(f"{c:^{W}}" for c in cells)).rstrip()

    idx_cells = ["…" if c is None else str(c) for c in cols]
    glyphs, ids = [], []
    for c in cols:
        if c is None:
            glyphs.append("…"), ids.append("")
        elif c < len(g.blocks):
            blk = g.blocks[c]
            glyphs.append(block_glyph(blk, c, f)), ids.append("·" if blk.is_null else str(blk.block_id))
        else:
            glyphs.append("|" if c == len(g.blocks) else ""), ids.append("")
    lines = [group_head(case, gi), row("idx", idx_cells), row("blocks", glyphs), row("block_id", ids)]

    def marker_row(label: str, at: dict, note: str) -> str:
        cells = [""] * len(cols)
        for c, ch in at.items():
            if c in pos:
                cells[pos[c]] = ch
        return row(label, cells) + ("   " + note if note else "")

    lines.append(marker_row("f", {f: "^"}, f"f = cdiv(N={N}, b={b}) = {f}  first fresh block"))
    lines.append(marker_row("k", {k: "^"}, f"k = cdiv(T={T}, b={b}) = {k}"))
    if not cfg.offloaded:
        lines.append("  (the connector does not offload this group: it is neither scanned nor loaded)")
        return "\n".join(lines)
    tail = tail_mark(case, gi, plans)
    if tail is not None:
        lines.append(marker_row("tail", {tail[0]: "^"}, tail[1]))
    for v, plan in plans.items():
        s = starts[v]
        if s is None:
            lines.append(f"  {v.value:<11}table shorter than k")
            continue
        at = {c: "~" for c in range(s, k)}
        at[s] = "^"
        lines.append(marker_row(v.value, at, _verdict(plan, gi, s, k)))
    return "\n".join(lines)


def _verdict(plan: LoadPlan, gi: int, start: int, k: int) -> str:
    a = plan.assertion
    if plan.unsupported is not None:
        return f"start={start}  (unsupported in this release)"
    if a is not None and a.group_index is None:
        return f"start={start}  (not reached: the request-level {a.name.value} assert fired first)"
    if a is not None and a.group_index == gi:
        return f"start={start}  ✗ {a.name.value}: {a.message}"
    if a is not None and a.group_index < gi:
        return f"start={start}  (not reached: group {a.group_index} asserted first)"
    gp = next(p for p in plan.groups if p.group_index == gi)
    if not gp.num_pending_gpu_blocks:
        return f"start={start}  loads nothing"
    tail = "" if gp.boundary_key_tokens is None else f" + boundary key @{gp.boundary_key_tokens}"
    return (
        f"start={start}  ✓ loads {list(gp.dst_block_ids)} "
        f"keys chunks [{gp.start_chunk_idx}, {gp.end_chunk_idx}){tail}"
    )


def case_header(case: Case) -> str:
    N, M = case.num_locally_computed_tokens, case.num_external_tokens
    extra = ""
    if case.num_tokens != case.num_prompt_tokens:
        extra += f"  num_tokens={case.num_tokens} (resumed)"
    if case.partial_tail_boundary is not None:
        extra += f"  partial_tail_boundary={case.partial_tail_boundary}"
    if case.cache_hit_alignment_tokens is not None:
        extra += f"  cache_hit_alignment_tokens={case.cache_hit_alignment_tokens}"
    return (
        f"case {case.name}: N=num_locally_computed_tokens={N}  M=num_external_tokens={M}"
        f"  T={N + M}  blocks_per_chunk={case.blocks_per_chunk}  tokens_per_hash={case.tokens_per_hash}"
        f"  num_prompt_tokens={case.num_prompt_tokens}" + ("  sync_load" if case.sync_load else "") + extra
    )


def draw_witness(witness, legend: bool = True) -> str:
    """A proof witness drawn: a load (a spec Case) as block tables, an allocate_slots witness
    (``kvbound.proofs.allocator.AllocCalls``; every kind: ``kvbound.proofs.witnesses``) as its calls and the model's numbers."""
    return draw_case(witness, legend=legend) if isinstance(witness, Case) else witness.draw()


def draw_case(case: Case, variants=tuple(Variant), plans: dict | None = None, legend: bool = True) -> str:
    """The whole case, one drawn table per group; ``plans`` overrides the spec's (e.g. impl's)."""
    plans = plans or {Variant(v): plan_load(case, v) for v in variants}
    parts = [case_header(case)]
    if legend:
        parts.append(LEGEND)
    parts += [draw_group(case, gi, plans) for gi in range(len(case.groups))]
    return "\n\n".join(parts)


def describe_plan(plan: LoadPlan) -> str:
    """One paragraph: the assert with its numbers, or what is loaded and from which keys."""
    if plan.unsupported is not None:
        return f"unsupported: {plan.unsupported}"
    if plan.assertion is not None:
        a = plan.assertion
        where = "before any group" if a.group_index is None else f"in group {a.group_index}"
        return f"AssertionError ({a.name.value}) {where}: {a.message}"
    if not plan.groups:
        return "num_external_tokens == 0: vLLM returns before planning; nothing is loaded"
    return (
        f"ok: dst_block_ids={list(plan.dst_block_ids)} group_sizes={list(plan.group_sizes)} "
        f"block_indices={list(plan.block_indices)} keys={json.dumps([list(k) for k in plan.keys])}"
    )


def why(case: Case, plan: LoadPlan) -> str:
    """The reason behind ``describe_plan``, in the PR's terms."""
    a = plan.assertion
    if plan.unsupported is not None:
        return ""
    if a is not None and a.name.value == "partial_tail":
        return (
            f"vLLM's lookup recorded a partial tail at {a.values['partial_tail_boundary']} tokens, so the load must "
            f"end there, but N + M = {a.values['num_cached_tokens']}"
        )
    if a is None:
        if not plan.groups:
            return ""
        scan = "from 0" if plan.variant is Variant.LEGACY else "from f = cdiv(N, b)"
        parts = []
        for gp in plan.groups:
            if gp.num_pending_gpu_blocks:
                parts.append(f"group {gp.group_index} starts at {gp.load_start_gpu_block_idx}")
            else:
                parts.append(f"group {gp.group_index} has nothing to load (no matching block in its scan range)")
        out = f"the scan {scan} finds the first fresh block: " + "; ".join(parts)
        if case.partial_tail_boundary is not None:
            out += (
                f"; the lookup's partial tail ends the load at {case.partial_tail_boundary} tokens, so each group's"
                " chunk keys stop one chunk early (end_chunk_idx = cdiv(T, tpc) - 1) and its last block loads"
                " through one boundary key"
            )
        return out
    g = case.groups[a.group_index]
    v = a.values
    if a.name.value == "boundary":
        s = v["load_start_gpu_block_idx"]
        blk = g.blocks[s] if s < len(g.blocks) else None
        what = f"block {blk.block_id} at index {s} is non-null and unhashed" if blk is not None else "no block matched"
        return (
            f"the legacy scan starts at index 0; in group {a.group_index} ({g.config.kind.value}) {what}, "
            f"below the first fresh index f={v['first_fresh_gpu_block_idx']}, so the load would start inside the "
            f"computed prefix: start*b = {s * v['tokens_per_block']} < N = {v['num_locally_computed_tokens']}"
        )
    if a.name.value == "alignment":
        return (
            f"N={v['num_locally_computed_tokens']} is not a multiple of group {a.group_index}'s tokens_per_block="
            f"{v['tokens_per_block']}; the scheduler rounds N to the LCM of the groups' block sizes, so this "
            "input is one vLLM's scheduler does not produce unless the connector's block size is not a divisor of it"
        )
    if a.name.value == "table_length":
        return f"group {a.group_index}'s table has {v['table_length']} blocks but k = cdiv(N+M, b) = {v['num_gpu_blocks']}"
    if a.name.value == "window_bound":
        return (
            f"group {a.group_index} ({g.config.kind.value}) would load {v['num_pending_gpu_blocks']} blocks but its window "
            f"holds at most {v['sliding_window_size_in_chunks']} chunk(s) * {v['blocks_per_chunk']} + 1"
            + (f" (this release's window ignores its extra_retained_tokens={g.config.extra_retained_tokens};"
               " 0.31+ count them)"
               if g.config.extra_retained_tokens and v["sliding_window_size_in_chunks"]
               < g.config.sliding_window_size_in_chunks(case.blocks_per_chunk) else "")
        )
    if a.name.value == "keys_length":
        return (
            f"the prompt ({case.num_prompt_tokens} tokens, tokens_per_hash={case.tokens_per_hash}) gives group "
            f"{a.group_index} only {v['num_offload_keys']} offload keys, but the load ends at chunk {v['end_chunk_idx']}"
        )
    return a.message  # an assert this page does not explain yet: the spec's own message


def explain_case(case: Case, variants=tuple(Variant), version: str | None = None) -> str:
    """Drawn tables and each variant's verdict; with ``version`` that vLLM release's plan
    (its scan, asserts and v2 features) instead of the variants' last releases."""
    if version is not None:
        plans = {variant_for_version(version): plan_for_version(case, version)}
    else:
        plans = {Variant(v): plan_load(case, v) for v in variants}
    out = [draw_case(case, plans=plans), ""]
    for v, p in plans.items():
        out.append(f"{v.value:<11}{describe_plan(p)}")
        reason = why(case, p)
        if reason:
            out.append(f"{'':<11}why: {reason}")
    return "\n".join(out)


class ContentRun(NamedTuple):
    """Slots ``lo``..``hi - 1`` of a block, alike: ``what`` is own (this prefix's KV), foreign
    (request ``who``'s KV from its position ``at`` on) or unwritten; ``words`` says so."""

    what: str
    lo: int
    hi: int
    who: object
    at: object
    words: str

    @property
    def ok(self) -> bool:
        return self.what == "own"


class ContentRow(NamedTuple):
    """One block of a content table: its index in the request's table, id, token range
    [a, b), runs, whether it holds the position the finding is at, and how it got there."""

    index: int
    block_id: int
    tokens: tuple
    runs: list
    at_position: bool
    via: str | None


def content_head(table: dict) -> str:
    return (f"group {table['group']} of request {table['request']} (block size {table['block_size']}),"
            f" at position {table['position']}")


def content_rows(table: dict) -> list:
    """A shadow-KV finding's block table (``kvbound/side/content.py`` ``ContentModel.table``)
    read as rows: text (``draw_content``) and SVG (``kvbound.svg.content_svg``) alike."""
    p = table["position"]
    out = []
    for row in table["rows"]:
        a, b = row["tokens"]
        runs = []
        for what, lo, hi, who, at in row["runs"]:
            span = f"{lo}" if hi == lo + 1 else f"{lo}..{hi - 1}"
            words = (f"own KV {span} ok" if what == "own" else f"unwritten {span} !!" if what == "unwritten"
                     else f"request {who}'s KV of position {at}.. at {span} !!")
            runs.append(ContentRun(what, lo, hi, who, at, words))
        out.append(ContentRow(row["index"], row["block_id"], (a, b), runs, a <= p < b, row.get("via")))
    return out


def draw_content(table: dict) -> str:
    """A shadow-KV finding's block table: each block of the request's group with what its
    slots hold against what this request expects there (its own prefix's KV)."""
    lines = [f"   {content_head(table)}:", "     idx  block  tokens        holds"]
    for row in content_rows(table):
        a, b = row.tokens
        mark = "  <-" if row.at_position else ""
        via = f"   ({row.via})" if row.via else ""
        lines.append(f"     {row.index:>3}  {row.block_id:>5}  [{a},{b})".ljust(31)
                     + " | ".join(r.words for r in row.runs) + mark + via)
    return "\n".join(lines)


class LookupKey(NamedTuple):
    """One offload key of a lookup finding: its name (``G:C`` or ``G:b:T``), the tier's answers
    to it in the order asked, when the lookup asked it (1-based, in the call's order), and
    whether the lookup's deferral hung on it."""

    name: str
    answers: tuple
    asked: tuple
    deferred: bool


def lookup_rows(detail: dict) -> list:
    """A lookup finding (its ``lookup_case`` and the real ``queries``) read as rows: per group,
    in the order the lookup walks them (``lookup_groups``), the group's row (spec/lookup_case.py
    ``LookupGroup`` as JSON) and its keys, chunk keys first, then boundary keys by tokens."""
    lk = detail["lookup_case"]["lookup"]
    asked: dict = {}
    for i, q in enumerate((detail.get("real") or {}).get("queries") or (), 1):
        asked.setdefault(q, []).append(i)
    deferred = {d.split()[-1] for d in detail.get("deferred_on") or ()}
    groups = {g["group_idx"]: g for g in lk["groups"]}
    out = []
    for gi in lk.get("lookup_groups") or sorted(groups):
        seen = [k for k in (*lk.get("tier", {}), *asked) if k.split(":", 1)[0] == str(gi)]
        chunks = max([groups[gi]["num_keys"], *(int(k.split(":")[1]) + 1 for k in seen if k.count(":") == 1)])
        names = [f"{gi}:{c}" for c in range(chunks)]
        names += sorted({k for k in seen if k.count(":") == 2}, key=lambda k: int(k.rsplit(":", 1)[1]))
        out.append((groups[gi], [LookupKey(k, tuple(lk.get("tier", {}).get(k, ())), tuple(asked.get(k, ())),
                                           k in deferred) for k in names]))
    return out
