"""Case files: round trip, and every class of bad input rejected with a message naming case, field and rule."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings

from kvbound.spec import CaseError, case_from_dict, case_to_dict, dump_cases, load_cases
from kvbound.spec.strategies import cases

GOOD = {
    "name": "good", "blocks_per_chunk": 1, "tokens_per_hash": 16, "num_prompt_tokens": 65,
    "num_locally_computed_tokens": 32, "num_external_tokens": 32, "sync_load": False,
    "groups": [
        {"kind": "full_attention", "tokens_per_block": 16, "blocks": ["H1", "H2", "U3", "U4"]},
        {"kind": "mamba", "tokens_per_block": 16, "blocks": ["N", "U11", "U12", "U13"]},
    ],
}


def bad(**edits):
    d = copy.deepcopy(GOOD)
    for path, value in edits.items():
        target, *rest = path.split("__")
        if rest:
            gi, key = int(rest[0]), rest[1]
            if value is DELETE:
                del d["groups"][gi][key]
            else:
                d["groups"][gi][key] = value
        elif value is DELETE:
            del d[target]
        else:
            d[target] = value
    return d


DELETE = object()

BAD = [
    # (edits, field named, words of the rule)
    (dict(blocks_per_chunk=DELETE), "blocks_per_chunk", "missing required field"),
    (dict(num_external_tokens="32"), "num_external_tokens", "must be an integer"),
    (dict(num_external_tokens=True), "num_external_tokens", "must be an integer"),
    (dict(num_locally_computed_tokens=-16), "num_locally_computed_tokens", "non-negative"),
    (dict(blocks_per_chunk=0), "blocks_per_chunk", "positive"),
    (dict(tokens_per_hash=0), "tokens_per_hash", "positive"),
    (dict(sync_load="yes"), "sync_load", "true or false"),
    (dict(groups=[]), "groups", "at least one"),
    (dict(groups="fa"), "groups", "must be a list"),
    (dict(tokens_per_blok=16), "tokens_per_blok", "unknown field"),
    (dict(groups__0__kind="flash"), "groups[0].kind", "unknown kind \"flash\""),
    (dict(groups__0__tokens_per_block=0), "groups[0].tokens_per_block", "positive"),
    (dict(groups__1__tokens_per_block=DELETE), "groups[1].tokens_per_block", "missing required field"),
    (dict(groups__1__blocks=["N", "X11"]), "groups[1].blocks[1]", "not a block token"),
    (dict(groups__1__blocks=["N", "H0"]), "groups[1].blocks[1]", "null block: write \"N\""),
    (dict(groups__1__blocks=["N", 11]), "groups[1].blocks[1]", "not a block token"),
    (dict(groups__1__blocks="N U11"), "groups[1].blocks", "must be a list"),
    (dict(groups__1__blocks=["N", "U3"]), "groups[1].blocks[1]", "already used at groups[0].blocks[2]"),
    (dict(groups__0__sliding_window=64), "groups[0].sliding_window", "only a 'sliding_window' group"),
    (dict(groups__1__attention_chunk_size=64), "groups[1].attention_chunk_size", "only a 'chunked_local' group"),
    (dict(groups__0__kind="sliding_window"), "groups[0].sliding_window", "is required"),
    (dict(groups__0__kind="chunked_local", groups__0__attention_chunk_size=0), "groups[0].attention_chunk_size", "positive"),
    (dict(tokens_per_hash=32), "groups[0].tokens_per_block", "multiple of tokens_per_hash"),
    (dict(name=""), "name", "non-empty string"),
]


@pytest.mark.parametrize("edits, field, words", BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_bad_input_is_named(edits, field, words):
    with pytest.raises(CaseError) as e:
        case_from_dict(bad(**edits), "file.json")
    assert e.value.field == field
    assert words in str(e.value)
    assert str(e.value).startswith("case ")


def test_good_case_round_trips():
    case = case_from_dict(GOOD)
    assert case_to_dict(case) == GOOD


@settings(max_examples=100, deadline=None)
@given(cases())
def test_generated_cases_round_trip_through_json(case):
    assert case_from_dict(json.loads(json.dumps(case_to_dict(case)))) == case


def test_jsonl_and_json_files(tmp_path):
    case = case_from_dict(GOOD)
    dump_cases([case, case_from_dict({**GOOD, "name": "two"})], tmp_path / "c.jsonl")
    assert [c.name for c in load_cases(tmp_path / "c.jsonl")] == ["good", "two"]
    dump_cases([case], tmp_path / "c.json")
    assert load_cases(tmp_path / "c.json") == [case]


def test_broken_json_names_file_and_line(tmp_path):
    p = tmp_path / "broken.jsonl"
    p.write_text(json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(CaseError, match=r"broken.jsonl:2.*not valid JSON"):
        load_cases(p)


def test_wrong_suffix_and_missing_file(tmp_path):
    with pytest.raises(CaseError, match="no such file"):
        load_cases(tmp_path / "nope.json")
    (tmp_path / "c.txt").write_text("{}")
    with pytest.raises(CaseError, match=r"\.json or \.jsonl"):
        load_cases(tmp_path / "c.txt")
