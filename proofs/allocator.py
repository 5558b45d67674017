"""The allocator model: what ``allocate_slots`` reserves and what it takes, per manager kind.

``KVCacheManager.allocate_slots`` (0.33.0 ``v1/core/kv_cache_manager.py:570-609``) asks every
single-type manager ``get_num_blocks_to_allocate``, compares the sum with the free blocks, and
only then allocates: ``add_local_computed_blocks`` (touches the local hit: an evictable hit
block leaves the free queue), ``allocate_external_computed_blocks`` (blocks for the
connector's tokens) and ``allocate_new_blocks`` (blocks for the tokens scheduled now, CoW
and checkpoint blocks included). If a manager takes more than it reserved, a pool holding
exactly the reserved blocks raises ``ValueError: Cannot get N free blocks from the pool``
(``block_pool.py:718-719``) mid-step. The property (``reservation``): ``taken ≤ reserved``.

One model serves three uses: the Z3 obligations (every input an unbounded integer), the
concrete evaluation of a witness (``AllocCalls``: the ``terms`` helpers fold on ints), and
``scripts/repro_0_33_sync_mamba.py --witness``, which replays a witness on the release's
real ``KVCacheManager`` and compares its numbers with ``predict``'s.

Which allocator code a release runs, and what it does, are the ``allocator`` and ``allocator_*``
columns of ``kvbound.spec.versions.RELEASES`` (nothing here names a release's behaviour).
Source lines are cited per function below ("STM" is ``v1/core/single_type_kv_cache_manager.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from kvbound.spec import GroupKind, cdiv, get_num_skipped_tokens
from kvbound.spec.versions import first_release, release_features

from .terms import AND, CDIV, FLOORDIV, IF, MAX, MIN, NOT, OR


@dataclass(frozen=True)
class AllocatorCode:
    """What MambaManager's align-mode code does: the ``allocator_*`` columns of a row of ``RELEASES``
    (each with its source there), under the first release of that code (the ``allocator`` column).
    The FullAttention / SlidingWindow / ChunkedLocal code paths the model reads (the base class's
    ``get_num_blocks_to_allocate``, ``add_local_computed_blocks``, ``allocate_external_computed_blocks``,
    ``allocate_new_blocks``, ``get_num_skipped_tokens``) are the same in 0.28.0 - 0.33.0 (compared
    function by function, docstrings and comments aside)."""

    release: str  # the first release of this code, "0.28.0" ... "0.32.0"
    relocation: str  # how a running request's speculative blocks are relocated (ReleaseFeatures.allocator_relocation)
    checkpoints: bool  # a prefill checkpoint block (_needs_internal_checkpoint)
    checkpoint_keeps_count: bool  # a running request's checkpoint step keeps the uncapped count
    spec_blocks_with_checkpoint: bool  # a running request's checkpoint step also adds num_speculative_blocks
    early_return_needs_no_checkpoint: bool  # allocate_new_blocks returns [] only without a checkpoint block
    new_blocks_clamped: bool  # num_new_blocks = max(num_required_blocks - len(req_blocks), 0)
    cap_is_min: bool  # min(num_new_blocks, physical_block_cap); else num_new_blocks = cap


def allocator_code(version: str) -> AllocatorCode:
    """The allocator code ``version`` runs, from the release table."""
    feats = release_features(version)
    if feats.allocator is None:
        raise ValueError(f"vLLM {version}: the reservation model covers the allocators of "
                         f"{first_release(lambda f: f.allocator)} and later")
    return AllocatorCode(feats.allocator, **{f.name: getattr(feats, "allocator_" + f.name)
                                             for f in fields(AllocatorCode) if f.name != "release"})


# --- one call, as the allocator computes it ----------------------------------------------

@dataclass
class Calls:
    """The inputs of two consecutive ``allocate_slots`` calls of one request on one manager:
    its first (a local hit of L tokens, E connector tokens, NEW tokens scheduled, LA lookahead
    tokens) and the running call after it (C computed tokens, NEW2 scheduled, LA2 lookahead).
    Ints (a witness) or Z3 terms (every call)."""

    b: object  # the manager's block_size
    L: object  # num_local_computed_tokens (the prefix-cache hit; a partial hit ends inside a block)
    E: object  # num_external_computed_tokens
    NEW: object  # num_new_tokens of the first call
    LA: object  # num_lookahead_tokens of the first call
    ev: object  # evictable hit blocks (ref_cnt 0): Mamba 0/1 (its one state block), else those past the skip
    S: object = 0  # MambaSpec.num_speculative_blocks
    c1: object = False  # the first call reserves a prefill checkpoint block (Mamba, 0.29+)
    C: object = 0  # request.num_computed_tokens at the running call
    NEW2: object = 0
    LA2: object = 0
    c2: object = False
    w: object = 0  # sliding_window
    extra: object = 0  # SlidingWindowSpec.extra_retained_tokens
    chunk: object = 0  # attention_chunk_size


@dataclass
class CallOut:
    reserved: object  # get_num_blocks_to_allocate
    taken: object  # blocks that leave the free queue: touched hit blocks + get_new_blocks
    ok: object  # the manager's own asserts hold
    n: object = 0  # len(req_blocks) after the call
    allocated: object = True  # Mamba: request in _allocated_block_reqs


def _skipped_tokens(kind, x, tokens):
    """``get_num_skipped_tokens(tokens)`` of the manager (the spec's one definition, as terms)."""
    return get_num_skipped_tokens(kind, tokens, sliding_window=x.w, extra_retained_tokens=x.extra,
                                  attention_chunk_size=x.chunk, maximum=MAX, floordiv=FLOORDIV)


def skipped_blocks(kind, x, tokens):
    """``num_skipped_tokens // block_size``, Python's floor (Mamba at 0 tokens: -1 // b = -1,
    which slices and pads nothing; clamped at 0 here, where it means the same)."""
    return MAX(FLOORDIV(MAX(_skipped_tokens(kind, x, tokens), 0), x.b), 0)


def _hit_blocks(x):
    """len(new_computed_blocks): cdiv(L, b) — a partial hit's last block included (the hit is
    nulls then cached blocks, STM 268; Mamba's hit is nulls then its one state block, STM 1470)."""
    return CDIV(x.L, x.b)


def _partial(x, blocks):
    """``_has_partial_local_hit`` (STM 164-174): blocks non-empty and L % b != 0."""
    return AND(blocks > 0, x.L % x.b != 0)


def first_call_base(kind, x: Calls) -> CallOut:
    """FullAttention / SlidingWindow / ChunkedLocal, a request's first call (0.33.0 numbers):
    reserve STM 176-266 (no blocks yet: not in num_cached_block), then add_local_computed_blocks
    STM 268-325, allocate_external_computed_blocks STM 327-368, allocate_new_blocks STM 370-411;
    kv_cache_manager.py:550-609 passes num_tokens = T + NEW + LA, total_computed_tokens = T."""
    T = x.L + x.E
    need = CDIV(T + x.NEW + x.LA, x.b)
    h = _hit_blocks(x)
    s = skipped_blocks(kind, x, T)
    held = MAX(s, h)  # nulls for the skipped blocks, then hit[s:]
    reserved = MAX(need - held, 0) + IF(_partial(x, h), 1, 0) + x.ev
    # allocation
    touched = x.ev  # the evictable blocks of hit[s:] leave the free queue (block_pool.touch)
    cow = IF(_partial(x, h - MIN(s, h)), 1, 0)  # the partial hit of the trimmed hit: a CoW block
    sk = _skipped_tokens(kind, x, T)
    ext_tokens = IF(sk > 0, MIN(T - sk, x.E), x.E)
    ext = IF(AND(x.E > 0, ext_tokens > 0), MAX(CDIV(T, x.b) - held, 0), 0)
    held2 = held + ext
    new = MAX(need - held2, 0)
    return CallOut(reserved, touched + ext + cow + new, True, held2 + new)


def running_call_base(kind, x: Calls, first: CallOut) -> CallOut:
    """A running request (in num_cached_block): reserve max(cdiv(num_tokens, b) - len, 0)
    (STM 226-233), allocate_new_blocks takes the same (STM 397-411); remove_skipped_blocks only
    swaps blocks for nulls (kv_cache_manager.py:564-568)."""
    need = CDIV(x.C + x.NEW2 + x.LA2, x.b)
    new = MAX(need - first.n, 0)
    return CallOut(new, new, True, first.n + new)


def _mamba_reserve(code: AllocatorCode, need, held_hit, partial, c, S, allocated):
    """MambaManager.get_num_blocks_to_allocate, align mode (0.33.0 STM 1692-1795; 0.29.0 STM
    1582-1659; 0.28.0 STM 1467-1490): num_new = need + S - hit - len (+1 for a partial hit),
    then the cap."""
    c = c if code.checkpoints else False
    nn = need + S - held_hit
    nn = IF(partial, MAX(nn, 0) + 1, nn)
    cap = 1 + IF(partial, 1, 0) + IF(c, 1, 0)
    spec = OR(NOT(allocated), AND(c, code.spec_blocks_with_checkpoint))
    cap = cap + IF(spec, S, 0)
    if code.cap_is_min:
        capped = MIN(nn, cap)
    elif code.checkpoint_keeps_count:
        capped = IF(AND(c, allocated), nn, cap)
    else:
        capped = cap
    return IF(nn > 0, capped, nn)


def _mamba_allocate(code: AllocatorCode, need, S, held, partial, c, allocated):
    """MambaManager.allocate_new_blocks, align mode (0.33.0 STM 1797-1923): (taken, ok, len)."""
    c = c if code.checkpoints else False
    req = need + S
    early = AND(req <= held, NOT(partial), NOT(c) if code.early_return_needs_no_checkpoint else True)
    skipped = req - S - 1
    null_end = skipped - IF(c, 1, 0)
    held1 = IF(held < skipped, MAX(held, null_end), held)
    if code.relocation == "skipped":
        thr, relocating = skipped, allocated
    elif code.relocation == "no-checkpoint":
        thr, relocating = skipped, AND(allocated, NOT(c))
    else:
        thr, relocating = null_end, allocated
    moved = IF(relocating, MAX(MIN(thr - (held - S), S), 0), 0)  # _relocate_speculative_block appends
    held2 = held1 + moved
    new = req - held2
    if code.new_blocks_clamped:
        new = MAX(new, 0)
    new = IF(partial, MAX(new, 0) + 1, new)
    max_new = 1 + IF(partial, 1, 0) + IF(c, 1, 0) + IF(
        OR(NOT(allocated), AND(c, code.spec_blocks_with_checkpoint)), S, 0)
    taken = MAX(new, 0)
    grown = held2 + taken - IF(partial, 1, 0)  # a CoW block replaces the partial hit in place
    return IF(early, 0, taken), OR(early, new <= max_new), IF(early, held, grown)


def first_call_mamba(code: AllocatorCode, x: Calls) -> CallOut:
    """Mamba align, a request's first call: reserve as ``_mamba_reserve`` (num_tokens =
    num_tokens_main_model = T + NEW: align mode ignores lookahead, STM 1719-1724), then
    add_local_computed_blocks (skips T - 1 tokens: the state block of the hit is touched only
    when it is not skipped), allocate_external_computed_blocks (one block for the loaded state
    unless the hit reaches T's block), allocate_new_blocks."""
    T = x.L + x.E
    need = CDIV(T + x.NEW, x.b)
    h = _hit_blocks(x)
    reserved = _mamba_reserve(code, need, h, _partial(x, h), x.c1, x.S, False) + x.ev
    s = skipped_blocks(GroupKind.MAMBA, x, T)
    touched = IF(AND(h >= 1, h - 1 >= s), x.ev, 0)
    held = MAX(s, h)
    partial_rec = _partial(x, h - MIN(s, h))
    ext_tokens = IF(T - 1 > 0, MIN(1, x.E), x.E)
    ext = IF(AND(x.E > 0, ext_tokens > 0), MAX(CDIV(T, x.b) - held, 0), 0)
    taken, ok, n = _mamba_allocate(code, need, x.S, held + ext, partial_rec, x.c1, False)
    return CallOut(reserved, touched + ext + taken, ok, n, True)


def running_call_mamba(code: AllocatorCode, x: Calls, first: CallOut) -> CallOut:
    """Mamba align, the running call after the first: no hit, no pending partial hit
    (allocate_new_blocks pops it), allocated (both of its branches add the request)."""
    need = CDIV(x.C + x.NEW2, x.b)
    reserved = _mamba_reserve(code, need, first.n, False, x.c2, x.S, True)
    taken, ok, n = _mamba_allocate(code, need, x.S, first.n, False, x.c2, True)
    return CallOut(reserved, taken, ok, n, True)


def calls(kind, code: AllocatorCode, x: Calls) -> tuple[CallOut, CallOut]:
    if kind is GroupKind.MAMBA:
        first = first_call_mamba(code, x)
        return first, running_call_mamba(code, x, first)
    first = first_call_base(kind, x)
    return first, running_call_base(kind, x, first)


def holds(out: CallOut):
    return AND(out.ok, out.taken <= out.reserved)


# --- a concrete pair of calls: a witness, or what a replay on real vLLM made -------------------

@dataclass(frozen=True)
class AllocCalls:
    """A witness of the reservation obligations: the manager, the release and the two calls'
    inputs (ints). ``scripts/repro_0_33_sync_mamba.py --witness FILE`` replays it on the real
    ``KVCacheManager`` of ``release`` (a full-attention group beside a Mamba one)."""

    name: str
    kind: GroupKind
    release: str  # the release whose allocator (and scheduler) the obligation is about
    b: int
    L: int
    E: int
    NEW: int
    LA: int = 0
    ev: int = 0
    S: int = 0
    c1: bool = False
    C: int = 0
    NEW2: int = 0
    LA2: int = 0
    c2: bool = False
    w: int = 0
    extra: int = 0
    chunk: int = 0

    @property
    def inputs(self) -> Calls:
        return Calls(**{f.name: getattr(self, f.name) for f in fields(Calls)})

    @property
    def sync(self) -> bool:
        return self.E > 0 and self.NEW > 0

    def predict(self) -> dict:
        """The model's numbers for both calls (ints: the terms fold)."""
        first, running = calls(self.kind, allocator_code(self.release), self.inputs)
        return {"first": {"reserved": first.reserved, "taken": first.taken, "ok": first.ok, "blocks": first.n},
                "running": {"reserved": running.reserved, "taken": running.taken, "ok": running.ok,
                            "blocks": running.n}}

    def replay_spec(self) -> dict:
        """The call spec ``scripts/repro_0_33_sync_mamba.py --calls`` replays: the local hit is made
        by a first request, freed when the witness has an evictable hit block."""
        return {"kind": self.kind.value, "b": self.b, "L": self.L, "E": self.E, "NEW": self.NEW, "LA": self.LA,
                "S": self.S, "NEW2": self.NEW2, "LA2": self.LA2, "w": self.w, "extra": self.extra,
                "chunk": self.chunk, "owner_freed": self.ev > 0}

    @classmethod
    def from_replay(cls, real: dict, group: int, release: str) -> "AllocCalls":
        """The calls a real replay made on one of its groups (``--calls`` output: the hit vLLM found,
        its evictable blocks and checkpoints), for ``predict`` to be compared with what vLLM did."""
        c = real["spec"]
        kind = GroupKind(real["kinds"][group])
        T = real["L"] + c["E"]
        return cls(name=f"replay-{kind.value}", kind=kind, release=release, b=c["b"], L=real["L"], E=c["E"],
                   NEW=c["NEW"], LA=c.get("LA", 0), ev=real["ev"][group],
                   S=c.get("S", 0) if kind is GroupKind.MAMBA else 0,
                   c1=bool(real.get("c1")) and kind is GroupKind.MAMBA, C=T + c["NEW"], NEW2=c.get("NEW2", 1),
                   LA2=c.get("LA2", 0), c2=bool(real.get("c2")) and kind is GroupKind.MAMBA,
                   w=c.get("w", 0) if kind is GroupKind.SLIDING_WINDOW else 0,
                   extra=c.get("extra", 0) if kind is GroupKind.SLIDING_WINDOW else 0,
                   chunk=c.get("chunk", 0) if kind is GroupKind.CHUNKED_LOCAL else 0)

    replayed_on = "the model"  # what replays it (predict, the allocator model)

    @property
    def replay_hint(self) -> str:
        return f"`scripts/repro_0_33_sync_mamba.py --calls` replays it on the real KVCacheManager of {self.release}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = self.kind.value
        return {"witness": "allocate_slots", **d}

    @classmethod
    def from_dict(cls, d: dict) -> "AllocCalls":
        d = {k: v for k, v in d.items() if k != "witness"}
        return cls(**{**d, "kind": GroupKind(d["kind"])})

    def draw(self) -> str:
        """The two calls as vLLM's allocate_slots sees them, and the model's numbers."""
        p = self.predict()
        T = self.L + self.E
        how = "sync load (new tokens in the same call)" if self.sync else (
            "async load (adopt only)" if self.E else "no connector tokens")
        lines = [
            f"case {self.name}: {self.kind.value} block_size={self.b}  vLLM {self.release} allocator",
            f"  first call   L={self.L} local  E={self.E} external  NEW={self.NEW} new  LA={self.LA} lookahead"
            f"  ({how}; T=L+E={T}, cdiv(T, b)={cdiv(T, self.b)}, cdiv(T+NEW, b)={cdiv(T + self.NEW, self.b)})"
            + (f"  num_speculative_blocks={self.S} checkpoint={self.c1}" if self.kind is GroupKind.MAMBA else "")
            + (f"  evictable hit blocks={self.ev}" if self.ev else ""),
            f"    reserved {p['first']['reserved']}  taken {p['first']['taken']}"
            + ("" if p["first"]["ok"] else "  (allocator assert fires)"),
            f"  running call C={self.C} computed  NEW2={self.NEW2}  LA2={self.LA2}"
            + (f"  checkpoint={self.c2}" if self.kind is GroupKind.MAMBA else ""),
            f"    reserved {p['running']['reserved']}  taken {p['running']['taken']}"
            + ("" if p["running"]["ok"] else "  (allocator assert fires)"),
        ]
        if self.kind is GroupKind.SLIDING_WINDOW:
            lines.insert(1, f"  sliding_window={self.w} extra_retained_tokens={self.extra}")
        if self.kind is GroupKind.CHUNKED_LOCAL:
            lines.insert(1, f"  attention_chunk_size={self.chunk}")
        return "\n".join(lines)


__all__ = ["AllocCalls", "AllocatorCode", "CallOut", "Calls", "allocator_code", "calls", "holds", "skipped_blocks"]
