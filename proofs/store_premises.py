"""The store premises: facts about one _build_store_jobs call, not a load.

Their subject is one request's numbers where ``_build_store_jobs`` reads them (``StoreTerms``):
what the scheduler scheduled and computed, and what the allocator holds. The store obligations
(``store.py``) rest on them; the load premises, and what every premise states (``Stated``), are
``premises.py``'s.

Each is restated from vLLM's own accounting for the three scheduling modes, so one premise holds
under all of them: sync scheduling (``Scheduler``), async scheduling (``AsyncScheduler``: a decode
step is scheduled before the previous one's output is back, and its sampled and draft tokens are
counted as ``num_output_placeholders`` in ``num_computed_tokens`` meanwhile) and speculative
decoding (``K`` draft tokens scheduled this step, ``L = num_lookahead_tokens`` slots the allocator
reserves past them). vLLM calls the connector's ``build_connector_meta`` (which calls
``_build_store_jobs``) after a step is scheduled and before ``_update_after_schedule`` adds the
scheduled tokens to ``num_computed_tokens``, so ``C`` is the count before the step. The lines are
read in every release the store spec covers (``RELEASE_LINES``), so each premise cites them per
release. ``check_store_call`` folds every premise of a status on one captured call (the trace,
``kvbound/trace/storecheck.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbound.spec import GroupKind

from .premises import CORE_SCHED, KVM, SCHED, V26, Stated, source
from .terms import AND, FLOORDIV, IMPLIES, OR

@dataclass(frozen=True)
class StoreTerms:
    """What a store premise reads: one request at one ``_build_store_jobs`` call (Z3 terms, or
    ints and bools for a captured call)."""

    P: object  # num_prompt_tokens
    O: object  # output tokens: num_tokens = P + O
    C: object  # num_computed_tokens (before this step's _update_after_schedule)
    S: object  # num_scheduled_tokens this step
    A: object  # GPU blocks allocated to the group (one block per chunk), as the connector holds them
    B: object  # tokens per block (= per chunk)
    T: object  # num_tokens (prompt and output tokens; neither placeholders nor drafts)
    computed: object  # tokens whose KV the forward wrote once the batch ran (spec.store.computed_tokens)
    horizon: object  # the release's store horizon (spec.store.store_horizon)
    Ph: object = 0  # num_output_placeholders (async scheduling; 0 under sync)
    K: object = 0  # draft tokens scheduled this step (len(scheduled_spec_decode_tokens[req_id]))
    L: object = 0  # num_lookahead_tokens: the slots allocate_slots reserves past them (speculative decoding)
    is_async: object = False  # the AsyncScheduler
    N0: object = 0  # next_stored_chunk_idx before the call: the chunks stored at earlier steps


@dataclass(frozen=True)
class StorePremise(Stated):
    """A premise of a store: one term over ``StoreTerms``."""

    term: Callable  # (StoreTerms) -> Z3 formula, or a bool on a captured call's ints


FULL = frozenset({GroupKind.FULL_ATTENTION})
ASYNC_SCHED = "v1/core/sched/async_scheduler.py"

# The lines each premise was read from, per release (``~/.cache/kvbound/vllm-X/vllm/``):
# run: schedule()'s running branch, num_new_tokens = num_tokens_with_spec + num_output_placeholders
#   - num_computed_tokens; spec: the draft tokens kept (scheduled_spec_decode_tokens); meta: the
#   connector's build_connector_meta, before upd: _update_after_schedule, whose inc:
#   num_computed_tokens += num_scheduled_token; ph: AsyncScheduler._update_after_schedule's
#   num_output_placeholders += 1 + drafts; pre: _preempt_request's num_computed_tokens = 0; stale:
#   a preempted request's in-flight output delivered (output_is_stale = True; 0.26 discards it);
#   rej: rejected drafts taken back (num_computed_tokens -= num_rejected); trim: a stop inside the
#   accepted drafts takes back the tokens past it (0.33 only); slot: allocate_slots' num_tokens_need_slot
#   = computed + new + num_lookahead_tokens (kv_cache_manager.py); clear: the offloading connector's
#   get_num_new_matched_tokens clears the request's block_ids (offloading/scheduler.py).
RELEASE_LINES = {
    "0.26.0": dict(run=502, spec=634, meta=1174, upd=1190, inc=1249, ph=39, pre=1225, stale=1678, rej=1695,
                   slot=430, clear=744),
    "0.27.0": dict(run=516, spec=652, meta=1236, upd=1252, inc=1330, ph=39, pre=1294, stale=1741, rej=1782,
                   slot=491, clear=840),
    "0.28.0": dict(run=558, spec=716, meta=1298, upd=1314, inc=1392, ph=39, pre=1356, stale=1805, rej=1846,
                   slot=494, clear=960),
    "0.29.0": dict(run=585, spec=743, meta=1364, upd=1383, inc=1461, ph=39, pre=1425, stale=1874, rej=1915,
                   slot=490, clear=960),
    "0.30.0": dict(run=656, spec=823, meta=1436, upd=1455, inc=1533, ph=39, pre=1497, stale=1952, rej=1993,
                   slot=527, clear=1043),
    "0.31.0": dict(run=674, spec=841, meta=1490, upd=1516, inc=1596, ph=45, pre=1560, stale=2026, rej=2067,
                   slot=539, clear=1065),
    "0.32.0": dict(run=703, spec=872, meta=1529, upd=1555, inc=1629, ph=45, pre=1593, stale=2085, rej=2126,
                   slot=542, clear=1068),
    "0.33.0": dict(run=839, spec=1021, meta=1757, upd=1783, inc=1858, ph=44, pre=1822, stale=2321, rej=2362,
                   slot=551, trim=2762, clear=1243),
}
_FILES = {"run": CORE_SCHED, "spec": CORE_SCHED, "meta": CORE_SCHED, "upd": CORE_SCHED, "inc": CORE_SCHED,
          "ph": ASYNC_SCHED, "pre": CORE_SCHED, "stale": CORE_SCHED, "rej": CORE_SCHED, "trim": CORE_SCHED,
          "slot": KVM, "clear": SCHED}
_WHAT = {"run": "schedule: a running request's num_new_tokens = num_tokens_with_spec + num_output_placeholders"
                " - num_computed_tokens",
         "spec": "schedule: the draft tokens kept, scheduled_spec_decode_tokens",
         "meta": "schedule: build_connector_meta (_build_store_jobs) before _update_after_schedule",
         "upd": "schedule: _update_after_schedule after the connector's metadata",
         "inc": "_update_after_schedule: num_computed_tokens += num_scheduled_token",
         "ph": "AsyncScheduler._update_after_schedule: num_output_placeholders += 1 + drafts scheduled",
         "pre": "_preempt_request: num_computed_tokens = 0, num_output_placeholders = 0",
         "stale": "update_from_output: a preempted request's in-flight output (0.26: discarded)",
         "rej": "update_from_output: num_computed_tokens -= num_rejected drafts",
         "trim": "_update_request_with_output: a stop inside the accepted drafts takes back the tokens past it",
         "slot": "allocate_slots: num_tokens_need_slot = computed + new + num_lookahead_tokens",
         "clear": "the offloading connector clears a request's block_ids only when it looks the request up "
                  "again (get_num_new_matched_tokens) or gets its full table"}


def per_release(*keys) -> tuple:
    """The sources of a premise: each of ``keys``' lines in every release that has it."""
    return tuple(source(f"vllm {v}", _FILES[k], lines[k], _WHAT[k])
                 for v, lines in RELEASE_LINES.items() for k in keys if k in lines)


def _running(s):
    return s.C + s.S <= s.T + s.Ph + s.K


def _preempted(s):
    """A request preempted, then finished by a stale output: async, nothing computed or scheduled."""
    return AND(s.is_async, s.C == 0, s.S == 0)


def _finished(s):
    # C >= T - 1: the final sampled token is never forwarded, but C may count past it: async
    # scheduling's in-flight placeholders, and before 0.33 the accepted drafts past a stop.
    # C = 0: a stale output (async) finished a request preempted meanwhile.
    return AND(s.O >= 1, s.S == 0, OR(s.C >= s.T - 1, _preempted(s)))


PREEMPTED_STORED = "store-preempted-stored"  # the one premise that rests on every earlier store accepted

STORE_PREMISES: tuple = (
    StorePremise(
        "store-running-scheduled",
        "A running request is scheduled at most its tokens, its output placeholders and its drafts: "
        "sync scheduling without drafts C + S ≤ T; async scheduling counts the sampled and draft tokens of "
        "steps whose output is not back (num_output_placeholders, Ph) in C; speculative decoding schedules "
        "K draft tokens past T.",
        "C + S ≤ T + Ph + K  (sync: Ph = 0; no drafts: K = 0)", FULL,
        per_release("run", "spec", "ph", "meta", "upd"),
        _running),
    StorePremise(
        "store-finished-by-sampling",
        "A request that finished by sampling has one output token at least and nothing scheduled; it "
        "computed all but the final sampled token, which is never forwarded (C = T − 1, sync without drafts), "
        "or more: under async scheduling C still counts the placeholder of a step scheduled before the "
        "finishing output came back (C = T), and before 0.33 the accepted drafts past a stop are not taken "
        "back; or, under async scheduling, C = 0: a stale output finished a request preempted meanwhile.",
        "O ≥ 1 ∧ S = 0 ∧ (C ≥ T − 1 ∨ (async ∧ C = 0))", FULL,
        per_release("inc", "ph", "rej", "trim", "pre", "stale"),
        _finished),
    StorePremise(
        "store-aborted-computed",
        "An aborted request computed at most its tokens and its placeholders (async scheduling: an abort "
        "between a step's scheduling and its output), and nothing is scheduled for it.",
        "C ≤ T + Ph ∧ S = 0", FULL,
        per_release("inc", "ph"),
        lambda s: AND(s.C <= s.T + s.Ph, s.S == 0)),
    StorePremise(
        "store-allocated-scheduled",
        "The allocator holds blocks for the tokens computed and scheduled and, under speculative decoding, "
        "for the L lookahead slots past them, and for the drafts rejected since (at most L: num_computed_tokens "
        "takes them back, the blocks stay): A ≤ cdiv(C + S + 2L, B); without speculative decoding A ≤ "
        "cdiv(C + S, B) (async scheduling: C counts the placeholders the allocator was asked for). Under "
        "async scheduling with speculative decoding the drafts of two steps are taken back after an "
        "allocation: those of the step in flight when it was made (counted in C as placeholders) and those of "
        "the step it scheduled, at most L each (a stop inside the accepted drafts takes back no more than the "
        "drafts rejected would), so A ≤ cdiv(C + S + 3L, B) (measured on 0.30.0-0.33.0: eagle and swa-mtp "
        "async reach A·B = C + 2L + B at a finished request's call). Except a request preempted (C = 0) and "
        "then ended before its next lookup, under either scheduler: finished by a stale output (async) or "
        "aborted while it waits (sync too: measured on 0.33.0 mamba@cpu_chunks=32, A = 4, C = S = 0, "
        "docs/trace.md): _preempt_request sets C = 0 and frees its blocks, but the connector still "
        "holds the block_ids it had at the preemption, which only its next lookup clears.",
        "A·B < C + S + 2L + B ∨ (async ∧ A·B < C + S + 3L + B) ∨ (C = 0 ∧ S = 0)  "
        "(no speculative decoding: L = 0)", FULL,
        per_release("slot", "inc", "ph", "rej", "trim", "pre", "clear"),
        lambda s: OR(s.A * s.B < s.C + s.S + 2 * s.L + s.B, AND(s.is_async, s.A * s.B < s.C + s.S + 3 * s.L + s.B),
                     AND(s.C == 0, s.S == 0))),
    StorePremise(
        PREEMPTED_STORED,
        "A request preempted and then finished by a stale output (async scheduling, C = 0) stores nothing "
        "new: its horizon reaches no chunk past those it stored before the preemption (N0), whose blocks the "
        "connector still holds though the scheduler freed them. vLLM does not enforce it: it holds when every "
        "store before the preemption was accepted and the stale output brings no accepted drafts (async "
        "scheduling without speculative decoding: the horizon T − 1 is the last running step's); a call that "
        "breaks it stores from freed blocks. The trace checks it on the requests whose every store the tier "
        "accepted (kvbound/trace/storecheck.py): after a refusal, N0 lags by the chunks refused.",
        "C = 0 ⇒ min(⌊horizon/B⌋, A) ≤ N0", FULL,
        per_release("pre", "stale", "clear"),
        lambda s: IMPLIES(s.C == 0, OR(FLOORDIV(s.horizon, s.B) <= s.N0, s.A <= s.N0))),
    StorePremise(
        "store-no-cap-assert",
        "0.26 does not cap the stored chunks at the allocated blocks: the store is reached only where its "
        "assert passes (more chunks than blocks is a crash, not a store).",
        "⌊horizon/B⌋ ≤ A", FULL,
        (source(V26, SCHED, 975, "_build_store_jobs: assert len(offload_keys) == len(offload_block_ids)"),),
        lambda s: FLOORDIV(s.horizon, s.B) <= s.A),
)

STORE_BY_ID = {p.id: p for p in STORE_PREMISES}

# The premise of each status (the one its numbers come from), then the allocation's.
STATUS_PREMISE = {"running": "store-running-scheduled", "finished": "store-finished-by-sampling",
                  "aborted": "store-aborted-computed"}


def store_premise_ids(status: str, caps_at_allocated: bool, async_spec: bool = False) -> tuple:
    """The premises a store of a request of ``status`` rests on, in the order the claim meets them;
    ``async_spec``: under speculative decoding with async scheduling, where store-preempted-stored
    is not assumed (a stale output can bring accepted drafts)."""
    preempted = (PREEMPTED_STORED,) if status == "finished" and not async_spec else ()
    return (STATUS_PREMISE[status], "store-allocated-scheduled") + preempted + (
        () if caps_at_allocated else ("store-no-cap-assert",))


def check_store_call(terms: StoreTerms, status: str, caps_at_allocated: bool) -> list:
    """The premises of ``status`` that a captured call's terms (ints) break: [(premise, detail)]."""
    out = []
    for pid in store_premise_ids(status, caps_at_allocated, bool(terms.is_async) and terms.L > 0):
        p = STORE_BY_ID[pid]
        if p.term(terms) is not True:
            out.append((p, f"{pid}: {p.math} does not hold (P={terms.P} T={terms.T} C={terms.C} S={terms.S} "
                           f"A={terms.A} B={terms.B} Ph={terms.Ph} K={terms.K} L={terms.L} N0={terms.N0} "
                           f"{'async' if terms.is_async else 'sync'})"))
    return out


__all__ = ["PREEMPTED_STORED", "RELEASE_LINES", "STATUS_PREMISE", "STORE_BY_ID", "STORE_PREMISES", "StorePremise",
           "StoreTerms", "check_store_call", "per_release", "store_premise_ids"]
