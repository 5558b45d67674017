"""The Z3 encoding of ``update_state_after_alloc``'s per-group plan.

A group's block table has a length and, per position, a state (null / hashed /
unhashed) and a block id. The load start is characterised, not unrolled: "the
first index in [lo, hi) whose block has the property, else hi" — a quantified
statement over a symbolic table (so every length at once), a few comparisons
over a concrete one. The request's numbers (N, M, b, bpc, ...) are unbounded
integers. The assert order per group is spec/plan.py's: table_length, scan,
boundary (legacy) / alignment (fixed*), window_bound, keys_length (pending > 0).

``Code`` says which code is encoded: a release's features (a row of the one release table,
``kvbound.spec.versions.RELEASES``) and the mutations planted in it (``Knobs``, mutations only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import z3

from kvbound.spec import STATE_CODES, STATE_H, STATE_N, STATE_U, AssertName, ReleaseFeatures, Variant
from kvbound.spec.asserts import ASSERT_CODE, NO_ASSERT
from kvbound.spec.versions import release_features

from .terms import AND, CDIV, FLOORDIV, IF, MAX, MIN, MOD, NOT, OR, Sx


# Outcome codes: spec/asserts.py's NO_ASSERT (the group plans), else ASSERT_CODE of the assert that fires first.


@dataclass(frozen=True)
class Knobs:
    """Mutations planted in a release's code (every default: no mutation), and python -O."""

    scan_from_zero: bool = False  # mutant: the fixed variants scan range(0, k), as legacy does
    f_floor: bool = False  # mutant: f = N // b instead of cdiv(N, b)
    null_skip: bool = True  # False: mutant, the scan stops at null blocks too
    unhashed_test: bool = True  # False: mutant, the scan drops its block_hash is None test
    no_scan: bool = False  # mutant: start = f (no loop at all)
    lo_offset: int = 0  # mutant: range(f + lo_offset, ...)
    hi_offset: int = 0  # mutant: range(..., k + hi_offset); -1 keeps the default k, +1 defaults to k + 1
    key_start_offset: int = 0  # mutant: keys from start // bpc + offset
    pending_offset: int = 0  # mutant: group size k - start + offset
    end_chunk_floor: bool = False  # mutant: end chunk T // tpc instead of cdiv
    sync_rule_dropped: bool = False  # mutant: a 0.33 sync load no longer matches hashed blocks by position
    asserts: bool = True  # False models python -O
    alignment_assert: bool = True  # False: mutant, the fixed variants' alignment assert is gone
    boundary_assert: bool = True  # False: mutant, the legacy boundary assert is gone
    window_before_scan_assert: bool = False  # mutant: the window bound is checked first
    window_slack_delta: int = 0  # mutant: pending <= window*bpc + the release's slack + delta
    key_start_ceil: bool = False  # mutant: keys from cdiv(start, bpc)
    retained_ignored: bool = False  # mutant: the window in chunks ignores extra_retained_tokens (0.31+ count them)
    keys_from_prompt: bool = False  # mutant: offload keys counted from the prompt, not all num_tokens
    tail_chunk_dropped: bool = True  # False: mutant, a partial tail's last chunk stays a chunk key
    tail_margin: bool = True  # False: mutant, a partial tail's key ignores the EAGLE proof margin
    tail_assert: bool = True  # False: mutant, the request-level assert partial_tail_boundary == num_cached_tokens
    copy_same_step_sources: bool = False  # mutant of the patched lookup (proofs/copy_contract.py): a partial hit's source
    # may again be a block cached in the current step


@dataclass(frozen=True)
class Code:
    """The code being encoded: one row of ``RELEASES`` (what that release does) and the mutations
    planted in it. Every release fact the encoding reads comes from ``release``."""

    release: ReleaseFeatures
    knobs: Knobs = Knobs()

    @property
    def variant(self) -> Variant:
        return self.release.variant

    @property
    def scan_from_zero(self) -> bool:
        """0.20 - 0.29 scan range(0, k) (or the mutant)."""
        return self.variant is Variant.LEGACY or self.knobs.scan_from_zero

    @property
    def legacy_assert(self) -> bool:
        """0.20 - 0.29 assert N <= start*b; 0.30+ N % b == 0."""
        return self.variant is Variant.LEGACY

    @property
    def match_hashed_on_sync(self) -> bool:
        """0.33+: a sync load matches by position."""
        return self.variant is Variant.FIXED_SYNC and not self.knobs.sync_rule_dropped

    @property
    def window_slack(self) -> int | None:
        """The window assert's slack (None: no window assert)."""
        slack = self.release.window_slack
        return None if slack is None else slack + self.knobs.window_slack_delta

    @property
    def window_counts_retained(self) -> bool:
        """0.31+: the window in chunks counts extra_retained_tokens."""
        return self.release.window_counts_retained and not self.knobs.retained_ignored

    @property
    def sync_loads(self) -> bool:
        """0.33+: the connector may load synchronously."""
        return self.release.sync_loads

    @property
    def eagle_margins(self) -> bool:
        """0.33+: partial tails with EAGLE groups, keyed boundary + margin."""
        return self.release.eagle_partial_tails

    @property
    def signature(self) -> tuple:
        """What the encoding reads of the release: two rows with one signature encode alike."""
        return (self.variant, self.window_slack, self.window_counts_retained, self.sync_loads, self.eagle_margins)

    def mutate(self, **change) -> "Code":
        return replace(self, knobs=replace(self.knobs, **change))


def code_for(version: str, asserts: bool = True, **mutations) -> Code:
    """The code of vLLM ``version`` (its row of RELEASES), with ``mutations`` planted."""
    return Code(release_features(version), Knobs(asserts=asserts, **mutations))


def window_in_chunks(kind_is_sliding, span, extra, tpc, counts_retained: bool):
    """``get_sliding_window_size_in_chunks`` as terms (spec: GroupConfig.sliding_window_size_in_chunks):
    a sliding window cdiv(w, tpc), from 0.31 max(that, cdiv(w - 1 + extra, tpc)); a chunk cdiv(c, tpc)."""
    plain = CDIV(span, tpc)
    sliding = MAX(plain, CDIV(span - 1 + extra, tpc)) if counts_retained else plain
    return IF(kind_is_sliding, sliding, plain)


class ConcreteTable:
    """A case's table: states and ids known, so scans and quantifiers fold to a few comparisons."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.length = len(blocks)
        self.states = [STATE_CODES[b.state] for b in blocks]
        self.ids = [b.block_id for b in blocks]
        self.broken = None  # the first position the last quantifier that failed failed at

    def state(self, i):
        return self.states[i]

    def token(self, i) -> str:
        """Block i as a case file writes it (``N``, ``H7``, ``U8``)."""
        return self.blocks[i].token

    def forall(self, lo, hi, body):
        """body(i) for every i in [lo, hi) inside the table (what a ``SymTable`` of this length,
        quantifiers expanded, states; lo, hi are ints here). On a break, ``broken`` is its first i."""
        rest = []
        for i in range(max(lo, 0), min(hi, self.length)):
            holds = body(i)
            if holds is False:
                self.broken = i
                return False
            if holds is not True:
                rest.append(holds)
        return AND(*rest)

    def new_int(self, name):
        return Sx(name)

    def ident(self, i):
        return self.ids[i]

    def first_match(self, s, lo, hi, pred):
        """s is the first i in [lo, hi) with pred(i), else hi (lo, hi are ints here).

        The quantifier "no i in [lo, s) has pred" folds, position by position, to
        "s <= i for every i with pred"; those bounds fold to the first such i.
        """
        first = next((i for i in range(max(lo, 0), min(hi, self.length)) if pred(i)), None)
        if first is None:
            return [s == hi]
        return [s <= first, OR(s == hi, s == first)]


class SymTable:
    """Every table at once: symbolic length, per-position state and id.

    ``expand=L`` fixes the length to L and writes each quantifier as L cases: the
    quantifier-free form the vacuity check solves for its one instance (exact,
    since every range a premise quantifies over lies inside [0, length)).
    """

    def __init__(self, name: str, expand: int | None = None):
        self.expand = expand
        self.length = z3.Int(f"{name}.len")
        self.st = z3.Array(f"{name}.state", z3.IntSort(), z3.IntSort())
        self.id = z3.Array(f"{name}.id", z3.IntSort(), z3.IntSort())
        self.name = name
        self._bound = 0  # bound-variable names are numbered per table, so runs repeat exactly

    def _var(self):
        self._bound += 1
        return z3.Int(f"{self.name}.i{self._bound}")

    def state(self, i):
        return self.st[i]

    def new_int(self, name):
        return z3.Int(name)

    def ident(self, i):
        return self.id[i]

    def wellformed(self):
        """States are N/H/U, only the null block has id 0 (its id)."""
        # Unused, but creating it fixes Z3's term numbering, and with it the models (the
        # witnesses docs/invariants.md pins); removing it changes witnesses, not verdicts.
        i = z3.Int(f"{self.name}.i")  # noqa: F841
        return z3.And(self.length >= 0, self.forall(0, self.length, lambda i: z3.And(
            self.st[i] >= STATE_N, self.st[i] <= STATE_U, (self.st[i] == STATE_N) == (self.id[i] == 0), self.id[i] >= 0,
        )))

    def forall(self, lo, hi, body):
        """body(i) for every i in [lo, hi)."""
        if self.expand is not None:
            return z3.And(*[z3.Implies(z3.And(lo <= i, i < hi), body(i)) for i in range(self.expand)])
        i = self._var()
        return z3.ForAll([i], z3.Implies(z3.And(lo <= i, i < hi), body(i)))

    def first_match(self, s, lo, hi, pred):
        return [
            z3.Or(s == hi, z3.And(lo <= s, s < hi, pred(s))),
            self.forall(lo, s, lambda i: z3.Not(pred(i))),
        ]


@dataclass
class GroupInputs:
    """One group's inputs; ints (a case) or Z3 terms (every case)."""

    N: object  # num_locally_computed_tokens
    M: object  # num_external_tokens
    b: object  # tokens_per_block
    bpc: object  # blocks_per_chunk
    window: object  # sliding_window_size_in_chunks, None for full attention
    num_keys: object  # offload keys at admission
    sync_load: object
    table: object  # ConcreteTable | SymTable
    windowed: object = True  # the window assert applies (a term when the group's kind is symbolic)
    tail: object = False  # a partial tail: partial_tail_boundary is not None
    boundary: object = 0  # partial_tail_boundary (read only with a tail)
    margin: object = 0  # the group's EAGLE proof margin (``_eagle_proof_margins``)
    first: bool = True  # the first offloaded group: the request-level partial_tail assert runs before it


@dataclass
class GroupOut:
    k: object
    f: object
    start: object  # load_start_gpu_block_idx (a Z3 Int, pinned by constraints)
    pending: object  # num_pending_gpu_blocks, the group size
    dst_len: object  # len(blocks[start:k])
    start_chunk: object
    end_chunk: object  # after vLLM's slice of offload_keys
    end_chunk_wanted: object  # end_chunk_idx: cdiv(T, tpc), minus 1 with a partial tail (what the keys assert compares)
    checks: tuple  # ((ASSERT_CODE, holds), ...) in vLLM's assert order
    constraints: list
    unknowns: tuple  # the Int unknowns the constraints pin (the scan's result)
    has_boundary_key: object = False  # a partial tail's boundary key follows the chunk keys (pending > 0)
    key_tokens: object = 0  # its token position: boundary + the group's EAGLE proof margin

    def passes(self):
        """No assert of this group fires."""
        return AND(*[ok for _, ok in self.checks])

    def fails_with(self, code: int):
        """The assert ``code`` is the first of this group to fire."""
        out = False
        for i, (c, ok) in enumerate(self.checks):
            if c == code:
                out = OR(out, AND(*[o for _, o in self.checks[:i]], NOT(ok)))
        return out

    @property
    def fail(self):
        """NO_ASSERT or the code of the first assert that fires, as one term."""
        out = NO_ASSERT
        for c, ok in reversed(self.checks):
            out = IF(NOT(ok), c, out)
        return out


def scan_pred(table, knobs: Knobs, match_hashed):
    """The property the scan looks for at position i."""

    def pred(i):
        st = table.state(i)
        nonnull = (st != STATE_N) if knobs.null_skip else True
        if not knobs.unhashed_test:
            return nonnull
        return AND(nonnull, OR(match_hashed, st == STATE_U)) if knobs.null_skip else OR(match_hashed, st != STATE_H)

    return pred


def encode_group(gi: int, g: GroupInputs, code: Code, tag: str = "") -> GroupOut:
    """What one group of ``update_state_after_alloc`` computes, as terms and constraints."""
    knobs = code.knobs
    T = g.N + g.M
    k = CDIV(T, g.b)
    f = FLOORDIV(g.N, g.b) if knobs.f_floor else CDIV(g.N, g.b)
    table = g.table
    start = table.new_int(f"start{tag}.{gi}")
    match_hashed = AND(g.sync_load, True) if code.match_hashed_on_sync else False
    pred = scan_pred(table, knobs, match_hashed)
    if knobs.no_scan:
        cs = [start == f]
    else:
        lo = 0 if code.scan_from_zero else f + knobs.lo_offset
        if knobs.hi_offset < 0:  # the short loop still defaults to k when nothing matched
            raw = table.new_int(f"start{tag}.{gi}.raw")
            cs = table.first_match(raw, lo, k + knobs.hi_offset, pred)
            cs.append(start == IF(raw == k + knobs.hi_offset, k, raw))
        else:
            cs = table.first_match(start, lo, k + knobs.hi_offset, pred)
    table_ok = table.length >= k
    if code.legacy_assert:
        assert_ok, assert_code = g.N <= start * g.b, ASSERT_CODE[AssertName.BOUNDARY]
    else:
        assert_ok, assert_code = MOD(g.N, g.b) == 0, ASSERT_CODE[AssertName.ALIGNMENT]
    dst_len = k - start
    pending = k - start + knobs.pending_offset
    slack = code.window_slack
    window_ok = True if g.window is None or slack is None else OR(NOT(g.windowed), pending <= g.window * g.bpc + slack)
    tpc = g.b * g.bpc
    num_chunks = FLOORDIV(T, tpc) if knobs.end_chunk_floor else CDIV(T, tpc)
    wanted = num_chunks - IF(g.tail, 1, 0) if knobs.tail_chunk_dropped else num_chunks  # end_chunk_idx
    start_chunk = (FLOORDIV(start + g.bpc - 1, g.bpc) if knobs.key_start_ceil else FLOORDIV(start, g.bpc)) \
        + knobs.key_start_offset
    keys_ok = OR(pending == 0, g.num_keys >= wanted)
    end_chunk = IF(pending == 0, start_chunk, MAX(start_chunk, MIN(wanted, g.num_keys)))
    has_boundary_key = AND(g.tail, pending > 0)
    key_tokens = g.boundary + g.margin if knobs.tail_margin else g.boundary
    checks = []
    if knobs.asserts and knobs.tail_assert and g.first:  # request level, before any group
        checks.append((ASSERT_CODE[AssertName.PARTIAL_TAIL], OR(NOT(g.tail), g.boundary == T)))
    checks.append((ASSERT_CODE[AssertName.TABLE_LENGTH], table_ok))
    if knobs.asserts:
        kept = knobs.boundary_assert if code.legacy_assert else knobs.alignment_assert
        scan_check = [(assert_code, assert_ok)] if kept else []
        window_check = [(ASSERT_CODE[AssertName.WINDOW_BOUND], window_ok)]
        checks += (window_check + scan_check if knobs.window_before_scan_assert else scan_check + window_check)
        checks += [(ASSERT_CODE[AssertName.KEYS_LENGTH], keys_ok)]
    unknowns = (start, raw) if knobs.hi_offset < 0 and not knobs.no_scan else (start,)
    return GroupOut(k, f, start, pending, dst_len, start_chunk, end_chunk, wanted, tuple(checks), cs, unknowns,
                    has_boundary_key, key_tokens)


def case_inputs(case, code: Code) -> list[GroupInputs]:
    """A spec Case as concrete group inputs (numbers folded in Python): its offloaded groups
    in order, each reading ``blocks.blocks[group_idx]``, as ``code``'s release has them
    (its knobs may mutate how keys and windows are derived from the case)."""
    from dataclasses import replace as _replace

    knobs = code.knobs
    counted = _replace(case, num_tokens=case.num_prompt_tokens) if knobs.keys_from_prompt else case
    tail = case.partial_tail_boundary is not None
    out = []
    for n, gi in enumerate(case.offloaded_group_indices):
        grp = case.groups[gi]
        out.append(GroupInputs(
            N=case.num_locally_computed_tokens,
            M=case.num_external_tokens,
            b=grp.config.tokens_per_block,
            bpc=case.blocks_per_chunk,
            window=grp.config.sliding_window_size_in_chunks(
                case.blocks_per_chunk, code.window_counts_retained),
            num_keys=counted.num_offload_keys(gi),
            sync_load=case.sync_load,
            table=ConcreteTable(grp.blocks),
            tail=tail,
            boundary=case.partial_tail_boundary if tail else 0,
            margin=case.eagle_proof_margin(gi) if tail and code.eagle_margins else 0,
            first=n == 0,
        ))
    return out
