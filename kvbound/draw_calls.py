"""The other calls drawn the way a reviewer thinks, as ``draw.py`` draws a load: a lookup case
(``get_num_new_matched_tokens``) as each group's keys on its own chunk grid with the tier's
answers, the order asked, N, the hit's boundary and the contract's clauses; a store case
(``_build_store_jobs``) as the group's chunks computed, allocated, keyed and stored per release,
with the horizon. ``kvbound explain`` prints them.
"""

from __future__ import annotations

from kvbound.spec import cdiv
from kvbound.spec.lookup import lookup_for_version
from kvbound.spec.lookup_case import LookupCase
from kvbound.spec.lookup_contract import answer_of, best_boundary, check_lookup, needed_chunks
from kvbound.spec.store_case import StoreCase, plan_store, store_rows
from kvbound.spec.versions import LATEST, release_features

from .draw import W, fold

LOOKUP_LEGEND = ("legend  [H] HIT  [P] HIT_PENDING  [R] RETRY  [M] MISS  [·] not in the tier (a MISS)"
                 "  asked: the order the lookup asked  L: being loaded by another request")
STORE_LEGEND = ("legend  computed: [c] every token forwarded  [p] some  [.] none;  [A] allocated  [K] keyed"
                " (its block hash arrived);  [s] stored before the call  [S] stored by it")
_LETTER = {"HIT": "H", "HIT_PENDING": "P", "RETRY": "R", "MISS": "M"}
CLAUSES = (("false_hit", "no false hit"), ("lost_hit", "no lost hit"), ("needless_deferral", "no needless deferral"))


def _row(label: str, cols: list, cell, note: str = "", width: int = 11) -> str:
    cells = "".join(f"{'…' if c is None else cell(c):^{W}}" for c in cols)
    return (f"  {label:<{width}}{cells}".rstrip() + ("   " + note if note else "")).rstrip()


# -- a lookup case ---------------------------------------------------------------------------
def _lookup_group(case: LookupCase, ci: int, res, boundary: int | None, feats) -> str:
    g = case.groups[ci]
    tpc, N = g.tokens_per_chunk, case.num_computed_tokens
    asked: dict = {}
    for i, q in enumerate(res.queries, 1):
        asked.setdefault(q, []).append(str(i))
    named = [int(k.split(":")[1]) for k in (*case.tier, *asked) if k.split(":")[0] == str(g.group_idx) and k.count(":") == 1]
    n = max([g.num_keys, *(c + 1 for c in named)])

    def tier(c):
        got = case.tier.get(f"{g.group_idx}:{c}")
        return "[" + "".join(_LETTER[a.value] for a in got)[:3] + "]" if got else "[·]"

    end = None if boundary is None else cdiv(boundary, tpc)
    marks = {N // tpc, g.num_keys} | ({end - 1} if end else set()) | set(named)
    cols = fold(n + 1, lambda c: tier(c) if c < n else "|", marks)
    head = [f"group {g.group_idx}", g.kind, f"tokens_per_chunk={tpc}", f"num_keys={g.num_keys}"]
    if g.window is not None:
        head.append(f"window={g.window} chunk(s)")
    if g.eagle:
        head.append("EAGLE drafter group")
    lines = ["  ".join(head),
             _row("chunk", cols, lambda c: str(c) if c < n else ""),
             _row("tokens", cols, lambda c: str(c * tpc) if c < n else "", "(each chunk's first token)"),
             _row("tier", cols, lambda c: tier(c) if c < n else "|"),
             _row("asked", cols, lambda c: ",".join(asked.get(f"{g.group_idx}:{c}", []))),
             _row("loading", cols, lambda c: "L" if f"{g.group_idx}:{c}" in case.being_loaded else "")]
    if not any(f"{g.group_idx}:{c}" in case.being_loaded for c in range(n)):
        lines.pop()
    lines.append(_row("N", cols, lambda c: "^" if c == N // tpc else "",
                      f"N={N}" + (" (on the grid)" if N % tpc == 0 else f" inside chunk {N // tpc}")))
    if boundary is not None and boundary > N:
        where = (f"the end of chunk {end - 1}" if boundary % tpc == 0
                 else f"inside chunk {end - 1} [{(end - 1) * tpc}, {end * tpc})")
        need = needed_chunks(case, ci, boundary, feats)
        reads = "cannot support it (under the smallest chunk, past its keys or off a recurrent state's grid)" if need is None \
            else "reads chunks " + ", ".join(f"{c}:{answer_of(case, f'{g.group_idx}:{c}').value}" for c in need)
        lines.append(_row("hit", cols, lambda c: "^" if c == end - 1 else "", f"boundary {boundary}: {where}; {reads}"))
    for k in sorted((k for k in {*case.tier, *asked} if k.startswith(f"{g.group_idx}:b:")),
                    key=lambda k: int(k.rsplit(":", 1)[1])):
        said = ", ".join(a.value for a in case.tier.get(k, ())) or "not in the tier"
        lines.append(f"  boundary key {k}: {said}" + (f"; asked {', '.join(asked[k])}" if k in asked else ""))
    return "\n".join(lines)


def explain_lookup(case: LookupCase, version: str | None = None) -> str:
    version = version or case.release or LATEST
    feats = release_features(version)
    res = lookup_for_version(case, version)
    N = case.num_computed_tokens
    boundary = None if res.hit is None else N + res.hit
    head = (f"lookup case {case.name}: get_num_new_matched_tokens, vLLM {version}  N=num_computed_tokens={N}"
            f"  num_tokens={case.num_tokens}  num_prompt_tokens={case.num_prompt_tokens}"
            f"  tokens_per_hash={case.tokens_per_hash}")
    extra = [f"{k}={getattr(case, k)}" for k in ("mamba_align_size", "max_num_new_tokens", "max_load_tokens",
                                                 "prior_partial_tail_boundary") if getattr(case, k) is not None]
    extra += [k for k in ("transfer_jobs", "skip_reading") if getattr(case, k)]
    parts = [head + ("  " + "  ".join(extra) if extra else ""), LOOKUP_LEGEND]
    parts += [_lookup_group(case, ci, res, boundary, feats) for ci in case.lookup_groups]
    if res.unsupported:
        return "\n\n".join(parts) + f"\n\nvLLM {version}  unsupported: {res.unsupported}"
    said = ("deferred (None): the scheduler asks again at a later step" if res.hit is None
            else f"hit {res.hit} tokens (boundary {boundary})")
    if res.partial_tail_boundary is not None:
        said += f", partial tail at {res.partial_tail_boundary}"
    out = [f"vLLM {version:<8}{said}; asked {', '.join(res.queries) or 'nothing'}"]
    breaches = {b.clause: b for b in check_lookup(case, feats, res.hit, res.partial_tail_boundary)}
    best = best_boundary(case, feats)
    for i, (clause, words) in enumerate(CLAUSES):
        b = breaches.get(clause)
        why = f"✗ {b.message}" if b else "✓ " + {
            "false_hit": "nothing returned" if not res.hit else "every group holds ready the chunks the hit reads",
            "lost_hit": f"the hit is not below the largest boundary every group supports ({best})",
            "needless_deferral": "not deferred" if res.hit is not None else "waiting can give more"}[clause]
        out.append(f"{'contract' if i == 0 else '':<14}{words}: {why}")
    return "\n\n".join(parts) + "\n\n" + "\n".join(out)


# -- a store case ----------------------------------------------------------------------------
def explain_store(case: StoreCase, version: str | None = None) -> str:
    tpc, C = case.tokens_per_chunk, case.num_computed_tokens
    releases = [version] if version else [s.first for s in store_rows()]
    plans = {r: plan_store(case, r) for r in releases}
    labels = {r: r if version else str(next(s for s in store_rows() if s.first == r)) for r in releases}
    lw = max(11, *(len(x) + 1 for x in labels.values()))
    computed = next((p.computed for p in plans.values() if p.computed is not None), C)
    n = max(cdiv(case.num_tokens, tpc), case.num_allocated_chunks, case.num_keyed_chunks,
            *(p.after or 0 for p in plans.values()), case.next_stored_chunk_idx,
            *(p.horizon // tpc + 1 for p in plans.values() if p.horizon is not None))

    def done(c):
        lo, hi = c * tpc, (c + 1) * tpc
        return "[c]" if hi <= computed else "[.]" if lo >= computed else "[p]"

    def stored(p):
        return lambda c: "[s]" if c < p.before else "[S]" if c in p.stored else " · "

    rows = [("computed", done), ("allocated", lambda c: "[A]" if c < case.num_allocated_chunks else " · "),
            ("keyed", lambda c: "[K]" if c < case.num_keyed_chunks else " · ")]
    hz = {p.horizon for p in plans.values() if p.horizon is not None}
    marks = {case.next_stored_chunk_idx, *(p.after for p in plans.values() if p.after is not None),
             *(h // tpc for h in hz)}
    cols = fold(n, lambda c: "".join(f(c) for _, f in rows) + "".join(stored(p)(c) for p in plans.values()), marks)
    extras = [k for k in ("offload_prompt_only", "drafter", "refused") if getattr(case, k)]
    extras += [f"{k}={getattr(case, k)}" for k in ("max_offload_tokens", "num_output_placeholders", "num_draft_tokens",
                                                   "num_lookahead_tokens") if getattr(case, k)]
    head = (f"store case {case.name}: _build_store_jobs on vLLM {case.release}, a {case.status} request"
            f" ({case.scheduler} scheduling)  P=num_prompt_tokens={case.num_prompt_tokens}"
            f"  T=num_tokens={case.num_tokens}  C=num_computed_tokens={C}"
            f"  S=num_scheduled_tokens={case.num_scheduled_tokens}  tokens_per_chunk={tpc}"
            f" ({case.tokens_per_block} x {case.blocks_per_chunk})" + ("  " + "  ".join(extras) if extras else ""))
    lines = [_row("chunk", cols, str, "", lw), _row("tokens", cols, lambda c: str(c * tpc), "(each chunk's first token)", lw),
             _row("computed", cols, done, f"{computed} tokens forwarded once the batch ran", lw),
             _row("allocated", cols, rows[1][1], f"{case.num_allocated_chunks} chunk(s) allocated", lw),
             _row("keyed", cols, rows[2][1], f"{case.num_keyed_chunks} keyed (len(offload_keys))", lw)]
    for h in sorted(hz):
        lines.append(_row("horizon", cols, lambda c: "^" if c == h // tpc else "",
                          f"horizon {h} tokens: {h // tpc} whole chunk(s) below it"
                          + ("" if len(hz) == 1 else f" ({', '.join(labels[r] for r, p in plans.items() if p.horizon == h)})"),
                          lw))
    verdicts = []
    if case.next_stored_chunk_idx_after is not None:
        own = plan_store(case)
        verdicts.append(f"observed on {case.release}: next_stored_chunk_idx {case.next_stored_chunk_idx} -> "
                        f"{case.next_stored_chunk_idx_after}" + (" ✓ the spec agrees" if own.after == case.next_stored_chunk_idx_after
                                                               else f" ✗ the spec of {case.release} says {own.after}"))
    for r, p in plans.items():
        label = labels[r]
        if p.after is None:
            lines.append(f"  {label:<{lw}}{p.outcome}: {p.reason}")
            continue
        ok = p.within_computed(tpc)
        what = (f"next_stored_chunk_idx {p.before} -> {p.after}: "
                + (("stores chunk " + str(p.stored[0]) if len(p.stored) == 1 else
                    f"stores chunks {p.stored[0]}..{p.stored[-1]}") if p.stored else "stores nothing")
                + (" ✓ within the computed tokens" if ok else f" ✗ chunk {p.stored[-1]} ends at {p.after * tpc}"
                   f" > {p.computed} computed"))
        if p.reason:
            what += f" ({p.reason})"
        lines.append(_row(label, cols, stored(p), what, lw))
    return "\n\n".join([head, STORE_LEGEND, "\n".join(lines)] + (["\n".join(verdicts)] if verdicts else []))

