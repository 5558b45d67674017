"""The one mutant table: every planted fault, by name, for all three checkers.

Each ``Mutant`` names one change to the load plan as vLLM's code would read it. The
three checkers apply it to their own copy of the semantics and must each kill it:

* ``encoding``: the Z3 encoding (``Knobs`` changes, here); ``kvbound prove`` kills a
  mutant when a proved obligation fails under it;
* ``spec``: the executable spec, patched at runtime (``kvbound.conform.mutants``, by
  the same names); ``kvbound conform --spec-mutants`` kills it when a real vLLM
  result that agreed with the spec disagrees with the mutant;
* ``impl``: the torch implementation (``kvbound.impl``, by the same names);
  ``kvbound diff`` kills it on a disagreement with the spec.

A checker that cannot express a mutant says why in ``not_for`` (never a silent
survivor); ``score`` turns a checker's kills into the JSON every command writes:
killed / total / percent, the survivors by name, and what is not applicable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHECKERS = ("encoding", "spec", "impl")


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  # the planted fault, in words
    cls: str  # the mutant class of issue 11: scan, assert, sync, keys, partial-tail, groups, plan; copy (issue 23)
    encoding: dict | None = None  # Knobs changes; None: see not_for["encoding"]
    not_for: dict = field(default_factory=dict)  # checker -> why it cannot express this mutant
    killer: str | None = None  # the obligation expected to kill it in the encoding (tried first; prove checks it)


_GROUPS = ("the encoding states one group's plan; which table a group reads (blocks.blocks[group_idx]) "
           "is the case-to-inputs mapping that check_plan, conform and diff exercise")

_COPY = ("the spec and the torch impl execute the connector's load plan; the copy contract is a scheduler "
         "step's, modelled only in proofs/copy_contract.py (tests/test_copy.py holds the model to the real KVCacheManager)")

MUTANTS: tuple[Mutant, ...] = (
    # the scan
    Mutant("scan-from-zero", "the fixed variants scan from 0 as legacy did", "scan", dict(scan_from_zero=True)),
    Mutant("scan-nulls", "the scan stops at the null block too (no null skip)", "scan", dict(null_skip=False)),
    Mutant("floor-f", "first fresh block f = N // b instead of cdiv(N, b)", "scan", dict(f_floor=True)),
    Mutant("unhashed-test-dropped", "the scan takes any non-null block (block_hash is None dropped)", "scan",
           dict(unhashed_test=False)),
    Mutant("start-equals-f", "no scan: load_start_gpu_block_idx = f", "scan", dict(no_scan=True)),
    Mutant("loop-from-f+1", "range(f + 1, k)", "scan", dict(lo_offset=1)),
    Mutant("loop-from-f-1", "range(f - 1, k)", "scan", dict(lo_offset=-1)),
    Mutant("loop-to-k-1", "range(f, k - 1) (the default start stays k)", "scan", dict(hi_offset=-1)),
    Mutant("loop-to-k+1", "range(f, k + 1)", "scan", dict(hi_offset=1)),
    # the asserts
    Mutant("assert-order", "the window bound is checked before the alignment assert (fixed variants)", "assert",
           dict(window_before_scan_assert=True), killer="assert-order"),
    Mutant("window-slack", "the window bound loses its + 1 (pending <= window * bpc)", "assert",
           dict(window_slack_delta=-1), killer="window-bound.window-nulls"),
    Mutant("window-retained", "the window in chunks ignores extra_retained_tokens (0.31+ count them)", "assert",
           dict(retained_ignored=True), killer="window-bound.window-nulls"),
    Mutant("alignment-dropped", "the fixed variants' alignment assert N % b == 0 is gone", "assert",
           dict(alignment_assert=False), killer="assert-order"),
    Mutant("boundary-dropped", "the legacy boundary assert N <= start * b is gone", "assert",
           dict(boundary_assert=False), killer="legacy-guarded"),
    # the sync rule
    Mutant("sync-rule", "a 0.33 sync load no longer matches hashed blocks by position", "sync",
           dict(sync_rule_dropped=True), killer="fixed-sync"),
    # the keys slice and the group size
    Mutant("keys-slice-start", "keys start at cdiv(start, bpc) instead of start // bpc", "keys",
           dict(key_start_ceil=True), killer="keys-in-lookup-range"),
    Mutant("keys-from-start//bpc+1", "keys start one chunk late", "keys", dict(key_start_offset=1), killer="keys-in-lookup-range"),
    Mutant("keys-slice-end", "keys end at T // tpc instead of cdiv(T, tpc)", "keys", dict(end_chunk_floor=True), killer="keys-in-lookup-range"),
    Mutant("keys-prompt-only", "offload keys counted from the prompt, not from all num_tokens", "keys",
           dict(keys_from_prompt=True), killer="keys-from-all-tokens"),
    Mutant("pending+1", "group size k - start + 1", "plan", dict(pending_offset=1), killer="destinations-exact"),
    Mutant("pending-1", "group size k - start - 1", "plan", dict(pending_offset=-1), killer="destinations-exact"),
    # partial tails
    Mutant("partial-tail-chunk", "a partial tail also loads its boundary's chunk as a chunk key", "partial-tail",
           dict(tail_chunk_dropped=False), killer="partial-tail.full-attention"),
    Mutant("partial-tail-margin", "a partial tail's key ignores the EAGLE proof margin", "partial-tail",
           dict(tail_margin=False), killer="partial-tail.full-attention"),
    Mutant("partial-tail-assert", "the request-level partial_tail assert (boundary == T) is gone", "partial-tail",
           dict(tail_assert=False), killer="partial-tail.guard"),
    # the copy contract (proofs/copy_contract.py): a scheduler step, not the load plan
    Mutant("copy-same-step-source", "the patched lookup takes a partial hit's source from blocks cached in the "
           "current step again (the fix undone)", "copy", dict(copy_same_step_sources=True), killer="copy.patched",
           not_for={"spec": _COPY, "impl": _COPY}),
    # group iteration
    Mutant("group-iteration", "groups iterated by position, not by their group_idx (non-offloaded groups)",
           "groups", not_for={"encoding": _GROUPS}),
)

BY_NAME = {m.name: m for m in MUTANTS}
ENCODING_KNOB_MUTANTS = {m.name: m.encoding for m in MUTANTS if m.encoding is not None}


def applicable(checker: str) -> list[Mutant]:
    return [m for m in MUTANTS if checker not in m.not_for]


def score(checker: str, killed: dict) -> dict:
    """The JSON of one checker's mutation run: ``killed`` maps a mutant name to what
    killed it (an obligation id, a case name) or None (it survived)."""
    if checker not in CHECKERS:
        raise ValueError(f"unknown checker {checker!r}; one of {CHECKERS}")
    unknown = sorted(set(killed) - set(BY_NAME))
    if unknown:
        raise ValueError(f"mutant {unknown[0]!r} is not in kvbound.proofs.mutants.MUTANTS")
    names = [m.name for m in applicable(checker) if m.name in killed]
    n_killed = sum(killed[n] is not None for n in names)
    return {
        "checker": checker,
        "killed": n_killed,
        "total": len(names),
        "percent": round(100.0 * n_killed / len(names), 1) if names else None,
        "survivors": [n for n in names if killed[n] is None],
        "killed_by": {n: killed[n] for n in names},
        "not_run": [m.name for m in applicable(checker) if m.name not in killed],
        "not_applicable": {m.name: m.not_for[checker] for m in MUTANTS if checker in m.not_for},
    }


__all__ = ["CHECKERS", "ENCODING_KNOB_MUTANTS", "MUTANTS", "Mutant", "applicable", "score"]
