"""A store case: one request at one ``_build_store_jobs`` call, its JSON form, and what the store
spec (``store.py``) says the call does.

A ``StoreCase`` holds what ``_build_store_jobs`` reads of one request and one full-attention,
non-draft group (the store spec's subject): the release, the request's status and token counts,
the group's chunk size, its allocated and keyed chunks, ``offload_prompt_only`` and
``max_offload_tokens``, ``next_stored_chunk_idx`` before the call, and optionally what the
release did (``next_stored_chunk_idx_after``, as the trace's worker records it). ``plan_store``
answers it (``StorePlan``): the horizon, where ``next_stored_chunk_idx`` lands, the chunks
stored and whether they end within the tokens the forward computed.

The file form is docs/case-format.md, "Store cases" (format 1): ``{"name": ..., "store": {...}}``.
Every field is validated on reading; a bad one is a ``CaseError`` naming the case, the field and
the rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvbound.errors import CaseError, UnsupportedVersion

from .store import ABORTED, FINISHED, RUNNING, STORE_COLUMNS, computed_tokens, group_frontier, store_features
from .versions import release_features, spans

STATUSES = (RUNNING, FINISHED, ABORTED)
STORE_CASE_FORMAT = 1
# (field, default): REQUIRED fields have none; the rest default as in vLLM or as "not recorded"
REQUIRED = object()
STORE_FIELDS = (
    ("release", REQUIRED), ("status", REQUIRED), ("num_prompt_tokens", REQUIRED), ("num_tokens", REQUIRED),
    ("num_computed_tokens", REQUIRED), ("num_scheduled_tokens", 0), ("tokens_per_block", REQUIRED),
    ("blocks_per_chunk", 1), ("num_allocated_chunks", REQUIRED), ("num_keyed_chunks", REQUIRED),
    ("offload_prompt_only", True), ("max_offload_tokens", None), ("refused", False), ("drafter", False),
    ("scheduler", "sync"), ("num_output_placeholders", 0), ("num_draft_tokens", 0), ("num_lookahead_tokens", 0),
    ("next_stored_chunk_idx", REQUIRED), ("next_stored_chunk_idx_after", None), ("format", STORE_CASE_FORMAT),
)
_INT_MIN = {"num_prompt_tokens": 1, "num_tokens": 1, "num_computed_tokens": 0, "num_scheduled_tokens": 0,
            "tokens_per_block": 1, "blocks_per_chunk": 1, "num_allocated_chunks": 0, "num_keyed_chunks": 0,
            "max_offload_tokens": 0, "next_stored_chunk_idx": 0, "next_stored_chunk_idx_after": 0,
            "num_output_placeholders": 0, "num_draft_tokens": 0, "num_lookahead_tokens": 0}
_NULLABLE = {"max_offload_tokens", "next_stored_chunk_idx_after"}
_BOOLS = ("offload_prompt_only", "refused", "drafter")
SCHEDULERS = ("sync", "async")
TOP_FIELDS = ("name", "description", "store")


@dataclass(frozen=True)
class StoreCase:
    name: str
    release: str  # the release that made the call
    status: str  # running | finished | aborted
    num_prompt_tokens: int
    num_tokens: int
    num_computed_tokens: int
    num_scheduled_tokens: int
    tokens_per_block: int
    blocks_per_chunk: int
    num_allocated_chunks: int  # the group's chunks with GPU blocks allocated
    num_keyed_chunks: int  # len(offload_keys): chunks whose block hash has arrived
    offload_prompt_only: bool
    max_offload_tokens: int | None
    refused: bool  # the tier refused the store (prepare_store returned None)
    next_stored_chunk_idx: int  # before the call
    drafter: bool = False  # the group is a drafter's (spec.store.is_drafter_group): it holds its trailing chunk
    scheduler: str = "sync"  # sync | async (the AsyncScheduler): what the store premises assume differs
    num_output_placeholders: int = 0  # request.num_output_placeholders (async)
    num_draft_tokens: int = 0  # draft tokens scheduled this step (speculative decoding)
    num_lookahead_tokens: int = 0  # the slots allocate_slots reserves past them
    next_stored_chunk_idx_after: int | None = None  # what the release did (None: not recorded)
    format: int = STORE_CASE_FORMAT

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_block * self.blocks_per_chunk


@dataclass(frozen=True)
class StorePlan:
    """What the store spec of ``release`` says the call does."""

    release: str
    outcome: str  # ok | assertion_error (0.26: more chunks than allocated blocks) | unsupported
    horizon: int | None = None  # tokens the call may store (store_horizon)
    computed: int | None = None  # tokens whose KV the forward wrote once the batch ran
    before: int = 0
    after: int | None = None  # next_stored_chunk_idx after the call (None: asserts / unsupported)
    reason: str | None = None

    @property
    def stored(self) -> tuple:
        """The chunks this call stores, [before, after)."""
        return () if self.after is None else tuple(range(self.before, self.after))

    def within_computed(self, tokens_per_chunk: int) -> bool | None:
        """Every stored chunk ends at or before the computed tokens (the KV promise)."""
        return None if self.after is None else self.after * tokens_per_chunk <= self.computed or not self.stored

    def to_json(self, case: StoreCase) -> dict:
        d = {"name": case.name, "kind": "store", "outcome": self.outcome, "vllm_version": self.release,
             "horizon": self.horizon, "computed_tokens": self.computed,
             "next_stored_chunk_idx": {"before": self.before, "after": self.after},
             "stored_chunks": list(self.stored), "within_computed": self.within_computed(case.tokens_per_chunk)}
        if self.reason:
            d["reason"] = self.reason
        if case.next_stored_chunk_idx_after is not None:  # what the case's release did
            d["observed_after"], d["observed_on"] = case.next_stored_chunk_idx_after, case.release
            if self.release == case.release and self.outcome != "unsupported":
                d["agrees"] = self.after == case.next_stored_chunk_idx_after
        return d


ASSERT_026 = "assert len(offload_keys) == len(offload_block_ids)"  # 0.26.0 offloading/scheduler.py:975


def plan_store(case: StoreCase, version: str | None = None) -> StorePlan:
    """The store spec of ``version`` (default: the case's release) on the case."""
    version = version or case.release
    try:
        feats = store_features(version)
    except ValueError as e:
        return StorePlan(version, "unsupported", before=case.next_stored_chunk_idx, reason=str(e))
    computed = computed_tokens(case.status, case.num_tokens, case.num_computed_tokens, case.num_scheduled_tokens)
    h, _, after = group_frontier(version, case.status, case.num_prompt_tokens, case.num_tokens,
                                 case.num_computed_tokens, case.num_scheduled_tokens, case.tokens_per_chunk,
                                 case.num_allocated_chunks, case.num_keyed_chunks, case.next_stored_chunk_idx,
                                 case.offload_prompt_only, case.max_offload_tokens, case.refused, case.drafter)
    if case.refused:
        return StorePlan(version, "ok", None, computed, case.next_stored_chunk_idx, after,
                         "the tier refused the store: nothing advances (the chunks are retried at a later step)")
    if after is None:
        return StorePlan(version, "assertion_error", h, computed, case.next_stored_chunk_idx, None,
                         f"{ASSERT_026}: {h // case.tokens_per_chunk} chunks below the horizon, "
                         f"{case.num_allocated_chunks} allocated")
    return StorePlan(version, "ok", h, computed, case.next_stored_chunk_idx, after)


def store_rows() -> list:
    """The runs of releases over which the store spec's columns hold (from its first release)."""
    return [s for s in spans(STORE_COLUMNS) if s.features.next_stored_chunk_idx]


# -- the case format ------------------------------------------------------------------------
def is_store_case(d) -> bool:
    return isinstance(d, dict) and "store" in d and "groups" not in d


def store_case_from_dict(d: dict, where: str = "?") -> StoreCase:
    name = d.get("name", where)
    if not isinstance(name, str) or not name:
        raise CaseError(where, "name", "must be a non-empty string")
    unknown = sorted(set(d) - set(TOP_FIELDS))
    if unknown:
        raise CaseError(name, unknown[0], f"unknown field; a store case has {', '.join(TOP_FIELDS)}")
    s = d["store"]
    if not isinstance(s, dict):
        raise CaseError(name, "store", "must be a JSON object (docs/case-format.md, \"Store cases\")")
    known = [f for f, _ in STORE_FIELDS]
    unknown = sorted(set(s) - set(known))
    if unknown:
        raise CaseError(name, f"store.{unknown[0]}", f"unknown field; a store case has {', '.join(known)}")
    v = {}
    for f, default in STORE_FIELDS:
        if f not in s:
            if default is REQUIRED:
                raise CaseError(name, f"store.{f}", "missing required field")
            v[f] = default
            continue
        x = s[f]
        if f in _INT_MIN:
            if x is None and f in _NULLABLE:
                v[f] = None
                continue
            if not isinstance(x, int) or isinstance(x, bool) or x < _INT_MIN[f]:
                raise CaseError(name, f"store.{f}", f"must be an integer >= {_INT_MIN[f]}"
                                + (" or null" if f in _NULLABLE else "") + f", got {x!r}")
        elif f in _BOOLS and not isinstance(x, bool):
            raise CaseError(name, f"store.{f}", f"must be true or false, got {x!r}")
        v[f] = x
    if v["format"] != STORE_CASE_FORMAT:
        raise CaseError(name, "store.format", f"this kvbound reads store case format {STORE_CASE_FORMAT}, got {v['format']!r}")
    if v["scheduler"] not in SCHEDULERS:
        raise CaseError(name, "store.scheduler", f"must be one of {', '.join(SCHEDULERS)}, got {v['scheduler']!r}")
    if v["status"] not in STATUSES:
        raise CaseError(name, "store.status", f"must be one of {', '.join(STATUSES)}, got {v['status']!r}")
    if not isinstance(v["release"], str):
        raise CaseError(name, "store.release", f"must be a vLLM release string such as \"0.33.0\", got {v['release']!r}")
    try:
        release_features(v["release"])
    except UnsupportedVersion as e:
        raise CaseError(name, "store.release", str(e)) from None
    if v["num_tokens"] < v["num_prompt_tokens"]:
        raise CaseError(name, "store.num_tokens", f"must be >= num_prompt_tokens={v['num_prompt_tokens']} (the prompt "
                        f"plus the output tokens), got {v['num_tokens']}")
    return StoreCase(name=name, **v)


def store_case_to_dict(case: StoreCase) -> dict:
    d = asdict(case)
    return {"name": d.pop("name"), "store": d}


__all__ = ["STATUSES", "StoreCase", "StorePlan", "is_store_case", "plan_store", "store_case_from_dict",
           "store_case_to_dict", "store_rows"]
