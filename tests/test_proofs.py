"""The Z3 obligations, their witnesses, the mutants, check_plan and ``kvbound prove``."""

from __future__ import annotations

import copy
import dataclasses
import json
import xml.etree.ElementTree as ET

import pytest

from kvbound.cli import main
from kvbound.proofs import (
    ENCODING_KNOB_MUTANTS, OBLIGATIONS, check_plan, run_obligation, solve_plan, witness_cases,
)
from kvbound.spec.verdicts import Verdict
from kvbound.proofs.encoding import Code, code_for
from kvbound.spec import variant_features
from kvbound.proofs.options import CATALOGUE
from kvbound.proofs.runner import Report, Result, run_mutants_one
from kvbound.spec import GroupKind, Variant, case_from_dict, plan_load
from kvbound.spec.strategies import random_cases

OPTIONS = CATALOGUE  # the generous budget: a loaded CI machine must not turn a proof unknown


@pytest.mark.parametrize("ob", OBLIGATIONS, ids=[o.id for o in OBLIGATIONS])
def test_obligation_meets_expected_verdict(ob):
    r = run_obligation(ob, OPTIONS)
    assert r.verdict == ob.expected, (r.verdict, r.detail)
    if ob.expected == Verdict.PROVED:
        assert r.vacuity == "premises satisfiable"
        assert r.witness is None
    else:
        assert r.witness is not None and r.replay is None, r.replay
    assert r.met


def test_obligations_are_declarative_and_documented():
    ids = [o.id for o in OBLIGATIONS]
    assert len(ids) == len(set(ids))
    required = {"boundary", "alignment", "fixed-assert-subsumes-legacy", "legacy-refuted", "legacy-without-asserts",
                "null-skip-needed", "destinations-exact", "keys-in-lookup-range", "window-bound", "fixed-sync"}
    assert required <= set(ids)
    for o in OBLIGATIONS:
        assert o.statement and o.math and o.premise and o.expected in (Verdict.PROVED, Verdict.REFUTED)
        assert o.expected == Verdict.PROVED or o.reproduce is not None, f"{o.id}: a refutation needs a spec replay"


def test_a_witness_the_spec_does_not_reproduce_fails_the_obligation():
    """Faithfulness is checked, not assumed: replay a witness against the wrong claim."""
    ob = next(o for o in OBLIGATIONS if o.id == "legacy-refuted")
    r = run_obligation(ob, OPTIONS)
    fixed_only = plan_load(r.witness, Variant.FIXED)
    assert fixed_only.ok  # the fixed code survives the same witness, so a replay against it must fail
    import dataclasses

    wrong = dataclasses.replace(ob, reproduce=lambda case: None if not plan_load(case, Variant.FIXED).ok else "ok")
    r2 = run_obligation(wrong, OPTIONS)
    assert not r2.met


def test_every_mutant_is_killed():
    killed = {m: run_mutants_one(m, OPTIONS) for m in ENCODING_KNOB_MUTANTS}
    assert all(killed.values()), [m for m, k in killed.items() if k is None]


@pytest.fixture(scope="module")
def witnesses():
    return witness_cases(OPTIONS)


def test_witness_cases_replay_on_the_spec(witnesses):
    """Every refuted load obligation's witness is a case the spec replays (the reservation
    obligations' witnesses are allocate_slots calls: tests/test_reservation.py replays them;
    the lookup obligations' are lookup cases: tests/test_lookup.py replays them; the copy
    obligations' are scheduler steps: tests/test_copy.py replays them)."""
    from kvbound.proofs import copy_contract, lookup, reservation, store

    cases = witnesses
    other = {o.id for m in (reservation, lookup, store, copy_contract) for o in m.OBLIGATIONS}
    refuted = [o for o in OBLIGATIONS if o.expected == Verdict.REFUTED and o.id not in other]
    assert sorted(c.name for c in cases) == sorted(f"witness-{o.id}" for o in refuted)
    by_name = {c.name: c for c in cases}
    for o in refuted:
        assert o.reproduce(by_name[f"witness-{o.id}"]) is None, o.id
    # the PR's failure: a recurrent group with an unhashed block below f kills legacy, not the fix
    legacy = by_name["witness-legacy-refuted"]
    assert legacy.groups[0].config.kind is GroupKind.MAMBA
    assert not plan_load(legacy, Variant.LEGACY).ok and plan_load(legacy, Variant.FIXED).ok


def test_null_skip_witness_writes_the_null_block_under_start_equals_f(witnesses):
    case = next(c for c in witnesses if c.name == "witness-null-skip-needed")
    mutant = solve_plan(case, code_for("0.30.0", no_scan=True))
    assert 0 in mutant["dst_block_ids"]
    assert 0 not in plan_load(case, Variant.FIXED).dst_block_ids


# --- check_plan -----------------------------------------------------------------

FACTS_CASE = {
    "name": "facts-fa-mamba", "blocks_per_chunk": 1, "tokens_per_hash": 4, "num_prompt_tokens": 64,
    "num_locally_computed_tokens": 16, "num_external_tokens": 16, "sync_load": False,
    "groups": [{"kind": "full_attention", "tokens_per_block": 16, "blocks": ["H31", "U32"]},
               {"kind": "mamba", "tokens_per_block": 16, "blocks": ["U41", "U42"]}],
}


def test_check_plan_forces_vllms_hand_built_case():
    case = case_from_dict(FACTS_CASE)
    plan = plan_load(case, Variant.FIXED).to_json(case.name)
    assert plan["dst_block_ids"] == [32, 42]  # docs/vllm-semantics.md#hand-built-cases
    assert check_plan(case, Variant.FIXED, plan).verdict == "forced"
    legacy = plan_load(case, Variant.LEGACY).to_json(case.name)
    assert legacy["assertion"] == "boundary"
    assert check_plan(case, Variant.LEGACY, legacy).verdict == "forced"
    r = check_plan(case, Variant.LEGACY, plan)  # the fixed plan is not what legacy does
    assert r.verdict == "not_forced" and "boundary" in r.detail


@pytest.mark.parametrize("variant", list(Variant))
def test_check_plan_agrees_with_the_spec_and_rejects_perturbed_plans(variant):
    for case in random_cases(40, seed=11):
        plan = plan_load(case, variant).to_json(case.name)
        assert check_plan(case, variant, plan).verdict == "forced", case.name
        if plan["outcome"] == "ok" and plan["block_indices"]:
            bad = copy.deepcopy(plan)
            bad["block_indices"][-1] += 1
            assert check_plan(case, variant, bad).verdict == "not_forced"
            bad = copy.deepcopy(plan)
            bad["keys"] = bad["keys"][:-1] if bad["keys"] else [[0, 0]]
            assert check_plan(case, variant, bad).verdict == "not_forced"


def test_check_plan_rejects_the_spec_plans_under_every_mutant():
    """check_plan is not a rubber stamp: under each encoded mutant of the one table, some
    spec plan of a generated case is no longer forced. floor-f is the exception, and why:
    cdiv(N, b) and N // b differ only on an unaligned N, where the alignment assert fires
    first either way (prove kills it: boundary)."""
    from kvbound.proofs.mutants import MUTANTS

    families = ("realistic", "recurrent_state", "adversarial", "partial_tail", "adversarial_tail",
                "retained_window", "resumed", "eagle")
    cases = [c for f in families for c in random_cases(25, seed=13, family=f)]
    plans = [(c, v, plan_load(c, v).to_json(c.name)) for c in cases for v in Variant]
    unseen = []
    for m in MUTANTS:
        if m.encoding is None or m.cls == "copy":  # the copy contract's mutant plants no load-plan change
            continue
        if not any(check_plan(c, v, p, code=Code(variant_features(v)).mutate(**m.encoding)).verdict == "not_forced"
                   for c, v, p in plans):
            unseen.append(m.name)
    assert unseen == ["floor-f"]


# --- the command ----------------------------------------------------------------

def test_prove_command_json_and_junit(tmp_path, capsys):
    out, xml = tmp_path / "p.json", tmp_path / "p.xml"
    ids = ["boundary", "legacy-refuted"]
    rc = main(["prove", "--only", *ids, "--json", str(out), "--junit", str(xml)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "witness for legacy-refuted" in text and "group 0  mamba" in text  # drawn by draw_case
    assert "total:" in text
    data = json.loads(out.read_text())
    assert [o["id"] for o in data["obligations"]] == ids
    assert data["obligations"][1]["witness"]["name"] == "witness-legacy-refuted"
    assert data["obligations"][0]["verdict"] == "proved" and data["mutation_score"] is None
    suite = ET.parse(xml).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "0"


def test_prove_unknown_exits_2_naming_the_obligation(monkeypatch, capsys):
    import kvbound.proofs as proofs

    ob = OBLIGATIONS[0]
    fake = Report([Result(ob, Verdict.UNKNOWN, 0.1, detail="timeout")], None, 0.1)
    monkeypatch.setattr(proofs, "run_all", lambda *a, **k: fake)
    rc = main(["prove", "--only", ob.id])
    captured = capsys.readouterr()
    assert rc == 2
    assert ob.id in captured.err and "unknown" in captured.err
    row = captured.out.splitlines()[1].split()
    assert row[0] == ob.id and row[2] == "unknown" and row[3] == "NO"


def test_prove_rejects_unknown_ids(capsys):
    assert main(["prove", "--only", "no-such-obligation"]) == 2
    assert "no-such-obligation" in capsys.readouterr().err


# --- premises: one term, on a world's Z3 terms and on a case's numbers ---------------------------------------------

from kvbound.proofs.premises import PREMISES, evaluate  # noqa: E402
from kvbound.proofs.world import z3_face_holds  # noqa: E402


def test_premises_hold_on_allocator_shaped_cases_and_each_fails_somewhere():
    """The realistic and recurrent_state families build tables as vLLM's allocator does:
    every premise holds there. Adversarial cases break each premise at least once, so no
    predicate is a check that cannot fail."""
    for family in ("realistic", "recurrent_state", "partial_tail", "short_prompt", "eagle", "retained_window",
                   "resumed", "group_subset"):
        for case in random_cases(80, seed=21, family=family):
            bad = [(c.premise.id, c.group_index, c.detail) for c in evaluate(case) if not c.holds]
            assert not bad, (case.name, bad)
    failed = {c.premise.id for family in ("adversarial", "adversarial_tail")
              for case in random_cases(300, seed=21, family=family) for c in evaluate(case) if not c.holds}
    assert failed == {p.id for p in PREMISES}


def test_each_premises_term_folded_on_a_case_agrees_with_z3_solving_it():
    """A premise is one term: folded on a case group's numbers (``check``, j the one the table
    shows) it holds exactly when Z3, with a World's inputs fixed to those numbers and j free,
    finds it satisfiable (both verdicts occur)."""
    seen = set()
    for family in ("adversarial", "realistic"):
        for case in random_cases(25, seed=5, family=family, max_groups=3):
            if case.num_external_tokens == 0:
                continue
            for gi, g in enumerate(case.groups):
                for p in PREMISES:
                    if p.applies(g.config.kind):
                        holds = p.check(case, gi) is None
                        assert z3_face_holds(p, case, gi) == holds, (case.name, gi, p.id)
                        seen.add(holds)
    assert seen == {True, False}


def test_every_premise_names_the_vllm_lines_it_was_read_from():
    import re

    for p in PREMISES:
        assert p.sources, p.id
        for src in p.sources:
            assert re.match(r"^vllm 0\.\d+\.\d+ [\w/]+\.py:\d+ \(", src), src


def test_a_planted_violation_is_named_with_its_block():
    from dataclasses import replace

    from kvbound.spec import Group, parse_table

    case = case_from_dict(FACTS_CASE)  # FA [H31, U32], Mamba [U41, U42], N=16, M=16
    assert all(c.holds for c in evaluate(case) if c.premise.id != "mamba-one-state-block")
    # a hashed block where the allocator puts the fresh one
    bad = replace(case, groups=(Group(case.groups[0].config, parse_table("H31 H32")), case.groups[1]))
    fails = [c for c in evaluate(bad) if not c.holds]
    assert [(c.premise.id, c.group_index) for c in fails] == [("fresh-after-nulls", 0)]
    assert "blocks[1] is H32" in fails[0].detail
    assert evaluate(replace(case, num_external_tokens=0)) == []  # no load, nothing assumed


def test_premises_command(tmp_path, capsys):
    from kvbound.spec import dump_cases

    good = tmp_path / "good.jsonl"
    dump_cases(list(random_cases(20, seed=4, family="realistic")), good)
    assert main(["premises", str(good), "--quiet", "--json", str(tmp_path / "p.json")]) == 0
    assert "FAIL" not in capsys.readouterr().out
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["failed"] == 0 and data["total"] > 20
    assert main(["premises", "examples/"]) == 1  # vLLM's hand-built tables are not allocator-shaped
    out = capsys.readouterr().out
    assert "facts-fa-mamba-n32-m32  group 1 mamba" in out and "mamba-one-state-block   FAILS" in out
    assert main(["premises", "--list"]) == 0
    assert "single_type_kv_cache_manager.py:1971" in capsys.readouterr().out
    assert main(["premises", str(good), "--only", "no-such"]) == 2
    assert "no-such" in capsys.readouterr().err


# --- the one mutant table -----------------------------------------------------------

def test_mutant_table_covers_every_class_and_scores_by_name():
    from kvbound.proofs.mutants import MUTANTS, applicable, score

    classes = {m.cls for m in MUTANTS}
    assert {"scan", "assert", "sync", "keys", "partial-tail", "groups"} <= classes
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    enc = [m.name for m in applicable("encoding")]
    assert enc == list(ENCODING_KNOB_MUTANTS)  # the runner's mutants are the table's encodable ones
    for m in MUTANTS:  # a mutant the encoding cannot express says why
        assert (m.encoding is None) == ("encoding" in m.not_for), m.name
    s = score("encoding", {n: ("x" if i else None) for i, n in enumerate(enc)})
    assert s["killed"] == len(enc) - 1 and s["survivors"] == [enc[0]] and s["total"] == len(enc)
    assert set(s["not_applicable"]) == {m.name for m in MUTANTS if "encoding" in m.not_for}
    with pytest.raises(ValueError):
        score("encoding", {"no-such-mutant": None})


@pytest.mark.parametrize("mutant, killers", [
    ("keys-prompt-only", ["keys-from-all-tokens"]),
    ("window-retained", ["window-bound.window-nulls"]),
    ("partial-tail-chunk", ["partial-tail.full-attention", "partial-tail.mamba"]),
    ("partial-tail-margin", ["partial-tail.full-attention"]),
    ("partial-tail-assert", ["partial-tail.guard"]),
])
def test_issue9_obligations_each_kill_their_own_mutant(mutant, killers):
    """issue 9: each new obligation is the one-group obligation that sees its mutant (the
    safe-load.* hybrids see some of them too)."""
    from kvbound.proofs.runner import kills

    change = ENCODING_KNOB_MUTANTS[mutant]
    got = [o.id for o in OBLIGATIONS if o.expected == Verdict.PROVED and o.mutable and o.bound.groups == 1
           and kills(o, o.code.mutate(**change), OPTIONS)]
    assert got == killers


def test_solver_options_own_the_timeout_and_unknown_is_never_an_answer():
    import z3

    from kvbound.errors import SolverUnknown
    from kvbound.proofs.options import PROVE, is_sat

    assert PROVE.with_timeout(0.25).timeout_ms == 250

    class GaveUp:  # what a solver past its timeout answers
        def check(self, *assumptions):
            return z3.unknown

        def reason_unknown(self):
            return "timeout"

    with pytest.raises(SolverUnknown, match=r"unknown \(timeout\)"):
        is_sat(GaveUp())
    x = z3.Int("x")
    s = PROVE.solver()
    s.add(x > 1)
    assert is_sat(s) and not is_sat(s, x < 0)


@pytest.mark.parametrize("family", ["partial_tail", "short_prompt", "eagle", "retained_window", "resumed",
                                    "group_subset", "adversarial_tail"])
def test_check_plan_models_case_format_v2(family):
    """The encoding plans partial tails (boundary keys, the partial_tail assert), retained windows,
    resumed requests and group subsets as the spec does, and rejects a plan without its boundary key."""
    rejected = 0
    for case in random_cases(25, seed=7, family=family):
        for variant in Variant:
            plan = plan_load(case, variant).to_json(case.name)
            assert check_plan(case, variant, plan).verdict == "forced", (case.name, variant, plan)
            tails = [k for k in plan["keys"] if len(k) == 3]
            if tails:
                bad = copy.deepcopy(plan)
                bad["keys"] = [k for k in bad["keys"] if len(k) != 3]
                assert check_plan(case, variant, bad).verdict == "not_forced"
                bad = copy.deepcopy(plan)
                bad["keys"] = [k if len(k) != 3 else [k[0], "boundary", k[2] + 1] for k in bad["keys"]]
                assert check_plan(case, variant, bad).verdict == "not_forced"
                rejected += 1
    if family in ("partial_tail", "short_prompt"):
        assert rejected


def test_every_mutant_killer_hint_names_a_proved_obligation():
    from kvbound.proofs.mutants import MUTANTS

    proved = {o.id for o in OBLIGATIONS if o.expected == Verdict.PROVED and o.mutable}
    for m in MUTANTS:
        assert m.killer is None or m.killer in proved, (m.name, m.killer)


def test_get_num_skipped_tokens_as_z3_terms_is_the_int_definition_on_small_inputs():
    """The spec's one definition, handed terms.MAX / FLOORDIV and Z3 integers (as the premises and the
    allocator model do), evaluates to what it gives on ints at every small input."""
    from itertools import product

    import z3

    from kvbound.proofs.terms import FLOORDIV, MAX
    from kvbound.spec import GroupKind, get_num_skipped_tokens

    n, w, e, c = z3.Ints("n w e c")
    for kind in GroupKind:
        term = get_num_skipped_tokens(kind, n, sliding_window=w, extra_retained_tokens=e, attention_chunk_size=c,
                                      maximum=MAX, floordiv=FLOORDIV)
        for vn, vw, ve, vc in product(range(20), range(1, 6), range(3), range(1, 6)):
            want = get_num_skipped_tokens(kind, vn, sliding_window=vw, extra_retained_tokens=ve, attention_chunk_size=vc)
            got = term if isinstance(term, int) else z3.simplify(z3.substitute(
                term, (n, z3.IntVal(vn)), (w, z3.IntVal(vw)), (e, z3.IntVal(ve)), (c, z3.IntVal(vc)))).as_long()
            assert got == want, (kind, vn, vw, ve, vc)
