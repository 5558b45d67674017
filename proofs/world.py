"""Symbolic worlds: every input an unbounded Z3 integer, every table symbolic.

A ``World`` is one group of one request (N, M, b, bpc, window, keys, sync_load
and a ``SymTable``) with the premises every call of ``update_state_after_alloc``
meets. Obligations add their own premises and encode the plan with ``plan``, which
returns the plan's terms and the constraints that pin them (it changes nothing in
the world: the obligation hands the constraints to its ``Problem``).
``to_case`` turns a model into a spec ``Case`` so the executable spec can replay it.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import replace

import z3

from kvbound.spec import NULL, Block, BlockState, Case, Group, GroupConfig, GroupKind, cdiv

from kvbound.spec import STATE_CODES, STATE_H, STATE_N

from .encoding import Code, GroupInputs, SymTable, encode_group, window_in_chunks
from .premises import GroupTerms, Premise, terms
from .terms import CDIV


_EXPAND: contextvars.ContextVar = contextvars.ContextVar("expand", default=None)


@contextmanager
def expanded(length: int):
    """Worlds built inside have tables of exactly ``length`` blocks, quantifiers expanded."""
    token = _EXPAND.set(length)
    try:
        yield
    finally:
        _EXPAND.reset(token)


class World:
    def __init__(self, kind: GroupKind = GroupKind.FULL_ATTENTION, name: str = "g"):
        self.kind = kind
        self.N, self.M = z3.Int("N"), z3.Int("M")
        self.b, self.bpc = z3.Int("tokens_per_block"), z3.Int("blocks_per_chunk")
        self.num_keys = z3.Int("num_offload_keys")
        self.sync_load = z3.Bool("sync_load")
        self.window = None if kind is GroupKind.FULL_ATTENTION else z3.Int("window_in_chunks")
        self.table = SymTable(name, expand=_EXPAND.get())
        self.T = self.N + self.M
        self.k = CDIV(self.T, self.b)
        self.f = CDIV(self.N, self.b)
        self.tpc = self.b * self.bpc
        self.j = z3.Int("j")  # the first fresh block (premise fresh-after-nulls)
        windowed = kind in (GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL)
        self.span = z3.Int("window_tokens") if windowed else None  # sliding_window / attention_chunk_size
        self.extra = z3.Int("extra_retained_tokens") if windowed else 0

    def group_terms(self) -> GroupTerms:
        """What the premises read of this group (no partial tail)."""
        return GroupTerms(self.N, self.M, self.T, self.b, self.bpc, self.tpc, self.f, self.k, self.j, self.table,
                          self.sync_load, self.num_keys, self.window, self.span, self.extra)

    def inputs(self) -> GroupInputs:
        return GroupInputs(self.N, self.M, self.b, self.bpc, self.window, self.num_keys, self.sync_load, self.table)

    def plan(self, code: Code, tag: str = ""):
        """The group's plan under ``code``; a windowed group's window in chunks is the config's, as
        ``code``'s release derives it from the window and its retained tokens (a constraint of the
        returned plan)."""
        out = encode_group(0, self.inputs(), code, tag)
        if self.span is None:
            return out
        return replace(out, constraints=out.constraints + [self.window == window_in_chunks(
            self.kind is GroupKind.SLIDING_WINDOW, self.span, self.extra, self.tpc, code.window_counts_retained)])

    def premise_terms(self, ids) -> list:
        """The Z3 faces of the premises ``ids`` that apply to this group's kind."""
        return terms(self.group_terms(), self.kind, ids)

    def base(self):
        """What every call meets: sizes positive, M > 0 (else vLLM returns early),
        the table long enough (premise table-covers-load; else table_length fires first)."""
        out = [self.b >= 1, self.bpc >= 1, self.N >= 0, self.M >= 1, self.num_keys >= 0,
               self.table.wellformed(), *self.premise_terms(("table-covers-load",))]
        if self.table.expand is not None:
            out.append(self.table.length == self.table.expand)
        if self.kind is GroupKind.MAMBA:
            out.append(self.window == 1)
        elif self.window is not None:  # a window of at least one token; only a sliding window retains extra
            out += [self.window >= 1, self.span >= 1,
                    self.extra >= 0 if self.kind is GroupKind.SLIDING_WINDOW else self.extra == 0]
        return out

    def aligned(self):
        return self.N % self.b == 0

    def small(self, max_len: int = 6, max_tokens: int = 64):
        """Witness shaping: small, readable numbers; keys enough for the load."""
        return [self.table.length <= max_len, self.table.length == self.k, self.T <= max_tokens, self.b <= 16, self.bpc <= 2,
                self.num_keys * self.tpc >= self.T, self.num_keys * self.tpc <= max_tokens,
                *([self.window <= 2] if self.window is not None else [])]

    def to_case(self, model: z3.ModelRef, name: str, sync_load=None) -> Case:
        v = lambda t: model.eval(t, model_completion=True).as_long()  # noqa: E731
        b, bpc, N, M = v(self.b), v(self.bpc), v(self.N), v(self.M)
        sync = z3.is_true(model.eval(self.sync_load, model_completion=True)) if sync_load is None else sync_load
        blocks = table_from_model(self.table, model, group_index=0)
        cfg = config_for(self.kind, b, bpc, None if self.window is None else v(self.window))
        if self.span is not None:  # the model's own window (plan() derives the window in chunks from it)
            field = "sliding_window" if self.kind is GroupKind.SLIDING_WINDOW else "attention_chunk_size"
            extra = v(self.extra) if self.kind is GroupKind.SLIDING_WINDOW else 0
            cfg = replace(cfg, **{field: v(self.span)}, extra_retained_tokens=extra)
        return Case(name=name, blocks_per_chunk=bpc, tokens_per_hash=b,
                    num_prompt_tokens=v(self.num_keys) * b * bpc, num_locally_computed_tokens=N,
                    num_external_tokens=M, groups=(Group(cfg, blocks),), sync_load=sync)


class TailWorld(World):
    """One group of a request whose lookup chose a partial tail, on a config that supports
    partial tails (0.33 ``SchedulerOffloadConfig.supports_partial_tail``: one block per chunk,
    one block size, a Mamba align group with tokens_per_block > tokens_per_hash). A
    full-attention group may be an EAGLE group, keyed ``margin`` tokens past the boundary."""

    def __init__(self, kind: GroupKind = GroupKind.FULL_ATTENTION, name: str = "g"):
        super().__init__(kind, name)
        self.boundary = z3.Int("partial_tail_boundary")
        self.margin = z3.Int("eagle_proof_margin")
        self.tph = z3.Int("tokens_per_hash")
        self.prompt = z3.Int("num_prompt_tokens")
        self.eagle = z3.Bool("is_eagle_group") if kind is GroupKind.FULL_ATTENTION else False

    def group_terms(self) -> GroupTerms:
        """What the premises read of this group: a partial tail, at ``boundary``."""
        return replace(super().group_terms(), tail=True, boundary=self.boundary, tph=self.tph, prompt=self.prompt,
                       tokens=self.prompt)

    def inputs(self) -> GroupInputs:
        return GroupInputs(self.N, self.M, self.b, self.bpc, self.window, self.num_keys, self.sync_load, self.table,
                           tail=True, boundary=self.boundary, margin=self.margin)

    def base(self):
        # eagle_proof_margin (0.33 kv_cache_utils): one hash unit (fine-grained lookup) or one block
        margin = z3.If(self.eagle, z3.Or(self.margin == self.tph, self.margin == self.b), self.margin == 0) \
            if self.eagle is not False else self.margin == 0
        return super().base() + [self.bpc == 1, self.tph >= 1, self.b > self.tph, self.b % self.tph == 0, margin]

    def small(self, max_len: int = 6, max_tokens: int = 64):
        return [self.table.length <= max_len, self.table.length == self.k, self.T <= max_tokens, self.b <= 16,
                self.prompt <= max_tokens]

    def to_case(self, model: z3.ModelRef, name: str, sync_load=None) -> Case:
        v = lambda t: model.eval(t, model_completion=True).as_long()  # noqa: E731
        b, N, M, tph = v(self.b), v(self.N), v(self.M), v(self.tph)
        blocks = table_from_model(self.table, model, group_index=0)
        eagle = self.eagle is not False and z3.is_true(model.eval(self.eagle, model_completion=True))
        cfg = replace(config_for(self.kind, b, 1, 1 if self.kind is GroupKind.MAMBA else None), is_eagle_group=eagle)
        groups = (Group(cfg, blocks),)
        if self.kind is not GroupKind.MAMBA:  # partial tails need a Mamba align group beside it
            k = cdiv(N + M, b)
            groups += (Group(config_for(GroupKind.MAMBA, b, 1, 1),
                             tuple([NULL] * (k - 1) + [Block(BlockState.UNHASHED, 90 + k)])),)
        return Case(name=name, blocks_per_chunk=1, tokens_per_hash=tph, num_prompt_tokens=v(self.prompt),
                    num_locally_computed_tokens=N, num_external_tokens=M, groups=groups,
                    sync_load=z3.is_true(model.eval(self.sync_load, model_completion=True)) if sync_load is None
                    else sync_load, partial_tail_boundary=v(self.boundary))


def config_for(kind: GroupKind, b: int, bpc: int, window_in_chunks) -> GroupConfig:
    """A config whose ``sliding_window_size_in_chunks`` is the model's window."""
    tpc = b * bpc
    if kind is GroupKind.SLIDING_WINDOW:
        return GroupConfig(kind, b, sliding_window=window_in_chunks * tpc)
    if kind is GroupKind.CHUNKED_LOCAL:
        return GroupConfig(kind, b, attention_chunk_size=window_in_chunks * tpc)
    return GroupConfig(kind, b)


def table_from_model(table: SymTable, model, group_index: int) -> tuple:
    """The model's table, ids renumbered (31, 32, ... for group 0, 41, ... for group 1)
    so every non-null block is distinct; the scan reads states, never ids."""
    n = model.eval(table.length, model_completion=True).as_long()
    out = []
    for i in range(n):
        st = model.eval(table.st[i], model_completion=True).as_long()
        if st == STATE_N:
            out.append(Block(BlockState.NULL))
        else:
            bid = 10 * (group_index + 3) + i + 1 if n <= 9 else 100 * (group_index + 1) + i + 1
            out.append(Block(BlockState.HASHED if st == STATE_H else BlockState.UNHASHED, bid))
    return tuple(out)


def z3_face_holds(p: Premise, case: Case, gi: int) -> bool:
    """``p``'s term as Z3 solves it on one group of a concrete case: is it satisfiable with
    every input fixed to the case's values (only ``j`` left free)? Agrees with ``p.check``
    (the same term folded on the case, j the one the table shows) exactly when that folding
    is exact."""
    from .options import PREMISE, is_sat

    g = case.groups[gi]
    with expanded(len(g.blocks)):
        w = World(g.config.kind)
    s = PREMISE.solver()
    s.add(w.N == case.num_locally_computed_tokens, w.M == case.num_external_tokens,
          w.b == g.config.tokens_per_block, w.bpc == case.blocks_per_chunk,
          w.num_keys == case.num_offload_keys(gi), w.sync_load == case.sync_load)
    s.add(w.table.length == len(g.blocks),
          *[w.table.state(i) == STATE_CODES[blk.state] for i, blk in enumerate(g.blocks)])
    if w.span is not None:
        s.add(w.span == (g.config.sliding_window or g.config.attention_chunk_size),
              w.extra == g.config.extra_retained_tokens)
    g = w.group_terms()
    s.add(z3.BoolVal(True) if p.term(g) is True else p.term(g))
    return is_sat(s)
