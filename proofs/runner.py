"""Run obligations: verdicts, vacuity, witnesses replayed through the spec, mutants.

Verdicts are what Z3 said, never more: ``unknown`` (a timeout included) is its
own verdict and never counts as proved. Timeouts and seeds: ``options.SolverOptions``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import z3

from kvbound.spec.verdicts import Verdict

from .encoding import Code
from .mutants import ENCODING_KNOB_MUTANTS
from .obligations import OBLIGATIONS, Obligation
from .problem import problem
from .options import OBLIGATION, PROVE, SolverOptions
from .terms import NOT, as_bool
from .witnesses import witness_from_dict, witness_to_dict
from .world import expanded


@dataclass
class Result:
    obligation: Obligation
    verdict: Verdict  # PROOF_VERDICTS
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
        if self.verdict == Verdict.PROVED:
            return self.vacuity == "premises satisfiable"
        return self.witness is not None and self.replay is None


def decide(ob: Obligation, code: Code | None = None, options: SolverOptions = OBLIGATION,
           seek: bool | None = None):
    """(verdict, model-or-None, problem): is premises ∧ ¬claim unsat?

    ``seek`` (default: the obligation expects a refutation) first looks for a
    counterexample on tables of a few fixed lengths, where the quantifiers expand
    and the search is quantifier-free: fast, repeatable, and a model found there is
    a genuine counterexample. The verdict "proved" only ever comes from the
    unbounded check."""
    code = code or ob.code
    if seek if seek is not None else ob.expected == Verdict.REFUTED:
        for shaped in (True, False):  # a shaped (readable) witness at any length before an unshaped one
            for length in WITNESS_LENGTHS:
                with expanded(length):
                    prob = problem(ob, code)
                if shaped and not prob.shaping:
                    break
                s = _assert_negation(prob, options.solver())
                s.add(*[as_bool(c) for c in (prob.shaping if shaped else [])])
                if s.check() == z3.sat:
                    return Verdict.REFUTED, s.model(), prob
                if not prob.tables:
                    break
    prob = problem(ob, code)
    s = _assert_negation(prob, options.solver())
    if prob.shaping:  # a small, readable witness first: sat there is sat everywhere
        s.push()
        s.add(*[as_bool(c) for c in prob.shaping])
        if s.check() == z3.sat:
            return Verdict.REFUTED, s.model(), prob
        s.pop()
    for split in prob.splits:
        s.push()
        s.add(as_bool(split))
        r = s.check()
        if r == z3.unknown:
            return Verdict.UNKNOWN, s.reason_unknown(), prob
        if r == z3.sat:
            return Verdict.REFUTED, s.model(), prob
        s.pop()
    return Verdict.PROVED, None, prob


WITNESS_LENGTHS = (2, 4, 6, 8)


def _assert_negation(prob, s: z3.Solver) -> z3.Solver:
    s.add(*[as_bool(p) for p in prob.premises + list(prob.constraints)])
    s.add(as_bool(NOT(prob.claim)))
    return s


def premises_instance(ob: Obligation, code: Code | None, options: SolverOptions):
    """An instance of the premises (vacuity) for each of the problem's ``cases`` (default: one),
    on tables of a few fixed lengths, so the check is quantifier-free. sat only when every case
    has an instance; otherwise the answer for the first case without one."""
    open_cases, last = None, {}
    for length in VACUITY_LENGTHS:
        with expanded(length):
            prob = problem(ob, code)
        if open_cases is None:
            open_cases = list(range(len(prob.cases)))
        s = options.solver()
        s.add(*[as_bool(p) for p in prob.premises + list(prob.constraints)])
        for ci in list(open_cases):
            last[ci] = s.check(as_bool(prob.cases[ci]))
            if last[ci] == z3.sat:
                open_cases.remove(ci)
        if not open_cases or not prob.tables:
            break
    return z3.sat if not open_cases else last[open_cases[0]]


VACUITY_LENGTHS = (4, 8, 1, 2)


def run_obligation(ob: Obligation, options: SolverOptions = OBLIGATION) -> Result:
    """Decide the obligation on its code; a proved one also on every later release it covers whose
    code the encoding reads differently (``Obligation.covered_codes``): proved only if proved on each."""
    t0 = time.perf_counter()
    codes = ob.covered_codes() if ob.expected == Verdict.PROVED else [ob.code]
    for code in codes:
        verdict, model, prob = decide(ob, code, options=options)
        if verdict != Verdict.PROVED:
            break
    res = Result(ob, verdict, 0.0)
    where = "" if code is ob.code else f" (on {code.release.release}'s code)"
    if verdict == Verdict.UNKNOWN:
        res.detail = f"solver unknown{where}: {model}"
    elif verdict == Verdict.PROVED:
        rs = [premises_instance(ob, c, options) for c in codes]
        r = next((x for x in rs if x != z3.sat), z3.sat)
        res.vacuity = "premises satisfiable" if r == z3.sat else f"premises {r}: the proof is vacuous"
        if len(codes) > 1:
            res.detail = "proved on the code of " + ", ".join(c.release.release for c in codes)
    elif verdict == Verdict.REFUTED:
        if prob.witness is None:  # an unexpected refutation: still show the counterexample
            res.witness = prob.world.to_case(model, f"counterexample-{ob.id}")
            res.replay = f"unexpected refutation{where}"
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



# --- the whole suite ------------------------------------------------------------

@dataclass
class Report:
    results: list  # [Result], in OBLIGATIONS order
    mutants: dict | None  # mutant -> killing obligation id (None: survived); None when not run
    seconds: float

    @property
    def mutation_score(self) -> tuple[int, int] | None:
        if self.mutants is None:
            return None
        return sum(v is not None for v in self.mutants.values()), len(self.mutants)

    @property
    def unknown(self) -> list:
        return [r for r in self.results if r.verdict == Verdict.UNKNOWN]

    @property
    def ok(self) -> bool:
        score = self.mutation_score
        return all(r.met for r in self.results) and (score is None or score[0] == score[1])


def by_id(ids=None) -> list[Obligation]:
    if not ids:
        return list(OBLIGATIONS)
    known = {o.id: o for o in OBLIGATIONS}
    missing = [i for i in ids if i not in known]
    if missing:
        raise KeyError(f"unknown obligation {missing[0]!r}; known: {', '.join(known)}")
    return [known[i] for i in ids]


def _task(args):
    """One unit of work in a worker: an obligation, or a mutant against every proved one."""
    kind, name, options = args
    if kind == "mutant":
        t0 = time.perf_counter()
        killer = run_mutants_one(name, options)
        return kind, name, {"killed_by": killer, "seconds": time.perf_counter() - t0}
    r = run_obligation(by_id([name])[0], options)
    return kind, name, {
        "verdict": r.verdict, "seconds": r.seconds, "vacuity": r.vacuity, "replay": r.replay,
        "detail": r.detail, "witness": None if r.witness is None else witness_to_dict(r.witness),
    }


def run_mutants_one(name: str, options: SolverOptions) -> str | None:
    """A proved obligation the mutant refutes, or None (it survived): the table's expected killer
    first (a stale hint only costs time), then every proved obligation, one-group ones first."""
    from .mutants import BY_NAME

    change = ENCODING_KNOB_MUTANTS[name]
    hint = BY_NAME[name].killer
    order = sorted(OBLIGATIONS, key=lambda o: (o.id != hint, o.bound.groups != 1))
    for ob in order:
        if ob.expected == Verdict.PROVED and ob.mutable and kills(ob, ob.code.mutate(**change), options):
            return ob.id
    return None


def kills(ob: Obligation, code: Code, options: SolverOptions) -> bool:
    """Does the claim fail for this code? The unbounded check answers most cases at
    once (a proof stays fast); when it hesitates, the bounded search finds the
    counterexample quantifier-free."""
    prob = problem(ob, code)
    s = _assert_negation(prob, options.solver(min(options.timeout_s, options.first_try_s)))
    verdicts = []
    for split in prob.splits:
        s.push()
        s.add(as_bool(split))
        verdicts.append(s.check())
        s.pop()
    if z3.sat in verdicts:
        return True
    if all(v == z3.unsat for v in verdicts):
        return False
    return decide(ob, code, options, seek=True)[0] == Verdict.REFUTED


def run_all(ids=None, options: SolverOptions = PROVE, mutants: bool = True, jobs: int = 2) -> Report:
    """Every obligation (vacuity and witness replay included) and every mutant.

    ``jobs`` worker processes share the work (Z3 is single-threaded per solver)."""
    t0 = time.perf_counter()
    obs = by_id(ids)
    tasks = [("mutant", m, options) for m in ENCODING_KNOB_MUTANTS] if mutants else []
    # longest first: the alignment proof, then the mutants, then the rest
    slow = [o for o in obs if o.bound.groups != 1]
    tasks = [("obligation", o.id, options) for o in slow] + tasks + \
            [("obligation", o.id, options) for o in obs if o not in slow]
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing as mp

        # a fresh process per task: Z3's shared state (term ids) then never depends on
        # which tasks a worker ran before, so pinned seeds give repeatable runs
        with mp.get_context("fork").Pool(jobs, maxtasksperchild=1) as pool:
            done = pool.map(_task, tasks, chunksize=1)
    else:
        done = [_task(t) for t in tasks]
    results, mut = {}, {}
    for kind, name, d in done:
        if kind == "mutant":
            mut[name] = d["killed_by"]
            continue
        ob = by_id([name])[0]
        w = d["witness"]
        results[name] = Result(ob, d["verdict"], d["seconds"], None if w is None else witness_from_dict(w),
                               d["vacuity"], d["replay"], d["detail"])
    return Report([results[o.id] for o in obs], mut if mutants else None, time.perf_counter() - t0)


def witness_cases(options: SolverOptions = PROVE) -> list:
    """Every witness the refuted obligations produce that is a load (a spec Case; the reservation
    obligations' witnesses are allocate_slots calls, replayed by scripts/repro_0_33_sync_mamba.py),
    named witness-<id>."""
    from kvbound.spec import Case

    out = []
    for ob in OBLIGATIONS:
        if ob.expected == Verdict.REFUTED:
            r = run_obligation(ob, options)
            if isinstance(r.witness, Case):
                out.append(replace(r.witness, name=f"witness-{ob.id}"))
    return out
