"""The reservation property: ``allocate_slots`` never takes more blocks than it reserved.

Per manager kind and per allocator code (``allocator``, the model of what each reserves and
takes): ``taken ≤ reserved`` (and the manager's own ``assert num_new_blocks <= max_new_blocks``
holds) on a request's first call and on the running call after it, under the allocation
premises (``allocation_premises.ALLOCATION_PREMISES``). Refuted for 0.33's sync connector load on
a Mamba (align) group, proved for the rest. The model is held to the real allocator, not the spec:
tests/test_reservation.py replays calls on a release's ``KVCacheManager``.
"""

from __future__ import annotations

from dataclasses import fields

import z3

from kvbound.spec import GroupKind
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import LATEST, Span, first_release, last_release, spans

from .allocator import AllocCalls, Calls, allocator_code, calls, holds
from .allocation_premises import ALLOCATION_BY_ID
from .problem import Bound, Obligation, Problem
from .terms import AND, NOT


# --- the symbolic world --------------------------------------------------------------------

_FIELDS = [f.name for f in fields(Calls)]
_BOOLS = {"c1", "c2"}


class ReservationWorld:
    """Every pair of calls at once, for one manager kind and allocator code."""

    def __init__(self, kind: GroupKind, release: str):
        self.kind, self.release, self.code = kind, release, allocator_code(release)
        self.x = Calls(**{n: (z3.Bool(n) if n in _BOOLS else z3.Int(n)) for n in _FIELDS})
        self.first, self.running = calls(kind, self.code, self.x)

    def premise_terms(self, ids) -> list:
        return [ALLOCATION_BY_ID[i].term(self.kind, self.x) for i in ids if ALLOCATION_BY_ID[i].applies(self.kind)]

    def base(self):
        x = self.x
        out = [x.b >= 1, x.L >= 0, x.E >= 0, x.NEW >= 0, x.LA >= 0, x.ev >= 0, x.S >= 0,
               x.NEW2 >= 1, x.LA2 >= 0]
        if self.kind is not GroupKind.MAMBA:
            out += [x.S == 0, NOT(x.c1), NOT(x.c2)]
        if self.kind is not GroupKind.SLIDING_WINDOW:
            out += [x.w == 0, x.extra == 0]
        if self.kind is not GroupKind.CHUNKED_LOCAL:
            out.append(x.chunk == 0)
        return out

    def claim(self):
        return AND(holds(self.first), holds(self.running))

    def small(self):
        """Witness shaping: the repro's shape (b = 64, no local hit, one block from the connector)."""
        x = self.x
        return [x.b == 64, x.L == 0, x.ev == 0, x.S == 0, NOT(x.c1), NOT(x.c2), x.LA == 0, x.LA2 == 0,
                x.E == x.b, x.NEW <= 4 * x.b, x.NEW % x.b == 0, x.NEW2 == 1]

    def to_case(self, model, name: str) -> AllocCalls:
        v = {}
        for n in _FIELDS:
            t = model.eval(getattr(self.x, n), model_completion=True)
            v[n] = z3.is_true(t) if n in _BOOLS else t.as_long()
        return AllocCalls(name=name, kind=self.kind, release=self.release, **v)


# --- the obligations -------------------------------------------------------------------------

ALLOC_PREMISES = ("alloc-call-adopts-or-computes", "alloc-evictable-hit", "alloc-running-computed",
                  "alloc-checkpoint-index", "alloc-window-config")
BOUND = Bound(1, 0, "unbounded (block_size, L, E, NEW, lookahead, num_speculative_blocks, window, chunk)",
              "one manager, two calls: a request's first allocate_slots call and the running call after it "
              "(the coordinator sums the managers' reservations and calls each manager's allocation once, so a "
              "per-manager bound sums to the request's); Mamba in align mode (prefix caching needs it), its "
              "checkpoint blocks free booleans (the model does not derive checkpoint positions)")
MATH = ("∀ b, L, E, NEW, LA, S, C, NEW2, LA2 (premises):  taken₁ ≤ reserved₁ ∧ taken₂ ≤ reserved₂ ∧ the "
        "manager's asserts hold, where reserved = get_num_blocks_to_allocate(T + NEW + LA, …) and taken = "
        "touched evictable hit blocks + get_new_blocks of add_local / allocate_external / allocate_new_blocks")


def _build(kind, release, scenario):
    def build(_knobs):
        w = ReservationWorld(kind, release)
        x = w.x
        prem = w.base()
        if scenario == "sync":  # a sync load: adopt E and compute NEW in the same call (0.33)
            prem += [x.E >= 1, x.NEW >= 1]
        return Problem(prem, w.claim(), w, tables=False, shaping=w.small() if scenario == "sync" else [],
                       witness=lambda m: w.to_case(m, f"witness-reservation.{kind.value}.{scenario}"),
                       splits=(x.E == 0, x.E >= 1),
                       cases=(x.E == 0, x.E >= 1, x.L >= 1))

    return build


def _replay_over_take(calls: "AllocCalls") -> str | None:
    """The model's numbers on the witness: the first call takes more than it reserved."""
    p = calls.predict()["first"]
    if not calls.sync:
        return "the witness is not a sync load"
    if not p["taken"] > p["reserved"]:
        return f"the model gives reserved {p['reserved']}, taken {p['taken']} on the witness"
    return None


_NAMES = {GroupKind.FULL_ATTENTION: "full-attention", GroupKind.SLIDING_WINDOW: "sliding-window",
          GroupKind.CHUNKED_LOCAL: "chunked-local", GroupKind.MAMBA: "mamba-align"}


# The releases the allocator model covers, and the runs of them that run one Mamba allocator code.
ALLOCATORS = Span(first_release(lambda f: f.allocator), LATEST)
MAMBA_CODES = [s for s in spans(("allocator",)) if s.features.allocator]
SYNC = Span(first_release(lambda f: f.sync_loads), LATEST)  # the releases whose connector loads synchronously


def _obligations() -> list:
    out = []
    for kind in (GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL):
        out.append(Obligation(
            f"reservation.{_NAMES[kind]}",
            f"A {kind.value} manager's allocate_slots never takes more blocks than get_num_blocks_to_allocate "
            "reserved, on a request's first call (a local hit, a partial hit's CoW block, connector tokens "
            "loaded sync or async, lookahead tokens) and on the running call after it.",
            MATH, "reserve and allocate count the same blocks (max(cdiv(num_tokens, b) − max(skipped, hit), 0), "
            "plus the CoW block and the touched evictable hit blocks)", Verdict.PROVED,
            _build(kind, LATEST, "any"), mutable=False, bound=BOUND, premises=ALLOC_PREMISES,
            releases=ALLOCATORS))
    for span in MAMBA_CODES:
        first, last = span.first, span.last
        out.append(Obligation(
            f"reservation.mamba-align.{first}" if first == last else f"reservation.mamba-align.{first}-{last}",
            f"vLLM {span}'s Mamba (align mode) allocate_slots never takes more blocks than it reserved, on the "
            "calls the offloading connector makes: local hits (partial ones too), connector tokens loaded "
            "asynchronously (adopted with no new tokens, computed by the running call after), speculative and "
            "checkpoint blocks.",
            MATH, "an async load adopts its tokens alone: one block for the loaded state, reserved by the cap",
            Verdict.PROVED, _build(GroupKind.MAMBA, first, "async"), mutable=False, bound=BOUND,
            premises=ALLOC_PREMISES + ("alloc-async-load",), releases=span))
    out.append(Obligation(
        "reservation.mamba-align.sync-load",
        "0.33's sync connector load on a Mamba (align) group takes one block more than admission reserved: "
        "allocate_external_computed_blocks takes a block for the loaded state, allocate_new_blocks one for the "
        "running state, and get_num_blocks_to_allocate caps the count at physical_block_cap = 1 + partial hit "
        "+ checkpoint (+ speculative blocks) — the loaded-state block is not counted. With exactly the reserved "
        "blocks free, get_new_blocks raises mid-step.",
        MATH.replace("∀", "¬ ∀", 1), "the cap counts the loaded-state block (it does not: 0.33.0 STM 1787-1790)",
        Verdict.REFUTED, _build(GroupKind.MAMBA, SYNC.first, "sync"), reproduce=_replay_over_take, mutable=False,
        bound=BOUND, premises=ALLOC_PREMISES, releases=SYNC,
        releases_note=f"the allocators of {Span(ALLOCATORS.first, last_release(lambda f: not f.sync_loads))} count "
                      "the same way; their offloading connector never loads synchronously"))
    return out


OBLIGATIONS: list[Obligation] = _obligations()

__all__ = ["ALLOC_PREMISES", "OBLIGATIONS", "ReservationWorld"]
