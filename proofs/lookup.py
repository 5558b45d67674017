"""Z3 obligations of the lookup contract (docs/lookup.md) on the sliding-window scan of the
lookup spec (``spec/lookup.py``, ``sliding_window_lookup``), per release family.

The scan over one window group's keys is unrolled over ``K`` keys (bounded: the scan's
state is carried key to key, so each key count is its own formula; ``K`` up to
``MAX_KEYS``), every key's answer a symbolic ``LookupResult`` and the window a symbolic
``1 <= w <= K``. Its claims, each the contract's clause for the group alone:

- ``lookup.window.no-needless-deferral``: the scan defers only when a HIT_PENDING key, were it
  HIT, would complete a window ending further right than the rightmost complete one
  (answers HIT / HIT_PENDING / MISS). Refuted on 0.25-0.29 (a HIT_PENDING right of a MISS
  keeps the scan deferring: 0.29.0 offloading/scheduler.py:642-664) and on 0.21-0.24 (the
  pending key breaks the run and defers: 0.21.0 :270-287); proved on 0.30+ (the gap clears
  the flag, 0.30.0 :706-713).
- ``lookup.window.no-needless-deferral.retry``: the same with RETRY answers too: refuted on
  every release with RETRY (0.25+): RETRY sets ``defer_lookup`` for good, gap or not
  (0.30.0 :701-705; 0.33.0 :830-834).
- ``lookup.window.no-lost-no-false-hit``: a hit ends at the rightmost complete window (or the
  run at the left end) and every key in its last window is HIT. Proved on every release.

A witness is a lookup case (a full-attention group whose keys are all HIT beside the window
group), replayed through the spec of the release (the release defers, the contract calls it
needless); ``kvbound conform --vllm X FILE`` replays it on the real release.
"""

from __future__ import annotations

import z3

from kvbound.spec.lookup import lookup_for_version
from kvbound.spec.lookup_case import Answer, LookupCase, LookupGroup, default_lookup_groups
from kvbound.spec.lookup_contract import check_lookup
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import CAMPAIGN_RELEASES, release_features, spans

from .problem import Bound, Obligation, Problem
from .witnesses import LookupWitness

MAX_KEYS = 6
HIT, PENDING, RETRY, MISS = 0, 1, 2, 3
_ANSWERS = (Answer.HIT, Answer.HIT_PENDING, Answer.RETRY, Answer.MISS)
TPC = 16  # tokens per chunk of a witness (the scan reasons in chunks; the size is immaterial)

BOUND = Bound(1, MAX_KEYS, f"keys 1..{MAX_KEYS}, window 1..keys, answers symbolic",
              "the scan is unrolled key by key: one formula per key count (its state runs from the right end)")

# The release families of the scan: the runs of campaign releases (each witness replays on the
# real one) over which the columns the scan reads hold.
FAMILIES = spans(("lookup_result_enum", "lookup_swa_gap_clears_pending"), CAMPAIGN_RELEASES)


class LookupWorld:
    """K keys, their answers and the window, as Z3 variables (``constraints``: their domains)."""

    def __init__(self, K: int, retry: bool, release: str):
        self.K, self.retry, self.release = K, retry, release
        self.a = [z3.Int(f"a{i}") for i in range(K)]
        self.w = z3.Int("w")
        top = RETRY if retry else PENDING
        self.constraints = [z3.And(self.w >= 1, self.w <= K)] + [
            z3.Or(x == HIT, x == MISS, *[x == v for v in range(PENDING, top + 1)]) for x in self.a]

    def to_case(self, model, name):
        return witness_case(self, model, name)


def scan(world: LookupWorld, feats):
    """(deferred, end) of ``sliding_window_lookup`` over the world's keys (end meaningful
    when not deferred), unrolled from the right end as the release scans."""
    a, w, K = world.a, world.w, world.K
    done = z3.BoolVal(False)
    res_defer = z3.BoolVal(False)
    res_end = z3.IntVal(0)
    defer = z3.BoolVal(False)
    pend = z3.BoolVal(False)
    cons = z3.IntVal(0)
    for idx in range(K - 1, -1, -1):
        x = a[idx]
        if not feats.lookup_result_enum:  # True / None / False: pending breaks the run, defers
            defer2 = z3.Or(defer, x == PENDING)
            cons2 = z3.If(x == HIT, cons + 1, 0)
            pend2 = pend
        else:
            cons2 = z3.If(z3.Or(x == HIT, x == PENDING), cons + 1, 0)
            if feats.lookup_swa_gap_clears_pending:
                pend2 = z3.If(x == PENDING, True, z3.If(z3.Or(x == MISS, x == RETRY), False, pend))
                defer2 = z3.Or(defer, x == RETRY)
            else:
                pend2 = pend
                defer2 = z3.Or(defer, x == PENDING, x == RETRY)
        hit_now = z3.And(z3.Not(done), cons2 == w)
        res_defer = z3.If(hit_now, z3.Or(defer2, pend2), res_defer)
        res_end = z3.If(hit_now, idx + w, res_end)
        done = z3.Or(done, hit_now)
        defer, pend, cons = defer2, pend2, cons2
    res_defer = z3.If(done, res_defer, z3.Or(defer, pend))
    res_end = z3.If(done, res_end, cons)
    return res_defer, res_end


def supported(world: LookupWorld, e: int, ok) -> z3.BoolRef:
    """The window group supports a hit ending at key ``e`` (1-based end): its last window
    (clipped at the left end: keys below are computed locally) is answered in ``ok``."""
    return z3.And(z3.BoolVal(True), *[z3.Implies(world.w > e - 1 - i, z3.Or(*[world.a[i] == v for v in ok]))
                                      for i in range(e)])


def best(world: LookupWorld, ok) -> z3.ArithRef:
    out = z3.IntVal(0)
    for e in range(1, world.K + 1):
        out = z3.If(supported(world, e, ok), e, out)
    return out


def witness_case(world: LookupWorld, model, name: str) -> LookupCase:
    K = world.K
    w = model.eval(world.w, model_completion=True).as_long()
    ans = [_ANSWERS[model.eval(x, model_completion=True).as_long()] for x in world.a]
    num_tokens = K * TPC + 1  # K keys; the cap (num_tokens - 1) is the last key's end
    groups = (LookupGroup(0, "full_attention", TPC, K),
              LookupGroup(1, "sliding_window", TPC, K, window=w, sliding_window=w * TPC))
    tier = {f"0:{c}": (Answer.HIT,) for c in range(K)}
    tier.update({f"1:{c}": (ans[c],) for c in range(K)})
    return LookupCase(name=name, num_computed_tokens=0, num_tokens=num_tokens, num_prompt_tokens=num_tokens,
                      groups=groups, lookup_groups=default_lookup_groups(groups), tokens_per_hash=TPC,
                      num_block_hashes=K, tier=tier, release=world.release)


def _replay_needless(w: LookupWitness) -> str | None:
    """None when the spec of the release defers on the witness and the contract calls it needless."""
    got = lookup_for_version(w.case, w.release)
    if got.hit is not None:
        return f"the spec of {w.release} does not defer (hit {got.hit})"
    if not any(b.clause == "needless_deferral" for b in check_lookup(w.case, release_features(w.release), None, None)):
        return "the contract does not call the deferral needless"
    return None


def _build(claim: str, release: str, retry: bool):
    feats = release_features(release)

    def build(knobs=None):
        worlds = [LookupWorld(K, retry, release) for K in range(1, MAX_KEYS + 1)]
        # one formula per key count: the claim is their conjunction, the witness the first model
        claims, constraints = [], []
        sel = z3.Int("K")
        for world in worlds:
            d, e = scan(world, feats)
            ok_ready = (HIT,)
            ok_maybe = (HIT, PENDING, RETRY) if retry else (HIT, PENDING)
            if claim == "needless":
                c = z3.Implies(d, best(world, ok_maybe) > best(world, ok_ready))
            else:
                c = z3.Implies(z3.Not(d), z3.And(e == best(world, ok_ready), *[
                    z3.Implies(e == j, supported(world, j, ok_ready)) for j in range(1, world.K + 1)]))
            claims.append(z3.Implies(sel == world.K, c))
            constraints += [z3.Implies(sel == world.K, x) for x in world.constraints]
        world = _Multi(worlds, sel, release)
        return Problem(premises=[z3.And(sel >= 1, sel <= MAX_KEYS)], claim=z3.And(*claims), world=world,
                       constraints=constraints, tables=False, witness=world.witness)
    return build


class _Multi:
    """The worlds of every key count, selected by ``K``."""

    def __init__(self, worlds, sel, release):
        self.worlds, self.sel, self.release = worlds, sel, release

    def witness(self, model) -> LookupWitness:
        K = model.eval(self.sel, model_completion=True).as_long()
        world = self.worlds[K - 1]
        return LookupWitness(witness_case(world, model, f"lookup-window-{self.release}"), self.release)

    def to_case(self, model, name):
        return self.witness(model)


def _obligations() -> list:
    out = []
    for family in FAMILIES:
        first, feats = family.first, family.features
        holds = feats.lookup_swa_gap_clears_pending and feats.lookup_result_enum
        out.append(Obligation(
            f"lookup.window.no-needless-deferral.{first}",
            f"vLLM {family}'s sliding-window lookup defers only when a HIT_PENDING key, were it HIT, would give a "
            "larger hit (tier answers HIT, HIT_PENDING, MISS).",
            "defer(scan(a, w))  ⟹  best(a, {HIT, PENDING}) > best(a, {HIT})",
            "a gap (MISS) clears the pending flag of the incomplete window to its right" if holds else
            "a HIT_PENDING right of a gap keeps the scan deferring (0.29.0 scheduler.py:642-664)",
            Verdict.PROVED if holds else Verdict.REFUTED, _build("needless", first, False),
            reproduce=None if holds else _replay_needless, mutable=False, bound=BOUND, releases=family))
        if feats.lookup_result_enum:
            out.append(Obligation(
                f"lookup.window.no-needless-deferral.retry.{first}",
                f"vLLM {family}'s sliding-window lookup defers only when a HIT_PENDING or RETRY key, were it HIT, "
                "would give a larger hit (tier answers HIT, HIT_PENDING, RETRY, MISS).",
                "defer(scan(a, w))  ⟹  best(a, {HIT, PENDING, RETRY}) > best(a, {HIT})",
                "a RETRY right of a gap sets defer_lookup for good (0.33.0 scheduler.py:830-834)",
                Verdict.REFUTED, _build("needless", first, True), reproduce=_replay_needless, mutable=False,
                bound=BOUND, releases=family))
        out.append(Obligation(
            f"lookup.window.no-lost-no-false-hit.{first}",
            f"vLLM {family}'s sliding-window lookup, when it does not defer, ends its hit at the rightmost complete "
            "window of HIT keys (or the run at the left end): nothing lost, nothing unready counted.",
            "¬defer(scan(a, w))  ⟹  end = best(a, {HIT}) ∧ supported(end, {HIT})",
            "the scan returns at the first complete window from the right", Verdict.PROVED,
            _build("exact", first, feats.lookup_result_enum), mutable=False, bound=BOUND, releases=family))
    return out


OBLIGATIONS: list[Obligation] = _obligations()

__all__ = ["OBLIGATIONS", "scan", "witness_case"]
