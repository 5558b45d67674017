"""The copy contract: every token a partial-hit copy carries was computed before the step.

A Z3 model of one scheduler step of the KV-cache manager's full-attention group (``CopyWorld``): a
holder ``E`` computed before the step, then three requests ``r0, r1, r2`` scheduled in that order,
each new (num_computed_tokens == 0: it looks up a local hit) or running (it computed tokens in
earlier steps). Integers are unbounded: block size ``B``, hash unit ``U``, each request's
num_tokens, computed tokens, scheduled tokens, hit, and every pair's common token prefix.

What vLLM does in that step (0.26.0 - 0.33.0, read in 0.33.0):

* a request's keys are cached when it is scheduled, up to the tokens scheduled
  (``v1/core/kv_cache_manager.py:621-625``), before any forward runs;
* a later request's lookup finds the cached blocks of its prefix at the hash unit's granularity,
  full blocks first, then the interior boundaries of the next block
  (``v1/core/single_type_kv_cache_manager.py:792-810``), and the hybrid coordinator trims the
  full-attention hit to the Mamba hit (``v1/core/kv_cache_coordinator.py:919-932``); a hit that ends
  inside a block is turned into a private copy of that block (``:316-325``, ``:388-398``,
  ``:455-475``: ``KVCacheBlockCopy(src, dst)``);
* the model runner zeroes the step's new blocks, applies all the step's copies at once (every source
  gathered before any destination is written: ``v1/worker/utils.py:909-955``, ``blocks[dst] =
  blocks[src]``), then runs the forward (``v1/worker/gpu_model_runner.py:1205-1211``).

So a copy carries what its source block held before the step: the tokens its owner had computed
then (``c``), none for a block allocated in the step (zeroed) or a copy destination of the step
(the chained shape). The claim: for every request whose hit ends inside a block, the source's
owner had computed the hit before the step: ``c_src ≥ h``.

The lookup is the code the obligations encode: the releases' (a partial hit's source may be any
block cached so far, this step's included), and the patched one (the fix direction of
docs/findings.md, modelled abstractly: a partial hit's source must have been cached before the
step; the model assumes nothing about how a patch keeps that set, only that the lookup honours it).
The model over-approximates which of several blocks with a key the lookup returns (vLLM returns
the first cached, ``v1/core/block_pool.py:207``): a proof covers every choice, and a refutation's
witness is replayed on the real ``KVCacheManager`` of 0.33.0 (tests/test_copy.py,
``scripts/repro_copy_step.py``).
"""

from __future__ import annotations

from itertools import combinations

import z3

from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import LATEST, Span, first_release

from .copy_premises import COPY_BY_ID, HOLDER, NAMES, STEP, CopyTerms
from .encoding import Code, code_for
from .problem import Bound, Obligation, Problem
from .terms import AND, FLOORDIV, IF, IMPLIES, NOT, OR
from .witnesses import CopyWitness


def sources(x: str) -> tuple:
    """Whose blocks a step request's lookup can find: the holder and the requests scheduled before it."""
    return (HOLDER,) + STEP[:STEP.index(x)]


def lookup(t: CopyTerms, src: dict, same_step_sources: bool) -> list:
    """A new request's hit: a multiple of the hash unit below num_tokens (the lookup caps it at
    num_tokens - 1), found through the source it names: a block of a request whose prefix it
    shares that far, keyed that far, and its own (not a full block it shares from another: that
    block's owner is the source). The releases key a source at scheduling (``K``); the patched
    lookup takes a partial hit only from keys cached before the step (``K0``)."""
    out = []
    for x in STEP:
        j_end = (FLOORDIV(t.h[x], t.B) + 1) * t.B  # the end of the block the hit ends in
        partial = t.h[x] % t.B != 0
        found = []
        for i, y in enumerate(sources(x)):
            K = t.c[y] if y == HOLDER else IF(t.new[y], t.h[y], t.c[y]) + t.s[y]  # cached at scheduling
            keyed = K if same_step_sources else IF(partial, t.K0[y], K)
            own = True if y == HOLDER else NOT(AND(t.new[y], t.h[y] >= j_end))
            found.append(AND(src[x] == i, t.common(x, y) >= t.h[x], keyed >= t.h[x], own))
        out.append(IMPLIES(t.new[x], AND(t.h[x] % t.U == 0, t.h[x] <= t.T[x] - 1,
                                         IMPLIES(t.h[x] >= 1, OR(*found)))))
    return out


def carried(t: CopyTerms, src: dict) -> list:
    """Per step request: its copy (if its hit ends inside a block) carries only tokens its source's
    owner computed before the step."""
    out = []
    for x in STEP:
        partial = AND(t.new[x], t.h[x] % t.B != 0)
        ok = AND(*[IMPLIES(src[x] == i, t.c[y] >= t.h[x]) for i, y in enumerate(sources(x))])
        out.append(IMPLIES(partial, ok))
    return out


class CopyWorld:
    """One step, symbolic: the terms the premises read, the lookup, the claim."""

    def __init__(self, same_step_sources: bool):
        Int = z3.Int
        self.t = CopyTerms(
            B=Int("B"), U=Int("U"),
            T={n: Int(f"T_{n}") for n in NAMES}, c={n: Int(f"c_{n}") for n in NAMES},
            s={HOLDER: 0, **{n: Int(f"s_{n}") for n in STEP}}, h={HOLDER: 0, **{n: Int(f"h_{n}") for n in STEP}},
            new={HOLDER: False, **{n: z3.Bool(f"new_{n}") for n in STEP}}, K0={n: Int(f"K0_{n}") for n in NAMES},
            lcp={(a, b): Int(f"lcp_{a}_{b}") for a, b in combinations(NAMES, 2)})
        self.src = {n: Int(f"src_{n}") for n in STEP}
        self.same_step_sources = same_step_sources

    def premise_terms(self, ids) -> list:
        return [COPY_BY_ID[i].term(self.t) for i in ids]

    def constraints(self) -> list:
        return lookup(self.t, self.src, self.same_step_sources)

    def claim(self):
        return AND(*carried(self.t, self.src))

    def small(self, shape: str = "plain") -> list:
        """Witness shaping: the shipped hybrid's sizes (64-token blocks, 16-token hashes), r2 idle,
        and a step the real manager takes the way the model does. The holder E computed up to its
        prompt's last hash boundary (where the Mamba group caches a state: T_E = c_E + 1), r1's hit
        ends there, inside a block that only r0 has cached as a full block (so the full-attention scan
        finds r0's block first, and the trim to the Mamba hit leaves its tail). ``plain``: r0 runs a
        chunk into a block allocated this step; ``chained``: r0 is new, its own hit ends in E's block at
        the same boundary, and r1's source is r0's copy destination."""
        t = self.t
        end = (FLOORDIV(t.h["r1"], t.B) + 1) * t.B
        out = [t.B == 64, t.U == 16, t.T[HOLDER] == t.c[HOLDER] + 1, t.c[HOLDER] % t.U == 0, t.K0[HOLDER] == t.c[HOLDER],
               *[t.T[n] <= 6 * t.B for n in NAMES], t.new["r1"], self.src["r1"] == 1, t.h["r1"] == t.c[HOLDER],
               t.s["r1"] == t.T["r1"] - t.h["r1"], t.c[HOLDER] < end, t.common("r0", "r1") < t.T["r0"],
               t.new["r2"], t.h["r2"] == 0, t.T["r2"] == 1, t.common("r2", "r0") == 0, t.common("r2", "r1") == 0,
               t.common("r2", HOLDER) == 0, t.K0["r0"] == t.c["r0"]]
        if shape == "plain":
            out += [NOT(t.new["r0"]), t.c["r0"] % t.B == 0, t.s["r0"] == t.T["r0"] - t.c["r0"], end <= t.T["r0"],
                    end <= t.common("r0", "r1"), end <= t.T["r1"] - 1]
        else:
            out += [t.new["r0"], self.src["r0"] == 0, t.h["r0"] == t.c[HOLDER], t.s["r0"] == t.T["r0"] - t.h["r0"],
                    t.h["r1"] + t.U <= t.common("r0", "r1"), t.h["r1"] + t.U <= t.T["r1"] - 1,
                    t.common("r0", "r1") < end]
        return out

    def to_witness(self, model, name: str, release: str) -> CopyWitness:
        def v(x):
            x = model.eval(x, model_completion=True) if not isinstance(x, (int, bool)) else x
            return x if isinstance(x, (int, bool)) else (z3.is_true(x) if z3.is_bool(x) else x.as_long())

        t = self.t
        reqs = []
        for n in NAMES:
            reqs.append({"name": n, "T": v(t.T[n]), "c": v(t.c[n]), "s": v(t.s[n]), "h": v(t.h[n]),
                         "new": v(t.new[n]), "K0": v(t.K0[n]),
                         "src": None if n == HOLDER else sources(n)[v(self.src[n])]})
        return CopyWitness(name=name, release=release, B=v(t.B), U=v(t.U), requests=tuple(reqs),
                           lcp=tuple((a, b, v(t.lcp[(a, b)])) for a, b in combinations(NAMES, 2)))


def witness_terms(w: CopyWitness) -> tuple[CopyTerms, dict]:
    """A witness's step as concrete terms (the premises and the claim fold on them)."""
    r = {q["name"]: q for q in w.requests}
    t = CopyTerms(B=w.B, U=w.U, T={n: r[n]["T"] for n in NAMES}, c={n: r[n]["c"] for n in NAMES},
                  s={n: r[n]["s"] for n in NAMES}, h={n: r[n]["h"] for n in NAMES},
                  new={n: r[n]["new"] for n in NAMES}, K0={n: r[n]["K0"] for n in NAMES},
                  lcp={(a, b): n for a, b, n in w.lcp})
    src = {n: (sources(n).index(r[n]["src"]) if r[n]["src"] is not None else -1) for n in STEP}
    return t, src


PREMISES = ("copy-hash-unit", "copy-prefixes", "copy-scheduled-within", "copy-lookup-on-first-schedule",
            "copy-cached-computed", "copy-mamba-state-before-step")


def replay_copy(w: CopyWitness, premises=None) -> str | None:
    """None when the witness, folded through the same terms, is a step the premises admit, the
    releases' lookup takes, and whose copy carries tokens not computed before the step."""
    t, src = witness_terms(w)
    bad = [p for p in (premises or PREMISES) if COPY_BY_ID[p].check(t)]
    if bad:
        return f"the witness breaks {', '.join(bad)}"
    if AND(*lookup(t, src, True)) is not True:
        return "the releases' lookup does not take the witness's hits"
    if AND(*carried(t, src)) is True:
        return "every copy of the witness carries computed tokens"
    return None


# --- the obligations -------------------------------------------------------------------------

# The releases with partial-hit copies: prefix_match_unit (a hash unit below the block size) and the
# copy-on-write path (KVCacheBlockCopy, _apply_cow: 0.26.0 v1/core/single_type_kv_cache_manager.py:381,
# gpu_model_runner.py:1199-1203) both arrive in 0.26.0; 0.25.1 has neither.
COPIES = Span(first_release(lambda f: f.prefix_match_unit), LATEST)
BOUND = Bound(0, 0, "unbounded (B, U, num_tokens, computed, scheduled, hits, common prefixes); ≤ 3 requests "
              "scheduled in the step and 1 holder computed before it",
              "one full-attention group (the copies are its; a Mamba group enters only as premise "
              "copy-mamba-state-before-step). The claim about one copy reads only its reader and its source's "
              "owner; three requests in order are what the plain shape (source scheduled before the reader) and the "
              "chained one (the source is an earlier request's copy destination) need, the holder what a Mamba "
              "state cached before the step needs")
MATH = ("∀ step (premises), ∀ x ∈ r0..r2:  new_x ∧ h_x mod B ≠ 0 → c_src(x) ≥ h_x,  src(x) found by the lookup "
        "among E and the requests before x")


def _build(same_step_sources: bool | None, block_hash_unit: bool, oid: str, release: str):
    def build(code: Code):
        w = CopyWorld(code.knobs.copy_same_step_sources if same_step_sources is None else same_step_sources)
        prem = [w.t.B == w.t.U] if block_hash_unit else []
        return Problem(prem, w.claim(), w, constraints=w.constraints(), tables=False,
                       shaping=[] if block_hash_unit else w.small(),
                       witness=lambda m: w.to_witness(m, f"witness-{oid}", release),
                       cases=(w.t.new["r1"], NOT(w.t.new["r1"])))

    return build


def _obligations() -> list:
    first = COPIES.first
    return [
        Obligation(
            "copy.same-step",
            f"vLLM {COPIES}: a request scheduled later in a step whose local hit ends inside a block another "
            "request of the same step cached at scheduling gets a copy of that block, applied before the "
            "forward: the copy carries tokens nobody had computed (the plain shape: a fresh, zeroed block; "
            "the chained shape: the source is itself a copy destination of the step).",
            "¬ (" + MATH + ")",
            "a partial hit's source was computed before the step (it is not: cached at scheduling, 0.33.0 "
            "v1/core/kv_cache_manager.py:621-625, found by the lookup, single_type_kv_cache_manager.py:792-810)",
            Verdict.REFUTED, _build(True, False, "copy.same-step", LATEST), reproduce=replay_copy, mutable=False,
            bound=BOUND, premises=PREMISES, releases=COPIES,
            releases_note="prefix_match_unit and the copy-on-write path arrive in 0.26.0; before, no partial hit"),
        Obligation(
            "copy.block-hash-unit",
            f"vLLM {COPIES} with the hash unit equal to the block size (the default when the groups share one "
            "block size: prefix_match_unit unset is the GCD of the block sizes) makes no partial-hit copy, so "
            "none carries uncomputed tokens.",
            MATH + "  (U = B)",
            "a hit is a multiple of U = B: it never ends inside a block", Verdict.PROVED,
            _build(True, True, "copy.block-hash-unit", LATEST), mutable=False, bound=BOUND, premises=PREMISES,
            releases=COPIES),
        Obligation(
            "copy.patched",
            "The patched lookup (a partial hit taken only from blocks whose keys were cached before the step; "
            "full-block hits unchanged) copies only tokens computed before the step, the chained shape included.",
            MATH + "  (partial-hit source keyed before the step)",
            "a partial hit's source keys were cached before the step, and what was cached then was computed "
            "(premise copy-cached-computed)", Verdict.PROVED,
            _build(None, False, "copy.patched", LATEST), mutable=True, bound=BOUND, premises=PREMISES,
            code=code_for(first), last=LATEST,
            releases_note="the fix direction of docs/findings.md, applied to each release's lookup"),
    ]


OBLIGATIONS: list[Obligation] = _obligations()

__all__ = ["BOUND", "COPIES", "OBLIGATIONS", "PREMISES", "CopyWorld", "replay_copy", "witness_terms"]
