"""Check a load plan against the Z3 encoding: are these outputs forced?

``check_plan`` fixes a case's inputs in the encoding the obligations use
(``encoding.encode_group``) and asks Z3 two things: the encoding has a model
(so "forced" is never vacuous), and no model has outputs other than the plan's
(the negated claim is unsat). The batched torch impl and the conformance runs
use it to hold their outputs to the proved semantics, not to the spec's code.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import z3

from kvbound.spec import AssertName, Variant
from kvbound.spec.verdicts import Verdict

from .options import PLAN_CHECK, SolverOptions
from .encoding import CODE_FAIL, FAIL_CODE, OK, Knobs, case_inputs, encode_group, knobs_for
from .terms import AND, NOT, OR, Sx, _lit



@dataclass(frozen=True)
class SymbolicCheck:
    verdict: Verdict  # PLAN_CHECK_VERDICTS
    detail: str = ""

    @property
    def forced(self) -> bool:
        return self.verdict is Verdict.FORCED


_local = threading.local()


def _solver(options: SolverOptions) -> z3.Solver:
    """One solver per thread, reused with push/pop: creating one costs more than a check."""
    s = getattr(_local, "solver", None)
    if s is None or _local.options != options:
        s = _local.solver = options.solver()
        _local.options = options
        _local.declared = set()
    return s


def encode_case(case, knobs: Knobs, tag: str = ""):
    """(group outputs, constraints) of a concrete case; None when M == 0 (vLLM returns early)."""
    if case.num_external_tokens == 0:
        return None, []
    outs = [encode_group(gi, g, knobs, tag) for gi, g in enumerate(case_inputs(case))]
    return outs, [c for o in outs for c in o.constraints]


def _decls(outs) -> str:
    return "".join(f"(declare-const {u.text} Int)" for o in outs or () for u in o.unknowns)


def _new_decls(outs) -> str:
    """Declarations the thread's solver has not seen (its parser keeps them across pop)."""
    seen = _local.declared
    new = [u.text for o in outs or () for u in o.unknowns if u.text not in seen]
    seen.update(new)
    return "".join(f"(declare-const {n} Int)" for n in new)


def _assert_text(decls: str, formulas) -> str:
    body = []
    for f in formulas:
        if f is True:
            continue
        body.append(f"(assert {_lit(f)})")
    return decls + "".join(body)


def _value(term, decls: str, model):
    """A term's value in a model (ints fold; Sx text is parsed back into Z3)."""
    if isinstance(term, bool):
        return term
    if isinstance(term, int):
        return term
    if isinstance(term, Sx):
        term = z3.parse_smt2_string(decls + f"(assert (= {term.text} {term.text}))")[0].arg(0)
    v = model.eval(term, model_completion=True)
    return z3.is_true(v) if z3.is_bool(v) else v.as_long()


def _split_keys(keys, n_groups):
    """Per group (first, end) chunk ranges, or None when keys are not contiguous runs in group order."""
    ranges = [None] * n_groups
    last_group = -1
    for g, c in keys:
        if not 0 <= g < n_groups or g < last_group:
            return None
        if ranges[g] is None:
            if g == last_group:
                return None
            ranges[g] = [c, c + 1]
        elif c != ranges[g][1]:
            return None
        else:
            ranges[g][1] = c + 1
        last_group = g
    return ranges


def plan_claim(case, outs, plan_json):
    """The plan's outputs as one formula over the encoding's terms (False if malformed)."""
    ok = plan_json.get("outcome") == "ok"
    empty = not any(plan_json.get(f) for f in ("dst_block_ids", "group_sizes", "block_indices", "keys"))
    if outs is None:  # M == 0: nothing planned, nothing loaded
        return ok and empty
    n = len(outs)
    if not ok:
        try:
            code = FAIL_CODE[AssertName(plan_json.get("assertion"))]
        except ValueError:
            return False
        if not empty:
            return False
        return OR(*[
            AND(*[o.passes() for o in outs[:g]], outs[g].fails_with(code)) for g in range(n)
        ])
    sizes, starts = list(plan_json["group_sizes"]), list(plan_json["block_indices"])
    keys = [tuple(k) for k in plan_json["keys"]]
    ranges = _split_keys(keys, n)
    if len(sizes) != n or len(starts) != n or ranges is None:
        return False
    dst = list(plan_json["dst_block_ids"])
    terms, pos = [], 0
    for g, o in enumerate(outs):
        s, p = starts[g], sizes[g]
        ids = case_inputs_table_ids(case, g)
        k = o.k
        # dst of group g is blocks[start:k]; with the claimed start that is a known slice
        want = ids[s:k] if 0 <= s <= len(ids) else None
        if want is None or dst[pos:pos + len(want)] != want:
            return False
        pos += len(want)
        terms += [o.passes(), o.start == s, o.pending == p]
        if ranges[g] is None:
            terms.append(o.end_chunk == o.start_chunk)
        else:
            terms += [o.start_chunk == ranges[g][0], o.end_chunk == ranges[g][1]]
    if pos != len(dst):
        return False
    return AND(*terms)


def case_inputs_table_ids(case, g):
    return [b.block_id for b in case.groups[g].blocks]


def model_plan(case, outs, model) -> dict:
    """The outputs a model picks, in ``LoadPlan.to_json`` shape (for not_forced details)."""
    if outs is None:
        return {"outcome": "ok", "assertion": None, "dst_block_ids": [], "group_sizes": [],
                "block_indices": [], "keys": []}
    decls = _decls(outs)
    val = lambda t: _value(t, decls, model)  # noqa: E731
    for g, o in enumerate(outs):
        code = val(o.fail)
        if code != OK:
            return {"outcome": "assertion_error", "assertion": CODE_FAIL[code].value, "group": g}
    dst, sizes, starts, keys = [], [], [], []
    for g, o in enumerate(outs):
        s, k = val(o.start), val(o.k)
        dst += case_inputs_table_ids(case, g)[s:k]
        sizes.append(val(o.pending))
        starts.append(s)
        keys += [[g, c] for c in range(val(o.start_chunk), val(o.end_chunk))]
    return {"outcome": "ok", "assertion": None, "dst_block_ids": dst, "group_sizes": sizes,
            "block_indices": starts, "keys": keys}


def solve_plan(case, knobs: Knobs, options: SolverOptions = PLAN_CHECK) -> dict | None:
    """The plan the encoding gives a case under ``knobs`` (a variant or a mutant); None if unknown."""
    outs, cs = encode_case(case, knobs)
    s = _solver(options)
    s.push()
    try:
        s.from_string(_assert_text(_new_decls(outs), cs))
        if s.check() != z3.sat:
            return None
        return model_plan(case, outs, s.model())
    finally:
        s.pop()


def check_plan(case, variant, plan_json: dict, options: SolverOptions = PLAN_CHECK,
               knobs: Knobs | None = None) -> SymbolicCheck:
    """Does the encoding of ``variant`` force exactly ``plan_json``'s outputs on ``case``?"""
    knobs = knobs or knobs_for(Variant(variant))
    outs, cs = encode_case(case, knobs)
    claim = plan_claim(case, outs, plan_json)
    s = _solver(options)
    s.push()
    try:
        s.from_string(_assert_text(_new_decls(outs), cs))
        r = s.check()
        if r != z3.sat:
            return SymbolicCheck(Verdict.UNKNOWN, f"the encoding of the case has no model ({r}): an encoding bug")
        if claim is False:
            return SymbolicCheck(Verdict.NOT_FORCED, f"the encoding gives {model_plan(case, outs, s.model())}")
        s.from_string(_assert_text("", [NOT(claim)]))  # the solver keeps the declarations
        r = s.check()
        if r == z3.unsat:
            return SymbolicCheck(Verdict.FORCED, "")
        if r == z3.sat:
            return SymbolicCheck(Verdict.NOT_FORCED, f"the encoding also allows {model_plan(case, outs, s.model())}")
        return SymbolicCheck(Verdict.UNKNOWN, f"solver: {s.reason_unknown()}")
    finally:
        s.pop()
