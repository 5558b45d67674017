"""The premises the obligations rest on: one named object each, one term each.

A premise is a fact about the inputs of ``update_state_after_alloc`` that vLLM's
allocator, scheduler or lookup guarantees (read from the source lines it lists),
not something the connector checks. Each ``Premise`` is written once, as ``term(g)``
over one group's terms ``g`` (a ``GroupTerms``) with ``terms.py``'s helpers, which
build Z3 terms or fold on ints:

* a world hands it Z3 terms (``world.World``, ``world.TailWorld``, a slot of
  ``hybrid.HybridWorld``): the formula the obligations assume;
* ``case_terms(case, gi)`` hands it one group of a concrete ``Case``: the same term
  folds to True or False, and a clause that breaks notes what is wrong
  (``Premise.check``).

``evaluate(case)`` runs every applicable premise on every group of a case; ``kvbound
premises CASE...`` prints it, and a call captured from a running vLLM (``conform/
capture.py``, the trace harness) can so be checked against what the proofs assume.

Premises hold at a load only (``num_external_tokens > 0``: with M = 0 vLLM returns
before planning), so ``evaluate`` reports nothing for M = 0.

The premises of other calls state theirs the same way (``Stated``, ``source``), over their own
terms: a pair of allocate_slots calls (``allocation_premises``), one ``_build_store_jobs`` call
(``store_premises``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from kvbound.spec import STATE_H, STATE_N, STATE_U, Case, GroupKind, cdiv, get_num_skipped_tokens

from .encoding import ConcreteTable
from .terms import AND, CDIV, FLOORDIV, IF, IMPLIES, MAX, OR

ALL_KINDS = frozenset(GroupKind)

# Source trees every premise's lines were read in (``~/.cache/kvbound/vllm-X/vllm/``), and their files.
V26, V28, V29, V30, V32, V33 = "vllm 0.26.0", "vllm 0.28.0", "vllm 0.29.0", "vllm 0.30.0", "vllm 0.32.0", "vllm 0.33.0"
STM = "v1/core/single_type_kv_cache_manager.py"
KVM = "v1/core/kv_cache_manager.py"
CORE_SCHED = "v1/core/sched/scheduler.py"
SCHED = "distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"  # the offloading connector's


@dataclass(frozen=True)
class Stated:
    """What every premise states: an id, the statement in words and as a formula, the group kinds
    it is stated for and the vLLM lines it was read from."""

    id: str
    statement: str  # English, for the report and the catalogue
    math: str  # the formula, in the catalogue's notation
    kinds: frozenset  # the group kinds it is stated for
    sources: tuple  # "release file:line (function)" it was read from

    def applies(self, kind: GroupKind) -> bool:
        return kind in self.kinds

    @property
    def kinds_label(self) -> str:
        """The kinds it is stated for, as the catalogue and ``kvbound premises --list`` print them."""
        return "every kind" if self.kinds == frozenset(GroupKind) else ", ".join(sorted(k.value for k in self.kinds))


@dataclass(frozen=True)
class Premise(Stated):
    """A premise of a load: one term over one group's terms."""

    term: Callable  # (GroupTerms) -> a Z3 formula (a world's terms), True or False (a case's)

    def check(self, case: Case, gi: int) -> str | None:
        """None when the premise holds on group ``gi`` of ``case`` (its term, folded on the case),
        else what is wrong."""
        return self.check_terms(case_terms(case, gi))

    def check_terms(self, g: GroupTerms) -> str | None:
        """The same on a case's group terms (``case_terms``): None, or the first broken clause's note."""
        g.notes.clear()
        if self.term(g) is True:
            return None
        return g.notes[0] if g.notes else f"{self.id}: {self.math} does not hold"


@dataclass(frozen=True)
class GroupTerms:
    """What a load premise reads of one group: Z3 terms (a world's) or ints (a case's,
    ``case_terms``), named as vLLM names them. A world passes its group's explicitly; a
    premise reads nothing else."""

    N: object  # num_locally_computed_tokens
    M: object  # num_external_tokens
    T: object  # N + M
    b: object  # tokens_per_block
    bpc: object  # blocks_per_chunk
    tpc: object  # tokens_per_chunk = b * bpc
    f: object  # cdiv(N, b), the first fresh block
    k: object  # cdiv(T, b), the end of the load region
    j: object  # the first fresh block after the nulls (premise fresh-after-nulls)
    table: object  # a SymTable (a world's) or a ConcreteTable (a case's)
    sync_load: object
    num_keys: object  # offload keys at admission
    window: object = None  # sliding_window_size_in_chunks (None: full attention)
    span: object = None  # sliding_window / attention_chunk_size in tokens (None: not windowed)
    extra: object = 0  # extra_retained_tokens
    tail: object = False  # a partial tail: False (none), True, or a Z3 Bool (the request's, in a hybrid)
    boundary: object = 0  # partial_tail_boundary (read with a tail)
    tph: object = None  # tokens_per_hash (read with a tail)
    prompt: object = None  # num_prompt_tokens (read with a tail)
    tokens: object = None  # request.num_tokens, what the keys cover (read with a tail; a world's is its prompt)
    tail_refusal: str | None = None  # why the config supports no partial tail (a world assumes it does:
    # TailWorld.base, HybridWorld.partial_tail_config); read with a tail
    notes: list | None = None  # a case's: what each broken clause says (None: a world's, nothing noted)


def case_terms(case: Case, gi: int) -> GroupTerms:
    """Group ``gi`` of ``case`` as the terms a premise reads: the case's numbers and table, and
    for fresh-after-nulls the j the table shows (its first non-null block in [f, k), else where
    the load or the table ends)."""
    g = case.groups[gi]
    cfg = g.config
    b, bpc = cfg.tokens_per_block, case.blocks_per_chunk
    N, M = case.num_locally_computed_tokens, case.num_external_tokens
    f, k = cdiv(N, b), cdiv(N + M, b)
    end = min(k, len(g.blocks))
    j = next((i for i in range(f, end) if not g.blocks[i].is_null), max(f, end))
    tail = case.partial_tail_boundary is not None
    return GroupTerms(N, M, N + M, b, bpc, b * bpc, f, k, j, ConcreteTable(g.blocks), case.sync_load,
                      case.num_offload_keys(gi), cfg.sliding_window_size_in_chunks(bpc),
                      cfg.sliding_window or cfg.attention_chunk_size, cfg.extra_retained_tokens, tail,
                      case.partial_tail_boundary or 0, case.tokens_per_hash, case.num_prompt_tokens,
                      case.num_tokens, case.partial_tail_refusal() if tail else None, notes=[])


class PremiseCheck(NamedTuple):
    premise: Premise
    group_index: int
    holds: bool
    detail: str  # what was compared; why it fails


# --- the terms ----------------------------------------------------------------------
#
# A clause that a case can break says what is wrong through ``_why`` (or ``_every``, for a
# quantifier over the table); in a world both return the clause unchanged.

def _why(g, holds, detail):
    """``holds``; on a case's group where it is False, ``detail()`` is noted."""
    if holds is False and g.notes is not None:
        g.notes.append(detail())
    return holds


def _every(g, lo, hi, body, detail):
    """``body(i)`` for every i in [lo, hi) of the group's table; on a case's table, ``detail(i)``
    of the first i that breaks it is noted."""
    t = g.table
    return _why(g, t.forall(lo, hi, body), lambda: detail(t.broken))


def _term_table_length(g):
    return _why(g, g.table.length >= g.k, lambda: f"len(blocks)={g.table.length} < k=cdiv(T={g.T}, b={g.b})={g.k}")


def _term_aligned(g):
    return _why(g, g.N % g.b == 0,
                lambda: f"N={g.N} is not a multiple of tokens_per_block={g.b} (N % b = {g.N % g.b})")


def _term_fresh_after_nulls(g):
    """∃ j ∈ [f, k]: [f, j) null, [j, k) fresh; j is the group's own ``g.j``."""
    t = g.table

    def broken(i):
        want = "non-null (a sync load's blocks are hashed at allocation)" if g.sync_load else "U (fresh, unhashed)"
        return f"blocks[{i}] is {t.token(i)}, expected {want}: [f={g.f}, j={g.j}) null then [j, k={g.k}) fresh"

    return AND(g.f <= g.j, g.j <= g.k,
               t.forall(g.f, g.j, lambda i: t.state(i) == STATE_N),
               _every(g, g.j, g.k, lambda i: OR(t.state(i) == STATE_U, AND(g.sync_load, t.state(i) != STATE_N)), broken))


def _term_computed_hashed(g):
    t = g.table
    return _every(g, 0, g.f, lambda i: t.state(i) == STATE_H,
                  lambda i: f"blocks[{i}] is {t.token(i)} below f={g.f}; a full-attention prefix hit is hashed blocks")


def _term_computed_cached(g):
    t = g.table
    return _every(g, 0, g.f, lambda i: t.state(i) != STATE_U,
                  lambda i: f"blocks[{i}] is {t.token(i)} below f={g.f}; a windowed group's computed blocks are "
                            "prefix-cache hits (hashed) or skipped (null)")


def _before_window(g, skipped):
    """The skipped blocks (``skipped`` tokens before the window at T) are null."""
    t, s = g.table, FLOORDIV(skipped, g.b)
    return _every(g, 0, s, lambda i: t.state(i) == STATE_N,
                  lambda i: f"blocks[{i}] is {t.token(i)}, but the first {s} blocks lie before the window at T and are null")


def _term_sliding_skipped_null(g):
    """The skipped blocks are null (the window in chunks is the config's: the plan derives it)."""
    skipped = get_num_skipped_tokens(GroupKind.SLIDING_WINDOW, g.T, sliding_window=g.span, extra_retained_tokens=g.extra,
                                     maximum=MAX, floordiv=FLOORDIV)
    return AND(g.span >= 1, g.extra >= 0, _before_window(g, skipped))


def _term_chunked_skipped_null(g):
    return AND(g.span >= 1, _before_window(g, get_num_skipped_tokens(
        GroupKind.CHUNKED_LOCAL, g.T, attention_chunk_size=g.span, maximum=MAX, floordiv=FLOORDIV)))


def _term_mamba_one_block(g):
    t = g.table
    return AND(g.window == 1, _every(g, g.f, g.k - 1, lambda i: t.state(i) == STATE_N, lambda i: (
        f"blocks[{i}] is {t.token(i)} in [f={g.f}, k-1={g.k - 1}); align mode keeps one state block, at k-1")))


def _term_keys_cover(g):
    tail = g.tail
    whole = g.num_keys * g.tpc >= g.T

    def short():
        want = cdiv(g.T, g.tpc) - tail
        what = "the chunks below a partial tail's boundary chunk" if tail else "the lookup caps T at keys*tpc"
        return f"{g.num_keys} offload keys < {want} = cdiv(T={g.T}, tokens_per_chunk={g.tpc}){' - 1' * tail}: {what}"

    # bpc = 1 with a tail
    return _why(g, whole if tail is False else IF(tail, g.num_keys >= CDIV(g.T, g.tpc) - 1, whole), short)


def _term_partial_tail_lookup(g):
    """``_lookup`` with a partial tail (0.33 scheduler.py:1068-1152): a hash-aligned boundary past N,
    before the prompt's last token, returned as M = boundary - N; keys from all tokens."""
    tail = g.tail
    if tail is False:
        return True
    B = g.boundary

    def off_grid():
        return f"partial_tail_boundary={B} is not a hash boundary in (N={g.N}, num_prompt_tokens - 1]"

    return IMPLIES(tail, AND(
        _why(g, B == g.N + g.M, lambda: f"partial_tail_boundary={B} != N + M = {g.T}: the lookup returns M = boundary - N"),
        _why(g, B > g.N, off_grid), _why(g, B % g.tph == 0, off_grid), _why(g, B <= g.prompt - 1, off_grid),
        g.num_keys == FLOORDIV(g.tokens, g.tpc),
        _why(g, g.tail_refusal is None, lambda: f"the config does not support partial tails: {g.tail_refusal}")))


def source(release, path, line, what):
    """A premise's source: "vllm X path:line (what)"."""
    return f"{release} {path}:{line} ({what})"


PREMISES: tuple = (
    Premise(
        "table-covers-load",
        "The group's table holds at least k = cdiv(T, b) blocks: the allocator appends fresh blocks up to "
        "cdiv(N + M, b) before the connector sees the table.",
        "len(blocks) ≥ k", ALL_KINDS,
        (source(V33, STM, 327, "allocate_external_computed_blocks: cdiv(total, block_size) - len(req_blocks) new blocks"),
         source(V29, STM, 295, "allocate_external_computed_blocks")),
        _term_table_length),
    Premise(
        "n-aligned",
        "N is a multiple of the group's tokens_per_block: the scheduler hands the connector the local hit rounded "
        "down to its block size, the LCM of every group's block size (proved by `alignment`).",
        "N mod b = 0", ALL_KINDS,
        (source(V33, CORE_SCHED, 1134, "partial_tail = num_new_local_computed_tokens % self.block_size"),
         source(V33, "v1/core/kv_cache_utils.py", 816, "resolve_kv_cache_block_sizes: LCM of the groups' block sizes"),
         source(V29, CORE_SCHED, 852, "the same rounding")),
        _term_aligned),
    Premise(
        "fresh-after-nulls",
        "In [f, k) the table is null blocks (skipped by a window) then the fresh blocks allocated for the load: "
        "non-null and unhashed, or (a 0.33 sync load) hashed at allocation.",
        "∃ j ∈ [f, k]: ∀ i ∈ [f, j): null ∧ ∀ i ∈ [j, k): fresh (U; non-null when sync)", ALL_KINDS,
        (source(V33, STM, 268, "add_local_computed_blocks: skipped blocks padded with null, then the computed ones"),
         source(V33, STM, 327, "allocate_external_computed_blocks: fresh blocks appended"),
         source(V33, "v1/core/block_pool.py", 706, "get_new_blocks: blocks from the free queue, cached hash evicted"),
         source(V33, "v1/core/kv_cache_manager.py", 613, "allocate_slots: cache_blocks unless delay_cache_blocks "
              "(an async load); a sync load's blocks are hashed here"),
         source(V29, STM, 236, "add_local_computed_blocks"), source(V29, "v1/core/block_pool.py", 647, "get_new_blocks")),
        _term_fresh_after_nulls),
    Premise(
        "computed-hashed",
        "A full-attention group's blocks below f are the prefix-cache hit: every one hashed.",
        "∀ i < f: state(i) = H", frozenset({GroupKind.FULL_ATTENTION}),
        (source(V33, STM, 739, "FullAttentionManager.find_longest_cache_hit: cached blocks only"),
         source(V33, STM, 268, "add_local_computed_blocks")),
        _term_computed_hashed),
    Premise(
        "computed-cached",
        "A sliding-window or chunked-local group's blocks below f are prefix-cache hits (hashed) or skipped "
        "(null): none is unhashed. (A Mamba group has no such premise: its running state block may be.)",
        "∀ i < f: state(i) ≠ U", frozenset({GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL}),
        (source(V33, STM, 268, "add_local_computed_blocks: nulls for skipped blocks, then the cache hits"),
         source(V29, STM, 236, "add_local_computed_blocks")),
        _term_computed_cached),
    Premise(
        "window-skipped-null",
        "A sliding-window group's blocks before its window at T are null: SlidingWindowManager skips "
        "max(0, T - w + 1 - extra_retained_tokens) tokens.",
        "∀ i < ⌊max(0, T − w + 1 − extra)/b⌋: null",
        frozenset({GroupKind.SLIDING_WINDOW}),
        (source(V33, STM, 1148, "SlidingWindowManager.get_num_skipped_tokens"),
         source(V33, STM, 268, "add_local_computed_blocks: num_skipped_blocks nulls"),
         source(V29, STM, 1071, "SlidingWindowManager.get_num_skipped_tokens")),
        _term_sliding_skipped_null),
    Premise(
        "chunk-skipped-null",
        "A chunked-local group's blocks before T's attention chunk are null.",
        "∀ i < ⌊⌊T/c⌋·c/b⌋: null", frozenset({GroupKind.CHUNKED_LOCAL}),
        (source(V33, STM, 1381, "ChunkedLocalAttentionManager.get_num_skipped_tokens"),
         source(V29, STM, 1310, "ChunkedLocalAttentionManager.get_num_skipped_tokens")),
        _term_chunked_skipped_null),
    Premise(
        "mamba-one-state-block",
        "A Mamba group in align mode keeps one state block for the load: [f, k-1) null, block k-1 the fresh "
        "state (get_num_skipped_tokens(T) = T - 1 nulls everything before it).",
        "∀ i ∈ [f, k−1): null;  window = 1", frozenset({GroupKind.MAMBA}),
        (source(V33, STM, 1971, "MambaManager.get_num_skipped_tokens: num_computed_tokens - 1"),
         source(V33, STM, 1797, "MambaManager.allocate_new_blocks (align): nulls up to the state block"),
         source(V29, STM, 1810, "MambaManager.get_num_skipped_tokens"),
         source(V29, STM, 1661, "MambaManager.allocate_new_blocks")),
        _term_mamba_one_block),
    Premise(
        "keys-cover-hit",
        "The lookup never returns a hit past the group's offload keys: T ≤ keys·tpc.",
        "num_offload_keys · tpc ≥ T", ALL_KINDS,
        (source(V33, SCHED, 915, "_lookup_complete_chunks: max_hit_size_tokens capped at len(offload_keys) * tpc"),
         source(V29, SCHED, 749, "the same cap")),
        _term_keys_cover),
    Premise(
        "partial-tail-lookup",
        "A partial tail is what the lookup chose: a boundary on a hash boundary past N and before the prompt's "
        "last token, on a config that supports partial tails, returned as M = boundary - N (so the scheduler "
        "calls with T = boundary).",
        "B = N + M ∧ N < B ≤ prompt − 1 ∧ tph | B ∧ supports_partial_tail", frozenset({
            GroupKind.FULL_ATTENTION, GroupKind.MAMBA}),
        (source(V33, SCHED, 1068, "_lookup: max_boundary, the boundary loop, return boundary - local_tokens"),
         source(V33, SCHED, 276, "SchedulerOffloadConfig.from_spec: supports_partial_tail"),
         source(V29, SCHED, 876, "_lookup")),
        _term_partial_tail_lookup),
)

BY_ID = {p.id: p for p in PREMISES}


def premise(pid: str) -> Premise:
    return BY_ID[pid]


def evaluate(case: Case, ids=None) -> list[PremiseCheck]:
    """Every applicable premise on every group of ``case`` (nothing when M = 0)."""
    if case.num_external_tokens == 0:
        return []
    chosen = PREMISES if ids is None else tuple(BY_ID[i] for i in ids)
    out = []
    for gi, g in enumerate(case.groups):
        applicable = [p for p in chosen if p.applies(g.config.kind)]
        terms_of_group = case_terms(case, gi) if applicable else None
        for p in applicable:
            problem = p.check_terms(terms_of_group)
            out.append(PremiseCheck(p, gi, problem is None, problem or ""))
    return out


def terms(g, kind, ids=None) -> list:
    """The Z3 faces of the premises (``ids``, default all) that apply to ``kind``."""
    chosen = PREMISES if ids is None else tuple(BY_ID[i] for i in ids)
    return [p.term(g) for p in chosen if p.applies(kind)]


def when_kind(kind_term, kind_codes, formula):
    """A premise for a slot whose kind is symbolic: it binds only when the slot has that kind."""
    return IF(OR(*[kind_term == c for c in kind_codes]), formula, True)


__all__ = ["PREMISES", "GroupTerms", "Premise", "PremiseCheck", "Stated", "evaluate", "premise", "source", "terms",
           "when_kind"]
