"""The padded tensor form of many ``Case``s: R requests x G groups x L block slots.

Padding is chosen so it can never change an answer: padded slots are null blocks
past the table's end, padded groups sit after ``num_groups`` and are masked out.
The converters (``convert.py``) go both ways so every batch can be checked against
the spec and saved as case files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from kvbound.errors import BatchError
from kvbound.spec import KIND_CHUNKED, KIND_MAMBA, KIND_SLIDING, STATE_N, STATE_U, GroupKind
from kvbound.spec import cdiv as spec_cdiv  # ints; the tensor cdiv is below

_KINDS = tuple(GroupKind)

# --- arithmetic on tensors ---------------------------------------------------------

def floordiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Floor division of non-negative ``a`` by positive ``b`` (int64 exact; int32 through float32)."""
    if a.dtype == torch.int64:
        return torch.div(a, b, rounding_mode="floor")
    return torch.div(a.to(torch.float32), b.to(torch.float32)).floor_().to(a.dtype)


def cdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cdiv of non-negative ``a`` by positive ``b``, as vLLM's ``cdiv``: the one ceiling division of tensors
    (``kvbound.spec.cdiv`` is the one of ints)."""
    if a.dtype == torch.int64:
        return torch.div(a + b - 1, b, rounding_mode="floor")
    return torch.div(a.to(torch.float32), b.to(torch.float32)).ceil_().to(a.dtype)


# --- block states packed into bit words ------------------------------------------

SLOT_WORD = 56  # slots per packed word: 7 octets, so a sentinel bit 56 still converts to float64 exactly
_BYTES_TO_BITS = 0x0102040810204080  # x * this >> 56: the low bits of 8 bytes (0/1 each) as 8 bits
PLANE_UNHASHED, PLANE_NONNULL = 0, 1  # the two bit planes of ``PlanBatch.slot_words``


def pack_slots(bits: torch.Tensor) -> torch.Tensor:
    """[C, L] uint8 0/1 -> [W, C] int64 words, W = ceil(L/56), bit i of word w = slot 56w + i.

    Each 8 slots are read as one int64 (one byte each) and multiplied by a magic
    constant that gathers their low bits into its top byte; those bytes, 7 to a
    little-endian word, are the word's bits. Words lead so the minimum over them is
    plane-wise; tables up to 56 blocks take one word (and one pass over the slots).
    """
    C, L = bits.shape
    if L % 8:
        bits = torch.cat([bits, bits.new_zeros((C, -L % 8))], dim=-1)
    n_oct = bits.shape[1] // 8
    per_word = SLOT_WORD // 8
    W = spec_cdiv(n_oct, per_word)
    if C == 0 or n_oct == 0:
        return torch.zeros((max(W, 1), C), dtype=torch.int64, device=bits.device)
    top = (bits.contiguous().view(torch.int64) * _BYTES_TO_BITS).view(torch.uint8).view(C, n_oct, 8)[:, :, 7]
    out = torch.zeros((C, W, 8), dtype=torch.uint8, device=bits.device)  # byte 7 stays 0: the sentinel's
    if n_oct % per_word:
        top = torch.cat([top, top.new_zeros((C, W * per_word - n_oct))], 1)
    out[:, :, :per_word] = top.view(C, W, per_word)
    words = out.view(torch.int64).view(C, W)
    return words.t().contiguous() if W > 1 else words.view(1, C)


def num_slot_words(L: int) -> int:
    return max(1, spec_cdiv(L, SLOT_WORD))


def pack_states(state: torch.Tensor) -> torch.Tensor:
    """[R, G, L] state codes -> [R, G, 2, W] int64: plane PLANE_UNHASHED holds the U
    blocks (bit 1 of the code: N=0, H=1, U=2), plane PLANE_NONNULL the non-null ones."""
    R, G, L = state.shape
    flat = state.reshape(R * G, L)
    planes = [pack_slots(flat >> 1), pack_slots((flat + 1) >> 1)]  # each [W, R*G]
    return torch.stack(planes, 0).permute(2, 0, 1).reshape(R, G, 2, num_slot_words(L)).contiguous()


def unpack_states(words: torch.Tensor, L: int) -> torch.Tensor:
    """[n, 2, W] packed words -> [n, L] uint8 state codes (U = unhashed + non-null = 2)."""
    slot = torch.arange(L, device=words.device)
    w, bit = slot // SLOT_WORD, slot % SLOT_WORD
    bits = (words[:, :, w] >> bit) & 1  # [n, 2, L]
    return (bits[:, PLANE_UNHASHED] + bits[:, PLANE_NONNULL]).to(torch.uint8)


_INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

# name -> (rank: 3 slots / 2 groups / 1 requests, allowed dtypes)
_SPEC = {
    "state": (3, (torch.uint8, torch.int8)),
    "block_id": (3, (torch.int32, torch.int64)),
    "table_length": (2, _INTS),
    "num_groups": (1, _INTS),
    "kind": (2, (torch.uint8, torch.int8)),
    "tokens_per_block": (2, _INTS),
    "window_tokens": (2, _INTS),
    "blocks_per_chunk": (1, _INTS),
    "tokens_per_hash": (1, _INTS),
    "num_prompt_tokens": (1, _INTS),
    "num_locally_computed_tokens": (1, _INTS),
    "num_external_tokens": (1, _INTS),
    "sync_load": (1, (torch.bool,)),
    # case format v2 (optional: ``None`` gives what a v1 case meant)
    "num_tokens": (1, _INTS),
    "partial_tail_boundary": (1, _INTS),  # -1: None
    "cache_hit_alignment_tokens": (1, _INTS),  # -1: None
    "decode_context_parallel_size": (1, _INTS),
    "extra_retained_tokens": (2, _INTS),
    "is_eagle_group": (2, (torch.bool,)),
    "mamba_cache_mode": (2, (torch.uint8, torch.int8)),  # MAMBA_MODE_CODES
    "offloaded": (2, (torch.bool,)),
}
# GroupConfig.mamba_cache_mode: None (means "align") and vLLM's three modes
MAMBA_MODE_CODES = {None: 0, "align": 1, "all": 2, "none": 3}


@dataclass
class PlanBatch:
    """Inputs of ``plan_batch``. Shapes: [R, G, L] slots, [R, G] groups, [R] requests.

    ``state`` holds BlockState codes (N=0, H=1, U=2); ``window_tokens`` is a
    group's ``sliding_window`` or ``attention_chunk_size`` (0 for the other kinds).
    ``names`` is optional and only used to name cases converted back. The case
    format v2 fields may be left out (``None``): each then takes the value a v1
    case means (num_tokens = num_prompt_tokens, no partial tail, every group
    offloaded, nothing retained, no EAGLE group).
    """

    state: torch.Tensor
    block_id: torch.Tensor
    table_length: torch.Tensor
    num_groups: torch.Tensor
    kind: torch.Tensor
    tokens_per_block: torch.Tensor
    window_tokens: torch.Tensor
    blocks_per_chunk: torch.Tensor
    tokens_per_hash: torch.Tensor
    num_prompt_tokens: torch.Tensor
    num_locally_computed_tokens: torch.Tensor
    num_external_tokens: torch.Tensor
    sync_load: torch.Tensor
    num_tokens: torch.Tensor | None = None
    partial_tail_boundary: torch.Tensor | None = None
    cache_hit_alignment_tokens: torch.Tensor | None = None
    decode_context_parallel_size: torch.Tensor | None = None
    extra_retained_tokens: torch.Tensor | None = None
    is_eagle_group: torch.Tensor | None = None
    mamba_cache_mode: torch.Tensor | None = None
    offloaded: torch.Tensor | None = None
    names: list | None = field(default=None, compare=False)
    # optional [R, G, 2, W] int64: ``state`` already packed (``pack_states``), as the
    # generators and ``batch_from_cases`` write it; the impl then gathers 16 bytes per
    # group instead of L and packs nothing. ``check_values`` checks it equals ``state``.
    slot_words: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.state, torch.Tensor) and self.state.dim() == 3:
            R, G, _ = self.state.shape
            dev = self.state.device
            v1 = {
                "num_tokens": lambda: self.num_prompt_tokens,
                "partial_tail_boundary": lambda: torch.full((R,), -1, dtype=torch.int64, device=dev),
                "cache_hit_alignment_tokens": lambda: torch.full((R,), -1, dtype=torch.int64, device=dev),
                "decode_context_parallel_size": lambda: torch.ones((R,), dtype=torch.int64, device=dev),
                "extra_retained_tokens": lambda: torch.zeros((R, G), dtype=torch.int64, device=dev),
                "is_eagle_group": lambda: torch.zeros((R, G), dtype=torch.bool, device=dev),
                "mamba_cache_mode": lambda: torch.zeros((R, G), dtype=torch.uint8, device=dev),
                "offloaded": lambda: torch.ones((R, G), dtype=torch.bool, device=dev),
            }
            for name, default in v1.items():
                if getattr(self, name) is None:
                    setattr(self, name, default())
        self.check_shapes()

    @property
    def shape(self) -> tuple:
        return tuple(self.state.shape)

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def num_request_groups(self) -> int:
        return int(self.num_groups.sum())

    def tensors(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in _SPEC}

    def check_shapes(self) -> None:
        """Type, shape and device of every tensor; cheap, always run."""
        if not isinstance(self.state, torch.Tensor) or self.state.dim() != 3:
            got = tuple(self.state.shape) if isinstance(self.state, torch.Tensor) else type(self.state).__name__
            raise BatchError("state", f"must be a 3-d tensor [requests, groups, slots], got {got}")
        R, G, L = self.state.shape
        want = {3: (R, G, L), 2: (R, G), 1: (R,)}
        for name, (rank, dtypes) in _SPEC.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise BatchError(name, f"must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != want[rank]:
                dims = {3: "[requests, groups, slots]", 2: "[requests, groups]", 1: "[requests]"}[rank]
                raise BatchError(name, f"must have shape {dims} = {list(want[rank])}, got {list(t.shape)}")
            if t.dtype not in dtypes:
                raise BatchError(name, f"dtype must be one of {', '.join(str(d) for d in dtypes)}, got {t.dtype}")
            if t.device != self.state.device:
                raise BatchError(name, f"is on {t.device} but state is on {self.state.device}; put the batch on one device")
        if self.names is not None and len(self.names) != R:
            raise BatchError("names", f"must name all {R} requests, got {len(self.names)}")
        if self.slot_words is not None:
            want_words = (R, G, 2, num_slot_words(L))
            if (not isinstance(self.slot_words, torch.Tensor) or tuple(self.slot_words.shape) != want_words
                    or self.slot_words.dtype != torch.int64 or self.slot_words.device != self.state.device):
                got = tuple(self.slot_words.shape) if isinstance(self.slot_words, torch.Tensor) else type(self.slot_words).__name__
                raise BatchError("slot_words", f"must be an int64 tensor {list(want_words)} on the state's device "
                                 f"(pack_states(state)), got {got}")

    def check_values(self) -> None:
        """The rules ``Case`` enforces that the arithmetic relies on (positive sizes,
        codes in range, tables that fit); one vectorised pass, so a bad tensor gets a
        named error instead of a division by zero or a silent wrong answer."""
        R, G, L = self.shape
        valid = torch.arange(G, device=self.device) < self.num_groups.unsqueeze(1)

        def bad(name: str, mask: torch.Tensor, rule: str) -> None:
            if bool(mask.any()):
                where = [int(i) for i in mask.nonzero()[0]]
                val = getattr(self, name)[tuple(where)].item()
                raise BatchError(name, f"{rule}; first violation at index {where}: {val}")

        bad("num_groups", (self.num_groups < 1) | (self.num_groups > G), f"must be in 1..{G} (the groups dimension)")
        bad("state", self.state.to(torch.int16).gt(STATE_U) | self.state.to(torch.int16).lt(0), "codes are N=0, H=1, U=2")
        bad("kind", ((self.kind.to(torch.int16) < 0) | (self.kind.to(torch.int16) >= len(_KINDS))) & valid,
            f"codes are {', '.join(f'{k.value}={i}' for i, k in enumerate(_KINDS))}")
        bad("tokens_per_block", valid & (self.tokens_per_block < 1), "must be positive on every real group")
        bad("blocks_per_chunk", self.blocks_per_chunk < 1, "must be positive")
        bad("tokens_per_hash", self.tokens_per_hash < 1, "must be positive")
        for name in ("num_prompt_tokens", "num_locally_computed_tokens", "num_external_tokens"):
            bad(name, getattr(self, name) < 0, "must be non-negative")
        bad("table_length", (self.table_length < 0) | (self.table_length > L), f"must be in 0..{L} (the slots dimension)")
        windowed = valid & ((self.kind == KIND_SLIDING) | (self.kind == KIND_CHUNKED))
        bad("window_tokens", windowed & (self.window_tokens < 1),
            "a sliding_window / chunked_local group needs a positive window (sliding_window / attention_chunk_size)")
        tpc = self.tokens_per_block * self.blocks_per_chunk.unsqueeze(1)
        bad("tokens_per_block", valid & (tpc % self.tokens_per_hash.unsqueeze(1) != 0),
            "tokens_per_block * blocks_per_chunk must be a multiple of tokens_per_hash")
        in_table = torch.arange(L, device=self.device) < self.table_length.unsqueeze(-1)
        bad("state", ~in_table & (self.state != STATE_N), "slots past table_length must be null (0)")
        bad("block_id", (self.state == STATE_N) & (self.block_id != 0), "a null slot has block_id 0")
        bad("block_id", (self.state != STATE_N) & (self.block_id < 1), "a non-null slot needs block_id >= 1")
        bad("num_tokens", self.num_tokens < self.num_prompt_tokens, "must be >= num_prompt_tokens")
        bad("partial_tail_boundary", self.partial_tail_boundary < -1, "is -1 (None) or a token count")
        bad("cache_hit_alignment_tokens", (self.cache_hit_alignment_tokens < -1) | (self.cache_hit_alignment_tokens == 0),
            "is -1 (None) or positive")
        bad("decode_context_parallel_size", self.decode_context_parallel_size < 1, "must be positive")
        bad("extra_retained_tokens", valid & ((self.extra_retained_tokens < 0)
            | ((self.extra_retained_tokens > 0) & (self.kind != KIND_SLIDING))),
            "only a sliding_window group retains tokens (>= 0)")
        bad("mamba_cache_mode", valid & ((self.mamba_cache_mode.to(torch.int16) >= len(MAMBA_MODE_CODES))
            | ((self.mamba_cache_mode != 0) & (self.kind != KIND_MAMBA))),
            "codes are None=0, align=1, all=2, none=3, on mamba groups only")
        bad("offloaded", ((valid & self.offloaded).sum(1) == 0).unsqueeze(1).expand(R, G),
            "at least one group of every request must be offloaded")
        if self.slot_words is not None:
            differs = (self.slot_words != pack_states(self.state)).flatten(2).any(2)
            if bool(differs.any()):
                where = [int(i) for i in differs.nonzero()[0]]
                raise BatchError("slot_words", f"must equal pack_states(state); first difference at [request, group] {where}")

    @property
    def uses_v2(self) -> bool:
        """Whether any request sets a case format v2 field away from its v1 meaning."""
        return bool((self.partial_tail_boundary >= 0).any() or (self.extra_retained_tokens > 0).any()
                    or (~self.offloaded).any() or (self.num_tokens != self.num_prompt_tokens).any()
                    or self.is_eagle_group.any())

    def rows(self, start: int, stop: int) -> "PlanBatch":
        """Requests ``start`` .. ``stop`` (views, no copy)."""
        return PlanBatch(**{k: v[start:stop] for k, v in self.tensors().items()},
                         names=self.names[start:stop] if self.names else None,
                         slot_words=None if self.slot_words is None else self.slot_words[start:stop])

    def to(self, device) -> "PlanBatch":
        return PlanBatch(**{k: v.to(device) for k, v in self.tensors().items()}, names=self.names,
                         slot_words=None if self.slot_words is None else self.slot_words.to(device))


def concat_batches(batches) -> PlanBatch:
    """One batch of the requests of ``batches`` in order (slots and groups padded to the widest)."""
    batches = list(batches)
    if len(batches) == 1:
        return batches[0]
    G = max(b.shape[1] for b in batches)
    L = max(b.shape[2] for b in batches)
    out = {}
    for name in batches[0].tensors():
        parts = []
        for b in batches:
            t = getattr(b, name)
            if t.dim() >= 2 and t.shape[1] < G:  # padded groups: inert values (offloaded, tokens_per_block 1)
                fill = 1 if name in ("tokens_per_block", "offloaded") else 0
                t = torch.cat([t, torch.full((t.shape[0], G - t.shape[1]) + tuple(t.shape[2:]), fill,
                                             dtype=t.dtype, device=t.device)], 1)
            if t.dim() == 3 and t.shape[2] < L:
                t = torch.cat([t, t.new_zeros(t.shape[:2] + (L - t.shape[2],))], 2)
            parts.append(t)
        out[name] = torch.cat(parts, 0)
    names = None if any(b.names is None for b in batches) else [n for b in batches for n in b.names]
    words = None
    if all(b.slot_words is not None for b in batches):  # padded groups and words are null slots: zeros
        W = num_slot_words(L)
        words = torch.cat([torch.nn.functional.pad(b.slot_words, (0, W - b.slot_words.shape[3], 0, 0, 0, G - b.shape[1]))
                           for b in batches], 0)
    return PlanBatch(**out, names=names, slot_words=words)


def resolve_device(device=None) -> torch.device:
    """CUDA when available unless told otherwise; asking for CUDA without it is a clear error."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BatchError("device", "CUDA was requested but torch.cuda.is_available() is False (CPU-only torch or no GPU)")
    return dev
