"""Z3 obligations of the store contract: every chunk ``_build_store_jobs`` stores was computed.

One obligation per (release row of ``spec.store.STORE_RELEASES``, request status,
``offload_prompt_only``), over unbounded integers: a request with ``P >= 1`` prompt tokens
and ``T = P + O`` tokens (``O >= 0``; ``O >= 1`` once it finished by sampling), ``C``
computed, ``S`` scheduled this step, ``A`` GPU blocks allocated, ``B`` tokens per block (one
block per chunk; the claim is per full-attention group, groups carry no state between them).

Premises, each read from vLLM (docs/trace.md, "Shadow KV"):
- running: ``C + S <= T`` (no spec decode: the scheduler schedules known tokens only);
  aborted: ``C <= T``; finished by sampling: ``C = T - 1`` (the final sampled token is
  never forwarded);
- the allocator holds blocks for the tokens scheduled so far: ``A <= cdiv(computed, B)``
  where ``computed`` is the KV written once the batch ran (``spec.store.computed_tokens``);
- 0.26 (no allocated cap): the store is reached only where its assert passes,
  ``horizon // B <= A``.

Claim: the stored chunks, ``min(horizon // B, A)`` of them (``storable_chunks``), end at or
before ``computed``: ``min(horizon // B, A) * B <= computed``. The horizon is encoded from the
same table the executable spec uses, so the two cannot drift apart.

Imports only kvbound.spec and z3.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from kvbound.spec.store import ABORTED, FINISHED, RUNNING, STORE_RELEASES, StoreFeatures

PROVED, REFUTED, UNKNOWN = "proved", "refuted", "unknown"


@dataclass(frozen=True)
class StoreObligation:
    id: str
    release: StoreFeatures
    status: str
    offload_prompt_only: bool
    expected: str
    statement: str = ("every chunk _build_store_jobs stores ends at or before the tokens the forward"
                      " computed")


@dataclass
class StoreResult:
    obligation: StoreObligation
    verdict: str
    witness: dict | None = None

    @property
    def as_expected(self) -> bool:
        return self.verdict == self.obligation.expected

    def drawing(self) -> str:
        """The witness as a reviewer reads it: the last stored block's slots, computed or not."""
        if not self.witness:
            return ""
        w = self.witness
        B, comp, stored = w["B"], w["computed"], w["stored_chunks"]
        start = (stored - 1) * B
        slots = "".join("c" if p < comp else "." for p in range(start, start + B))
        return (f"{self.obligation.id}: P={w['P']} T={w['T']} C={w['C']} S={w['S']} A={w['A']} B={B}\n"
                f"  stored chunk {stored - 1} = tokens [{start}, {start + B}) under the hash of its prefix\n"
                f"  block slots |{slots}|  (c = KV computed, . = never forwarded)")


def _expected(f: StoreFeatures, status: str, prompt_only: bool) -> str:
    if status == FINISHED and not prompt_only and not f.finished_clamp:
        return REFUTED  # num_tokens counts the final sampled token (0.26-0.29)
    if status == ABORTED and not f.aborted_at_computed:
        return REFUTED  # an aborted request's horizon is num_tokens (0.26)
    return PROVED


STORE_OBLIGATIONS: tuple = tuple(
    StoreObligation(f"store.computed[{f.release}+,{status},prompt_only={po}]", f, status, po,
                    _expected(f, status, po))
    for _, f in STORE_RELEASES for status in (RUNNING, FINISHED, ABORTED) for po in (True, False))


def _problem(ob: StoreObligation):
    P, O, C, S, A, B = z3.Ints("P O C S A B")
    T = P + O
    f = ob.release
    prem = [P >= 1, O >= 0, C >= 0, S >= 0, A >= 0, B >= 1]
    if ob.status == RUNNING:
        prem += [C + S <= T]
        after = C + S
        computed = C + S
    elif ob.status == FINISHED:
        prem += [O >= 1, C == T - 1, S == 0]
        after = z3.If(P > T - 1, P, T - 1) if f.finished_clamp else T
        computed = C
    else:
        prem += [C <= T, S == 0]
        after = C if f.aborted_at_computed else T
        computed = C
    h = z3.If(after < T, after, T)
    if ob.offload_prompt_only:
        h = z3.If(h < P, h, P)
    prem += [A * B < computed + B]  # A <= cdiv(computed, B)
    if f.caps_at_allocated:
        stored = z3.If(h / B < A, h / B, A)
    else:  # 0.26: no cap; more chunks than blocks asserts (a crash, not a store)
        prem += [h / B <= A]
        stored = h / B
    claim = stored * B <= computed
    small = [P <= 64, O <= 64, B == 16]  # the trace layouts' block size: witnesses replay there
    return prem, claim, small, dict(P=P, O=O, C=C, S=S, A=A, B=B, T=T, stored=stored, computed=computed)


def run_store_obligation(ob: StoreObligation, timeout_ms: int = 20000) -> StoreResult:
    prem, claim, small, v = _problem(ob)
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*prem)
    s.add(z3.Not(claim))
    s.push()
    s.add(*small)  # small witnesses first
    r = s.check()
    if r != z3.sat:
        s.pop()
        r = s.check()
    if r == z3.unsat:
        return StoreResult(ob, PROVED)
    if r != z3.sat:
        return StoreResult(ob, UNKNOWN)  # never "proved"
    m = s.model()
    val = {k: m.eval(x, model_completion=True).as_long() for k, x in v.items()}
    return StoreResult(ob, REFUTED, {"P": val["P"], "O": val["O"], "T": val["T"], "C": val["C"],
                                      "S": val["S"], "A": val["A"], "B": val["B"],
                                      "computed": val["computed"], "stored_chunks": val["stored"],
                                      "release": ob.release.release, "status": ob.status,
                                      "offload_prompt_only": ob.offload_prompt_only})


def run_store_obligations() -> list[StoreResult]:
    return [run_store_obligation(ob) for ob in STORE_OBLIGATIONS]
