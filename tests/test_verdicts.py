"""One ordered enum of verdicts: its order, what each says held, and that the checks use it."""

from __future__ import annotations

import json

from kvbound.spec.verdicts import CONFORM_VERDICTS, PLAN_CHECK_VERDICTS, PROOF_VERDICTS, Verdict


def test_order_is_counterexample_then_nothing_then_holds():
    assert min(Verdict.PROVED, Verdict.UNKNOWN) is Verdict.UNKNOWN  # a summary is the minimum
    assert min(Verdict.AGREE, Verdict.UNDRIVEN, Verdict.DISAGREE) is Verdict.DISAGREE
    for group in (PROOF_VERDICTS, PLAN_CHECK_VERDICTS, CONFORM_VERDICTS):
        assert list(group) == sorted(group)
        assert [v.holds for v in group][0] is False and [v.holds for v in group][-1] is True
    assert Verdict.UNKNOWN.holds is None and Verdict.UNSUPPORTED.holds is None


def test_members_are_the_json_strings():
    assert Verdict.PROVED == "proved" and f"{Verdict.NOT_FORCED}" == "not_forced"
    assert json.loads(json.dumps({"v": Verdict.UNSUPPORTED})) == {"v": "unsupported"}
    assert Verdict("agree") is Verdict.AGREE


def test_every_check_reports_a_verdict_member():
    from kvbound.conform import compare
    from kvbound.proofs import OBLIGATIONS
    from kvbound.proofs.symbolic import check_plan
    from kvbound.spec import Variant, load_cases, plan_load

    from conftest import EXAMPLES

    import kvbound.proofs as proofs

    assert not {"PROVED", "REFUTED", "UNKNOWN"} & set(dir(proofs))  # no second name for a verdict
    assert all(o.expected in PROOF_VERDICTS for o in OBLIGATIONS)
    assert {compare.AGREE, compare.DISAGREE, compare.FAULT, compare.UNDRIVEN, compare.UNSUPPORTED} == set(CONFORM_VERDICTS)
    (case,) = load_cases(EXAMPLES / "pr_case.json")
    r = check_plan(case, Variant.FIXED, plan_load(case, Variant.FIXED).to_json(case.name))
    assert r.verdict is Verdict.FORCED
