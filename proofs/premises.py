"""The premises the obligations rest on: one named object each, with two faces.

A premise is a fact about the inputs of ``update_state_after_alloc`` that vLLM's
allocator, scheduler or lookup guarantees (read from the source lines it lists),
not something the connector checks. Each ``Premise`` has

* ``term(g)``: its Z3 formula over one group's terms ``g``, a ``GroupTerms`` (each world
  builds its groups' explicitly: ``world.World``, ``world.TailWorld``, a slot of
  ``hybrid.HybridWorld``), which the obligations assume; and
* ``check(case, gi)``: the same statement as an executable predicate over one
  group of a concrete ``Case`` (``None`` when it holds, else what is wrong).

``evaluate(case)`` runs every applicable premise on every group of a case; ``kvbound
premises CASE...`` prints it, and a call captured from a running vLLM (``conform/
capture.py``, the trace harness) can so be checked against what the proofs assume.

Premises hold at a load only (``num_external_tokens > 0``: with M = 0 vLLM returns
before planning), so ``evaluate`` reports nothing for M = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from kvbound.spec import BlockState, Case, GroupKind, cdiv

from .encoding import HSH, NUL, UNH
from .terms import AND, CDIV, FLOORDIV, IF, IMPLIES, MAX, OR

ALL_KINDS = frozenset(GroupKind)

# Source trees the lines below were read in (``~/.cache/kvbound/vllm-X/vllm/``).
V29, V33 = "vllm 0.29.0", "vllm 0.33.0"
STM = "v1/core/single_type_kv_cache_manager.py"
SCHED = "distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"


@dataclass(frozen=True)
class Premise:
    id: str
    statement: str  # English, for the report and the catalogue
    math: str  # the formula, in the catalogue's notation
    kinds: frozenset  # the group kinds it is stated for
    sources: tuple  # "release file:line (function)" it was read from
    term: Callable  # (GroupTerms) -> Z3 formula
    check: Callable  # (Case, group index) -> None when it holds, else what is wrong

    def applies(self, kind: GroupKind) -> bool:
        return kind in self.kinds

    @property
    def kinds_label(self) -> str:
        """The kinds it is stated for, as the catalogue and ``kvbound premises --list`` print them."""
        return "every kind" if self.kinds == frozenset(GroupKind) else ", ".join(sorted(k.value for k in self.kinds))


@dataclass(frozen=True)
class GroupTerms:
    """What a load premise's Z3 face reads of one group: Z3 terms (or ints), named as vLLM
    names them. A world passes its group's explicitly; a premise reads nothing else."""

    N: object  # num_locally_computed_tokens
    M: object  # num_external_tokens
    T: object  # N + M
    b: object  # tokens_per_block
    bpc: object  # blocks_per_chunk
    tpc: object  # tokens_per_chunk = b * bpc
    f: object  # cdiv(N, b), the first fresh block
    k: object  # cdiv(T, b), the end of the load region
    j: object  # the first fresh block after the nulls (premise fresh-after-nulls)
    table: object  # a SymTable
    sync_load: object
    num_keys: object  # offload keys at admission
    window: object = None  # sliding_window_size_in_chunks (None: full attention)
    span: object = None  # sliding_window / attention_chunk_size in tokens (None: not windowed)
    extra: object = 0  # extra_retained_tokens
    tail: object = False  # a partial tail: False (none), True, or a Z3 Bool (the request's, in a hybrid)
    boundary: object = 0  # partial_tail_boundary (read with a tail)
    tph: object = None  # tokens_per_hash (read with a tail)
    prompt: object = None  # num_prompt_tokens (read with a tail)


class PremiseCheck(NamedTuple):
    premise: Premise
    group_index: int
    holds: bool
    detail: str  # what was compared; why it fails


# --- the concrete faces -----------------------------------------------------------

def _numbers(case: Case, gi: int):
    g = case.groups[gi]
    b = g.config.tokens_per_block
    N, T = case.num_locally_computed_tokens, case.num_cached_tokens
    return g, b, N, T, cdiv(N, b), cdiv(T, b)


def _first_fresh_shape(case: Case, gi: int):
    """(j, problem): the first non-null block in [f, k), and the first block that
    breaks "[f, j) null, [j, k) fresh" (None when the shape holds)."""
    g, b, N, T, f, k = _numbers(case, gi)
    blocks = g.blocks[:k]
    fresh = (BlockState.UNHASHED, BlockState.HASHED) if case.sync_load else (BlockState.UNHASHED,)
    j = next((i for i in range(f, len(blocks)) if not blocks[i].is_null), min(k, len(blocks)))
    for i in range(j, len(blocks)):
        if blocks[i].state not in fresh:
            want = "non-null (a sync load's blocks are hashed at allocation)" if case.sync_load else "U (fresh, unhashed)"
            return j, f"blocks[{i}] is {blocks[i].token}, expected {want}: [f={f}, j={j}) null then [j, k={k}) fresh"
    return j, None


def _check_table_length(case, gi):
    g, b, N, T, f, k = _numbers(case, gi)
    if len(g.blocks) < k:
        return f"len(blocks)={len(g.blocks)} < k=cdiv(T={T}, b={b})={k}"
    return None


def _check_aligned(case, gi):
    g, b, N, *_ = _numbers(case, gi)
    return None if N % b == 0 else f"N={N} is not a multiple of tokens_per_block={b} (N % b = {N % b})"


def _check_fresh_after_nulls(case, gi):
    return _first_fresh_shape(case, gi)[1]


def _check_computed_hashed(case, gi):
    g, b, N, T, f, k = _numbers(case, gi)
    for i in range(min(f, len(g.blocks))):
        if not g.blocks[i].is_hashed:
            return f"blocks[{i}] is {g.blocks[i].token} below f={f}; a full-attention prefix hit is hashed blocks"
    return None


def _check_computed_cached(case, gi):
    g, b, N, T, f, k = _numbers(case, gi)
    for i in range(min(f, len(g.blocks))):
        if g.blocks[i].state is BlockState.UNHASHED:
            return f"blocks[{i}] is {g.blocks[i].token} below f={f}; a windowed group's computed blocks are prefix-cache hits (hashed) or skipped (null)"
    return None


def _skipped_blocks(case, gi) -> int:
    """Blocks before the window vLLM's manager pads with nulls at T."""
    g, b, N, T, f, k = _numbers(case, gi)
    cfg = g.config
    if cfg.kind is GroupKind.SLIDING_WINDOW:
        extra = cfg.extra_retained_tokens
        return max(0, T - cfg.sliding_window + 1 - extra) // b
    if cfg.kind is GroupKind.CHUNKED_LOCAL:
        return (T // cfg.attention_chunk_size) * cfg.attention_chunk_size // b
    return 0


def _check_skipped_null(case, gi):
    g = case.groups[gi]
    s = _skipped_blocks(case, gi)
    for i in range(min(s, len(g.blocks))):
        if not g.blocks[i].is_null:
            return f"blocks[{i}] is {g.blocks[i].token}, but the first {s} blocks lie before the window at T and are null"
    return None


def _check_mamba_one_block(case, gi):
    g, b, N, T, f, k = _numbers(case, gi)
    for i in range(f, min(k - 1, len(g.blocks))):
        if not g.blocks[i].is_null:
            return f"blocks[{i}] is {g.blocks[i].token} in [f={f}, k-1={k - 1}); align mode keeps one state block, at k-1"
    return None


def _tail(case) -> bool:
    return case.partial_tail_boundary is not None


def _check_keys_cover(case, gi):
    g, b, N, T, f, k = _numbers(case, gi)
    tpc = g.config.tokens_per_chunk(case.blocks_per_chunk)
    have, want = case.num_offload_keys(gi), cdiv(T, tpc) - _tail(case)
    if have < want:
        what = "the chunks below a partial tail's boundary chunk" if _tail(case) else "the lookup caps T at keys*tpc"
        return f"{have} offload keys < {want} = cdiv(T={T}, tokens_per_chunk={tpc}){' - 1' * _tail(case)}: {what}"
    return None


def _check_hit_a_chunk(case, gi):
    g = case.groups[gi]
    tpc = g.config.tokens_per_chunk(case.blocks_per_chunk)
    M = case.num_external_tokens
    if _tail(case):  # a partial tail ends on a hash boundary past the complete hit
        return None if M >= case.tokens_per_hash else f"M={M} < tokens_per_hash={case.tokens_per_hash}"
    return None if M >= tpc else f"M={M} < tokens_per_chunk={tpc}: the complete-chunk lookup returns 0 below a chunk"


def _check_partial_tail_lookup(case, gi):
    if not _tail(case):
        return None
    B, N, T, tph = case.partial_tail_boundary, case.num_locally_computed_tokens, case.num_cached_tokens, \
        case.tokens_per_hash
    if B != T:
        return f"partial_tail_boundary={B} != N + M = {T}: the lookup returns M = boundary - N"
    if B <= N or B % tph or B > case.num_prompt_tokens - 1:
        return f"partial_tail_boundary={B} is not a hash boundary in (N={N}, num_prompt_tokens - 1]"
    if not case.supports_partial_tail:
        return f"the config does not support partial tails: {case.partial_tail_refusal()}"
    return None


# --- the Z3 faces -----------------------------------------------------------------

def _term_table_length(g):
    return g.table.length >= g.k


def _term_aligned(g):
    return g.N % g.b == 0


def _term_fresh_after_nulls(g):
    """∃ j ∈ [f, k]: [f, j) null, [j, k) fresh; j is the group's own ``g.j``."""
    t = g.table
    return AND(g.f <= g.j, g.j <= g.k,
               t.forall(g.f, g.j, lambda i: t.state(i) == NUL),
               t.forall(g.j, g.k, lambda i: OR(t.state(i) == UNH, AND(g.sync_load, t.state(i) != NUL))))


def _term_computed_hashed(g):
    t = g.table
    return t.forall(0, g.f, lambda i: t.state(i) == HSH)


def _term_computed_cached(g):
    t = g.table
    return t.forall(0, g.f, lambda i: t.state(i) != UNH)


def _term_sliding_skipped_null(g):
    """The skipped blocks are null (the window in chunks is the config's: the plan derives it)."""
    t = g.table
    skipped = MAX(g.T - g.span + 1 - g.extra, 0)
    return AND(g.span >= 1, g.extra >= 0, t.forall(0, FLOORDIV(skipped, g.b), lambda i: t.state(i) == NUL))


def _term_chunked_skipped_null(g):
    t = g.table
    return AND(g.span >= 1, t.forall(0, FLOORDIV(FLOORDIV(g.T, g.span) * g.span, g.b), lambda i: t.state(i) == NUL))


def _term_mamba_one_block(g):
    t = g.table
    return AND(g.window == 1, t.forall(g.f, g.k - 1, lambda i: t.state(i) == NUL))


def _term_keys_cover(g):
    tail = g.tail
    whole = g.num_keys * g.tpc >= g.T
    return whole if tail is False else IF(tail, g.num_keys >= CDIV(g.T, g.tpc) - 1, whole)  # bpc = 1 with a tail


def _term_hit_a_chunk(g):
    tail = g.tail
    return g.M >= g.tpc if tail is False else IF(tail, g.M >= g.tph, g.M >= g.tpc)


def _term_partial_tail_lookup(g):
    """``_lookup`` with a partial tail (0.33 scheduler.py:1068-1152): a hash-aligned boundary past N,
    before the prompt's last token, returned as M = boundary - N; keys from all tokens."""
    tail = g.tail
    if tail is False:
        return True
    return IMPLIES(tail, AND(g.boundary == g.N + g.M, g.boundary > g.N, g.boundary % g.tph == 0,
                             g.boundary <= g.prompt - 1, g.num_keys == FLOORDIV(g.prompt, g.tpc)))


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
        _term_table_length, _check_table_length),
    Premise(
        "n-aligned",
        "N is a multiple of the group's tokens_per_block: the scheduler hands the connector the local hit rounded "
        "down to its block size, the LCM of every group's block size (proved by `alignment`).",
        "N mod b = 0", ALL_KINDS,
        (source(V33, "v1/core/sched/scheduler.py", 1134, "partial_tail = num_new_local_computed_tokens % self.block_size"),
         source(V33, "v1/core/kv_cache_utils.py", 816, "resolve_kv_cache_block_sizes: LCM of the groups' block sizes"),
         source(V29, "v1/core/sched/scheduler.py", 852, "the same rounding")),
        _term_aligned, _check_aligned),
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
        _term_fresh_after_nulls, _check_fresh_after_nulls),
    Premise(
        "computed-hashed",
        "A full-attention group's blocks below f are the prefix-cache hit: every one hashed.",
        "∀ i < f: state(i) = H", frozenset({GroupKind.FULL_ATTENTION}),
        (source(V33, STM, 739, "FullAttentionManager.find_longest_cache_hit: cached blocks only"),
         source(V33, STM, 268, "add_local_computed_blocks")),
        _term_computed_hashed, _check_computed_hashed),
    Premise(
        "computed-cached",
        "A sliding-window or chunked-local group's blocks below f are prefix-cache hits (hashed) or skipped "
        "(null): none is unhashed. (A Mamba group has no such premise: its running state block may be.)",
        "∀ i < f: state(i) ≠ U", frozenset({GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL}),
        (source(V33, STM, 268, "add_local_computed_blocks: nulls for skipped blocks, then the cache hits"),
         source(V29, STM, 236, "add_local_computed_blocks")),
        _term_computed_cached, _check_computed_cached),
    Premise(
        "window-skipped-null",
        "A sliding-window group's blocks before its window at T are null: SlidingWindowManager skips "
        "max(0, T - w + 1 - extra_retained_tokens) tokens.",
        "∀ i < ⌊max(0, T − w + 1 − extra)/b⌋: null",
        frozenset({GroupKind.SLIDING_WINDOW}),
        (source(V33, STM, 1148, "SlidingWindowManager.get_num_skipped_tokens"),
         source(V33, STM, 268, "add_local_computed_blocks: num_skipped_blocks nulls"),
         source(V29, STM, 1071, "SlidingWindowManager.get_num_skipped_tokens")),
        _term_sliding_skipped_null, _check_skipped_null),
    Premise(
        "chunk-skipped-null",
        "A chunked-local group's blocks before T's attention chunk are null.",
        "∀ i < ⌊⌊T/c⌋·c/b⌋: null", frozenset({GroupKind.CHUNKED_LOCAL}),
        (source(V33, STM, 1381, "ChunkedLocalAttentionManager.get_num_skipped_tokens"),
         source(V29, STM, 1310, "ChunkedLocalAttentionManager.get_num_skipped_tokens")),
        _term_chunked_skipped_null, _check_skipped_null),
    Premise(
        "mamba-one-state-block",
        "A Mamba group in align mode keeps one state block for the load: [f, k-1) null, block k-1 the fresh "
        "state (get_num_skipped_tokens(T) = T - 1 nulls everything before it).",
        "∀ i ∈ [f, k−1): null;  window = 1", frozenset({GroupKind.MAMBA}),
        (source(V33, STM, 1971, "MambaManager.get_num_skipped_tokens: num_computed_tokens - 1"),
         source(V33, STM, 1797, "MambaManager.allocate_new_blocks (align): nulls up to the state block"),
         source(V29, STM, 1810, "MambaManager.get_num_skipped_tokens"),
         source(V29, STM, 1661, "MambaManager.allocate_new_blocks")),
        _term_mamba_one_block, _check_mamba_one_block),
    Premise(
        "keys-cover-hit",
        "The lookup never returns a hit past the group's offload keys: T ≤ keys·tpc.",
        "num_offload_keys · tpc ≥ T", ALL_KINDS,
        (source(V33, SCHED, 915, "_lookup_complete_chunks: max_hit_size_tokens capped at len(offload_keys) * tpc"),
         source(V29, SCHED, 749, "the same cap")),
        _term_keys_cover, _check_keys_cover),
    Premise(
        "hit-a-chunk",
        "A complete-chunk lookup returns M = 0 or at least one chunk of every group: M ≥ tpc.",
        "M ≥ tpc", ALL_KINDS,
        (source(V33, SCHED, 994, "_lookup_complete_chunks: new_num_hit_tokens < tokens_per_chunk returns 0"),
         source(V29, SCHED, 808, "the same")),
        _term_hit_a_chunk, _check_hit_a_chunk),
)

PREMISES += (
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
        _term_partial_tail_lookup, _check_partial_tail_lookup),
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
        for p in chosen:
            if p.applies(g.config.kind):
                problem = p.check(case, gi)
                out.append(PremiseCheck(p, gi, problem is None, problem or ""))
    return out


def terms(g, kind, ids=None) -> list:
    """The Z3 faces of the premises (``ids``, default all) that apply to ``kind``."""
    chosen = PREMISES if ids is None else tuple(BY_ID[i] for i in ids)
    return [p.term(g) for p in chosen if p.applies(kind)]


def when_kind(kind_term, kind_codes, formula):
    """A premise for a slot whose kind is symbolic: it binds only when the slot has that kind."""
    return IF(OR(*[kind_term == c for c in kind_codes]), formula, True)


__all__ = ["PREMISES", "GroupTerms", "Premise", "PremiseCheck", "evaluate", "premise", "terms", "when_kind"]
