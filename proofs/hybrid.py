"""A hybrid model in one formula: up to ``GROUPS`` KV-cache groups of symbolic kind.

``HybridWorld`` is one call of ``update_state_after_alloc`` on a model whose groups
each have their own kind (full attention, sliding window, chunked local, Mamba) and
``tokens_per_block``; N is the scheduler's rounding of the local hit to a common
multiple of every group's block size (the LCM rule of ``alignment``), M what the
lookup can return, and every group's table meets its kind's allocator premises
(``proofs.premises``, through each slot's ``premise_terms``). Tables have
``TABLE_LENGTH`` positions (quantifiers expanded), sizes are unbounded integers.

The plan of every group is ``encoding.encode_group``, so the scan, the asserts in
vLLM's order and the key slice are the ones every other obligation uses.
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd

import z3

from kvbound.spec import (KIND_CODES, KIND_FULL, KIND_MAMBA, KIND_OF_CODE, STATE_H, STATE_N, STATE_U, Block, BlockState,
                          Case, Group, GroupKind, cdiv)

from .encoding import Code, GroupInputs, SymTable, encode_group, window_in_chunks
from .premises import PREMISES, GroupTerms, when_kind
from .terms import AND, CDIV, IF, IMPLIES, NOT, OR
from .world import _EXPAND, config_for

GROUPS = 4
SHARED = ("keys-cover-hit",)  # premises of every group that bound the shared M and T
TABLE_LENGTH = 0  # 0: symbolic tables (every length), quantifiers left to Z3


class Slot:
    """One group of the hybrid world."""

    def __init__(self, world: "HybridWorld", s: int, length: int):
        self.index = s
        self.kind = z3.Int(f"kind[{s}]")
        self.N, self.M, self.T = world.N, world.M, world.T
        self.bpc, self.sync_load = world.bpc, world.sync_load
        self.b = z3.Int(f"tokens_per_block[{s}]")
        self.tpc = self.b * self.bpc
        self.f, self.k = CDIV(self.N, self.b), CDIV(self.T, self.b)
        self.j = z3.Int(f"j[{s}]")
        self.window = z3.Int(f"window_in_chunks[{s}]")
        self.span = z3.Int(f"window_tokens[{s}]")
        self.extra = z3.Int(f"extra_retained_tokens[{s}]")
        self.num_keys = z3.Int(f"num_offload_keys[{s}]")
        self.c = z3.Int(f"unit / tokens_per_block[{s}]")  # the LCM rule's multiplier
        self.table = SymTable(f"g{s}", expand=length if length and length > 0 else None)
        # a partial tail (the request's, shared by every group); the EAGLE margin is the group's
        self.tail, self.boundary, self.tph, self.prompt = world.tail, world.boundary, world.tph, world.prompt
        self.margin = z3.Int(f"eagle_proof_margin[{s}]")
        self.eagle = z3.Bool(f"is_eagle_group[{s}]")

    def is_kind(self, kind: GroupKind):
        return self.kind == KIND_CODES[kind]

    def group_terms(self) -> GroupTerms:
        """What the premises read of this group (the request's partial tail a Z3 Bool)."""
        return GroupTerms(self.N, self.M, self.T, self.b, self.bpc, self.tpc, self.f, self.k, self.j, self.table,
                          self.sync_load, self.num_keys, self.window, self.span, self.extra, self.tail,
                          self.boundary, self.tph, self.prompt, tokens=self.prompt)

    def inputs(self) -> GroupInputs:
        return GroupInputs(self.N, self.M, self.b, self.bpc, self.window, self.num_keys, self.sync_load,
                           self.table, windowed=z3.Not(self.is_kind(GroupKind.FULL_ATTENTION)),
                           tail=self.tail, boundary=self.boundary, margin=self.margin)


class HybridWorld:
    def __init__(self, groups: int = GROUPS, length: int | None = None):
        length = length or _EXPAND.get() or TABLE_LENGTH  # the runner expands tables to find witnesses
        self.length = length if length > 0 else None
        self.n = z3.Int("num_groups")
        self.N, self.M = z3.Int("N"), z3.Int("M")
        self.T = self.N + self.M
        self.bpc = z3.Int("blocks_per_chunk")
        self.sync_load = z3.Bool("sync_load")
        self.unit, self.q = z3.Int("scheduler_block_size"), z3.Int("N / scheduler_block_size")
        self.tail = z3.Bool("partial_tail")  # the lookup chose a partial tail (partial_tail_boundary set)
        self.boundary, self.tph = z3.Int("partial_tail_boundary"), z3.Int("tokens_per_hash")
        self.prompt = z3.Int("num_prompt_tokens")
        self.slots = [Slot(self, s, length) for s in range(groups)]

    def active(self, s: int):
        return s < self.n

    def plan(self, code: Code, tag: str = ""):
        """The plan of group 0, the group the claim is about (w.l.o.g.: the plan carries no state
        from one group to the next, so any group of the model can be numbered 0); a windowed group 0's
        window in chunks is the config's, as ``code``'s release derives it (a constraint of the returned
        plan)."""
        s0 = self.slots[0]
        out = encode_group(0, s0.inputs(), code, tag)
        sliding, chunked = s0.is_kind(GroupKind.SLIDING_WINDOW), s0.is_kind(GroupKind.CHUNKED_LOCAL)
        return replace(out, constraints=out.constraints + [
            z3.Implies(OR(sliding, chunked), AND(s0.span >= 1, s0.extra >= 0, s0.window == window_in_chunks(
                sliding, s0.span, s0.extra, s0.tpc, code.window_counts_retained))),
            z3.Implies(chunked, s0.extra == 0)])

    def base(self):
        """Sizes positive; the LCM rule: N = q·unit, unit a common multiple of every
        active group's tokens_per_block (resolve_kv_cache_block_sizes, proved by
        ``alignment``); a load (M ≥ 1)."""
        out = [self.n >= 1, self.n <= len(self.slots), self.bpc >= 1, self.N >= 0, self.M >= 1,
               self.unit >= 1, self.q >= 0, self.N == self.q * self.unit]
        for s in self.slots:
            out += [s.kind >= 0, s.kind < len(KIND_CODES), s.b >= 1, s.num_keys >= 0,
                    z3.Implies(self.active(s.index), AND(s.c >= 1, self.unit == s.c * s.b,
                                                         )),
                    s.table.wellformed(), *([] if self.length is None else [s.table.length == self.length])]
        return out + self.partial_tail_config()

    def partial_tail_config(self, eagle_margins: bool = True):
        """A partial tail only on a config that supports one (0.33 scheduler.py:276-293: one block per
        chunk, one block size, only full-attention and Mamba align groups, a Mamba group with
        tokens_per_block > tokens_per_hash); an EAGLE full-attention group keys it ``margin`` past the
        boundary (0.33 kv_cache_utils.eagle_proof_margin: one hash unit or one block)."""
        s0 = self.slots[0]
        supported = AND(self.bpc == 1, self.tph >= 1, s0.b > self.tph, s0.b % self.tph == 0,
                        *[z3.Implies(self.active(s.index), AND(s.b == s0.b, OR(s.kind == KIND_FULL, s.kind == KIND_MAMBA)))
                          for s in self.slots],
                        OR(*[AND(self.active(s.index), s.kind == KIND_MAMBA) for s in self.slots]))
        margin = IF(AND(self.tail, s0.eagle, s0.kind == KIND_FULL),
                    OR(s0.margin == self.tph, s0.margin == s0.b) if eagle_margins else s0.margin == 0,
                    s0.margin == 0)
        return [z3.Implies(self.tail, supported), margin]

    def premise_terms(self, ids) -> list:
        """Each premise on group 0, bound to the kinds it is stated for; the other groups'
        premises that reach group 0 (through M and T, shared by every group) on them."""
        out = []
        chosen = [p for p in PREMISES if p.id in ids]
        for s in self.slots:
            for p in chosen if s.index == 0 else [p for p in chosen if p.id in SHARED]:
                codes = sorted(KIND_CODES[k] for k in p.kinds)  # sorted: frozenset order varies per process
                out.append(z3.Implies(self.active(s.index), when_kind(s.kind, codes, p.term(s.group_terms()))))
            # kinds without a window: the config premise the window assert reads
            out.append(z3.Implies(s.is_kind(GroupKind.FULL_ATTENTION), AND(s.window == 0, s.extra == 0)))
        return out

    def pr_shape(self):
        """Witness shaping: the PR's drawing, a full-attention group beside a Mamba group 0 of
        [H][H][·][U][·]…[F] with small numbers."""
        s0, t = self.slots[0], self.slots[0].table
        out = [self.n == 2, self.slots[1].is_kind(GroupKind.FULL_ATTENTION), s0.is_kind(GroupKind.MAMBA),
               self.bpc == 1, s0.b == 16, self.slots[1].b == 16, s0.f >= 5, self.M == 16,
               t.state(0) == STATE_H, t.state(1) == STATE_H, t.state(2) == STATE_N, t.state(3) == STATE_U, t.state(4) == STATE_N]
        return out + [s0.num_keys * s0.tpc <= 128, self.slots[1].num_keys * self.slots[1].tpc <= 128]

    def retained_window_shape(self):
        """Witness shaping: a sliding-window group 0 with retained tokens beside a full-attention group,
        block size 16, one block per chunk, T a whole number of chunks (what the complete-chunk lookup
        returns), small numbers."""
        s0, s1 = self.slots[0], self.slots[1]
        return [self.n == 2, s0.is_kind(GroupKind.SLIDING_WINDOW), s1.is_kind(GroupKind.FULL_ATTENTION),
                self.bpc == 1, s0.b == 16, s1.b == 16, NOT(self.tail), self.T % 16 == 0, self.T <= 128,
                s0.span % 16 == 0, s0.span <= 64, s0.extra >= 1, s0.extra <= 18, s0.num_keys * s0.tpc > self.T,
                s0.table.length == s0.k,
                s0.num_keys * s0.tpc <= 128, s1.num_keys * s1.tpc <= 128, NOT(self.sync_load)]

    def to_case(self, model, name: str) -> Case:
        """Group 0 as the model has it; the other groups (which the claim does not read) as
        vLLM's allocator builds a full-attention or Mamba table of their block size."""
        v = lambda t: model.eval(t, model_completion=True).as_long()  # noqa: E731
        n, bpc, N, M = v(self.n), v(self.bpc), v(self.N), v(self.M)
        T = N + M
        sync = z3.is_true(model.eval(self.sync_load, model_completion=True))
        groups, tpcs, prompt = [], [], 0
        next_id = 1
        for s in self.slots[:n]:
            kind, b = KIND_OF_CODE[v(s.kind)], v(s.b)
            k = cdiv(T, b)
            blocks = []
            if s.index == 0:
                length = v(s.table.length) if s.table.expand is None else s.table.expand
                for i in range(length):
                    st = v(s.table.st[i])
                    if st == STATE_N:
                        blocks.append(Block(BlockState.NULL))
                    else:
                        blocks.append(Block(BlockState.HASHED if st == STATE_H else BlockState.UNHASHED, next_id))
                        next_id += 1
                span = v(s.span) if kind in (GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL) else None
            else:
                kind = GroupKind.MAMBA if kind is GroupKind.MAMBA else GroupKind.FULL_ATTENTION
                span = None
                if kind is GroupKind.MAMBA:
                    blocks = [Block(BlockState.NULL)] * (k - 1) + [Block(BlockState.UNHASHED, next_id)]
                    next_id += 1
                else:
                    f = cdiv(N, b)
                    blocks = [Block(BlockState.HASHED if i < f else BlockState.UNHASHED, next_id + i) for i in range(k)]
                    next_id += k
            extra = v(s.extra) if kind is GroupKind.SLIDING_WINDOW and s.index == 0 else 0
            cfg = config_for(kind, b, bpc, 1 if kind is GroupKind.MAMBA else None) if span is None \
                else _windowed_config(kind, b, span, extra)
            groups.append(Group(cfg, tuple(blocks)))
            tpcs.append(b * bpc)
            prompt = max(prompt, v(s.num_keys) * b * bpc)
        tph = 0
        for t in tpcs:
            tph = gcd(tph, t)
        return Case(name=name, blocks_per_chunk=bpc, tokens_per_hash=tph, num_prompt_tokens=prompt,
                    num_locally_computed_tokens=N, num_external_tokens=M, groups=tuple(groups), sync_load=sync)


def _windowed_config(kind, b, span, extra=0):
    from kvbound.spec import GroupConfig

    if kind is GroupKind.SLIDING_WINDOW:
        return GroupConfig(kind, b, sliding_window=span, extra_retained_tokens=extra)
    return GroupConfig(kind, b, attention_chunk_size=span)


def safe_parts(w: HybridWorld, o) -> list:
    """For group 0 (any group of the model): no assert fires, the load is exactly the fresh
    blocks [j, k) (so no null block and no computed block is written), the group size counts
    them, and the keys are chunks inside the lookup's range [N // tpc, cdiv(T, tpc))."""
    s = w.slots[0]
    t = s.table
    # the lookup's range: chunks [N // tpc, cdiv(T, tpc)); a partial tail's last chunk is its
    # boundary key, at the position the lookup confirmed (boundary + the group's EAGLE margin)
    keys_ok = OR(o.pending == 0, AND(
        o.start_chunk >= s.N / s.tpc, o.end_chunk <= CDIV(s.T, s.tpc) - IF(s.tail, 1, 0),
        IF(s.tail, o.start_chunk <= o.end_chunk, o.start_chunk < o.end_chunk),
        o.has_boundary_key == s.tail, IMPLIES(s.tail, o.key_tokens == s.boundary + s.margin)))
    return [*[ok for _, ok in o.checks], o.start == s.j, o.pending == o.dst_len,
            t.forall(o.start, o.k, lambda i: t.state(i) != STATE_N), keys_ok]


__all__ = ["GROUPS", "TABLE_LENGTH", "HybridWorld", "safe_parts"]
