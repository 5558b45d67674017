"""One table of vLLM's asserts (spec/asserts.py): every layer's codes, values and patterns come from it."""

from __future__ import annotations

import pytest

from kvbound.spec import AssertName
from kvbound.spec.asserts import ASSERT_CODE, ASSERTS, NO_ASSERT, REQUEST_ASSERTS, ROW


def test_every_assert_name_has_one_row_and_a_distinct_nonzero_code():
    assert [row.name for row in ASSERTS] == list(AssertName)
    assert sorted(ASSERT_CODE.values()) == list(range(1, len(AssertName) + 1)) and NO_ASSERT == 0


def test_the_codes_have_one_name_spec_asserts_s():
    from kvbound.impl import plan as impl_plan
    from kvbound.proofs import encoding

    assert not {"FAIL_CODE", "CODE_FAIL", "OK"} & set(dir(encoding))
    assert not {"ASSERT_CODES", "CODE_OK", "ASSERT_NAMES"} & set(dir(impl_plan))


def _firing_cases():
    """The examples and 400 generated cases of every family: between them every assert fires."""
    from conftest import EXAMPLES
    from kvbound.spec import load_case_paths
    from kvbound.spec.strategies import random_cases

    return list(load_case_paths([EXAMPLES])) + list(random_cases(400, seed=3, family="all"))


def test_a_request_assert_fires_before_any_group_and_a_group_assert_after_the_groups_before_it():
    """What a row's ``request_level`` does: the spec fires a request-level assert before it plans a
    group (no group planned, no group named); a group's assert names its group, with the
    offloaded groups before it planned."""
    from kvbound.spec import Variant, plan_load

    seen = set()
    for case in _firing_cases():
        for v in Variant:
            plan = plan_load(case, v)
            a = plan.assertion
            if a is None:
                continue
            seen.add((a.name, a.name in REQUEST_ASSERTS))
            planned = [g.group_index for g in plan.groups]
            if a.name in REQUEST_ASSERTS:
                assert a.group_index is None and planned == [], (case.name, v, a)
            else:
                order = list(case.offloaded_group_indices)
                assert planned == order[:order.index(a.group_index)], (case.name, v, a, planned)
    assert seen == {(name, name in REQUEST_ASSERTS) for name in AssertName}
    assert any(request for _, request in seen) and not all(request for _, request in seen)


def test_the_impl_reports_each_assert_with_the_specs_numbers():
    """On every case that fires an assert, the batched impl reports the same assert, group and
    numbers as the spec, in the row's order (conform names a real one from its statement:
    tests/test_conform.py)."""
    from kvbound.impl import batch_from_cases, plan_batch, to_load_plans
    from kvbound.spec import Variant, plan_load

    cases = _firing_cases()
    batch = batch_from_cases(cases)
    seen = set()
    for v in Variant:
        for case, got in zip(cases, to_load_plans(batch, plan_batch(batch, v))):
            want = plan_load(case, v).assertion
            assert (want is None) == (got.assertion is None), (case.name, v)
            if want is not None:
                seen.add(want.name)
                assert (got.assertion.name, got.assertion.group_index) == (want.name, want.group_index)
                assert list(got.assertion.values.items()) == list(want.values.items()) and \
                    tuple(got.assertion.values) == ROW[want.name].values, (case.name, v)
    assert seen == set(AssertName)


@pytest.mark.parametrize("name", list(AssertName))
def test_the_spec_reports_exactly_the_values_the_table_names(name):
    """Every assert the generated and example cases fire carries the table's values, in order."""
    from kvbound.spec import Variant, plan_load

    seen = False
    for case in _firing_cases():
        for v in Variant:
            a = plan_load(case, v).assertion
            if a is not None and a.name is name:
                seen = True
                assert tuple(a.values) == ROW[name].values
    assert seen, f"no case fired {name.value}: the check above ran on nothing"


def test_the_spec_refuses_to_report_values_the_table_does_not_name(monkeypatch):
    from dataclasses import replace

    from conftest import EXAMPLES
    from kvbound.spec import Variant, load_cases, plan_load
    from kvbound.spec import plan as spec_plan

    (pr,) = load_cases(EXAMPLES / "pr_case.json")
    rows = dict(ROW, **{AssertName.BOUNDARY: replace(ROW[AssertName.BOUNDARY], values=("tokens_per_block",))})
    monkeypatch.setattr(spec_plan, "ROW", rows)
    with pytest.raises(AssertionError, match="boundary must report spec/asserts.py's"):
        plan_load(pr, Variant.LEGACY)
