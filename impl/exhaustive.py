"""Every case of a small declared scope, enumerated as tensors.

A scope fixes small sets for each input and the enumeration takes their product:
every table of length <= ``len`` over {null, hashed, unhashed} for each of 1 ..
``groups`` groups of every kind, every N and every M > 0 on a grid of ``step``
tokens with T = N + M <= (``len`` + 1) * b (so tables also fall short of k), every
block size in ``b`` and blocks_per_chunk in ``bpc``, prompts of T + each of
``prompt`` tokens, with and without a sync load. Row i of the scope is decoded from
i in mixed radix, so any range of rows is built directly (no list of the rest).

Windows are fixed per kind so each kind's bound can be both met and broken within
the tables: a sliding window of b + 1 tokens, a local-attention chunk of b tokens;
tokens_per_hash is b (it only has to divide a chunk: the key count is P // tpc).
Block ids are 1, 2, ... in (group, slot) order over the non-null blocks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import torch

from kvbound.errors import ScopeError
from kvbound.spec import Case, GroupKind

from kvbound.spec import KIND_CODES, STATE_H, STATE_N, STATE_U

from .batch import PlanBatch, resolve_device
from .convert import cases_from_batch

_KIND_LETTERS = {"F": GroupKind.FULL_ATTENTION, "S": GroupKind.SLIDING_WINDOW, "C": GroupKind.CHUNKED_LOCAL,
                 "M": GroupKind.MAMBA}
DEFAULT_SCOPE = "groups=1,len=4,b=4,bpc=1|2,step=2,prompt=-1|0,sync=0|1,kinds=FSCM"


@dataclass(frozen=True)
class Scope:
    groups: int = 1
    len: int = 4
    b: tuple = (4,)
    bpc: tuple = (1, 2)
    step: int = 2
    prompt: tuple = (-1, 0)
    sync: tuple = (False, True)
    kinds: tuple = tuple(_KIND_LETTERS.values())
    _tables: list = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> "Scope":
        """``key=value`` pairs separated by commas; lists use ``|``; unnamed keys keep
        ``DEFAULT_SCOPE``'s value. E.g. ``groups=2,len=2,bpc=1``."""
        values = {}
        for part in [p for p in (DEFAULT_SCOPE + "," + text).split(",") if p.strip()]:
            if "=" not in part:
                raise ScopeError(f"{part!r} is not key=value (keys: {', '.join(_KEYS)})")
            key, val = (x.strip() for x in part.split("=", 1))
            if key not in _KEYS:
                raise ScopeError(f"unknown key {key!r}; a scope has {', '.join(_KEYS)}")
            try:
                values[key] = _KEYS[key](val)
            except (ValueError, KeyError):
                raise ScopeError(f"{key}={val!r}: {_HELP[key]}") from None
        scope = cls(**values)
        if scope.groups < 1 or scope.len < 0 or scope.step < 1 or min(scope.b) < 1 or min(scope.bpc) < 1:
            raise ScopeError("groups, step, b and bpc must be positive and len non-negative")
        return scope

    def describe(self) -> str:
        return (f"groups=1..{self.groups}, tables of length <= {self.len} over N/H/U, kinds "
                f"{'/'.join(k.value for k in self.kinds)}, b in {list(self.b)}, bpc in {list(self.bpc)}, "
                f"N and M on a {self.step}-token grid up to T = (len+1)*b, prompt T{list(self.prompt)}, "
                f"sync_load in {[bool(s) for s in self.sync]}")

    # --- the mixed radix -----------------------------------------------------
    def tables(self) -> list:
        if self._tables is None:
            out = [()]
            for n in range(1, self.len + 1):
                out += list(itertools.product((STATE_N, STATE_H, STATE_U), repeat=n))
            object.__setattr__(self, "_tables", out)
        return self._tables

    def token_pairs(self, b: int) -> list:
        top = (self.len + 1) * b
        return [(n, n + m) for n in range(0, top, self.step) for m in range(self.step, top - n + 1, self.step)]

    def _per_group(self) -> int:
        return len(self.kinds) * len(self.tables())

    def _segments(self) -> list:
        """(groups, b, rows) in enumeration order."""
        out = []
        for g in range(1, self.groups + 1):
            for b in self.b:
                rows = self._per_group() ** g * len(self.token_pairs(b)) * len(self.bpc) * len(self.prompt) * len(self.sync)
                out.append((g, b, rows))
        return out

    @property
    def size(self) -> int:
        return sum(rows for _, _, rows in self._segments())


_KEYS = {
    "groups": int, "len": int, "step": int,
    "b": lambda v: tuple(int(x) for x in v.split("|")),
    "bpc": lambda v: tuple(int(x) for x in v.split("|")),
    "prompt": lambda v: tuple(int(x) for x in v.split("|")),
    "sync": lambda v: tuple(bool(int(x)) for x in v.split("|")),
    "kinds": lambda v: tuple(_KIND_LETTERS[c] for c in v),
}
_HELP = {
    "groups": "an integer (the most groups a case has)", "len": "an integer (longest table)",
    "step": "an integer (the token grid of N and M)", "b": "block sizes, e.g. 4|8", "bpc": "e.g. 1|2",
    "prompt": "offsets of the prompt from T, e.g. -1|0", "sync": "0, 1 or 0|1",
    "kinds": "letters F (full), S (sliding), C (chunked local), M (mamba), e.g. FSCM",
}


@dataclass
class ScopeChunk:
    """Rows ``first`` .. ``first + n`` of a scope, as a batch."""

    batch: PlanBatch
    first: int

    def cases(self, rows=None, validate: bool = True) -> list[Case]:
        rows = list(range(self.batch.shape[0])) if rows is None else list(rows)
        out = cases_from_batch(self.batch, rows, validate)
        return [replace(c, name=f"exhaustive-{self.first + r}") for c, r in zip(out, rows)]

    def family_counts(self) -> dict:
        return {"exhaustive": self.batch.shape[0]}


def _digits(index: torch.Tensor, radices):
    """Mixed-radix digits of ``index``, fastest first."""
    out = []
    for r in radices:
        out.append(index % r)
        index = torch.div(index, r, rounding_mode="floor")
    return out


def scope_chunks(scope: Scope, chunk: int = 10_000, device=None):
    """The scope's rows in order, ``chunk`` at a time, as ``ScopeChunk``s."""
    dev = resolve_device(device)
    tables = scope.tables()
    L = max(8, scope.len + (-scope.len % 8))
    table_state = torch.zeros((len(tables), L), dtype=torch.uint8)
    for i, t in enumerate(tables):
        table_state[i, : len(t)] = torch.tensor(t, dtype=torch.uint8) if t else table_state[i, :0]
    table_len = torch.tensor([len(t) for t in tables])
    kind_codes = torch.tensor([KIND_CODES[k] for k in scope.kinds])
    done = 0
    for G, b, rows in scope._segments():
        pairs = torch.tensor(scope.token_pairs(b))
        radices = [len(scope.sync), len(scope.prompt), len(scope.bpc), len(pairs)] + [scope._per_group()] * G
        for start in range(0, rows, chunk):
            idx = torch.arange(start, min(rows, start + chunk))
            d = _digits(idx, radices)
            yield ScopeChunk(_build(scope, G, b, d, pairs, table_state, table_len, kind_codes, len(tables)).to(dev),
                             done + start)
        done += rows


def _build(scope, G, b, d, pairs, table_state, table_len, kind_codes, n_tables) -> PlanBatch:
    R = d[0].shape[0]
    sync = torch.tensor(scope.sync)[d[0]]
    prompt_off = torch.tensor(scope.prompt)[d[1]]
    bpc = torch.tensor(scope.bpc)[d[2]]
    N, T = pairs[d[3], 0], pairs[d[3], 1]
    group_choice = torch.stack(d[4:], 1)  # [R, G]
    kind = kind_codes[torch.div(group_choice, n_tables, rounding_mode="floor")]
    table = group_choice % n_tables
    state = table_state[table]  # [R, G, L]
    nonnull = (state != STATE_N).view(R, -1).to(torch.int64)
    block_id = ((torch.cumsum(nonnull, 1)) * nonnull).view(state.shape).to(torch.int32)
    window = torch.where(kind == KIND_CODES[GroupKind.SLIDING_WINDOW], b + 1,
                         torch.where(kind == KIND_CODES[GroupKind.CHUNKED_LOCAL], b, 0))
    return PlanBatch(
        state=state.contiguous(), block_id=block_id, table_length=table_len[table],
        num_groups=torch.full((R,), G), kind=kind.to(torch.uint8), tokens_per_block=torch.full((R, G), b),
        window_tokens=window, blocks_per_chunk=bpc, tokens_per_hash=torch.full((R,), b),
        num_prompt_tokens=(T + prompt_off).clamp(min=0), num_locally_computed_tokens=N,
        num_external_tokens=T - N, sync_load=sync,
    )
