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

from kvbound.spec import LOAD_FIELDS, AssertName, Variant
from kvbound.spec.verdicts import Verdict

from .options import PLAN_CHECK, SolverOptions
from kvbound.spec.asserts import ASSERT_CODE, ASSERT_OF_CODE, NO_ASSERT

from .encoding import Code, case_inputs, encode_group
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


def encode_case(case, code: Code, tag: str = ""):
    """(group outputs, constraints) of a concrete case under ``code``, one output per offloaded
    group in order; None when M == 0 (vLLM returns early)."""
    if case.num_external_tokens == 0:
        return None, []
    outs = [encode_group(gi, g, code, tag) for gi, g in zip(case.offloaded_group_indices, case_inputs(case, code))]
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


def _split_keys(keys, group_ids):
    """(per group (first, end) chunk ranges, per group boundary key tokens), or None when the
    keys are not, group by group in order, a contiguous chunk run then at most one boundary key."""
    pos = {gi: n for n, gi in enumerate(group_ids)}
    n_groups = len(group_ids)
    ranges, tails = [None] * n_groups, [None] * n_groups
    last_group = -1
    for key in keys:
        if len(key) == 3:
            gi, word, kt = key
            g = pos.get(gi)
            if word != "boundary" or g is None or g < last_group or tails[g] is not None:
                return None
            tails[g], last_group = kt, g
            continue
        gi, c = key
        g = pos.get(gi, -1)
        if not 0 <= g < n_groups or g < last_group or tails[g] is not None:
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
    return ranges, tails


def plan_claim(case, outs, plan_json):
    """The plan's outputs as one formula over the encoding's terms (False if malformed)."""
    ok = plan_json.get("outcome") == "ok"
    empty = not any(plan_json.get(f) for f in LOAD_FIELDS)
    if outs is None:  # M == 0: nothing planned, nothing loaded
        return ok and empty
    n = len(outs)
    if not ok:
        try:
            code = ASSERT_CODE[AssertName(plan_json.get("assertion"))]
        except ValueError:
            return False
        if not empty:
            return False
        return OR(*[
            AND(*[o.passes() for o in outs[:g]], outs[g].fails_with(code)) for g in range(n)
        ])
    sizes, starts = list(plan_json["group_sizes"]), list(plan_json["block_indices"])
    keys = [tuple(k) for k in plan_json["keys"]]
    split = _split_keys(keys, case.offloaded_group_indices)
    if len(sizes) != n or len(starts) != n or split is None:
        return False
    ranges, tails = split
    dst = list(plan_json["dst_block_ids"])
    terms, pos = [], 0
    for g, o in enumerate(outs):
        s, p = starts[g], sizes[g]
        ids = case_inputs_table_ids(case, case.offloaded_group_indices[g])
        k = o.k
        # dst of group g is blocks[start:k]; with the claimed start that is a known slice
        want = ids[s:k] if 0 <= s <= len(ids) else None
        if want is None or dst[pos:pos + len(want)] != want:
            return False
        pos += len(want)
        terms += [o.passes(), o.start == s, o.pending == p, o.has_boundary_key == (tails[g] is not None)]
        if tails[g] is not None:
            terms.append(o.key_tokens == tails[g])
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
    group_ids = case.offloaded_group_indices
    for g, o in enumerate(outs):
        code = val(o.fail)
        if code != NO_ASSERT:
            name = ASSERT_OF_CODE[code]
            return {"outcome": "assertion_error", "assertion": name.value,
                    "group": None if name is AssertName.PARTIAL_TAIL else group_ids[g]}
    dst, sizes, starts, keys = [], [], [], []
    for g, o in enumerate(outs):
        gi = group_ids[g]
        s, k = val(o.start), val(o.k)
        dst += case_inputs_table_ids(case, gi)[s:k]
        sizes.append(val(o.pending))
        starts.append(s)
        keys += [[gi, c] for c in range(val(o.start_chunk), val(o.end_chunk))]
        if val(o.has_boundary_key):
            keys.append([gi, "boundary", val(o.key_tokens)])
    return {"outcome": "ok", "assertion": None, "dst_block_ids": dst, "group_sizes": sizes,
            "block_indices": starts, "keys": keys}


def _refusal(case, variant):
    """Why ``variant``'s release refuses the case's config (None: it plans it), the spec's rule."""
    from kvbound.spec import unsupported_reason, variant_features

    return unsupported_reason(case, variant_features(variant)) if case.uses_v2_features else None


def solve_plan(case, code: Code, options: SolverOptions = PLAN_CHECK) -> dict | None:
    """The plan the encoding gives a case under ``code`` (a release, or a mutant of one); None if unknown."""
    outs, cs = encode_case(case, code)
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
               code: Code | None = None) -> SymbolicCheck:
    """Does the encoding of ``variant`` (its last release, as the spec plans it; or ``code``) force
    exactly ``plan_json``'s outputs on ``case``?"""
    from kvbound.spec import variant_features

    variant = Variant(variant)
    code = code or Code(variant_features(variant))
    refusal = _refusal(case, variant)
    if refusal is not None or plan_json.get("outcome") == "unsupported":
        # a release that refuses the config never reaches the plan: nothing to encode, only the rule to match
        if refusal is not None and plan_json.get("outcome") == "unsupported":
            return SymbolicCheck(Verdict.FORCED, f"unsupported: {refusal}")
        return SymbolicCheck(Verdict.NOT_FORCED, f"the release's support rule says {refusal or 'supported'}, "
                                                 f"the plan says {plan_json.get('outcome')}")
    outs, cs = encode_case(case, code)
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
