"""Run obligations: verdicts, vacuity, witnesses replayed through the spec, mutants.

Verdicts are what Z3 said, never more: ``unknown`` (a timeout included) is its
own verdict and never counts as proved. Seeds are pinned (``symbolic.SEED``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import z3

from .encoding import Knobs
from .obligations import OBLIGATIONS, PROVED, REFUTED, Obligation
from .symbolic import SEED
from .terms import NOT, as_bool

UNKNOWN = "unknown"


@dataclass
class Result:
    obligation: Obligation
    verdict: str  # proved | refuted | unknown
    seconds: float
    witness: object = None  # a spec Case, for a refutation
    vacuity: str = ""  # proved: "premises satisfiable" or why not
    replay: str | None = None  # refuted: None when the spec reproduced the failure, else why not
    detail: str = ""

    @property
    def met(self) -> bool:
        o = self.obligation
        if self.verdict != o.expected:
            return False
        if self.verdict == PROVED:
            return self.vacuity == "premises satisfiable"
        return self.witness is not None and self.replay is None


def _solver(timeout_ms: int) -> z3.Solver:
    s = z3.Solver()
    s.set("random_seed", SEED)
    s.set("timeout", int(timeout_ms))
    return s


def decide(ob: Obligation, knobs: Knobs | None = None, timeout_ms: int = 5000):
    """(verdict, model-or-None, problem): is premises ∧ ¬claim unsat?"""
    prob = ob.build(knobs or ob.knobs)
    s = _solver(timeout_ms)
    s.add(*[as_bool(p) for p in prob.premises + prob.world.constraints])
    s.add(as_bool(NOT(prob.claim)))
    if prob.shaping:  # a small, readable witness first: sat there is sat everywhere
        s.push()
        s.add(*[as_bool(c) for c in prob.shaping])
        if s.check() == z3.sat:
            return REFUTED, s.model(), prob
        s.pop()
    r = s.check()
    if r == z3.unsat:
        return PROVED, None, prob
    if r == z3.unknown:
        return UNKNOWN, s.reason_unknown(), prob
    return REFUTED, s.model(), prob


def premises_instance(prob, timeout_ms: int):
    """One instance of the premises (vacuity): small numbers first, then any."""
    s = _solver(timeout_ms)
    s.add(*[as_bool(p) for p in prob.premises + prob.world.constraints])
    s.push()
    s.add(*[as_bool(c) for c in prob.world.small(max_len=8)])
    r = s.check()
    if r == z3.sat:
        return r
    s.pop()
    return s.check()


def run_obligation(ob: Obligation, timeout_ms: int = 5000) -> Result:
    t0 = time.perf_counter()
    verdict, model, prob = decide(ob, timeout_ms=timeout_ms)
    res = Result(ob, verdict, 0.0)
    if verdict == UNKNOWN:
        res.detail = f"solver unknown: {model}"
    elif verdict == PROVED:
        r = premises_instance(prob, timeout_ms)
        res.vacuity = "premises satisfiable" if r == z3.sat else f"premises {r}: the proof is vacuous"
    elif verdict == REFUTED:
        if prob.witness is None:  # an unexpected refutation: still show the counterexample
            res.witness = prob.world.to_case(model, f"counterexample-{ob.id}")
            res.replay = "unexpected refutation"
        else:
            try:
                res.witness = prob.witness(model)
            except Exception as e:  # a model the spec rejects is an encoding bug
                res.replay = f"witness is not a valid case: {e}"
            else:
                res.replay = ob.reproduce(res.witness) if ob.reproduce else "no replay defined"
    res.seconds = time.perf_counter() - t0
    return res


# --- mutants --------------------------------------------------------------------

MUTANTS = {
    "scan-from-0": dict(scan_from_zero=True),
    "no-null-skip": dict(null_skip=False),
    "floor-f": dict(f_floor=True),
    "unhashed-test-dropped": dict(unhashed_test=False),
    "start-equals-f": dict(no_scan=True),
    "loop-from-f+1": dict(lo_offset=1),
    "loop-from-f-1": dict(lo_offset=-1),
    "loop-to-k-1": dict(hi_offset=-1),
    "loop-to-k+1": dict(hi_offset=1),
    "keys-from-start//bpc+1": dict(key_start_offset=1),
    "pending+1": dict(pending_offset=1),
    "pending-1": dict(pending_offset=-1),
    "end-chunk-floor": dict(end_chunk_floor=True),
}


def run_mutants(obligations=None, timeout_ms: int = 5000) -> dict:
    """mutant -> id of the first proved obligation it refutes (None: it survived)."""
    obs = [o for o in (obligations or OBLIGATIONS) if o.expected == PROVED and o.mutable]
    out = {}
    for name, change in MUTANTS.items():
        out[name] = None
        for ob in obs:
            verdict, _, _ = decide(ob, replace(ob.knobs, **change), timeout_ms)
            if verdict == REFUTED:
                out[name] = ob.id
                break
    return out
