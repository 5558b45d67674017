"""Case format v2: v1 files mean what they meant (byte-identical plans), the new
fields parse and validate (every bad-input class with its message), and the three
inputs of issue 9 give vLLM's outputs release by release."""

from __future__ import annotations

import copy
import json

import pytest

from kvbound.spec import (
    AssertName,
    CaseError,
    Variant,
    boundary_key,
    case_from_dict,
    case_to_dict,
    load_cases,
    plan_for_version,
    plan_load,
    release_features,
)

from conftest import EXAMPLES, ROOT, kvbound  # noqa: E402  the one CLI runner (installed script, never the source tree)

GOLDEN = ROOT / "tests" / "golden"
V2 = ROOT / "tests" / "cases_v2"  # the v2 examples; they move to examples/ once impl and proofs model v2
# the example files of case format v1, in the order `kvbound plan examples/` read them
V1_EXAMPLES = (
    "chunked_local.json", "facts_fa_mamba_run.json", "full_attention.json", "mamba_align.json", "pr_case.json",
    "sliding_window.json", "sync_load.json", "vllm_partial_lookup_null_skip.json",
    "vllm_partial_lookup_short_prompt.json", "vllm_recurrent_unhashed.json",
)
VERSIONS = ("0.20.0", "0.21.0", "0.26.0", "0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.32.0", "0.33.0")


# --- v1 means what it meant: characterisation tests --------------------------------------
#
# These two are characterisation (golden-file) tests: they pin what the v1 spec and tool printed,
# not what vLLM does. They fail on any change of output, a correct one included; what vLLM does is
# checked by conform (real releases) and the proofs. A deliberate change regenerates the files.

def test_characterisation_v1_cases_plan_byte_identical_to_case_format_v1():
    """Characterisation: tests/golden/v1-plan.jsonl was written by the v1 spec (commit 0fb3592) for 190
    v1 cases (the examples and 60 generated cases of each v1 family), every variant and nine releases."""
    lines = (GOLDEN / "v1-cases.jsonl").read_text().splitlines()
    got = []
    for line in lines:
        case = case_from_dict(json.loads(line))
        assert json.dumps(case_to_dict(case)) == line  # a v1 case dumps as v1, byte for byte
        for v in Variant:
            out = plan_load(case, v).to_json(case.name)
            out["variant"] = v.value
            got.append(json.dumps(out))
        for ver in VERSIONS:
            out = plan_for_version(case, ver).to_json(case.name)
            out["vllm"] = ver
            got.append(json.dumps(out))
    want = (GOLDEN / "v1-plan.jsonl").read_text().splitlines()
    assert len(got) == len(want) == 190 * 12
    assert got == want


def test_characterisation_v1_example_files_kvbound_plan_byte_identical():
    """Characterisation: `kvbound plan` on the v1 example files prints what the v1 tool printed
    (tests/golden/v1-plan-cli.txt)."""
    files = [EXAMPLES / f for f in V1_EXAMPLES]
    out = ""
    for extra in ([], ["--variant", "legacy"], ["--vllm-version", "0.26.0"], ["--vllm-version", "0.29.0"]):
        r = kvbound("plan", *files, *extra)
        assert r.returncode == 0, r.stderr
        out += r.stdout
    assert out == (GOLDEN / "v1-plan-cli.txt").read_text()


# --- issue 9's three inputs ---------------------------------------------------------------

def plan_json(name, version):
    (case,) = load_cases(V2 / name)
    return plan_for_version(case, version).to_json(case.name)


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0"])
def test_partial_tail_at_44_of_a_45_token_prompt(version):
    p = plan_json("partial_tail_fa_mamba.json", version)
    assert p["outcome"] == "ok"
    assert p["dst_block_ids"] == [2, 3, 13]
    assert p["group_sizes"] == [2, 1] and p["block_indices"] == [1, 2]
    # chunk 1 of group 0, then one boundary key per group (no chunk 2: the tail replaces it)
    assert p["keys"] == [[0, 1], [0, "boundary", 44], [1, "boundary", 44]]


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0"])
def test_partial_tail_of_a_10_token_prompt_loads_through_boundary_keys(version):
    p = plan_json("partial_tail_short_prompt.json", version)
    assert p["outcome"] == "ok"
    assert p["dst_block_ids"] == [1, 11] and p["group_sizes"] == [1, 1] and p["block_indices"] == [0, 0]
    assert p["keys"] == [[0, "boundary", 8], [1, "boundary", 8]]


def test_retained_window_mtp_is_ok_from_0_31_and_window_bound_before():
    assert plan_json("retained_window_mtp.json", "0.33.0")["outcome"] == "ok"
    assert plan_json("retained_window_mtp.json", "0.31.0")["outcome"] == "ok"
    (case,) = load_cases(V2 / "retained_window_mtp.json")
    p = plan_for_version(case, "0.29.0")
    assert p.assertion.name is AssertName.WINDOW_BOUND and p.assertion.group_index == 1
    assert p.assertion.values["sliding_window_size_in_chunks"] == 1  # 0.28-0.30 ignore the retained tokens
    assert plan_for_version(case, "0.27.0").outcome == "unsupported"


def test_v1_partial_tail_cases_gave_keys_length():
    """Without the boundary the 45-token case dies on keys_length: the v1 answer the issue reports."""
    (case,) = load_cases(V2 / "partial_tail_fa_mamba.json")
    v1 = case_from_dict({k: v for k, v in case_to_dict(case).items() if k != "partial_tail_boundary"})
    assert plan_for_version(v1, "0.33.0").assertion.name is AssertName.KEYS_LENGTH


# --- release semantics --------------------------------------------------------------------

TAIL = json.loads((V2 / "partial_tail_fa_mamba.json").read_text())


def v2(**edits):
    d = copy.deepcopy(TAIL)
    for path, value in edits.items():
        target, *rest = path.split("__")
        if rest:
            d["groups"][int(rest[0])][rest[1]] = value
        else:
            d[target] = value
    return d


def test_partial_tail_assert_fires_when_the_boundary_is_not_T():
    case = case_from_dict(v2(num_external_tokens=12))  # T = 28 != 44
    for version in ("0.28.0", "0.29.0", "0.30.0", "0.33.0"):
        p = plan_for_version(case, version)
        assert p.assertion.name is AssertName.PARTIAL_TAIL and p.assertion.group_index is None
        assert p.assertion.values == {"partial_tail_boundary": 44, "num_cached_tokens": 28}
    assert plan_for_version(case, "0.33.0", asserts=False).ok  # python -O: loads anyway


def test_eagle_group_keys_its_tail_past_the_boundary_from_0_33():
    # an EAGLE full-attention group: margin one block (16), or one hash unit (4) with fine-grained hits
    d = v2(num_tokens=64, partial_tail_boundary=28, num_external_tokens=12, num_prompt_tokens=45)
    d["groups"].append({"kind": "full_attention", "tokens_per_block": 16, "is_eagle_group": True,
                        "blocks": ["H21", "U22"]})
    d["groups"][0]["blocks"] = ["H1", "U2"]
    d["groups"][1]["blocks"] = ["N", "U13"]
    case = case_from_dict(d)
    p = plan_for_version(case, "0.33.0")
    assert p.keys[-1] == (2, "boundary", 44) and p.keys[1] == (1, "boundary", 28)
    assert boundary_key(case, 2, release_features("0.33.0")) == (2, "boundary", 44)
    fine = case_from_dict({**d, "cache_hit_alignment_tokens": 4})
    assert plan_for_version(fine, "0.33.0").keys[-1] == (2, "boundary", 32)
    for old in ("0.29.0", "0.32.0"):  # supports_partial_tail excludes EAGLE groups before 0.33
        q = plan_for_version(case, old)
        assert q.outcome == "unsupported" and "EAGLE" in q.unsupported


def test_group_subsets_index_blocks_by_group_idx_from_0_30():
    d = copy.deepcopy(TAIL)
    d["groups"].insert(0, {"kind": "full_attention", "tokens_per_block": 16, "offloaded": False, "blocks": []})
    case = case_from_dict(d)
    p = plan_for_version(case, "0.33.0").to_json(case.name)
    assert p["keys"] == [[1, 1], [1, "boundary", 44], [2, "boundary", 44]]
    assert p["group_sizes"] == [2, 1] and p["dst_block_ids"] == [2, 3, 13]
    q = plan_for_version(case, "0.29.0")
    assert q.outcome == "unsupported" and "every KV-cache group" in q.unsupported


def test_resumed_request_has_keys_for_every_token():
    d = json.loads((EXAMPLES / "vllm_partial_lookup_short_prompt.json").read_text())
    case = case_from_dict(d)
    assert plan_load(case, Variant.FIXED_SYNC).assertion.name is AssertName.KEYS_LENGTH
    resumed = case_from_dict({**d, "num_tokens": 64})
    assert plan_load(resumed, Variant.FIXED_SYNC).ok


# --- every new bad-input class, message checked -------------------------------------------

BAD = [
    (dict(num_tokens=40), "num_tokens", "must be >= num_prompt_tokens 45"),
    (dict(num_tokens="x"), "num_tokens", "must be an integer"),
    (dict(num_tokens=None), "num_tokens", "must be an integer, or left out"),
    (dict(partial_tail_boundary=0), "partial_tail_boundary", "must be positive"),
    (dict(partial_tail_boundary=43), "partial_tail_boundary", "not a multiple of tokens_per_hash 4"),
    (dict(partial_tail_boundary=48), "partial_tail_boundary", "> num_prompt_tokens - 1 = 44"),
    (dict(blocks_per_chunk=2), "partial_tail_boundary", "supports_partial_tail holds; here blocks_per_chunk is 2"),
    (dict(groups__0__tokens_per_block=32), "partial_tail_boundary", "one block size"),
    (dict(groups__1__mamba_cache_mode="all"), "partial_tail_boundary", "no offloaded mamba group in cache mode \"align\""),
    (dict(tokens_per_hash=16), "partial_tail_boundary", "tokens_per_block > tokens_per_hash 16"),
    (dict(decode_context_parallel_size=2), "partial_tail_boundary", "decode_context_parallel_size is 2"),
    (dict(decode_context_parallel_size=0), "decode_context_parallel_size", "must be positive"),
    (dict(cache_hit_alignment_tokens=0), "cache_hit_alignment_tokens", "must be positive"),
    (dict(groups__1__mamba_cache_mode="fast"), "groups[1].mamba_cache_mode", "must be one of align, all, none"),
    (dict(groups__0__mamba_cache_mode="align"), "groups[0].mamba_cache_mode", "only a 'mamba' group has"),
    (dict(groups__0__extra_retained_tokens=16), "groups[0].extra_retained_tokens", "only a 'sliding_window' group"),
    (dict(groups__0__is_eagle_group="yes"), "groups[0].is_eagle_group", "must be true or false"),
    (dict(groups__0__offloaded=0), "groups[0].offloaded", "must be true or false"),
    (dict(groups__0__offloaded=False, groups__1__offloaded=False), "groups", "at least one group must be offloaded"),
    (dict(groups__0__colour=1), "groups[0].colour", "optionally extra_retained_tokens, is_eagle_group"),
]


@pytest.mark.parametrize("edits,field,rule", BAD, ids=[f"{b[1]}:{b[2][:30]}" for b in BAD])
def test_bad_v2_input_names_case_field_rule(edits, field, rule):
    with pytest.raises(CaseError) as e:
        case_from_dict(v2(**edits))
    assert e.value.case == TAIL["name"] and e.value.field == field, str(e.value)
    assert rule in e.value.rule, str(e.value)


def test_bad_sliding_window_retained_and_eagle_hash():
    sw = json.loads((V2 / "retained_window_mtp.json").read_text())
    sw["groups"][1]["extra_retained_tokens"] = -1
    with pytest.raises(CaseError, match=r"groups\[1\].extra_retained_tokens: must be non-negative"):
        case_from_dict(sw)
    d = v2()
    d["groups"].append({"kind": "full_attention", "tokens_per_block": 16, "is_eagle_group": True,
                        "blocks": ["H21", "U22", "U23"]})
    with pytest.raises(CaseError, match="EAGLE proof margin 16 of group 2 = 60 > the 44 tokens"):
        case_from_dict(d)


def test_bad_v2_case_file_is_one_line_exit_2(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(v2(partial_tail_boundary=43)))
    r = kvbound("plan", p)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert "partial_tail_boundary" in r.stderr and "multiple of tokens_per_hash" in r.stderr


# --- generators of the v2 families ---------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402

from kvbound.spec.strategies import (  # noqa: E402
    ADVERSARIAL_FAMILIES,
    ALL_FAMILIES,
    V2_FAMILIES,
    cases,
    family_of,
    random_cases,
)


@pytest.mark.parametrize("family", [f for f in V2_FAMILIES if f not in ADVERSARIAL_FAMILIES])
def test_v2_families_hold_only_what_vllm_builds_and_plan_ok_on_0_33(family):
    for case in random_cases(150, seed=31, family=family):
        assert family_of(case) == family
        p = plan_for_version(case, "0.33.0")
        assert p.ok, (case.name, p.outcome, p.assertion, p.unsupported)
        if family in ("partial_tail", "short_prompt"):
            assert case.partial_tail_boundary == case.num_cached_tokens and case.supports_partial_tail
            assert all(len(g.keys) and g.keys[-1][1] == "boundary" for g in p.groups if g.num_pending_gpu_blocks)
        if family == "short_prompt":
            assert case.num_prompt_tokens <= case.groups[0].config.tokens_per_block
        if family == "eagle":
            assert any(g.config.is_eagle_group for g in case.groups)
        if family == "retained_window":
            assert any(g.config.extra_retained_tokens for g in case.groups)
        if family == "resumed":
            assert case.num_tokens > case.num_prompt_tokens
        if family == "group_subset":
            assert len(case.offloaded_group_indices) < len(case.groups)


def test_partial_tail_family_has_the_prs_recurrent_shape_and_legacy_crashes_on_it():
    shapes = legacy_boundary = 0
    for case in random_cases(200, seed=8, family="partial_tail"):
        f = case.num_locally_computed_tokens // case.groups[0].config.tokens_per_block
        for g in case.groups:
            if g.config.kind.value == "mamba" and any(b.state.value == "U" for b in g.blocks[:f]):
                shapes += 1
        legacy_boundary += plan_for_version(case, "0.29.0").assertion is not None
    assert shapes > 50 and legacy_boundary > 50


def test_adversarial_tail_finds_the_partial_tail_assert():
    names = {plan_for_version(c, "0.33.0").assertion.name for c in random_cases(200, seed=2, family="adversarial_tail")
             if plan_for_version(c, "0.33.0").assertion is not None}
    assert AssertName.PARTIAL_TAIL in names and AssertName.TABLE_LENGTH in names


def test_random_cases_default_mix_is_the_v1_families():
    assert {family_of(c) for c in random_cases(30, seed=0)} == {"realistic", "recurrent_state", "adversarial"}
    assert {family_of(c) for c in random_cases(len(ALL_FAMILIES), seed=0, family="all")} == set(ALL_FAMILIES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(family="all"))
def test_hypothesis_strategy_draws_every_family_through_st_randoms(case):
    assert family_of(case) in ALL_FAMILIES
    p = plan_for_version(case, "0.33.0")
    if family_of(case) not in ADVERSARIAL_FAMILIES:
        assert p.ok, (case.name, p.assertion, p.unsupported)


# --- a partial tail drawn ---------------------------------------------------------------------

def test_explain_draws_the_partial_tail_boundary_first_fresh_region_and_key():
    r = kvbound("explain", V2 / "partial_tail_recurrent.json")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "partial_tail_boundary=76" in out.splitlines()[0]
    tail_rows = [line for line in out.splitlines() if line.lstrip().startswith("tail")]
    assert len(tail_rows) == 2
    assert 'boundary 76 holds 12 of block 4\'s 16 tokens; loaded through key [1, "boundary", 76]' in tail_rows[1]
    # the tail caret sits under block 4, the same column as f's caret in that group
    group1 = out.split("group 1")[1].splitlines()
    f_row = next(line for line in group1 if line.lstrip().startswith("f "))
    assert f_row.index("^") == tail_rows[1].index("^")
    assert "fixed-sync                       ^   start=4  ✓ loads [13] keys chunks [4, 4) + boundary key @76" in out
    assert "✗ boundary" in out  # the legacy scan still stops at the recurrent state block


def test_svg_marks_the_partial_tail_and_eagle_key():
    from kvbound.svg import case_svgs

    (case,) = load_cases(V2 / "partial_tail_recurrent.json")
    svgs = case_svgs(case)
    assert all("partial tail: boundary 76" in s for s in svgs)
    d = v2(num_tokens=64, partial_tail_boundary=28, num_external_tokens=12)
    d["groups"] = [{"kind": "full_attention", "tokens_per_block": 16, "blocks": ["H1", "U2"]},
                   {"kind": "mamba", "tokens_per_block": 16, "blocks": ["N", "U13"]},
                   {"kind": "full_attention", "tokens_per_block": 16, "is_eagle_group": True, "blocks": ["H21", "U22"]},
                   {"kind": "full_attention", "tokens_per_block": 16, "offloaded": False, "blocks": ["H31", "U32"]}]
    case = case_from_dict(d)
    svgs = case_svgs(case)
    assert "EAGLE drafter group" in svgs[2] and "boundary + EAGLE proof margin 16" in svgs[2]
    assert "not offloaded" in svgs[3] and "fixed-sync" not in svgs[3]


def test_explain_with_a_release_plans_as_that_release():
    r = kvbound("explain", "--vllm-version", "0.30.0", V2 / "retained_window_mtp.json")
    assert "AssertionError (window_bound) in group 1" in r.stdout and "ignores its extra_retained_tokens=16" in r.stdout
    r = kvbound("explain", "--vllm-version", "0.31.0", V2 / "retained_window_mtp.json")
    assert "fixed      ok: dst_block_ids=[2, 3, 4, 12, 13, 14]" in r.stdout
    r = kvbound("explain", "--vllm-version", "0.27.0", V2 / "partial_tail_fa_mamba.json")
    assert "unsupported: vLLM 0.27.0 has no partial tails" in r.stdout
