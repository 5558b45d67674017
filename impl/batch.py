"""The padded tensor form of many ``Case``s: R requests x G groups x L block slots.

Padding is chosen so it can never change an answer: padded slots are null blocks
past the table's end, padded groups sit after ``num_groups`` and are masked out.
Converters go both ways so every batch can be checked against the spec and saved
as case files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from kvbound.errors import BatchError
from kvbound.spec import Block, BlockState, Case, Group, GroupConfig, GroupKind

# Small integer codes; the order of the enums is the code.
STATE_CODES = {s: i for i, s in enumerate(BlockState)}  # N=0, H=1, U=2
STATE_N, STATE_H, STATE_U = (STATE_CODES[s] for s in (BlockState.NULL, BlockState.HASHED, BlockState.UNHASHED))
KIND_CODES = {k: i for i, k in enumerate(GroupKind)}
KIND_FULL, KIND_SLIDING, KIND_CHUNKED, KIND_MAMBA = (
    KIND_CODES[k] for k in (GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL, GroupKind.MAMBA)
)
_STATES = tuple(BlockState)
_KINDS = tuple(GroupKind)




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
}


@dataclass
class PlanBatch:
    """Inputs of ``plan_batch``. Shapes: [R, G, L] slots, [R, G] groups, [R] requests.

    ``state`` holds BlockState codes (N=0, H=1, U=2); ``window_tokens`` is a
    group's ``sliding_window`` or ``attention_chunk_size`` (0 for the other kinds).
    ``names`` is optional and only used to name cases converted back.
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
    names: list | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
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

    def to(self, device) -> "PlanBatch":
        return PlanBatch(**{k: v.to(device) for k, v in self.tensors().items()}, names=self.names)


def resolve_device(device=None) -> torch.device:
    """CUDA when available unless told otherwise; asking for CUDA without it is a clear error."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BatchError("device", "CUDA was requested but torch.cuda.is_available() is False (CPU-only torch or no GPU)")
    return dev


def batch_from_cases(cases, device=None, slots: int | None = None, groups: int | None = None) -> PlanBatch:
    """Pad ``cases`` into one batch; the blocks go in with one scatter, not a per-slot loop."""
    cases = list(cases)
    if not cases:
        raise BatchError("cases", "need at least one case to build a batch")
    dev = resolve_device(device)
    R = len(cases)
    G = max(len(c.groups) for c in cases)
    L = max((len(g.blocks) for c in cases for g in c.groups), default=0)
    G, L = max(G, groups or 0), max(L, slots or 0, 1)
    L += -L % 8  # whole octets: plan_batch then packs the slots without a copy
    lengths, kinds, tpb, win = [], [], [], []
    states, ids = [], []
    for c in cases:
        for g in c.groups:
            cfg = g.config
            lengths.append(len(g.blocks))
            kinds.append(KIND_CODES[cfg.kind])
            tpb.append(cfg.tokens_per_block)
            win.append(cfg.sliding_window or cfg.attention_chunk_size or 0)
            states += [STATE_CODES[b.state] for b in g.blocks]
            ids += [b.block_id for b in g.blocks]
        pad = G - len(c.groups)
        lengths += [0] * pad
        kinds += [0] * pad
        tpb += [1] * pad
        win += [0] * pad
    table_length = torch.tensor(lengths, dtype=torch.int64).view(R, G)
    # slot (r, g, i) of block number j: flat index (r*G + g)*L + i
    rg = torch.repeat_interleave(torch.arange(R * G), table_length.view(-1))
    offsets = torch.cumsum(table_length.view(-1), 0) - table_length.view(-1)
    flat = rg * L + (torch.arange(len(states)) - offsets[rg])
    id_dtype = torch.int32 if max(ids, default=0) < 2**31 else torch.int64
    state = torch.zeros(R * G * L, dtype=torch.uint8)
    block_id = torch.zeros(R * G * L, dtype=id_dtype)
    state[flat] = torch.tensor(states, dtype=torch.uint8)
    block_id[flat] = torch.tensor(ids, dtype=id_dtype)

    def req(attr):
        return torch.tensor([getattr(c, attr) for c in cases], dtype=torch.int64, device=dev)

    return PlanBatch(
        state=state.view(R, G, L).to(dev),
        block_id=block_id.view(R, G, L).to(dev),
        table_length=table_length.to(dev),
        num_groups=torch.tensor([len(c.groups) for c in cases], dtype=torch.int64, device=dev),
        kind=torch.tensor(kinds, dtype=torch.uint8).view(R, G).to(dev),
        tokens_per_block=torch.tensor(tpb, dtype=torch.int64).view(R, G).to(dev),
        window_tokens=torch.tensor(win, dtype=torch.int64).view(R, G).to(dev),
        blocks_per_chunk=req("blocks_per_chunk"),
        tokens_per_hash=req("tokens_per_hash"),
        num_prompt_tokens=req("num_prompt_tokens"),
        num_locally_computed_tokens=req("num_locally_computed_tokens"),
        num_external_tokens=req("num_external_tokens"),
        sync_load=torch.tensor([c.sync_load for c in cases], dtype=torch.bool, device=dev),
        names=[c.name for c in cases],
    )


def cases_from_batch(batch: PlanBatch, rows=None) -> list[Case]:
    """Back to spec ``Case``s (validated on construction), e.g. to save as case files."""
    batch.check_values()
    rows = range(batch.shape[0]) if rows is None else rows
    t = {k: v.cpu().tolist() for k, v in batch.tensors().items()}
    out = []
    for r in rows:
        groups = []
        for g in range(t["num_groups"][r]):
            kind = _KINDS[t["kind"][r][g]]
            w = t["window_tokens"][r][g]
            blocks = tuple(
                Block(_STATES[s], i)
                for s, i in zip(t["state"][r][g][: t["table_length"][r][g]], t["block_id"][r][g])
            )
            groups.append(
                Group(
                    GroupConfig(
                        kind,
                        t["tokens_per_block"][r][g],
                        sliding_window=w if kind is GroupKind.SLIDING_WINDOW else None,
                        attention_chunk_size=w if kind is GroupKind.CHUNKED_LOCAL else None,
                    ),
                    blocks,
                )
            )
        out.append(
            Case(
                name=batch.names[r] if batch.names else f"batch-{r}",
                blocks_per_chunk=t["blocks_per_chunk"][r],
                tokens_per_hash=t["tokens_per_hash"][r],
                num_prompt_tokens=t["num_prompt_tokens"][r],
                num_locally_computed_tokens=t["num_locally_computed_tokens"][r],
                num_external_tokens=t["num_external_tokens"][r],
                groups=tuple(groups),
                sync_load=bool(t["sync_load"][r]),
            )
        )
    return out
