"""The copy contract (proofs/copy_contract.py) against real vLLM, and its checks able to fail.

* the refutation's witness ↔ the real manager: ``copy.same-step``'s witness, replayed on the real
  ``KVCacheManager`` of 0.26.0 and 0.33.0 (the range's ends; 0.25.1 has no block copies) (``scripts/repro_copy_step.py``), makes the copy the model says: the
  reader's hit, the source block (its owner's block, allocated in the step) and its owner's
  computed tokens short of the hit;
* the model ↔ the fix: the patched lookup is proved, and the mutant that undoes it is refuted;
* the premises and the replay can each fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest

from conftest import ROOT, release_env_for
from kvbound.proofs.copy_contract import COPIES, OBLIGATIONS, PREMISES, replay_copy, witness_terms
from kvbound.proofs.copy_premises import COPY_BY_ID, COPY_PREMISES
from kvbound.proofs.options import PROVE
from kvbound.proofs.problem import problem
from kvbound.proofs.runner import kills, run_mutants_one, run_obligation
from kvbound.proofs.terms import NOT, as_bool
from kvbound.proofs.witnesses import CopyWitness, witness_from_dict, witness_to_dict
from kvbound.spec.verdicts import Verdict

SCRIPT = ROOT / "scripts" / "repro_copy_step.py"
BY_ID = {o.id: o for o in OBLIGATIONS}


@pytest.fixture(scope="module")
def witness() -> CopyWitness:
    r = run_obligation(BY_ID["copy.same-step"], PROVE)
    assert r.met and r.verdict == Verdict.REFUTED and r.replay is None
    return r.witness


def test_the_obligations_meet_their_verdicts_and_releases():
    assert (COPIES.first, COPIES.last) == ("0.26.0", "0.33.0")
    for ob in OBLIGATIONS:
        r = run_obligation(ob, PROVE)
        assert r.met, (ob.id, r.verdict, r.vacuity, r.replay)
        assert ob.premises == PREMISES and (ob.span.first, ob.span.last) == ("0.26.0", "0.33.0")


def test_the_witness_draws_the_plain_shape_and_round_trips(witness):
    text = witness.draw()
    assert "r1 idx" in text and "copy of r0's block" in text and "allocated in this step" in text
    assert witness_from_dict(json.loads(json.dumps(witness_to_dict(witness)))) == witness


@pytest.fixture(scope="module")
def chained() -> CopyWitness:
    """The same refutation shaped as the chained form: r0 is new and partial-hits the holder's
    block, r1's source is r0's copy destination."""
    import z3

    ob = BY_ID["copy.same-step"]
    prob = problem(ob)
    s = PROVE.solver()
    s.add(*[as_bool(p) for p in prob.premises + prob.constraints], as_bool(NOT(prob.claim)))
    s.add(*[as_bool(c) for c in prob.world.small("chained")])
    assert s.check() == z3.sat
    return prob.witness(s.model())


def test_the_model_refutes_the_chained_shape_too(chained):
    """A copy whose source is another copy's destination of the same step (docs/findings.md)."""
    assert replay_copy(chained) is None
    assert "itself a copy destination of this step" in chained.draw()


def test_the_chained_witness_copies_a_copy_destination_on_real_0_33(chained):
    """vLLM applies a step's copies at once: r1's copy reads r0's destination before r0's copy fills it."""
    real = _replay_real("0.33.0", chained)
    assert uncomputed_copy_problems(real, chained) == []
    cp = next(c for c in real["copies"] if c["group"] == 0 and c["reader"] == "r1")
    assert cp["src_copied_this_step"] is True and set(cp["src_holders"]) == {"r0"}


def _replay_real(version: str, w: CopyWitness, rc: int = 0):
    env = release_env_for(version)
    path = ROOT / ".pytest_cache" / f"copy-witness-{version}-{os.getpid()}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(w.to_dict()))
    try:
        p = subprocess.run([env.python, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=env.tree or "", VLLM_TARGET_DEVICE="cpu"))
    finally:
        path.unlink(missing_ok=True)
    assert p.returncode == rc, (p.stdout[-2000:], p.stderr[-3000:])
    if rc:
        return p.stdout.strip().splitlines()[-1]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["vllm"] == version
    return out


def uncomputed_copy_problems(real: dict, w: CopyWitness) -> list[str]:
    """Empty when the real step makes the witness's copy: every request's computed tokens before the
    step and hit as the model has them, a
    full-attention copy into each reader's block at the hit's index, from its source's block, whose
    owner had computed up to the hit before the step exactly where the model says so (for the
    witness's broken copy: not)."""
    by = {q["name"]: q for q in w.requests}
    problems = []
    for q in w.requests:
        if q["name"] != "E" and real["hits"][q["name"]] != q["h"]:
            problems.append(f"{q['name']}: real hit {real['hits'][q['name']]}, model {q['h']}")
        if real["computed_before_step"][q["name"]] != q["c"]:
            problems.append(f"{q['name']}: real computed {real['computed_before_step'][q['name']]}, model {q['c']}")
    readers = [q for q in w.requests if q["new"] and q["h"] % w.B]
    for q in readers:
        j, src = q["h"] // w.B, by[q["src"]]
        got = [cp for cp in real["copies"] if cp["reader"] == q["name"] and cp["group"] == 0 and cp["idx"] == j]
        if not got:
            problems.append(f"no full-attention copy into {q['name']}'s block {j}")
            continue
        holder = got[0]["src_holders"].get(src["name"])
        if holder is None or holder["idx"] != j:
            problems.append(f"the copy's source is not {src['name']}'s block {j}: {got[0]['src_holders']}")
        elif (holder["computed_before_step"] >= q["h"]) != (src["c"] >= q["h"]):
            problems.append(f"{src['name']} had computed {holder['computed_before_step']} before the step, the "
                            f"model {src['c']}, of {q['name']}'s hit {q['h']}")
    return problems


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0"])  # the range's ends (every release between: docs/findings.md)
def test_the_witness_copies_an_uncomputed_block_on_the_real_manager(witness, version):
    real = _replay_real(version, witness)
    assert uncomputed_copy_problems(real, witness) == []
    cp = next(c for c in real["copies"] if c["group"] == 0)
    assert cp["src_allocated_this_step"] is True  # zeroed before the copy runs: the plain shape
    # the check can fail: the same real step against a witness whose source had computed the hit
    by = {q["name"]: q for q in witness.requests}
    claimed = replace(witness, requests=tuple(dict(q, c=by["r1"]["h"]) if q["name"] == "r0" else q
                                              for q in witness.requests))
    assert any("real computed" in p for p in uncomputed_copy_problems(real, claimed))


def test_the_release_before_the_range_makes_no_block_copy(witness):
    """0.25.1's manager has no copy-on-write path: the replay says so in one line."""
    line = _replay_real("0.25.1", witness, rc=2)
    assert line.startswith("vllm 0.25.1 cannot replay a copy step") and "0.26.0" in line


def test_the_patched_lookup_is_proved_and_its_mutant_refuted():
    ob = BY_ID["copy.patched"]
    assert ob.mutable and ob.code is not None
    assert not kills(ob, ob.code, PROVE)
    assert kills(ob, ob.code.mutate(copy_same_step_sources=True), PROVE)
    assert run_mutants_one("copy-same-step-source", PROVE) == "copy.patched"


def test_every_copy_premise_can_fail_and_holds_on_the_witness(witness):
    t, _ = witness_terms(witness)
    assert all(p.check(t) is None for p in COPY_PREMISES)
    r = {q["name"]: q for q in witness.requests}
    breaking = {
        "copy-hash-unit": lambda w: replace(w, U=w.B + 1),
        "copy-prefixes": lambda w: replace(w, lcp=tuple((a, b, (n if (a, b) != ("E", "r0") else 0))
                                                        for a, b, n in w.lcp)),
        "copy-scheduled-within": lambda w: _with(w, "r1", s=r["r1"]["T"]),
        "copy-lookup-on-first-schedule": lambda w: _with(w, "r0", h=16),
        "copy-cached-computed": lambda w: _with(w, "r0", K0=r["r0"]["c"] + 1),
        "copy-mamba-state-before-step": lambda w: _with(w, "E", K0=0),
    }
    assert set(breaking) == {p.id for p in COPY_PREMISES}
    for pid, make in breaking.items():
        bad, _ = witness_terms(make(witness))
        assert COPY_BY_ID[pid].check(bad) is not None, pid
        assert replay_copy(make(witness)) is not None, pid


def _with(w: CopyWitness, name: str, **change) -> CopyWitness:
    return replace(w, requests=tuple(dict(q, **change) if q["name"] == name else q for q in w.requests))


def test_a_witness_whose_copy_is_computed_does_not_replay(witness):
    """The replay is not a rubber stamp: the same step with the source computed through the hit
    (r0 computed before the step as far as r1 hits) breaks no premise and copies only computed tokens."""
    r = {q["name"]: q for q in witness.requests}
    h = r["r1"]["h"]
    fine = _with(_with(witness, "r0", c=h, K0=h, s=r["r0"]["T"] - h), "r0")
    assert replay_copy(fine) == "every copy of the witness carries computed tokens"
