"""The batched torch impl: agrees with the spec (hypothesis, random batches, the corpus),
is forced by the symbolic model, rejects bad tensors by name, and the differential
machinery itself catches a broken impl."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from kvbound.cli import main
from kvbound.impl import (
    BatchError,
    agrees_with_spec,
    batch_from_cases,
    cases_from_batch,
    diff_against_spec,
    plan_batch,
    plan_fields,
    plan_variants,
    shrink_case,
    to_load_plans,
)
from kvbound.impl import plan as impl_plan
from kvbound.spec import STATE_H
from kvbound.spec import AssertName, Variant, case_to_dict, load_case_paths, load_cases, plan_load
from kvbound.spec.asserts import ASSERT_CODE
from kvbound.spec.verdicts import Verdict
from kvbound.spec.strategies import cases, random_cases

from conftest import CORPUS, EXAMPLES, ROOT


def _agree_all(case_list, asserts=True):
    stats = diff_against_spec(case_list, device="cpu", asserts=asserts)
    assert stats.disagreements == [], [(d.case.name, d.variant, d.detail) for d in stats.disagreements[:3]]
    return stats


def test_examples_agree_with_spec_every_variant():
    _agree_all(load_case_paths([EXAMPLES]))


def test_corpus_replays_clean():
    """Every shrunk failing case ever saved must now agree, under every variant."""
    corpus = load_case_paths([CORPUS])
    assert corpus, "corpus/ holds the shrunk cases the differential found; it must not be empty"
    _agree_all(corpus)
    for c in corpus:
        for v in Variant:
            assert agrees_with_spec(c, v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_hypothesis_cases_agree(case):
    for v in Variant:
        assert agrees_with_spec(case, v), (case.name, v)


def test_random_batch_agrees_including_python_O():
    batch = list(random_cases(3000, seed=20260))
    stats = _agree_all(batch)
    # the batch exercises every assertion and every kind, or the agreement says little
    seen = {name for (_, name) in stats.outcomes}
    assert seen >= {"ok", "table_length", "boundary", "alignment", "window_bound", "keys_length"}
    assert all(n > 0 for n in stats.groups.values())
    _agree_all(batch[:1000], asserts=False)


def test_first_failing_group_in_config_order():
    pr = load_cases(EXAMPLES / "pr_case.json")[0]
    b = batch_from_cases([pr])
    out = plan_batch(b, Variant.LEGACY)
    assert out.failing_group.tolist() == [1]  # the mamba group, after the full-attention group planned
    assert out.dense("code")[0].tolist() == [0, ASSERT_CODE[AssertName.BOUNDARY]]
    plan = to_load_plans(b, out)[0]
    assert plan.assertion.name is AssertName.BOUNDARY and plan.dst_block_ids == ()
    assert plan_fields(plan) == plan_fields(plan_load(pr, Variant.LEGACY))
    fixed = to_load_plans(b, plan_batch(b, Variant.FIXED))[0]
    assert fixed.ok and fixed.dst_block_ids == plan_load(pr, Variant.FIXED).dst_block_ids


def test_sync_load_matches_by_position_only_in_fixed_sync():
    sync = load_cases(EXAMPLES / "sync_load.json")[0]
    b = batch_from_cases([sync])
    assert bool((b.state == STATE_H).any())
    outs = plan_variants(b)
    for v, out in outs.items():
        assert plan_fields(to_load_plans(b, out)[0]) == plan_fields(plan_load(sync, v))


def test_converters_round_trip_and_padding_is_inert():
    cs = list(random_cases(200, seed=3))
    b = batch_from_cases(cs, slots=130, groups=11)  # extra padding must change nothing
    assert b.shape[1:] == (11, 136)
    assert cases_from_batch(b) == cs
    for v, out in plan_variants(b).items():
        for c, p in zip(cs, to_load_plans(b, out)):
            assert plan_fields(p) == plan_fields(plan_load(c, v))


def test_long_tables_span_several_packed_words():
    """Tables longer than 32 and 64 slots: the scan crosses word boundaries."""
    from kvbound.spec import Case, Group, GroupConfig, GroupKind, H, NULL, U

    cs = []
    for n_hashed in (0, 31, 32, 33, 63, 64, 65, 90):
        table = tuple(H(i + 1) for i in range(n_hashed)) + (NULL,) * 3 + tuple(U(500 + i) for i in range(4))
        T = len(table) * 16
        for N in (0, n_hashed * 16, min(n_hashed + 2, len(table) - 1) * 16):
            cs.append(Case(f"long-{n_hashed}-{N}", 1, 16, T + 16, N, T - N,
                           (Group(GroupConfig(GroupKind.FULL_ATTENTION, 16), table),)))
    _agree_all(cs)


def test_packed_states_give_the_same_plans_as_the_bytes():
    """``slot_words`` (packed from the start) and plain ``state`` bytes plan alike, also
    across several words and after ``concat_batches``; a ``slot_words`` that differs
    from ``state`` is a named error."""
    import dataclasses

    from kvbound.impl import concat_batches
    from kvbound.impl.batch import pack_states, unpack_states
    from kvbound.impl.generate import generate_batch

    a = batch_from_cases(list(random_cases(150, seed=5)), slots=130)  # 136 slots: 3 words
    b = generate_batch(400, seed=2).batch
    for batch in (a, b, concat_batches([b.rows(0, 100), a.rows(0, 50)])):
        assert batch.slot_words is not None
        R, G, L = batch.shape
        assert torch.equal(unpack_states(batch.slot_words.reshape(R * G, 2, -1), L).view(R, G, L), batch.state)
        batch.check_values()
        plain = dataclasses.replace(batch, slot_words=None)
        for v, out in plan_variants(batch).items():
            want = plan_variants(plain, (v,))[v]
            for name in ("load_start_gpu_block_idx", "num_pending_gpu_blocks", "code", "failing_group",
                         "start_chunk_idx", "end_chunk_idx"):
                assert torch.equal(getattr(out, name), getattr(want, name)), (v, name)
    off = b.slot_words.clone()
    off[3, 0, 1, 0] ^= 1 << 2  # slot 2 of request 3, group 0 turns (non-)null in the words only
    with pytest.raises(BatchError, match=r"slot_words: must equal pack_states\(state\); first difference at \[request, group\] \[3, 0\]"):
        plan_batch(dataclasses.replace(b, slot_words=off), Variant.FIXED)
    with pytest.raises(BatchError, match="PlanBatch.slot_words: must be an int64 tensor"):
        dataclasses.replace(b, slot_words=pack_states(b.state)[:, :1])


def test_trusted_case_views_skip_only_the_revalidation():
    """``cases_from_batch(validate=False)`` builds with ``Case.trusted``: the same cases,
    and only inside that call is ``validate_case`` skipped (an invalid case still raises after)."""
    import dataclasses

    from kvbound.spec import Case, CaseError

    cs = list(random_cases(100, seed=7))
    b = batch_from_cases(cs)
    assert cases_from_batch(b, validate=False) == cs == cases_from_batch(b)
    fields = {f.name: getattr(cs[0], f.name) for f in dataclasses.fields(Case)}
    bad = dict(fields, blocks_per_chunk=0)
    assert Case.trusted(**bad).blocks_per_chunk == 0
    with pytest.raises(CaseError, match="blocks_per_chunk"):
        Case(**bad)


def test_bad_tensors_are_named():
    b = batch_from_cases(list(random_cases(4, seed=1)))
    with pytest.raises(BatchError, match="PlanBatch.block_id: must have shape"):
        type(b)(**dict(b.tensors(), block_id=b.block_id[:, :, :-1]))
    with pytest.raises(BatchError, match="PlanBatch.tokens_per_block: dtype"):
        type(b)(**dict(b.tensors(), tokens_per_block=b.tokens_per_block.float()))
    with pytest.raises(BatchError, match="PlanBatch.state: must be a 3-d tensor"):
        type(b)(**dict(b.tensors(), state=b.state[0]))
    bad = type(b)(**dict(b.tensors(), tokens_per_block=torch.zeros_like(b.tokens_per_block)))
    with pytest.raises(BatchError, match="tokens_per_block: must be positive"):
        plan_batch(bad, Variant.FIXED)
    bad = type(b)(**dict(b.tensors(), state=b.state.clone().fill_(7)))
    with pytest.raises(BatchError, match="state: codes are N=0, H=1, U=2"):
        plan_batch(bad, Variant.FIXED)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device in this environment")
def test_cuda_agrees_with_cpu():
    cs = list(random_cases(500, seed=9))
    cpu = plan_variants(batch_from_cases(cs, device="cpu"))
    gpu = plan_variants(batch_from_cases(cs, device="cuda"))
    for v in Variant:
        for f in ("load_start_gpu_block_idx", "num_pending_gpu_blocks", "code", "end_chunk_idx"):
            assert torch.equal(cpu[v].dense(f), gpu[v].dense(f).cpu()), (v, f)
        assert torch.equal(cpu[v].failing_group, gpu[v].failing_group.cpu()), v


def test_cuda_requested_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(BatchError, match="CUDA was requested"):
        batch_from_cases(list(random_cases(1, seed=0)), device="cuda")
    assert main(["diff", "--cases", "1", "--device", "cuda"]) == 2


def test_symbolic_model_forces_impl_plans():
    from kvbound.proofs.symbolic import check_plan

    cs = load_case_paths([EXAMPLES]) + list(random_cases(60, seed=77))
    b = batch_from_cases(cs)
    for v, out in plan_variants(b).items():
        for c, p in zip(cs, to_load_plans(b, out)):
            r = check_plan(c, v, p.to_json(c.name))
            assert r.verdict == "forced", (c.name, v, r.detail)


def _broken_scan(monkeypatch):
    """An off-by-one in the fixed scan: it starts at f + 1 instead of f."""
    real = impl_plan.keep_from
    monkeypatch.setattr(impl_plan, "keep_from", lambda scan_from, num_words: real(scan_from + 1, num_words))


def test_differential_catches_and_shrinks_a_broken_impl(monkeypatch):
    _broken_scan(monkeypatch)
    cs = list(random_cases(300, seed=1))
    stats = diff_against_spec(cs, device="cpu")
    assert stats.disagreements, "a broken scan must be caught"
    assert {d.variant for d in stats.disagreements} == {Variant.FIXED, Variant.FIXED_SYNC}
    d = stats.disagreements[0]
    small = shrink_case(d.case, lambda c: not agrees_with_spec(c, d.variant))
    assert not agrees_with_spec(small, d.variant)
    size = lambda c: sum(len(g.blocks) for g in c.groups) + len(c.groups)  # noqa: E731
    assert size(small) < size(d.case) and len(small.groups) == 1
    # the saved corpus cases were found this way: each one catches this bug
    for c in load_case_paths([CORPUS]):
        if c.name.startswith("mutant-scan-from-off-by-one"):
            assert not agrees_with_spec(c, Variant.FIXED), c.name


def test_diff_command_reports_saves_and_fails(monkeypatch, tmp_path, capsys):
    out_json = tmp_path / "d.json"
    assert main(["diff", "--cases", "60", "--seed", "2", "--symbolic-cases", "20", "--json", str(out_json),
                 "--corpus", str(tmp_path / "c")]) == 0
    rep = json.loads(out_json.read_text())
    assert rep["result"] == Verdict.AGREE and rep["cases"] == 60 and rep["symbolic"]["forced"] == 60
    assert "result: agree" in capsys.readouterr().out
    _broken_scan(monkeypatch)
    assert main(["diff", "--cases", "150", "--seed", "1", "--against", "spec", "--corpus", str(tmp_path / "c"),
                 "--show", "1", "--json", str(out_json)]) == 1
    text = capsys.readouterr().out
    assert "DISAGREEMENT (fixed" in text and "dst_block_ids" in text and "[F]" in text
    rep = json.loads(out_json.read_text())
    assert rep["result"] == Verdict.DISAGREE and rep["saved"]
    assert all(load_cases(p) for p in rep["saved"])


def test_diff_command_bad_input(capsys):
    assert main(["diff", "--cases", "5", "--against", "spec,oracle"]) == 2
    assert "oracle" in capsys.readouterr().err


# --- generation in tensors, the exhaustive scope, the spec in worker processes -------

def test_tensor_generator_builds_valid_cases_that_agree():
    from kvbound.impl.generate import generate_batch

    gb = generate_batch(3000, seed=5)
    again = generate_batch(3000, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(gb.batch.tensors().values(), again.batch.tensors().values()))
    other = generate_batch(3000, seed=5, first=3000)
    assert not torch.equal(gb.batch.num_locally_computed_tokens, other.batch.num_locally_computed_tokens)
    cs = gb.cases()  # validating constructor: a generated row is a well-formed Case
    assert cs == gb.cases(validate=False)
    assert gb.family_counts() == {"realistic": 1000, "recurrent_state": 1000, "adversarial": 1000}
    assert {c.name.rsplit("-", 1)[-1] for c in cs if c.name.startswith("adversarial")} >= {"unaligned_n", "wide_hit"}
    stats = _agree_all(cs)
    seen = {name for (_, name) in stats.outcomes}
    assert seen >= {"ok", "table_length", "boundary", "alignment", "window_bound", "keys_length"}
    # the PR's shape: a recurrent_state case has an unhashed Mamba block below f
    rec = [c for c in cs if c.name.startswith("recurrent_state")]
    assert all(any(g.config.kind.value == "mamba" for g in c.groups) for c in rec)


def test_the_generators_skipped_tokens_are_the_specs_on_every_small_input():
    """The tensor generator's skipped tokens (what its allocator tables pad with nulls) are the spec's
    get_num_skipped_tokens for a sliding-window and a chunked-local group at every T < 65 and window
    < 17; it skips nothing of the other kinds (a Mamba table is drawn on its own)."""
    from kvbound.impl.generate import num_skipped_tokens
    from kvbound.spec import GroupKind, get_num_skipped_tokens

    T, w = torch.meshgrid(torch.arange(65), torch.arange(1, 17), indexing="ij")
    for kind in GroupKind:
        sliding = torch.full(T.shape, kind is GroupKind.SLIDING_WINDOW)
        chunked = torch.full(T.shape, kind is GroupKind.CHUNKED_LOCAL)
        got = num_skipped_tokens(sliding, chunked, T, w).tolist()
        want = [[get_num_skipped_tokens(kind, t, sliding_window=x, attention_chunk_size=x)
                 if kind in (GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL) else 0
                 for t, x in zip(row_t, row_w)] for row_t, row_w in zip(T.tolist(), w.tolist())]
        assert got == want, kind


def test_exhaustive_scope_enumerates_every_case_once():
    from kvbound.impl.exhaustive import Scope, ScopeError, scope_chunks

    scope = Scope.parse("groups=2,len=1,bpc=1,prompt=0,sync=0")
    chunks = list(scope_chunks(scope, chunk=700))
    cases = [c for ch in chunks for c in ch.cases()]
    assert len(cases) == scope.size == (4 * 4 + (4 * 4) ** 2) * len(scope.token_pairs(4))
    keys = {json.dumps(dict(case_to_dict(c), name=None), sort_keys=True) for c in cases}
    assert len(keys) == scope.size  # no case twice
    _agree_all(cases)
    with pytest.raises(ScopeError, match="unknown key 'lenght'"):
        Scope.parse("lenght=3")


def test_spec_in_worker_processes_gives_the_same_counts():
    from kvbound.impl import run_differential
    from kvbound.impl.generate import generate_batch

    def chunks():
        return (generate_batch(400, seed=2, first=i) for i in (0, 400, 800))

    inline, _ = run_differential(chunks(), workers=0)
    pooled, tm = run_differential(chunks(), workers=1)
    assert inline.cases == pooled.cases == 1200 and not pooled.disagreements
    assert inline.outcomes == pooled.outcomes and inline.groups == pooled.groups
    assert tm.spec_cpu > 0


def test_workers_report_a_broken_impl(monkeypatch, tmp_path):
    _broken_scan(monkeypatch)  # the impl runs in this process; the spec in the workers
    out_json = tmp_path / "d.json"
    assert main(["diff", "--cases", "300", "--seed", "1", "--against", "spec", "--workers", "1", "--no-save",
                 "--json", str(out_json)]) == 1
    rep = json.loads(out_json.read_text())
    assert rep["variants"]["fixed"]["disagreements"] > 0 and rep["variants"]["legacy"]["disagreements"] == 0


def test_diff_exhaustive_command(tmp_path, capsys):
    out_json = tmp_path / "e.json"
    assert main(["diff", "--exhaustive", "len=2,bpc=1,sync=0", "--against", "spec", "--workers", "0",
                 "--json", str(out_json)]) == 0
    rep = json.loads(out_json.read_text())
    assert rep["exhaustive"]["cases"] == rep["cases"] > 1000 and rep["result"] == Verdict.AGREE
    assert main(["diff", "--exhaustive", "groups=x"]) == 2
    assert "groups" in capsys.readouterr().err


def test_case_format_v2_agrees_every_family():
    """Partial tails (boundary keys, the partial_tail assert), EAGLE margins, retained
    window tokens, resumed requests, group subsets and unsupported outcomes, as the spec."""
    from kvbound.spec.cases import Case
    from kvbound.spec.case_kinds import load_any_case_paths

    # the load-plan cases of tests/cases_v2 (its lookup cases are conform's and test_lookup's: no impl)
    v2 = [c for c in load_any_case_paths([ROOT / "tests" / "cases_v2"]) if isinstance(c, Case)]
    cs = v2 + list(random_cases(1400, seed=4, family="all"))
    b = batch_from_cases(cs)
    assert b.uses_v2 and cases_from_batch(b) == cs  # the v2 fields survive the tensors
    stats = _agree_all(cs)
    seen = {name for (_, name) in stats.outcomes}
    assert {"partial_tail", "unsupported", "ok"} <= seen
    _agree_all(cs[:500], asserts=False)
    keys = [k for c in cs for p in to_load_plans(batch_from_cases([c]), plan_batch(batch_from_cases([c]), "fixed-sync"))
            for k in p.keys if len(k) == 3]
    assert keys and all(k[1] == "boundary" for k in keys)


def test_every_impl_mutant_of_the_one_table_is_planted_and_killed():
    """kvbound.proofs.mutants names the faults; the impl plants each at runtime (its
    source untouched, restored after) and the differential kills every one."""
    from kvbound.impl import plan as P
    from kvbound.impl.mutants import IMPL_MUTANTS, applied, kill_run, mutant_chunks
    from kvbound.proofs.mutants import applicable, score

    assert set(IMPL_MUTANTS) == {m.name for m in applicable("impl")}
    before = {name: getattr(P, name) for name in dir(P)}
    killed = kill_run(mutant_chunks(seed=0, files=load_case_paths([EXAMPLES])))
    assert {name: getattr(P, name) for name in dir(P)} == before  # every patch undone
    result = score("impl", killed)
    assert result["survivors"] == [] and result["percent"] == 100.0, result
    with applied("pending+1"):  # while planted, the impl really is wrong
        assert not agrees_with_spec(load_cases(EXAMPLES / "pr_case.json")[0], Variant.FIXED)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(family="all"))
def test_hypothesis_cases_of_every_family_agree(case):
    for v in Variant:
        assert agrees_with_spec(case, v), (case.name, v)
        assert agrees_with_spec(case, v, asserts=False), (case.name, v, "python -O")
