"""The partial-tail claims of one group's plan (part of the property ``group_plan``).

A partial tail (0.33+: ``world.TailWorld``) loads the chunks below the boundary's chunk plus one
boundary key, at the position the lookup confirmed; the request-level ``partial_tail`` assert
cannot fire on the lookup's answer and stops any other. Each obligation's builder, its spec replay
and its ``Obligation`` entry are here; ``group_plan.OBLIGATIONS`` lists them in its order.
"""

from __future__ import annotations

from kvbound.spec import STATE_N, AssertName, GroupKind, Variant, plan_load
from kvbound.spec.asserts import ASSERT_CODE
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import LATEST

from .problem import CODE_033, Obligation, Problem
from .terms import AND, FLOORDIV, IMPLIES, NOT
from .world import TailWorld


def _partial_tail_loads(kind):
    """A partial tail loads the chunks below the boundary's chunk plus one boundary key, at the
    position the lookup confirmed (``_lookup_partial_tail`` keys boundary + margin with the same
    ``_partial_tail_key_tokens``), no null block, within [f, k)."""

    def build(code):
        w = TailWorld(kind)
        p = w.plan(code)
        t = w.table
        lookup_key_tokens = w.boundary + w.margin  # 0.33 scheduler.py:1154-1158, as the lookup used it
        parts = [p.passes(), p.start == w.j, p.start >= w.f,
                 t.forall(p.start, p.k, lambda i: t.state(i) != STATE_N),
                 IMPLIES(p.pending > 0, AND(
                     p.start_chunk >= FLOORDIV(w.N, w.tpc), p.end_chunk == p.k - 1,
                     p.has_boundary_key, p.key_tokens == lookup_key_tokens))]
        # one split per conjunct (their negations cover ¬claim): each settles at once, whatever Z3
        # built earlier in the process (one search over the whole claim can wander past the timeout)
        return Problem(w.base(), AND(*parts), w, constraints=p.constraints, splits=tuple(NOT(x) for x in parts))

    return build


def _partial_tail_assert_holds(code):
    w = TailWorld(GroupKind.MAMBA)
    p = w.plan(code)
    return Problem(w.base(), NOT(p.fails_with(ASSERT_CODE[AssertName.PARTIAL_TAIL])), w, constraints=p.constraints)


def _partial_tail_guard(code):
    w = TailWorld(GroupKind.MAMBA)
    p = w.plan(code)
    prem = w.base() + [w.boundary != w.T]
    return Problem(prem, p.fails_with(ASSERT_CODE[AssertName.PARTIAL_TAIL]), w, constraints=p.constraints)


def _partial_tail_chunk_needed(code):
    w = TailWorld(GroupKind.FULL_ATTENTION)
    p = w.plan(code.mutate(tail_chunk_dropped=False))  # keeps the boundary's chunk as a chunk key
    prem = w.base() + [NOT(w.eagle), NOT(w.sync_load)]
    return Problem(prem, NOT(p.fails_with(ASSERT_CODE[AssertName.KEYS_LENGTH])), w, constraints=p.constraints,
                   witness=lambda m: w.to_case(m, "witness-partial-tail.boundary-chunk-dropped"),
                   shaping=w.small() + [w.N == 0, w.b == 16, w.tph == 4, w.j == w.f])


def _replay_tail_chunk(case):
    plan = plan_load(case, Variant.FIXED_SYNC)
    if not plan.ok:
        return f"spec fixed-sync fails on the witness: {plan.assertion.name.value}"
    if not any(len(k) == 3 for k in plan.keys):
        return "the spec's plan has no boundary key"
    return None


TAIL = ("n-aligned", "fresh-after-nulls", "keys-cover-hit", "partial-tail-lookup")

OBLIGATIONS: list[Obligation] = [
    Obligation(
        "partial-tail.full-attention",
        "A partial tail on a full-attention group (an EAGLE group included) loads exactly the fresh blocks, "
        "no null block, within [f, k); its keys are the chunks below the boundary's chunk plus one boundary key, "
        "at the token position the lookup confirmed (boundary + the EAGLE proof margin).",
        "tail lookup ∧ allocator  ⟹  no assert ∧ start = j ≥ f ∧ no null in [start, k) ∧ "
        "(pending > 0 ⟹ ⌊N/tpc⌋ ≤ start_chunk ∧ end_chunk = k − 1 ∧ boundary key at B + margin)",
        "the lookup chose the boundary (partial-tail-lookup)", Verdict.PROVED,
        _partial_tail_loads(GroupKind.FULL_ATTENTION), CODE_033, premises=TAIL + ("computed-hashed",), last=LATEST),
    Obligation(
        "partial-tail.mamba",
        "A partial tail on the Mamba align group loads its one state block with one boundary key.",
        "tail lookup ∧ [f, k−1) null  ⟹  the same claim as partial-tail.full-attention",
        "the lookup chose the boundary (partial-tail-lookup)", Verdict.PROVED,
        _partial_tail_loads(GroupKind.MAMBA), CODE_033, premises=TAIL + ("mamba-one-state-block",), last=LATEST),
    Obligation(
        "partial-tail.assert-holds",
        "The request-level partial_tail assert (partial_tail_boundary == num_cached_tokens) cannot fire when M "
        "is the lookup's answer (boundary - N).",
        "M = B − N  ⟹  ¬ partial_tail fires",
        "the scheduler passes the lookup's M unchanged", Verdict.PROVED, _partial_tail_assert_holds, CODE_033,
        premises=("partial-tail-lookup",), last=LATEST),
    Obligation(
        "partial-tail.guard",
        "Any other M (boundary != T) is stopped by the partial_tail assert, before any group is planned.",
        "B ≠ N + M  ⟹  partial_tail is the first assert to fire",
        "the assert runs before the group loop", Verdict.PROVED, _partial_tail_guard, CODE_033, last=LATEST),
    Obligation(
        "partial-tail.boundary-chunk-dropped",
        "Keeping the boundary's chunk as a chunk key (no -1 on end_chunk_idx) fires keys_length on a short "
        "prompt's partial tail: the boundary key must replace it.",
        "∃ tail lookup: end_chunk_idx = ⌈T/tpc⌉ ∧ keys < ⌈T/tpc⌉",
        "a partial tail's last chunk is its boundary key", Verdict.REFUTED, _partial_tail_chunk_needed, CODE_033,
        reproduce=_replay_tail_chunk, mutable=False, about=CODE_033.mutate(tail_chunk_dropped=False), premises=TAIL),
]
