"""The safe-load property: on every hybrid model, the release's plan is safe for every group.

No assert fires, exactly the fresh blocks are loaded (no null block, no computed block written)
and only keys inside the lookup's range are requested — for every mix of group kinds and block
sizes at once (``hybrid.HybridWorld``, up to ``hybrid.GROUPS`` groups, each table meeting its
kind's premises). Refuted for 0.28 – 0.29 (the PR's shape) and 0.30 (retained windows), proved
for 0.31 – 0.33.
"""

from __future__ import annotations

from kvbound.spec import AssertName, GroupKind, Variant, cdiv, plan_load
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import LATEST

from .hybrid import GROUPS, HybridWorld, safe_parts
from .problem import CODE_030, CODE_031, CODE_033, CODE_LEGACY, FIXED_LAST_RELEASE, LEGACY_LAST_RELEASE, Bound, Obligation, Problem
from .replays import replay_window_retained
from .terms import AND, NOT


def _safe_load(oid: str):
    """The release's plan on a whole hybrid model (proofs/hybrid.py): no assert, exactly the
    fresh blocks, keys inside the lookup's range — for every group at once."""

    def build(code):
        w = HybridWorld()
        out = w.plan(code)
        prem = w.base() + ([] if code.sync_loads else [NOT(w.sync_load)])  # sync loads: 0.33+
        if not code.eagle_margins:  # EAGLE groups key partial tails past the boundary from 0.33
            prem.append(w.slots[0].margin == 0)
        parts = safe_parts(w, out)
        legacy = code.variant is Variant.LEGACY
        # one split per conjunct (their negations cover ¬claim): Z3 settles each at once
        return Problem(prem, AND(*parts), w, constraints=out.constraints,
                       shaping=w.pr_shape() if legacy else w.retained_window_shape(),
                       witness=lambda m: w.to_case(m, f"witness-{oid}"),
                       splits=tuple(NOT(p) for p in parts),
                       # non-vacuous in each branch: a partial tail or not, each kind of group 0, several groups
                       cases=(w.tail, NOT(w.tail), w.n >= 2,
                              *[w.slots[0].kind == c for c in range(4)],
                              *([w.sync_load] if code.sync_loads else [])))

    return build


def _replay_pr_shape(case):
    """The legacy witness fires the boundary assert in a Mamba group that keeps a non-null
    unhashed block below f (the PR's shape), and the fix plans it safely."""
    legacy = plan_load(case, Variant.LEGACY)
    if legacy.ok or legacy.assertion.name is not AssertName.BOUNDARY:
        return f"spec legacy gives {legacy.assertion.name.value if legacy.assertion else 'ok'}, expected boundary"
    g = case.groups[legacy.assertion.group_index]
    b = g.config.tokens_per_block
    f = cdiv(case.num_locally_computed_tokens, b)
    if g.config.kind is not GroupKind.MAMBA or not any(blk.state.value == "U" for blk in g.blocks[:f]):
        return "the failing group is not a recurrent group with an unhashed block below f"
    for v in (Variant.FIXED, Variant.FIXED_SYNC):
        if not plan_load(case, v).ok:
            return f"the fix ({v.value}) fails on the witness too"
    return None


HYBRID = ("table-covers-load", "n-aligned", "fresh-after-nulls", "computed-hashed", "computed-cached",
          "window-skipped-null",
          "chunk-skipped-null", "mamba-one-state-block", "keys-cover-hit", "partial-tail-lookup")
HYBRID_BOUND = Bound(GROUPS, None, "unbounded (tokens_per_block per group, blocks_per_chunk, N, M, windows)",
                     f"a model of up to {GROUPS} groups of symbolic kinds (slots unrolled: the LCM rule has no closed "
                     "form over a symbolic count); the claim is stated for its group 0, which is any group w.l.o.g. "
                     "(the plan carries no state from one group to the next); the others enter through the LCM rule "
                     "(N) and the lookup (T ≤ every group's keys·tpc)")
SAFE_MATH = ("∀ n ≤ G groups, kinds, b_g, bpc, N = q·unit (b_g | unit), M, tail?, tables meeting their kind's "
             "premises:  ∀ g < n: no assert ∧ start_g = j_g ∧ pending_g = |blocks_g[start_g:k_g]| ∧ "
             "∀ i ∈ [start_g, k_g): state ≠ null ∧ ⌊N/tpc_g⌋ ≤ chunk keys_g < ⌈T/tpc_g⌉ − tail ∧ "
             "(tail ⟹ one boundary key at B + margin_g)")

OBLIGATIONS: list[Obligation] = [
    Obligation(
        "safe-load.fixed",
        "0.31 – 0.32's plan is safe on every hybrid model: for every group (mixed kinds and block sizes, N rounded by "
        "the scheduler's LCM rule, M as the lookup returns it, a partial tail or not, tables as the allocator "
        "builds them) no assert fires, exactly the fresh blocks are loaded (no null block, no computed block "
        "written), and only keys inside the lookup's range are requested (a partial tail's boundary key at the "
        "position the lookup confirmed).",
        SAFE_MATH, "every premise of every group's kind; the LCM rule", Verdict.PROVED, _safe_load("safe-load.fixed"), CODE_031,
        bound=HYBRID_BOUND, premises=HYBRID, last=FIXED_LAST_RELEASE),
    Obligation(
        "safe-load.fixed.0.30",
        "0.30's plan (the fixed scan, but a window in chunks of cdiv(w, tpc) that does not count "
        "extra_retained_tokens) is not safe on every hybrid model: a sliding-window group of a multi-module MTP "
        "deployment (extra_retained_tokens = num_speculative_tokens - 1), on a table the allocator builds (its "
        "get_num_skipped_tokens keeps the retained tokens' blocks), fires the window assert; 0.31 counts them. "
        "On a lookup whose T is a whole number of chunks this needs extra_retained_tokens >= tokens_per_block + 2 "
        "(w a multiple of the block size, one block per chunk).",
        SAFE_MATH.replace("∀ n", "¬ ∀ n"), "the window in chunks counts extra_retained_tokens (0.31+)", Verdict.REFUTED,
        _safe_load("safe-load.fixed.0.30"), CODE_030, reproduce=replay_window_retained, mutable=False,
        bound=HYBRID_BOUND, premises=HYBRID),
    Obligation(
        "safe-load.fixed-sync",
        "0.33's plan (sync loads match by position) is safe on every hybrid model, sync or async load, partial "
        "tails with EAGLE proof margins included: the same claim as safe-load.fixed.",
        SAFE_MATH, "every premise of every group's kind; the LCM rule", Verdict.PROVED, _safe_load("safe-load.fixed-sync"), CODE_033, bound=HYBRID_BOUND, premises=HYBRID, last=LATEST),
    Obligation(
        "safe-load.legacy",
        "0.29's plan is not safe on hybrid models: a recurrent group that keeps its state block below f (the "
        "PR's shape, which the allocator premises admit) fires the boundary assert.",
        SAFE_MATH.replace("∀ n", "¬ ∀ n"), "the scan starts at f (0.29 scans from 0)", Verdict.REFUTED,
        _safe_load("safe-load.legacy"), CODE_LEGACY, reproduce=_replay_pr_shape, mutable=False, bound=HYBRID_BOUND,
        premises=HYBRID, last=LEGACY_LAST_RELEASE),
]
