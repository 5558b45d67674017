"""One table of vLLM's asserts (spec/asserts.py): every layer's codes, values and patterns come from it."""

from __future__ import annotations

import pytest

from kvbound.spec import AssertName
from kvbound.spec.asserts import ASSERT_CODE, ASSERTS, NO_ASSERT, REQUEST_ASSERTS, ROW


def test_every_assert_name_has_one_row_and_a_distinct_nonzero_code():
    assert [row.name for row in ASSERTS] == list(AssertName)
    assert sorted(ASSERT_CODE.values()) == list(range(1, len(AssertName) + 1)) and NO_ASSERT == 0
    assert REQUEST_ASSERTS == (AssertName.PARTIAL_TAIL,)


def test_the_encoding_the_impl_and_conform_derive_from_the_table():
    from kvbound.conform import compare
    from kvbound.impl import plan as impl_plan
    from kvbound.proofs import encoding

    assert not {"FAIL_CODE", "CODE_FAIL", "OK"} & set(dir(encoding))  # the codes have one name: spec/asserts.py's
    assert not {"ASSERT_CODES", "CODE_OK", "ASSERT_NAMES"} & set(dir(impl_plan))
    assert impl_plan.ASSERTION_VALUES == {row.name: row.values for row in ASSERTS}
    assert [name for name, _ in compare._ASSERT_PATTERNS] == list(AssertName)


@pytest.mark.parametrize("name", list(AssertName))
def test_the_spec_reports_exactly_the_values_the_table_names(name):
    """Every assert the generated and example cases fire carries the table's values, in order."""
    from conftest import EXAMPLES
    from kvbound.spec import Variant, load_case_paths, plan_load
    from kvbound.spec.strategies import random_cases

    seen = False
    cases = list(load_case_paths([EXAMPLES])) + list(random_cases(400, seed=3, family="all"))
    for case in cases:
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
