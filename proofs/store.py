"""The store property: every chunk ``_build_store_jobs`` stores was computed by the forward.

One obligation per (run of releases over which the store columns of ``RELEASES`` hold, request status,
``offload_prompt_only``, scheduling modes), over unbounded integers: a request with ``P >= 1`` prompt
tokens and ``T = P + O`` tokens (``O >= 0``), ``C`` computed, ``S`` scheduled this step, ``A`` GPU
blocks allocated, ``B`` tokens per block (one block per chunk; the claim is per full-attention
group, groups carry no state between them), ``Ph`` output placeholders, ``K`` draft tokens
scheduled, ``L`` lookahead slots. The premises (``store_premises.STORE_PREMISES``, each read from
vLLM per release) say what the scheduler and the allocator hand ``_build_store_jobs`` in every
mode; ``MODES`` says which modes an obligation covers: sync scheduling, async scheduling and
speculative decoding under the sync scheduler in one (``Ph = 0`` unless async, ``K = L = 0``
under async), speculative decoding under async scheduling in the other (every term free).

Claim: the chunks the call stores, those from ``N0`` (``next_stored_chunk_idx`` before it) up to
``min(horizon // B, A)`` (``storable_chunks``), end at or before ``computed``
(``spec.store.computed_tokens``): ``min(horizon // B, A) ≤ N0 ∨ min(horizon // B, A) * B <= computed``.
The horizon is encoded from the same release row the executable spec reads, and every
witness is replayed through ``spec.store``, so the two cannot drift apart.
"""

from __future__ import annotations

import z3

from kvbound.spec import ReleaseFeatures
from kvbound.spec.store import (ABORTED, FINISHED, RUNNING, STORE_COLUMNS, computed_tokens, next_stored_chunk_idx,
                                store_features, store_horizon)
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import spans

from .store_premises import STORE_BY_ID, StoreTerms, store_premise_ids
from .problem import Bound, Obligation, Problem
from .witnesses import StoreWitness

STATUSES = (RUNNING, FINISHED, ABORTED)
# The scheduling modes an obligation covers, and what each adds to the world (``StoreWorld.mode``).
SYNC_ASYNC_SPEC, ASYNC_SPEC = "sync/async/spec", "async+spec"
MODES = {SYNC_ASYNC_SPEC: "sync scheduling, async scheduling (output placeholders) and speculative decoding "
                          "under the sync scheduler (drafts, lookahead slots)",
         ASYNC_SPEC: "speculative decoding under async scheduling (placeholders, drafts and lookahead slots)"}


class StoreWorld:
    """One request's numbers at one ``_build_store_jobs`` call, as Z3 integers, and the horizon and
    computed tokens of its status under one release row."""

    def __init__(self, feats: ReleaseFeatures, status: str, offload_prompt_only: bool, mode: str = SYNC_ASYNC_SPEC):
        self.feats, self.status, self.offload_prompt_only, self.mode = feats, status, offload_prompt_only, mode
        self.P, self.O, self.C, self.S, self.A, self.B = z3.Ints("P O C S A B")
        self.Ph, self.K, self.L, self.N0 = z3.Ints("Ph K L N0")
        self.is_async = z3.Bool("async")
        self.T = self.P + self.O
        T, C, S, P = self.T, self.C, self.S, self.P
        if status == RUNNING:
            after, self.computed = C + S, C + S
        elif status == FINISHED:
            after, self.computed = (z3.If(P > T - 1, P, T - 1) if feats.store_finished_clamp else T), C
        else:
            after, self.computed = (C if feats.store_aborted_at_computed else T), C
        h = z3.If(after < T, after, T)
        self.horizon = z3.If(h < P, h, P) if offload_prompt_only else h
        chunks = self.horizon / self.B
        self.stored = z3.If(chunks < self.A, chunks, self.A) if feats.store_caps_at_allocated else chunks

    def terms(self) -> StoreTerms:
        return StoreTerms(self.P, self.O, self.C, self.S, self.A, self.B, self.T, self.computed, self.horizon,
                          self.Ph, self.K, self.L, self.is_async, self.N0)

    def premise_terms(self, ids) -> list:
        return [STORE_BY_ID[i].term(self.terms()) for i in ids]

    def base(self):
        base = [self.P >= 1, self.O >= 0, self.C >= 0, self.S >= 0, self.A >= 0, self.B >= 1, self.Ph >= 0,
                self.K >= 0, self.L >= 0, self.N0 >= 0]
        if self.mode == ASYNC_SPEC:
            return base + [self.is_async]
        # the sync scheduler has no placeholders; async scheduling without a drafter has no drafts, no lookahead
        return base + [z3.Implies(z3.Not(self.is_async), self.Ph == 0),
                       z3.Implies(self.is_async, z3.And(self.K == 0, self.L == 0))]

    def small(self):
        return [self.P <= 64, self.O <= 64, self.B == 16]  # the trace layouts' block size: witnesses replay there

    def to_case(self, model, name: str) -> StoreWitness:
        v = {k: model.eval(getattr(self, k), model_completion=True).as_long()
             for k in ("P", "O", "T", "C", "S", "A", "B", "computed", "stored", "Ph", "K", "L", "N0")}
        return StoreWitness(name=name, release=self.feats.release, status=self.status,
                            offload_prompt_only=self.offload_prompt_only, P=v["P"], O=v["O"], T=v["T"], C=v["C"],
                            S=v["S"], A=v["A"], B=v["B"], computed=v["computed"], stored_chunks=v["stored"],
                            Ph=v["Ph"], K=v["K"], L=v["L"], N0=v["N0"],
                            is_async=z3.is_true(model.eval(self.is_async, model_completion=True)))


def _build(f: ReleaseFeatures, status: str, prompt_only: bool, mode: str, oid: str):
    def build(_code):
        w = StoreWorld(f, status, prompt_only, mode)
        return Problem(w.base(), z3.Or(w.stored <= w.N0, w.stored * w.B <= w.computed), w, tables=False,
                       shaping=w.small(),
                       witness=lambda m: w.to_case(m, f"witness-{oid}"))

    return build


def replay_store(w: StoreWitness) -> str | None:
    """None when the store spec of the witness's release stores a chunk past what was computed."""
    T = w.P + w.O
    horizon = store_horizon(w.release, w.status, w.P, T, w.C, w.S, w.offload_prompt_only)
    stored = next_stored_chunk_idx(w.N0, horizon, w.B, w.A, store_features(w.release).store_caps_at_allocated)
    computed = computed_tokens(w.status, T, w.C, w.S)
    if stored is None:
        return f"spec {w.release} asserts on the witness (more chunks than allocated blocks)"
    if stored <= w.N0 or stored * w.B <= computed:
        return f"spec {w.release} stores {stored} chunks, within the {computed} computed tokens"
    return None


def _expected(f: ReleaseFeatures, status: str, prompt_only: bool, mode: str) -> tuple[Verdict, str]:
    """The verdict and the premise it rests on (or whose absence the witness shows)."""
    if status == FINISHED and mode == ASYNC_SPEC:
        return Verdict.REFUTED, ("a request preempted (num_computed_tokens = 0) and then finished by a stale "
                                 "output whose accepted drafts move its horizon past the chunks it stored before "
                                 "the preemption (no store-preempted-stored here): the connector still holds its "
                                 "freed blocks, and stores a chunk it has not computed since")
    if status == FINISHED and not prompt_only and not f.store_finished_clamp:
        return Verdict.REFUTED, ("a finished request's horizon is clamped to max(num_prompt_tokens, num_tokens - 1) "
                                 "(0.30+; before, num_tokens counts the final sampled token)")
    if status == ABORTED and not f.store_aborted_at_computed:
        return Verdict.REFUTED, "an aborted request's horizon is num_computed_tokens (0.27+; 0.26: num_tokens)"
    if status == FINISHED:
        return Verdict.PROVED, ("the horizon stops before the final sampled token (the clamp, or "
                                "offload_prompt_only caps it at the prompt)")
    if status == ABORTED:
        return Verdict.PROVED, "an aborted request's horizon is what it computed"
    return Verdict.PROVED, "a running request's horizon is what it has computed once the batch ran"



BOUND = Bound(1, 0, "unbounded (P, O, C, S, A, B, Ph, K, L)",
              "one full-attention group, one block per chunk: _build_store_jobs stores each group's chunks on its "
              "own, with no state carried from one group to the next")
MATH = "n ≤ N0 ∨ n·B ≤ computed,  n = min(⌊horizon/B⌋, A),  horizon = the release's tokens after the batch, capped (T; P if prompt only)"
# The runs of releases over which the store spec's columns hold, from its first release on.
STORE_SPANS = [s for s in spans(STORE_COLUMNS) if s.features.next_stored_chunk_idx]


def _obligations() -> list:
    out = []
    for span in STORE_SPANS:
        f = span.features
        for status in STATUSES:
            for po in (True, False):
                for mode in MODES:
                    oid = f"store.computed[{f.release}+,{status},prompt_only={po},{mode}]"
                    expected, premise = _expected(f, status, po, mode)
                    out.append(Obligation(
                        oid,
                        f"vLLM {span}'s _build_store_jobs, for {'an' if status == ABORTED else 'a'} "
                        f"{status} request with offload_prompt_only={po}, under {MODES[mode]}, stores only "
                        "chunks that end at or before the tokens the forward computed.",
                        MATH if expected == Verdict.PROVED else f"¬ ({MATH})", premise, expected,
                        _build(f, status, po, mode, oid),
                        reproduce=None if expected == Verdict.PROVED else replay_store, mutable=False, bound=BOUND,
                        premises=store_premise_ids(status, f.store_caps_at_allocated, mode == ASYNC_SPEC),
                        releases=span))
    return out


OBLIGATIONS: list[Obligation] = _obligations()

__all__ = ["MODES", "OBLIGATIONS", "STATUSES", "StoreWorld", "replay_store"]
