"""The reservation property (proofs/reservation.py) against real vLLM.

Three relations, each able to fail:

* the model ↔ the real allocator: random allocate_slots calls of every manager kind replayed
  on the real ``KVCacheManager`` of 0.29.0 and 0.33.0 (``scripts/repro_0_33_sync_mamba.py
  --calls``), reserved and taken per group and per call equal to the model's numbers;
* the refutation's witness ↔ the real allocator: ``reservation.mamba-align.sync-load``'s witness
  takes one block more than it reserved on real 0.33.0, and a pool holding exactly the
  reserved blocks raises from the block pool;
* the check ↔ a planted fix: with the fix planted at runtime (``--plant-fix``) the witness is
  reserved exactly, and the over-allocation check reports it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

from conftest import ROOT, release_env_for
from kvbound.proofs.allocator import AllocCalls
from kvbound.proofs.allocation_premises import ALLOCATION_PREMISES
from kvbound.proofs.reservation import OBLIGATIONS, ReservationWorld
from kvbound.proofs.runner import run_obligation
from kvbound.spec import GroupKind

SCRIPT = ROOT / "scripts" / "repro_0_33_sync_mamba.py"
KINDS = tuple(k.value for k in GroupKind)


def _replay(version, specs, *flags) -> dict:
    env = release_env_for(version)
    path = ROOT / ".pytest_cache" / f"reservation-calls-{version}-{os.getpid()}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(specs))
    try:
        p = subprocess.run([env.python, str(SCRIPT), "--calls", str(path), *flags], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=env.tree or ""), timeout=600)
    finally:
        path.unlink(missing_ok=True)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["vllm"] == version
    return out


def random_specs(n: int, seed: int) -> list[dict]:
    """Calls of every kind: local hits (kept or evictable), connector tokens sync and async, lookahead,
    speculative Mamba blocks, windows with retained tokens, chunks; sizes around a few blocks."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        b = rng.choice((16, 32))
        L = b * rng.randint(0, 3)
        E = rng.choice((0, 0, b, 2 * b, rng.randint(1, 3 * b)))
        NEW = rng.choice((0, rng.randint(1, 3 * b), b))
        if E + NEW == 0:  # 0.28 - 0.32 raise on a call that only adopts a local hit (0.33 allows it)
            NEW = rng.randint(1, 2 * b)
        out.append({"kind": kind, "b": b, "L": L, "E": E, "NEW": NEW, "LA": rng.randint(0, 3),
                    "S": rng.randint(0, 2) if kind == "mamba" else 0, "NEW2": rng.randint(1, b + 3),
                    "LA2": rng.randint(0, 3), "w": rng.randint(1, 3 * b), "extra": rng.choice((0, 0, 1, 3, b)),
                    "chunk": rng.choice((b, 2 * b)), "owner_freed": rng.random() < 0.5})
    return out


def disagreements(real: dict, release: str) -> list[str]:
    """Where the model's numbers differ from what the real allocator did (every group, both calls),
    and any allocation premise the real call breaks."""
    out = []
    for r in real["calls"]:
        if r["error"]:
            out.append(f"{r['spec']}: vLLM raised {r['error']}")
            continue
        for gi in range(len(r["kinds"])):
            calls = AllocCalls.from_replay(r, gi, release)
            want = calls.predict()
            for call in ("first", "running"):
                got = r[call][gi]
                model = want[call]
                if (got["reserved"], got["taken"]) != (model["reserved"], model["taken"]):
                    out.append(f"{calls} {call}: real reserved {got['reserved']} taken {got['taken']}, "
                               f"model {model['reserved']} {model['taken']}")
            bad = [p.check(calls) for p in ALLOCATION_PREMISES if p.applies(calls.kind)]
            out += [f"{calls}: {b}" for b in bad if b and "async" not in b]
    return out


def _witness() -> AllocCalls:
    ob = next(o for o in OBLIGATIONS if o.id == "reservation.mamba-align.sync-load")
    r = run_obligation(ob)
    assert r.met and r.verdict == "refuted" and r.replay is None
    return r.witness


@pytest.fixture(scope="module")
def witness() -> AllocCalls:
    return _witness()


FINDING = [  # the finding's call (tests/test_finding_0_33.py), and an async load with speculative blocks
    {"kind": "mamba", "b": 64, "L": 0, "E": 64, "NEW": 256, "NEW2": 1},
    {"kind": "mamba", "b": 16, "L": 32, "E": 32, "NEW": 0, "S": 1, "NEW2": 5, "owner_freed": True},
]
N_RANDOM = 48


@pytest.fixture(scope="module")
def real(witness):
    """One replay per release (importing vLLM is the slow part): the random calls, the finding's,
    and the witness — on 0.33.0 also in a pool holding exactly the reserved blocks, and with the fix
    planted."""
    specs = random_specs(N_RANDOM, seed=7) + FINDING + [witness.replay_spec()]
    out = {"0.29.0": _replay("0.29.0", specs)}
    # the witness's first call reserves 1 (Mamba) + what full attention reserves: cdiv(T + NEW, b)
    tight = sum(c["reserved"] for c in out["0.29.0"]["calls"][-1]["first"]) + 1
    out["0.33.0"] = _replay("0.33.0", specs + [{**witness.replay_spec(), "num_blocks": tight},
                                                {**witness.replay_spec(), "plant_fix": True}])
    return out


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0"])
def test_the_model_counts_what_the_real_allocator_counts(real, version):
    got = {**real[version], "calls": real[version]["calls"][:N_RANDOM + len(FINDING) + 1]}
    assert disagreements(got, version) == []
    # the random calls reach the branches the obligations quantify over
    calls = [AllocCalls.from_replay(r, len(r["kinds"]) - 1, version) for r in got["calls"]]
    assert {c.kind for c in calls} == set(GroupKind)
    assert any(c.ev for c in calls) and any(c.L for c in calls) and any(c.sync for c in calls)
    assert any(c.S for c in calls) and any(c.extra and c.kind is GroupKind.SLIDING_WINDOW for c in calls)
    over = [c for c in calls if c.predict()["first"]["taken"] > c.predict()["first"]["reserved"]]
    assert over and all(c.kind is GroupKind.MAMBA and c.sync for c in over)  # the finding, and only it


def test_a_wrong_model_disagrees_with_the_real_allocator(real, monkeypatch):
    """Planted in the model: the Mamba cap counts the loaded-state block (the suggested fix, applied
    to the model rather than to vLLM): the real replay of the finding's call then disagrees."""
    from kvbound.proofs import allocator as R

    finding = {**real["0.33.0"], "calls": real["0.33.0"]["calls"][N_RANDOM:N_RANDOM + 1]}
    assert disagreements(finding, "0.33.0") == []
    orig = R._mamba_reserve
    monkeypatch.setattr(R, "_mamba_reserve", lambda code, need, held, partial, c, S, allocated:
                        orig(code, need, held, partial, c, S, allocated) + (0 if allocated else 1))
    assert len(disagreements(finding, "0.33.0")) == 1


def over_allocation_problems(call: dict, witness: AllocCalls) -> list[str]:
    """Empty when the real replay of the witness shows what the obligation refutes: the Mamba
    group's first call takes one block more than it reserved, as the model says."""
    if call["error"]:
        return [f"vLLM raised {call['error']}"]
    got, want = call["first"][-1], witness.predict()["first"]
    problems = []
    if got["taken"] != got["reserved"] + 1:
        problems.append(f"real Mamba first call: reserved {got['reserved']}, taken {got['taken']}")
    if (got["reserved"], got["taken"]) != (want["reserved"], want["taken"]):
        problems.append(f"model {want['reserved']}/{want['taken']} != real {got['reserved']}/{got['taken']}")
    return problems


def test_the_sync_load_witness_over_allocates_on_real_0_33(real, witness):
    assert witness.kind is GroupKind.MAMBA and witness.release == "0.33.0" and witness.sync
    calls = real["0.33.0"]["calls"]
    assert over_allocation_problems(calls[-3], witness) == []
    # a pool with exactly the reserved blocks free (+ the null block): the allocation raises mid-step
    assert "Cannot get 1 free blocks from the pool" in (calls[-2]["error"] or "")


def test_the_witness_check_flips_when_the_fix_is_planted(real, witness):
    fixed = real["0.33.0"]["calls"][-1]
    assert fixed["spec"]["plant_fix"] is True
    got = fixed["first"][-1]
    assert got["reserved"] == got["taken"]
    assert len(over_allocation_problems(fixed, witness)) == 2


def test_the_0_29_allocator_miscounts_the_same_call(real, witness):
    """0.28 - 0.32's allocators count a sync call the same way; only 0.33's offloading connector
    makes one (0.29's always loads asynchronously), so their obligations assume alloc-async-load."""
    got = real["0.29.0"]["calls"][-1]["first"][-1]
    assert got["taken"] == got["reserved"] + 1
    ob = next(o for o in OBLIGATIONS if o.id == "reservation.mamba-align.0.29.0")
    assert "alloc-async-load" in ob.premises


def test_every_allocation_premise_can_fail_and_the_world_states_them():
    """Each premise's term, folded on a concrete call, is False on some call (no premise that
    cannot fail), and the symbolic world adds exactly the applicable ones."""
    base = AllocCalls(name="p", kind=GroupKind.MAMBA, release="0.33.0", b=16, L=16, E=16, NEW=16, C=48, NEW2=1)
    breaking = {
        "alloc-call-adopts-or-computes": dict(L=0, E=0, NEW=0, C=0),
        "alloc-evictable-hit": dict(ev=2),
        "alloc-running-computed": dict(C=47),
        "alloc-checkpoint-index": dict(c2=True, C=0, L=0, E=0, NEW=0, NEW2=1),
        "alloc-async-load": dict(),
        "alloc-window-config": dict(kind=GroupKind.SLIDING_WINDOW, w=0),
    }
    from dataclasses import replace

    for p in ALLOCATION_PREMISES:
        bad = replace(base, **breaking[p.id])
        assert p.applies(bad.kind), p.id
        assert p.check(bad) is not None, p.id
    assert all(p.check(base) is None for p in ALLOCATION_PREMISES if p.id != "alloc-async-load")
    w = ReservationWorld(GroupKind.FULL_ATTENTION, "0.33.0")
    applicable = [p for p in ALLOCATION_PREMISES if p.applies(GroupKind.FULL_ATTENTION)]
    assert len(applicable) == 4 and len(w.premise_terms([p.id for p in ALLOCATION_PREMISES])) == 4
