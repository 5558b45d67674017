"""The property of one group's plan: the scan and its asserts, group by group.

The load plan loops over groups with no state carried from one to the next, so each claim here
is about one group (``world.World``; ``world.TailWorld`` for a partial tail) and holds for each:
where the scan starts (boundary, null skip, the sync rule), what it loads (destinations, the
window bounds), which keys it requests, and which assert fires first. The whole hybrid model is
``safe_load``'s. Each obligation's builder, its spec replay and its ``Obligation`` entry are here,
but a partial tail's (``partial_tail``, listed here in its place).
"""

from __future__ import annotations

import z3

from kvbound.spec import STATE_H, STATE_N, STATE_U, AssertName, GroupKind, Variant, plan_load
from kvbound.spec.asserts import ASSERT_CODE
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import LATEST

from . import partial_tail
from .encoding import code_for
from .problem import CODE_030, CODE_031, CODE_033, CODE_LEGACY, FIXED_LAST_RELEASE, LEGACY_LAST_RELEASE, Obligation, Problem
from .replays import replay_assert, replay_window_retained
from .terms import AND, FLOORDIV, IMPLIES, NOT, OR
from .world import World


def _group_plan(plan, gi=0):
    return plan.groups[gi] if len(plan.groups) > gi else None


def _boundary(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    return Problem(w.base(), w.N <= p.start * w.b, w, constraints=p.constraints)


def _fixed_subsumes(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    return Problem(w.base() + [w.aligned()], w.N <= p.start * w.b, w, constraints=p.constraints)


def _fixed_subsumes_converse(code):
    w = World(GroupKind.FULL_ATTENTION)
    p = w.plan(code)
    return Problem(w.base() + [w.N <= p.start * w.b], w.aligned(), w, constraints=p.constraints,
                   witness=lambda m: w.to_case(m, "witness-fixed-assert-subsumes-legacy.converse"),
                   shaping=w.small())


def _replay_converse(case):
    err = replay_assert(Variant.FIXED, AssertName.ALIGNMENT)(case)
    if err:
        return err
    g = _group_plan(plan_load(case, Variant.FIXED, asserts=False))
    b = case.groups[0].config.tokens_per_block
    if not case.num_locally_computed_tokens <= g.load_start_gpu_block_idx * b:
        return "the legacy assert would fail too on the fixed start"
    return None


def _recurrent_below_f(w):
    t = w.table
    i = z3.Int("i_unhashed")
    return [0 <= i, i < w.f, t.state(i) == STATE_U]


def _legacy_refuted(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    prem = w.base() + [NOT(w.sync_load), w.j < w.k] + _recurrent_below_f(w)
    return Problem(prem, w.N <= p.start * w.b, w, constraints=p.constraints,
                   witness=lambda m: w.to_case(m, "witness-legacy-refuted"), shaping=w.small())


def _legacy_full_attention(code):
    w = World(GroupKind.FULL_ATTENTION)
    legacy, fixed = w.plan(code_for(LEGACY_LAST_RELEASE), "L"), w.plan(code, "F")
    t = w.table
    prem = w.base() + [t.forall(0, w.f, lambda i: t.state(i) == STATE_H)]
    return Problem(prem, legacy.start == fixed.start, w, constraints=legacy.constraints + fixed.constraints)


def _legacy_agrees_when_passing(code):
    w = World(GroupKind.MAMBA)
    legacy, fixed = w.plan(code_for(LEGACY_LAST_RELEASE), "L"), w.plan(code, "F")
    prem = w.base() + [w.aligned(), w.N <= legacy.start * w.b]
    return Problem(prem, legacy.start == fixed.start, w, constraints=legacy.constraints + fixed.constraints)


def _legacy_without_asserts(code):
    w = World(GroupKind.MAMBA)
    legacy, fixed = w.plan(code_for(LEGACY_LAST_RELEASE, asserts=False), "L"), w.plan(code, "F")
    prem = w.base() + [NOT(w.sync_load), w.j < w.k] + _recurrent_below_f(w)
    claim = OR(legacy.start >= w.f, legacy.start_chunk == fixed.start_chunk)
    return Problem(prem, claim, w, constraints=legacy.constraints + fixed.constraints, witness=lambda m: w.to_case(m, "witness-legacy-without-asserts"),
                   shaping=w.small())


def _replay_without_asserts(case):
    legacy = plan_load(case, Variant.LEGACY, asserts=False)
    fixed = plan_load(case, Variant.FIXED)
    if not legacy.ok or not fixed.ok:
        return "both plans should complete under python -O / the fix"
    g = legacy.groups[0]
    if g.load_start_gpu_block_idx >= g.first_fresh_gpu_block_idx:
        return "legacy -O does not load below the computed boundary"
    if legacy.keys == fixed.keys:
        return "legacy -O requests the same keys as the fix"
    return None


def _null_skip_needed(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code.mutate(no_scan=True))  # the variant start = f, no loop
    t = w.table
    prem = w.base() + [NOT(w.sync_load), w.j < w.k]
    claim = t.forall(p.start, w.k, lambda i: t.state(i) != STATE_N)
    return Problem(prem, claim, w, constraints=p.constraints, witness=lambda m: w.to_case(m, "witness-null-skip-needed"),
                   shaping=w.small())


def _replay_null_skip(case):
    g = _group_plan(plan_load(case, Variant.FIXED))
    if g is None:
        return "the fixed plan fails on the witness"
    blocks = case.groups[0].blocks
    f = g.first_fresh_gpu_block_idx
    if 0 in g.dst_block_ids:
        return "the fixed scan writes the null block too"
    if not (f < g.num_gpu_blocks and blocks[f].is_null):
        return "start = f does not land on a null block"
    return None


def _null_skip_fixed(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    t = w.table
    return Problem(w.base(), t.forall(p.start, w.k, lambda i: t.state(i) != STATE_N), w, constraints=p.constraints)


def _destinations_exact(code):
    w = World(GroupKind.SLIDING_WINDOW)
    p = w.plan(code)
    t = w.table
    prem = w.base() + ([] if code.sync_loads else [NOT(w.sync_load)])  # sync loads: 0.33+
    claim = AND(p.start == w.j, p.pending == p.dst_len,
                OR(w.sync_load, t.forall(p.start, w.k, lambda i: t.state(i) != STATE_H)))
    return Problem(prem, claim, w, constraints=p.constraints)


def _keys_in_range(code):
    """The lookup (``_lookup_complete_chunks``) confirms chunks [N // tpc, cdiv(T, tpc)):
    it starts at ``start_chunk_idx = N // tpc`` and its hit T is capped at keys·tpc."""
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    lookup_start, lookup_end = FLOORDIV(w.N, w.tpc), FLOORDIV(w.T + w.tpc - 1, w.tpc)
    claim = OR(p.pending == 0, AND(lookup_start <= p.start_chunk, p.start_chunk < p.end_chunk,
                                   p.end_chunk == lookup_end))
    return Problem(w.base(), claim, w, constraints=p.constraints)


def _keys_from_lookup_start(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    return Problem(w.base(), p.start_chunk >= FLOORDIV(w.N, w.tpc), w, constraints=p.constraints)


def _keys_count(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    prem = w.base() + [p.pending > 0, w.num_keys >= p.end_chunk_wanted]
    want = FLOORDIV(p.pending + p.start % w.bpc + w.bpc - 1, w.bpc)
    return Problem(prem, p.end_chunk - p.start_chunk == want, w, constraints=p.constraints)


def _window_bound(code):
    w = World(GroupKind.SLIDING_WINDOW)
    p = w.plan(code)
    t = w.table
    below_f = t.forall(0, w.f, lambda i: t.state(i) != STATE_U)  # local blocks: hashed, or null when skipped
    prem = w.base() + [below_f, NOT(w.sync_load)]
    return Problem(prem, p.pending <= w.window * w.bpc + code.window_slack, w, constraints=p.constraints,
                   witness=lambda m: w.to_case(m, "witness-window-bound"), shaping=w.small(max_len=8))


def _window_nulls(kind):
    """pending <= window*bpc + 1 once the blocks the window's manager skips are null."""

    def build(code):
        w = World(kind)
        p = w.plan(code)
        window_ok = dict(p.checks).get(ASSERT_CODE[AssertName.WINDOW_BOUND], True)  # the assert, as encoded
        return Problem(w.base() + [NOT(w.sync_load)], window_ok, w, constraints=p.constraints)

    return build


def _fixed_sync(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    t = w.table
    claim = AND(t.forall(w.f, p.start, lambda i: t.state(i) == STATE_N),
                OR(p.start == w.k, AND(p.start >= w.f, p.start < w.k, t.state(p.start) != STATE_N)))
    return Problem(w.base() + [w.sync_load], claim, w, constraints=p.constraints)


def _fixed_sync_needed(code):
    w = World(GroupKind.FULL_ATTENTION)
    p = w.plan(code)  # the 0.30 - 0.32 scan, which matches unhashed blocks only
    prem = w.base() + [w.sync_load, w.j < w.k]
    return Problem(prem, p.start == w.j, w, constraints=p.constraints,
                   witness=lambda m: w.to_case(m, "witness-fixed-sync.needed", sync_load=True),
                   # shaped so vLLM 0.33's own lookup reserves the sync load (kvbound conform drives it):
                   # a hit of whole chunks, at least one, ending before the prompt does
                   shaping=w.small() + [w.T % w.tpc == 0, w.M >= w.tpc, w.num_keys * w.tpc > w.T])


def _replay_sync_needed(case):
    fixed, sync = plan_load(case, Variant.FIXED), plan_load(case, Variant.FIXED_SYNC)
    if not (fixed.ok and sync.ok):
        return "both plans should complete"
    if fixed.group_sizes == sync.group_sizes:
        return "the fixed scan loads the sync-hashed blocks anyway"
    return None


def _assert_order(code):
    w = World(GroupKind.SLIDING_WINDOW)
    p = w.plan(code)
    return Problem(w.base() + [w.N % w.b != 0], p.fails_with(ASSERT_CODE[AssertName.ALIGNMENT]), w, constraints=p.constraints)


def _legacy_guarded(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    return Problem(w.base(), IMPLIES(p.passes(), p.start >= w.f), w, constraints=p.constraints)


def _keys_from_all_tokens(code):
    """Keys exist for the hashes of all num_tokens (request.block_hashes covers every token,
    update_offload_keys); the lookup caps T at keys·tpc. (n // tph) // (tpc // tph) = n // tpc."""
    w = World(GroupKind.FULL_ATTENTION)
    p = w.plan(code)
    prompt, tokens = z3.Int("num_prompt_tokens"), z3.Int("num_tokens")
    counted = prompt if code.knobs.keys_from_prompt else tokens
    all_keys = FLOORDIV(tokens, w.tpc)
    prem = w.base() + [prompt >= 1, tokens >= prompt, w.num_keys == FLOORDIV(counted, w.tpc),
                       w.T <= all_keys * w.tpc]
    return Problem(prem, OR(p.pending == 0, w.num_keys >= p.end_chunk_wanted), w, constraints=p.constraints)


def _window_retained_before_031(code):
    """0.28-0.30: the allocator retains extra_retained_tokens below the window, the connector's
    window in chunks does not count them (cdiv(w, tpc))."""
    w = World(GroupKind.SLIDING_WINDOW)
    p = w.plan(code)  # 0.28 - 0.30: the window in chunks is cdiv(w, tpc)
    window_ok = dict(p.checks)[ASSERT_CODE[AssertName.WINDOW_BOUND]]
    return Problem(w.base() + [NOT(w.sync_load)], window_ok, w, constraints=p.constraints,
                   witness=lambda m: w.to_case(m, "witness-window-bound.retained-before-0.31"),
                   shaping=w.small(max_len=8, max_tokens=128) + [w.b == 16, w.bpc == 1, w.extra >= 1, w.extra <= 3,
                                                                 w.span % 16 == 0, w.span <= 32])


def _start_is_fresh(code):
    w = World(GroupKind.MAMBA)
    p = w.plan(code)
    t = w.table
    return Problem(w.base() + [NOT(w.sync_load)], OR(p.start == w.k, t.state(p.start) == STATE_U), w, constraints=p.constraints)


ALLOC = ("n-aligned", "fresh-after-nulls")  # what the allocator and the scheduler's rounding give every group

OBLIGATIONS: list[Obligation] = [
    Obligation(
        "boundary",
        "The fixed scan never starts below the computed tokens: N <= start*b, for any table.",
        "∀ table, N ≥ 0, M ≥ 1, b ≥ 1:  start = min{i ∈ [⌈N/b⌉, k) : P(i)} ∪ {k}  ⟹  N ≤ start·b",
        "the scan starts at f = cdiv(N, b)", Verdict.PROVED, _boundary, CODE_030, last=LATEST),
    Obligation(
        "fixed-assert-subsumes-legacy",
        "Whenever the fixed code passes its alignment assert, the legacy assert holds on its start.",
        "N mod b = 0 ∧ start = scan_fixed  ⟹  N ≤ start·b",
        "the scan starts at f = cdiv(N, b)", Verdict.PROVED, _fixed_subsumes, CODE_030, last=LATEST),
    Obligation(
        "fixed-assert-subsumes-legacy.converse",
        "The converse fails: the legacy assert can hold where the alignment assert fires.",
        "¬(N ≤ start·b  ⟹  N mod b = 0)",
        "the scheduler's rounding of N (without it N may be unaligned)", Verdict.REFUTED, _fixed_subsumes_converse, CODE_030,
        reproduce=_replay_converse, mutable=False),
    Obligation(
        "legacy-refuted",
        "The legacy scan fires its boundary assert on a recurrent table with a non-null unhashed block below f.",
        "∃ table, i < f: state(i) = U ∧ N mod b = 0 ∧ N > scan_legacy·b",
        "a recurrent group keeps its state block below f", Verdict.REFUTED, _legacy_refuted, CODE_LEGACY,
        reproduce=replay_assert(Variant.LEGACY, AssertName.BOUNDARY), mutable=False, premises=ALLOC, last=LEGACY_LAST_RELEASE),
    Obligation(
        "legacy-refuted.full-attention",
        "On full-attention tables (every block below f hashed) legacy and fixed scans agree.",
        "(∀ i < f: state(i) = H)  ⟹  scan_legacy = scan_fixed",
        "full attention: every block below f is full and cached", Verdict.PROVED, _legacy_full_attention, CODE_030,
        premises=("computed-hashed",), last=FIXED_LAST_RELEASE),
    Obligation(
        "legacy-refuted.agrees-when-passing",
        "Under alignment, whenever the legacy assert passes, legacy and fixed give the same start.",
        "N mod b = 0 ∧ N ≤ scan_legacy·b  ⟹  scan_legacy = scan_fixed",
        "the scheduler's rounding of N", Verdict.PROVED, _legacy_agrees_when_passing, CODE_030, premises=("n-aligned",), last=FIXED_LAST_RELEASE),
    Obligation(
        "legacy-without-asserts",
        "With asserts stripped (python -O) the legacy plan loads into a computed block and requests wrong keys.",
        "∃ table: scan_legacy < f ∧ scan_legacy // bpc ≠ scan_fixed // bpc",
        "a recurrent group keeps its state block below f", Verdict.REFUTED, _legacy_without_asserts, CODE_030,
        reproduce=_replay_without_asserts, mutable=False, premises=ALLOC),
    Obligation(
        "null-skip-needed",
        "The variant start = f writes into the shared null block.",
        "∃ allocator table: ∃ i ∈ [f, k): state(i) = null",
        "the scan skips null blocks", Verdict.REFUTED, _null_skip_needed, CODE_030,
        reproduce=_replay_null_skip, mutable=False, about=CODE_030.mutate(no_scan=True), premises=ALLOC),
    Obligation(
        "null-skip-needed.fixed",
        "The fixed scan never targets the null block when [f, k) is nulls then fresh blocks.",
        "[f, j) null ∧ [j, k) fresh  ⟹  ∀ i ∈ [start, k): state(i) ≠ null",
        "the allocator puts nulls before fresh blocks", Verdict.PROVED, _null_skip_fixed, CODE_030, premises=ALLOC, last=LATEST),
    Obligation(
        "destinations-exact",
        "Under the allocator precondition the destinations are exactly the fresh blocks, no hashed block is "
        "overwritten, and the group size equals the number of destinations.",
        "[f, j) null ∧ [j, k) fresh  ⟹  start = j ∧ pending = |blocks[start:k]| ∧ (sync ∨ ∀ i ∈ [start, k): state(i) ≠ H)",
        "the allocator puts nulls before fresh blocks", Verdict.PROVED, _destinations_exact, CODE_030, premises=ALLOC, last=LATEST),
    Obligation(
        "keys-in-lookup-range",
        "A group that loads requests exactly the chunks from its load start's chunk to the end of the range "
        "the lookup confirmed, [N // tpc, cdiv(T, tpc)) (the lookup starts at chunk N // tpc and caps T at "
        "keys·tpc): no key before the lookup's start, none past its end, none of its tail left out.",
        "keys·tpc ≥ T ∧ pending > 0  ⟹  ⌊N/tpc⌋ ≤ start_chunk < end_chunk = ⌈T/tpc⌉",
        "the scan starts at f = cdiv(N, b); the lookup caps T at keys·tpc", Verdict.PROVED, _keys_in_range, CODE_030,
        premises=("keys-cover-hit",), last=LATEST),
    Obligation(
        "keys-from-lookup-start",
        "The first requested key is at or after the chunk the lookup started from: start // bpc >= N // tpc.",
        "⌊start/bpc⌋ ≥ ⌊N/(b·bpc)⌋",
        "the scan starts at f = cdiv(N, b)", Verdict.PROVED, _keys_from_lookup_start, CODE_030, last=LATEST),
    Obligation(
        "keys-count-matches-worker",
        "Per group the key count equals cdiv(pending + start % bpc, bpc), as vLLM's worker requires.",
        "pending > 0 ∧ keys ≥ ⌈T/tpc⌉  ⟹  end_chunk − start_chunk = ⌈(pending + start mod bpc)/bpc⌉",
        "keys are chunks [start // bpc, cdiv(T, tpc))", Verdict.PROVED, _keys_count, CODE_030, last=LATEST),
    Obligation(
        "window-bound",
        "The allocator shape alone does not bound a windowed group's pending blocks by window*bpc + 1.",
        "∃ allocator table: pending > window_in_chunks·bpc + 1",
        "the window's skipped blocks are null", Verdict.REFUTED, _window_bound, CODE_030,
        reproduce=replay_assert(Variant.FIXED, AssertName.WINDOW_BOUND), mutable=False, premises=ALLOC),
    Obligation(
        "window-bound.window-nulls",
        "A sliding-window group whose blocks before the window are null (SlidingWindowManager skips "
        "T - w + 1 - extra_retained_tokens tokens) has pending <= window_in_chunks*bpc + 1, with 0.33's "
        "window in chunks max(cdiv(w, tpc), cdiv(w - 1 + extra, tpc)).",
        "[0, ⌊max(0, T−w+1−extra)/b⌋) null ∧ [f, j) null ∧ [j, k) fresh  ⟹  pending ≤ window·bpc + 1",
        "the window's skipped blocks are null", Verdict.PROVED, _window_nulls(GroupKind.SLIDING_WINDOW), CODE_031,
        premises=ALLOC + ("window-skipped-null",), last=LATEST),
    Obligation(
        "window-bound.retained-before-0.31",
        "On allocator-built tables of a sliding window with extra_retained_tokens (multi-module MTP), 0.30's "
        "window assert can fire (0.28 - 0.29 count the window the same way): the allocator keeps the retained tokens' blocks, the connector's window "
        "(cdiv(w, tpc)) does not count them; 0.31 counts them. Whether 0.28 - 0.30's lookup returns such a T "
        "is not modelled here (its T is a chunk multiple or num_tokens - 1, and the gap then needs "
        "extra_retained_tokens comparable to a block).",
        "∃ allocator table, extra > 0: pending > ⌈w/tpc⌉·bpc + 1",
        "the window in chunks counts extra_retained_tokens (0.31+)", Verdict.REFUTED, _window_retained_before_031, CODE_030, reproduce=replay_window_retained, mutable=False, 
        premises=ALLOC + ("window-skipped-null",)),
    Obligation(
        "window-bound.chunked-local",
        "A chunked-local group whose blocks before T's chunk are null has pending <= window_in_chunks*bpc + 1.",
        "[0, ⌊⌊T/c⌋·c/b⌋) null ∧ [f, j) null ∧ [j, k) fresh  ⟹  pending ≤ ⌈c/tpc⌉·bpc + 1",
        "the chunks before T's chunk are null", Verdict.PROVED, _window_nulls(GroupKind.CHUNKED_LOCAL), CODE_030,
        premises=ALLOC + ("chunk-skipped-null",), last=LATEST),
    Obligation(
        "window-bound.mamba",
        "A Mamba group in align mode (one fresh state block after nulls) has pending <= bpc + 1.",
        "[f, k−1) null ∧ [k−1, k) fresh  ⟹  pending ≤ 1·bpc + 1",
        "Mamba align mode allocates one state block", Verdict.PROVED, _window_nulls(GroupKind.MAMBA), CODE_030,
        premises=ALLOC + ("mamba-one-state-block",), last=LATEST),
    Obligation(
        "fixed-sync",
        "A sync load matches by position: the load starts at the first non-null block at or after f.",
        "sync  ⟹  (∀ i ∈ [f, start): state(i) = null) ∧ (start = k ∨ state(start) ≠ null)",
        "0.33 hashes sync-loaded blocks at allocation", Verdict.PROVED, _fixed_sync, CODE_033, last=LATEST),
    Obligation(
        "fixed-sync.needed",
        "Without the positional match, a sync load (fresh blocks hashed at allocation) loads nothing.",
        "∃ sync allocator table: scan_fixed ≠ j",
        "0.33 hashes sync-loaded blocks at allocation", Verdict.REFUTED, _fixed_sync_needed, code_for(FIXED_LAST_RELEASE),
        reproduce=_replay_sync_needed, mutable=False, premises=ALLOC),
    Obligation(
        "assert-order",
        "An unaligned N is reported as the alignment assert (the first after table_length), whatever the "
        "window bound would say: vLLM's assert order per group.",
        "len ≥ k ∧ N mod b ≠ 0  ⟹  the first assert to fire is alignment",
        "the asserts run in vLLM's order: table_length, alignment, window_bound, keys_length", Verdict.PROVED,
        _assert_order, CODE_030, last=LATEST),
    Obligation(
        "legacy-guarded",
        "0.29's boundary assert guards every load: whenever the legacy plan passes, it starts at or after f "
        "(so the PR's bug is a crash, never a silent wrong load, with asserts on).",
        "N mod b = 0 ∧ the legacy plan passes  ⟹  start ≥ f",
        "the scheduler's rounding of N", Verdict.PROVED, _legacy_guarded, CODE_LEGACY, premises=("n-aligned",), last=LEGACY_LAST_RELEASE),
    Obligation(
        "keys-from-all-tokens",
        "Offload keys are counted from all num_tokens (a resumed request's output tokens included), so a load "
        "the lookup returned never fires keys_length, however far T runs past the prompt.",
        "keys = ⌊num_tokens/tpc⌋ ∧ T ≤ keys·tpc ∧ pending > 0  ⟹  keys ≥ ⌈T/tpc⌉",
        "request.block_hashes covers every token; the lookup caps T at keys·tpc", Verdict.PROVED, _keys_from_all_tokens, CODE_030, last=LATEST),
    *partial_tail.OBLIGATIONS,
    Obligation(
        "load-start-is-fresh",
        "The fixed scan (not a sync load) starts at a non-null unhashed block, or loads nothing.",
        "¬sync  ⟹  start = k ∨ state(start) = U",
        "the scan requires block_hash is None", Verdict.PROVED, _start_is_fresh, CODE_030, last=LATEST),
]
