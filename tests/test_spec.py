"""The executable spec against vLLM's own facts (docs/vllm-semantics.md, the PR) and its properties."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, assume, given, settings

from kvbound.spec import (
    AssertName,
    Case,
    Group,
    GroupConfig,
    GroupKind,
    Variant,
    cdiv,
    get_num_skipped_tokens,
    load_cases,
    parse_table,
    plan_load,
    variant_for_version,
)
from kvbound.spec.strategies import cases, random_cases

from conftest import EXAMPLES
FA, MAMBA = GroupKind.FULL_ATTENTION, GroupKind.MAMBA


def example(name: str) -> Case:
    (case,) = load_cases(EXAMPLES / name)
    return case


def mk(groups, N, M, P, tph=16, bpc=1, sync=False, name="t") -> Case:
    return Case(name, bpc, tph, P, N, M, tuple(Group(GroupConfig(k, b), parse_table(t)) for k, b, t in groups), sync)


# --- the PR's case ---------------------------------------------------------------

def test_pr_case_legacy_fires_boundary_with_start_3():
    case = example("pr_case.json")
    mamba = case.groups[1].blocks
    assert len(mamba) == 22 and [b.token[0] for b in mamba[:5]] == ["H", "H", "N", "U", "N"]
    plan = plan_load(case, Variant.LEGACY)
    a = plan.assertion
    assert a.name is AssertName.BOUNDARY and a.group_index == 1
    assert a.values["load_start_gpu_block_idx"] == 3
    assert a.values["num_locally_computed_tokens"] == 21 * 16
    assert plan.dst_block_ids == () and plan.keys == ()


@pytest.mark.parametrize("variant", [Variant.FIXED, Variant.FIXED_SYNC])
def test_pr_case_fixed_loads_block_21_only(variant):
    case = example("pr_case.json")
    plan = plan_load(case, variant)
    assert plan.ok
    mamba = plan.groups[1]
    assert mamba.load_start_gpu_block_idx == 21 and mamba.num_pending_gpu_blocks == 1
    assert mamba.dst_block_ids == (case.groups[1].blocks[21].block_id,)
    assert plan.keys == ((0, 21), (1, 21))


# --- vLLM's hand-built cases (docs/vllm-semantics.md#hand-built-cases) -------------------------------------------

def test_vllm_recurrent_unhashed_block_case():
    case = mk([(FA, 16, "H31 U32"), (MAMBA, 16, "U41 U42")], N=16, M=16, P=64, tph=4)
    plan = plan_load(case, Variant.FIXED)
    assert plan.dst_block_ids == (32, 42)
    assert plan.group_sizes == (1, 1) and plan.block_indices == (1, 1)
    assert plan.keys == ((0, 1), (1, 1))
    assert 41 not in plan.dst_block_ids
    legacy = plan_load(case, Variant.LEGACY)
    assert legacy.assertion.name is AssertName.BOUNDARY and legacy.assertion.group_index == 1


def test_vllm_partial_lookup_null_skip_case():
    case = mk([(FA, 16, "U31 U32"), (MAMBA, 16, "N U41")], N=0, M=28, P=64, tph=4)
    for v in Variant:
        plan = plan_load(case, v)
        assert plan.dst_block_ids == (31, 32, 41), v
        assert plan.group_sizes == (2, 1) and plan.block_indices == (0, 1)
        assert plan.keys == ((0, 0), (0, 1), (1, 1))
    short = mk([(FA, 16, "U31 U32"), (MAMBA, 16, "N U41")], N=0, M=28, P=30, tph=4)
    for v in Variant:
        assert plan_load(short, v).assertion.name is AssertName.KEYS_LENGTH


def test_facts_run_case_fa_mamba_n32_m32():
    case = mk([(FA, 16, "H1 H2 U3 U4"), (MAMBA, 16, "N U11 U12 U13")], N=32, M=32, P=65)
    assert plan_load(case, Variant.LEGACY).assertion.name is AssertName.BOUNDARY
    plan = plan_load(case, Variant.FIXED_SYNC)
    assert plan.dst_block_ids == (3, 4, 12, 13)
    assert plan.group_sizes == (2, 2) and plan.block_indices == (2, 2) and len(plan.keys) == 4


def test_shipped_examples_match_their_facts():
    assert plan_load(example("vllm_recurrent_unhashed.json"), "fixed").dst_block_ids == (32, 42)
    assert plan_load(example("vllm_partial_lookup_null_skip.json"), "fixed").dst_block_ids == (31, 32, 41)
    assert plan_load(example("facts_fa_mamba_run.json"), "fixed-sync").dst_block_ids == (3, 4, 12, 13)


# --- the other asserts, each with its numbers --------------------------------------

def test_no_external_tokens_returns_before_planning():
    plan = plan_load(mk([(MAMBA, 16, "U1")], N=16, M=0, P=32), Variant.LEGACY)
    assert plan.ok and plan.groups == () and plan.to_json("x")["dst_block_ids"] == []


def test_alignment_fires_on_unaligned_n_in_fixed_only():
    case = mk([(FA, 16, "H1 H2 U3")], N=20, M=28, P=64)
    a = plan_load(case, Variant.FIXED).assertion
    assert a.name is AssertName.ALIGNMENT and a.values == {
        "num_locally_computed_tokens": 20, "tokens_per_block": 16, "load_start_gpu_block_idx": 2}
    legacy = plan_load(case, Variant.LEGACY)  # 20 <= 2 * 16: the legacy assert is silent
    assert legacy.ok and legacy.dst_block_ids == (3,)


def test_table_length_fires_first():
    case = mk([(FA, 16, "H1")], N=16, M=32, P=64)
    a = plan_load(case, Variant.FIXED).assertion
    assert a.name is AssertName.TABLE_LENGTH and a.values == {"table_length": 1, "num_gpu_blocks": 3}


def test_window_bound_on_mamba_with_too_many_pending():
    case = mk([(MAMBA, 16, "U1 U2 U3")], N=0, M=48, P=64)
    a = plan_load(case, Variant.FIXED).assertion
    assert a.name is AssertName.WINDOW_BOUND
    assert a.values["num_pending_gpu_blocks"] == 3 and a.values["sliding_window_size_in_chunks"] == 1


def test_asserts_stripped_legacy_loads_into_computed_block():
    case = example("pr_case.json")
    plan = plan_load(case, Variant.LEGACY, asserts=False)
    assert plan.ok and plan.groups[1].load_start_gpu_block_idx == 3
    assert 33 in plan.dst_block_ids and (1, 3) in plan.keys  # a computed block, wrong keys


def test_sync_load_matches_by_position_only_in_fixed_sync():
    case = example("sync_load.json")
    assert plan_load(case, Variant.FIXED).dst_block_ids == ()
    assert plan_load(case, Variant.FIXED_SYNC).dst_block_ids == (3, 4)


# --- properties -----------------------------------------------------------------

def _aligned(case: Case) -> bool:
    return all(case.num_locally_computed_tokens % g.config.tokens_per_block == 0 for g in case.groups)


def _same(a, b) -> bool:
    return a.to_json("x") == b.to_json("x")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases())
def test_legacy_asserts_or_equals_fixed_when_n_is_block_aligned(case):
    assume(_aligned(case))  # hypothesis counts and reports the examples it discards
    legacy, fixed = plan_load(case, Variant.LEGACY), plan_load(case, Variant.FIXED)
    assert (legacy.assertion is not None and legacy.assertion.name is AssertName.BOUNDARY) or _same(legacy, fixed)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(cases(kinds=[GroupKind.FULL_ATTENTION]))
def test_legacy_equals_fixed_on_full_attention_configs(case):
    from kvbound.proofs.premises import evaluate

    # the tables vLLM builds for full attention: every block below f a cache hit (premise computed-hashed),
    # and an aligned N (legacy has no alignment assert: an unaligned N is a different question)
    # (the recurrent_state family adds its Mamba group whatever kinds are asked for)
    assume(all(g.config.kind is FA for g in case.groups))
    assume(_aligned(case) and all(c.holds for c in evaluate(case, ["computed-hashed"])))
    assert _same(plan_load(case, Variant.LEGACY), plan_load(case, Variant.FIXED))


def test_fixed_variants_never_assert_on_calls_that_meet_the_allocator_premises():
    """Not a check of our generator: every family, adversarial ones included, is filtered by the
    proofs' premises (what vLLM's allocator, scheduler and lookup guarantee, each read from
    vLLM's source); on what passes, 0.30+ never asserts, and 0.29 asserts only on the PR's
    shape (a Mamba group's unhashed block below f) or, lacking 0.31's retained-token window,
    on a window with extra_retained_tokens."""
    from kvbound.proofs.premises import evaluate
    from kvbound.spec.strategies import ALL_FAMILIES  # every family the generators have, by their own list

    kept, legacy_boundary = 0, 0
    for family in ALL_FAMILIES:
        for case in random_cases(60, seed=31, family=family):
            if case.num_external_tokens == 0 or not all(c.holds for c in evaluate(case)):
                continue
            kept += 1
            for v in (Variant.FIXED, Variant.FIXED_SYNC):
                plan = plan_load(case, v)
                assert plan.ok or plan.unsupported, (case.name, v, plan.assertion)
            legacy = plan_load(case, Variant.LEGACY)
            if legacy.assertion is None:
                continue
            g = case.groups[legacy.assertion.group_index]
            f = cdiv(case.num_locally_computed_tokens, g.config.tokens_per_block)
            if legacy.assertion.name is AssertName.BOUNDARY:
                legacy_boundary += 1
                assert g.config.kind is MAMBA and any(b.state.value == "U" for b in g.blocks[:f]), case.name
            else:
                assert legacy.assertion.name is AssertName.WINDOW_BOUND and g.config.extra_retained_tokens, case.name
    assert kept >= 400 and legacy_boundary >= 50, (kept, legacy_boundary)


def _premises_broken(case):
    from kvbound.proofs.premises import evaluate
    return [(c.premise.id, c.group_index, c.detail) for c in evaluate(case) if not c.holds]


def test_eagle_cases_are_hits_the_lookup_can_return():
    """An EAGLE group pops the chunk it queried past the hit (0.33 scheduler.py:936-942, 984-985):
    every ``eagle`` case, whole chunks or a partial tail, meets every premise (keys-cover-hit above all)."""
    bad = [(c.name, b) for c in random_cases(2000, seed=11, family="eagle") if (b := _premises_broken(c))]
    assert not bad, bad[:3]
    whole = [c for c in random_cases(2000, seed=11, family="eagle") if c.partial_tail_boundary is None]
    assert len(whole) >= 200  # the whole-chunk EAGLE cases are drawn, and each has the chunk past T
    assert all(c.num_offload_keys(0) * c.blocks_per_chunk * c.groups[0].config.tokens_per_block
               >= c.num_cached_tokens + c.groups[0].config.tokens_per_block for c in whole)


@settings(max_examples=200, deadline=None)
@given(cases(family="eagle"))
def test_eagle_cases_meet_every_premise_hypothesis(case):
    assert not _premises_broken(case), case


def test_fixed_and_fixed_sync_agree_without_sync_load():
    for case in random_cases(300, seed=3):
        if not case.sync_load:
            assert _same(plan_load(case, Variant.FIXED), plan_load(case, Variant.FIXED_SYNC))


def test_random_cases_repeat_from_their_seed_and_each_family_keeps_its_shape():
    from kvbound.proofs.premises import evaluate

    def dump(seed, family=None):
        return [plan_load(c, "fixed").to_json(c.name) | {"case": repr(c)} for c in random_cases(20, seed=seed, family=family)]

    assert dump(5) == dump(5)  # a seed is a reproducible corpus
    assert dump(5) != dump(6)  # and the seed matters
    # what a family promises, judged by the premises (not by the generator's own code)
    assert all(c.holds for case in random_cases(60, seed=5, family="realistic") for c in evaluate(case))
    broken = [case.name for case in random_cases(60, seed=5, family="adversarial")
              if not all(c.holds for c in evaluate(case))]
    assert len(broken) >= 15


# --- versions -----------------------------------------------------------------------

@pytest.mark.parametrize("version, variant", [
    ("0.20.0", Variant.LEGACY), ("0.26.0", Variant.LEGACY), ("0.29.0", Variant.LEGACY),
    ("0.30.0", Variant.FIXED), ("0.32.1", Variant.FIXED), ("0.33.0", Variant.FIXED_SYNC),
    ("0.34.0rc1", Variant.FIXED_SYNC), ("v0.29.0+cu130", Variant.LEGACY),
])
def test_version_map(version, variant):
    assert variant_for_version(version) is variant


@pytest.mark.parametrize("version, words", [
    ("0.18.2", "no offloading connector"), ("0.19.1", "group 0 only"), ("latest", "MAJOR.MINOR"),
])
def test_version_map_refuses_what_it_cannot_model(version, words):
    with pytest.raises(ValueError, match=words):
        variant_for_version(version)


# --- release details beside the scan (read from each wheel) -----------------------------

def test_release_asserts_per_release():
    from kvbound.spec import ReleaseFeatures, release_features

    latest = ReleaseFeatures()
    assert release_features("0.20.0").window_slack is None
    assert release_features("0.26.0").window_slack == 0 and release_features("0.26.0").keys_every_group
    assert release_features("0.27.0").window_slack == 1 and release_features("0.27.0").keys_every_group
    for v in ("0.28.0", "0.29.0", "0.30.0", "0.33.0"):
        a = release_features(v)
        assert (a.window_slack, a.keys_every_group) == (latest.window_slack, latest.keys_every_group)


def test_the_v1_release_names_warn_and_still_answer():
    import kvbound.spec as spec

    for name in ("ReleaseAsserts", "LATEST_ASSERTS", "release_asserts"):
        with pytest.warns(DeprecationWarning, match=name):
            assert getattr(spec, name) is not None
    with pytest.warns(DeprecationWarning):
        assert spec.release_asserts("0.29.0") == spec.release_features("0.29.0")
    assert not {"ReleaseAsserts", "LATEST_ASSERTS", "release_asserts"} & set(spec.__all__)


def test_0_26_window_bound_has_no_slack():
    from kvbound.spec import plan_for_version

    case = mk([(MAMBA, 16, "N U1 U2")], N=16, M=32, P=64)  # 2 pending, Mamba window 1 chunk
    assert plan_for_version(case, "0.29.0").ok
    a = plan_for_version(case, "0.26.0").assertion
    assert a.name is AssertName.WINDOW_BOUND and "+ 0" in a.message


def test_0_27_checks_keys_of_a_group_with_nothing_pending():
    from kvbound.spec import plan_for_version

    # group 1 (b=64) has nothing to load, yet 0.27 checks its keys: a 32-token prompt gives it 0 < 1
    case = mk([(FA, 16, "H1 U2"), (FA, 64, "H3")], N=16, M=16, P=32)
    assert plan_for_version(case, "0.29.0").dst_block_ids == (2,)
    a = plan_for_version(case, "0.27.0").assertion
    assert a.name is AssertName.KEYS_LENGTH and a.group_index == 1
    assert a.values["num_offload_keys"] == 0 and a.values["end_chunk_idx"] == 1


def test_get_num_skipped_tokens_gives_vllm_s_own_examples():
    """The examples of vLLM's docstrings (0.33 single_type_kv_cache_manager.py:1148, :1381), the retained
    tokens pulling the window's trailing edge back, and a Mamba group keeping one token's state."""
    SW, CL = GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL
    assert get_num_skipped_tokens(SW, 7, sliding_window=4) == 4
    assert get_num_skipped_tokens(SW, 7, sliding_window=4, extra_retained_tokens=2) == 2
    assert get_num_skipped_tokens(SW, 2, sliding_window=4) == 0  # the window still reaches token 0
    assert [get_num_skipped_tokens(CL, n, attention_chunk_size=8) for n in (13, 8, 7)] == [8, 8, 0]
    assert get_num_skipped_tokens(MAMBA, 13) == 12 and get_num_skipped_tokens(FA, 13) == 0
