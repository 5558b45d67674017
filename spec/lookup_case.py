"""A lookup case: what one ``get_num_new_matched_tokens`` call reads and answers, and its JSON form.

A ``LookupCase`` holds the request's sizes, the groups as the connector configured them
(``LookupGroup``) and the tier's answers per offload key (``Answer``: HIT, HIT_PENDING, RETRY,
MISS; a key asked twice in one call may be answered twice); a ``LookupResult`` the hit in tokens
or ``None`` (deferred), the recorded ``partial_tail_boundary`` and the keys asked, in order. A
key is named ``(group_idx, chunk_idx)`` or ``(group_idx, "b", key_tokens)`` (a partial tail's
boundary key: the hash of the first ``key_tokens`` tokens), written ``G:C`` / ``G:b:T``.

The algorithm that answers a case is ``lookup.py``'s; the file form (docs/case-format.md,
"Lookup cases") is below; ``case_kinds.load_any_case_paths`` reads it beside load and store cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kvbound.errors import CaseError


class Answer(str, Enum):
    """``vllm.v1.kv_offload.base.LookupResult`` (0.25+); 0.21-0.24 answer True / None /
    False, named here HIT / HIT_PENDING ("write in-flight; caller should retry") / MISS."""

    HIT = "HIT"
    HIT_PENDING = "HIT_PENDING"
    RETRY = "RETRY"
    MISS = "MISS"


@dataclass(frozen=True)
class LookupGroup:
    """One ``GroupOffloadConfig`` as the lookup reads it."""

    group_idx: int
    kind: str  # full_attention | sliding_window | chunked_local | mamba
    tokens_per_chunk: int
    num_keys: int  # len(group_state.offload_keys)
    window: int | None = None  # sliding_window_size_in_chunks (None: full attention)
    sliding_window: int = 0  # SlidingWindowSpec.sliding_window (tokens)
    extra_retained_tokens: int = 0
    eagle: bool = False  # is_eagle_group
    requires_cow_source: bool = False


def key_name(key) -> str:
    return ":".join(str(x) for x in key)


def parse_key(name: str) -> tuple:
    parts = name.split(":")
    if len(parts) == 2:
        return int(parts[0]), int(parts[1])
    if len(parts) == 3 and parts[1] == "b":
        return int(parts[0]), "b", int(parts[2])
    raise ValueError(f"offload key {name!r} is neither 'G:C' nor 'G:b:T'")


@dataclass(frozen=True)
class LookupCase:
    name: str
    num_computed_tokens: int
    num_tokens: int
    num_prompt_tokens: int
    groups: tuple  # LookupGroup, in kv_group_configs order
    lookup_groups: tuple  # config indices: full attention first, then windows largest first
    tokens_per_hash: int
    num_block_hashes: int
    tier: dict = field(default_factory=dict)  # key name -> answers in the order asked
    mamba_align_size: int | None = None
    partial_tail_block_size: int = 0  # 0: no partial tails
    eagle_proof_margins: dict = field(default_factory=dict)  # group_idx -> tokens
    max_num_new_tokens: int | None = None
    max_load_tokens: int | None = None
    transfer_jobs: bool = False
    skip_reading: bool = False
    being_loaded: frozenset = frozenset()  # key names in _chunks_being_loaded
    # req_status.partial_tail_boundary before the call: the early returns (transfers in flight,
    # skip_reading_prefix_cache) leave it as it was, since only _lookup resets it (0.33.0
    # offloading/scheduler.py:1074 in _lookup vs the returns at :1247-1252 and :1258-1259)
    prior_partial_tail_boundary: int | None = None
    release: str | None = None  # the release the case was captured on (informative)

    @property
    def sliding_window_groups(self) -> tuple:
        return tuple(i for i in self.lookup_groups if self.groups[i].window is not None)


@dataclass
class LookupResult:
    hit: int | None  # tokens beyond num_computed_tokens; None: deferred
    partial_tail_boundary: int | None = None
    queries: list = field(default_factory=list)  # key names, in the order asked
    unsupported: str | None = None
    hit_end: dict = field(default_factory=dict)  # config idx -> lookup_hit_end_chunk_idx (0.33)

    def to_json(self, name: str | None = None) -> dict:
        d = {"hit": self.hit, "deferred": self.hit is None and self.unsupported is None,
             "partial_tail_boundary": self.partial_tail_boundary, "queries": list(self.queries)}
        if name is not None:
            d = {"name": name, **d}
        if self.unsupported:
            d["outcome"], d["reason"] = "unsupported", self.unsupported
        else:
            d["outcome"] = "ok"
        return d


def canonical_key(case: LookupCase, key) -> tuple:
    """A boundary key at a whole number of the group's chunks IS that chunk's key (both
    hash the first T tokens): name it as the chunk."""
    if len(key) == 3:
        gi, _, T = key
        g = next((g for g in case.groups if g.group_idx == gi), None)
        if g is not None and T % g.tokens_per_chunk == 0:
            return gi, T // g.tokens_per_chunk - 1
    return key


# -- the case format ------------------------------------------------------------------------
_GROUP_FIELDS = ("group_idx", "kind", "tokens_per_chunk", "num_keys", "window", "sliding_window",
                 "extra_retained_tokens", "eagle", "requires_cow_source")


def lookup_case_from_dict(d: dict, where: str = "?") -> LookupCase:
    try:
        lk = d["lookup"]
        groups = tuple(LookupGroup(**{k: g[k] for k in _GROUP_FIELDS if k in g}) for g in lk["groups"])
        tier = {}
        for name, answers in (lk.get("tier") or {}).items():
            parse_key(name)
            answers = [answers] if isinstance(answers, str) else list(answers)
            tier[name] = tuple(Answer(a) for a in answers)
        case = LookupCase(
            name=d.get("name", where), num_computed_tokens=int(lk["num_computed_tokens"]),
            num_tokens=int(lk["num_tokens"]), num_prompt_tokens=int(lk.get("num_prompt_tokens", lk["num_tokens"])),
            groups=groups,
            lookup_groups=tuple(lk.get("lookup_groups") or default_lookup_groups(groups)),
            tokens_per_hash=int(lk.get("tokens_per_hash", groups[0].tokens_per_chunk)),
            num_block_hashes=int(lk.get("num_block_hashes", 0)), tier=tier,
            mamba_align_size=lk.get("mamba_align_size"),
            partial_tail_block_size=int(lk.get("partial_tail_block_size", 0)),
            eagle_proof_margins={int(k): int(v) for k, v in (lk.get("eagle_proof_margins") or {}).items()},
            max_num_new_tokens=lk.get("max_num_new_tokens"), max_load_tokens=lk.get("max_load_tokens"),
            transfer_jobs=bool(lk.get("transfer_jobs", False)), skip_reading=bool(lk.get("skip_reading", False)),
            being_loaded=frozenset(lk.get("being_loaded", ())),
            prior_partial_tail_boundary=lk.get("prior_partial_tail_boundary"), release=lk.get("release"),
        )
    except CaseError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CaseError(where, "lookup", f"not a lookup case ({type(e).__name__}: {e})") from None
    if not case.groups or any(g.tokens_per_chunk <= 0 or g.num_keys < 0 for g in case.groups):
        raise CaseError(where, "lookup.groups", "at least one group, each with tokens_per_chunk > 0 and num_keys >= 0")
    return case


def default_lookup_groups(groups) -> tuple:
    """The connector's order: full-attention groups, then windowed groups by window, largest first."""
    fa = [i for i, g in enumerate(groups) if g.window is None]
    sw = sorted((i for i, g in enumerate(groups) if g.window is not None), key=lambda i: -groups[i].window)
    return tuple(fa + sw)


def lookup_case_to_dict(case: LookupCase) -> dict:
    lk = {
        "num_computed_tokens": case.num_computed_tokens, "num_tokens": case.num_tokens,
        "num_prompt_tokens": case.num_prompt_tokens,
        "groups": [{k: getattr(g, k) for k in _GROUP_FIELDS} for g in case.groups],
        "lookup_groups": list(case.lookup_groups), "tokens_per_hash": case.tokens_per_hash,
        "num_block_hashes": case.num_block_hashes,
        "tier": {k: [Answer(a).value for a in v] for k, v in case.tier.items()},
        "mamba_align_size": case.mamba_align_size, "partial_tail_block_size": case.partial_tail_block_size,
        "eagle_proof_margins": {str(k): v for k, v in case.eagle_proof_margins.items()},
        "max_num_new_tokens": case.max_num_new_tokens, "max_load_tokens": case.max_load_tokens,
        "transfer_jobs": case.transfer_jobs, "skip_reading": case.skip_reading,
        "being_loaded": sorted(case.being_loaded),
    }
    if case.prior_partial_tail_boundary is not None:
        lk["prior_partial_tail_boundary"] = case.prior_partial_tail_boundary
    if case.release:
        lk["release"] = case.release
    return {"name": case.name, "lookup": lk}


def is_lookup_case(d) -> bool:
    return isinstance(d, dict) and "lookup" in d and "groups" not in d
