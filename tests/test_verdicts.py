"""One ordered enum of verdicts: its order, what each says held, and that the checks use it."""

from __future__ import annotations

import json

from kvbound.spec.verdicts import CONFORM_VERDICTS, PLAN_CHECK_VERDICTS, PROOF_VERDICTS, Verdict


def test_order_is_counterexample_then_nothing_then_holds():
    assert min(Verdict.PROVED, Verdict.UNKNOWN) is Verdict.UNKNOWN  # a summary is the minimum
    assert min(Verdict.AGREE, Verdict.UNDRIVEN, Verdict.DISAGREE) is Verdict.DISAGREE


def _verdicts_of_real_checks() -> dict:
    """{what the check established: the verdicts it reached}, from real checks: two obligations,
    check_plan with the spec's plan and with a wrong one, conform's judge on a matching, a
    differing, a crashed, a refused and an undriven real result."""
    from kvbound.conform import compare
    from kvbound.proofs import OBLIGATIONS, run_obligation
    from kvbound.proofs.symbolic import check_plan
    from kvbound.spec import Variant, load_cases, plan_load

    from conftest import EXAMPLES

    by_id = {o.id: o for o in OBLIGATIONS}
    proved, refuted = (run_obligation(by_id[i]).verdict for i in ("alignment", "legacy-refuted"))
    (pr,) = load_cases(EXAMPLES / "pr_case.json")
    plan = plan_load(pr, Variant.FIXED).to_json(pr.name)
    forced = check_plan(pr, Variant.FIXED, plan).verdict
    not_forced = check_plan(pr, Variant.FIXED, dict(plan, dst_block_ids=[b + 1 for b in plan["dst_block_ids"]])).verdict
    (facts,) = load_cases(EXAMPLES / "facts_fa_mamba_run.json")
    ok = {"outcome": "ok", "phase": "done", "dst_block_ids": [3, 4, 12, 13], "group_sizes": [2, 2],
          "block_indices": [2, 2], "keys": [[0, 2], [0, 3], [1, 2], [1, 3]],
          "lookup": {"num_external_tokens": 32}, "sync_load_marked": False}
    (sync,) = load_cases(EXAMPLES / "sync_load.json")
    judged = [compare.judge(c, "0.33.0", r)["verdict"] for c, r in [
        (facts, ok), (facts, dict(ok, dst_block_ids=[3, 4, 11, 12])),
        (facts, {"outcome": "worker_crash", "exit_code": -11, "stderr_tail": "boom"}),
        (facts, {"outcome": "assertion_error", "phase": "setup", "assert_site": {}}),
        (sync, dict(ok, dst_block_ids=[3, 4], group_sizes=[2], block_indices=[2], keys=[[0, 2], [0, 3]]))]]
    agree, disagree, fault, unsupported, undriven = judged
    return {"a counterexample": [refuted, not_forced, disagree, fault],
            "nothing": [unsupported, undriven],
            "the claim": [proved, forced, agree]}


def test_each_check_s_verdict_says_what_it_established_and_sorts_by_it():
    """The verdicts real checks reach: ``holds`` is False on a counterexample, None where nothing was
    established, True where the claim holds; sorted (as the report lists them), counterexamples
    come first, so the summary of the checks (their min) is a counterexample."""
    from kvbound.spec.verdicts import CONFORM_VERDICTS, PLAN_CHECK_VERDICTS, PROOF_VERDICTS

    got = _verdicts_of_real_checks()
    assert got == {"a counterexample": [Verdict.REFUTED, Verdict.NOT_FORCED, Verdict.DISAGREE, Verdict.FAULT],
                   "nothing": [Verdict.UNSUPPORTED, Verdict.UNDRIVEN],
                   "the claim": [Verdict.PROVED, Verdict.FORCED, Verdict.AGREE]}
    for established, holds in (("a counterexample", False), ("nothing", None), ("the claim", True)):
        assert {v.holds for v in got[established]} == {holds}, established
    every = [v for vs in got.values() for v in vs]
    assert [v.holds for v in sorted(every)] == [False] * 4 + [None] * 2 + [True] * 3
    assert min(every).holds is False
    relation = {"prove": (got["a counterexample"][0], got["the claim"][0]),
                "check_plan": (got["a counterexample"][1], got["the claim"][1]),
                "conform": (*got["a counterexample"][2:], *got["nothing"], got["the claim"][2])}
    for name, allowed in (("prove", PROOF_VERDICTS), ("check_plan", PLAN_CHECK_VERDICTS), ("conform", CONFORM_VERDICTS)):
        assert set(relation[name]) <= set(allowed), name


def test_members_are_the_json_strings():
    assert Verdict.PROVED == "proved" and f"{Verdict.NOT_FORCED}" == "not_forced"
    assert json.loads(json.dumps({"v": Verdict.UNSUPPORTED})) == {"v": "unsupported"}
    assert Verdict("agree") is Verdict.AGREE


def test_a_record_reads_back_its_checks_verdict_and_refuses_another_relations():
    """A conform record, written as kvbound conform writes it, reads back with its verdict; the same
    record with a proof's verdict is refused with the field named (one line, no traceback)."""
    import pytest

    from kvbound.conform import compare
    from kvbound.errors import ReportInputError
    from kvbound.records import ConformCase
    from kvbound.spec import load_cases

    from conftest import EXAMPLES

    (facts,) = load_cases(EXAMPLES / "facts_fa_mamba_run.json")
    rec = dict(compare.judge(facts, "0.33.0", {"outcome": "worker_crash", "exit_code": -11}), row="example")
    back = ConformCase.from_json(json.loads(json.dumps(ConformCase.from_dict(rec).to_json())), "cases[0]")
    assert back.verdict is Verdict.FAULT
    with pytest.raises(ReportInputError, match=r"^cases\[0\]\.verdict: 'proved' is not one of fault, "):
        ConformCase.from_json(dict(rec, verdict="proved"), "cases[0]")


def test_obligations_expect_proof_verdicts_and_no_second_name_exists():
    from kvbound.proofs import OBLIGATIONS
    from kvbound.spec.verdicts import PROOF_VERDICTS

    import kvbound.proofs as proofs

    assert not {"PROVED", "REFUTED", "UNKNOWN"} & set(dir(proofs))  # no second name for a verdict
    assert all(o.expected in PROOF_VERDICTS for o in OBLIGATIONS)
