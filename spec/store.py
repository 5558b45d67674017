"""The store path's executable spec: how far each release's ``_build_store_jobs`` stores.

Per request and step, ``_build_store_jobs`` takes a token horizon (``tokens_after_batch``),
caps it (``offloadable_tokens``, the release's ``_calc_num_offloadable_tokens``) and stores
each group's whole chunks below it that are allocated
(``RequestOffloadState.storable_chunks``), advancing ``next_stored_chunk_idx`` to that
count. What each release does is the ``next_stored_chunk_idx`` and ``store_*`` columns of
``versions.RELEASES`` (each with its vLLM lines there): the horizon of a finished request
(``num_tokens``, from 0.30 clamped to ``max(num_prompt_tokens, num_tokens - 1)``, the GPU
prefix cache's commit point) and of an aborted one (``num_computed_tokens`` from 0.27), and
whether ``storable_chunks`` caps at the allocated chunks (from 0.27; 0.26 asserts instead) and
at the keyed chunks, those whose block hash has arrived (from 0.30).

Every group kind advances its own ``next_stored_chunk_idx`` by the one rule (full attention,
sliding window, chunked local, Mamba: ``storable_chunks`` reads no kind; which of a window's
chunks are offered is the reachable mask's business, not the frontier's), with its own
tokens per chunk, allocated and keyed chunks; a drafter (EAGLE/MTP) group holds back its
trailing chunk while the request decodes (``drafter_holds_tail``), from 0.30 not once it has
finished (``store_drafter_tail_at_finish``); which groups are a drafter's is
``is_drafter_group`` (``untagged_groups_non_draft``).

What the KV promise needs (``computed_tokens``): every stored chunk's tokens were
forwarded; the final sampled token never is.
"""

from __future__ import annotations

from .versions import first_release, release_features
from .vocab import ReleaseFeatures

RUNNING, FINISHED, ABORTED = "running", "finished", "aborted"

# The columns of RELEASES the store spec reads (each with its source in spec/versions.py).
# STORE_COLUMNS: one full-attention, non-draft group's frontier (the store obligations' subject,
# proofs/store.py); GROUP_STORE_COLUMNS: what else a group's kind and role change.
STORE_COLUMNS = ("next_stored_chunk_idx", "store_aborted_at_computed", "store_finished_clamp", "store_caps_at_allocated",
                 "store_caps_at_keyed")
GROUP_STORE_COLUMNS = ("store_drafter_tail_at_finish", "untagged_groups_non_draft", "store_skips_cow_source")


def store_features(version: str) -> ReleaseFeatures:
    """The row of RELEASES ``version`` runs; ValueError before the store spec's first release."""
    feats = release_features(version)
    if not feats.next_stored_chunk_idx:
        raise ValueError(f"vllm {version}: the store spec starts at "
                         f"{first_release(lambda f: f.next_stored_chunk_idx)}")
    return feats


def tokens_after_batch(version: str, status: str, num_prompt_tokens: int, num_tokens: int,
                       num_computed_tokens: int, num_scheduled_tokens: int = 0) -> int:
    f = store_features(version)
    if status == ABORTED and f.store_aborted_at_computed:
        return num_computed_tokens
    if status in (FINISHED, ABORTED):
        return max(num_prompt_tokens, num_tokens - 1) if f.store_finished_clamp else num_tokens
    return num_computed_tokens + num_scheduled_tokens


def offloadable_tokens(n: int, num_tokens: int, num_prompt_tokens: int, offload_prompt_only: bool,
                       max_offload_tokens: int | None = None) -> int:
    n = min(n, num_tokens)
    if max_offload_tokens is not None:
        n = min(n, max_offload_tokens)
    if offload_prompt_only:
        n = min(n, num_prompt_tokens)
    return n


def store_horizon(version: str, status: str, num_prompt_tokens: int, num_tokens: int,
                  num_computed_tokens: int, num_scheduled_tokens: int = 0, offload_prompt_only: bool = True,
                  max_offload_tokens: int | None = None) -> int:
    """The tokens ``_build_store_jobs`` may store for this request in this step."""
    return offloadable_tokens(
        tokens_after_batch(version, status, num_prompt_tokens, num_tokens, num_computed_tokens,
                           num_scheduled_tokens),
        num_tokens, num_prompt_tokens, offload_prompt_only, max_offload_tokens)


def is_drafter_group(version: str, tagged: bool, any_tagged: bool, eagle_speculation: bool) -> bool:
    """Whether the connector treats a group as an EAGLE/MTP drafter's: the groups vLLM's planner tagged
    ``is_eagle_group``; with speculative decoding on and none tagged, every group before 0.30, none from it."""
    if tagged:
        return True
    return eagle_speculation and not any_tagged and not store_features(version).untagged_groups_non_draft


def drafter_holds_tail(version: str, status: str, horizon: int, num_prompt_tokens: int) -> bool:
    """Whether a drafter group's trailing storable chunk is held back this call: while decoding (the
    horizon past the prompt), and from 0.30 only while the request has not finished (aborted included:
    ``Request.is_finished``)."""
    if horizon <= num_prompt_tokens:
        return False
    return status == RUNNING or not store_features(version).store_drafter_tail_at_finish


def next_stored_chunk_idx(before: int, horizon: int, tokens_per_chunk: int, num_allocated_chunks: int,
                          caps_at_allocated: bool = True, num_keyed_chunks: int | None = None,
                          holds_tail: bool = False) -> int | None:
    """A group's ``next_stored_chunk_idx`` after the step (when the
    tier accepted the store): the allocated (and, from 0.30, keyed: ``num_keyed_chunks``, None
    where the release does not cap there) whole chunks below the horizon. None where the
    release asserts instead (0.26: more chunks than allocated blocks). ``holds_tail``: a drafter
    group's trailing chunk held back (``drafter_holds_tail``)."""
    n = horizon // tokens_per_chunk
    if holds_tail:
        n = max(0, n - 1)
    if num_keyed_chunks is not None:
        n = min(n, num_keyed_chunks)
    if not caps_at_allocated and n > max(before, num_allocated_chunks):
        return None
    return max(before, min(n, num_allocated_chunks))


def group_frontier(version: str, status: str, num_prompt_tokens: int, num_tokens: int, num_computed_tokens: int,
                   num_scheduled_tokens: int, tokens_per_chunk: int, num_allocated_chunks: int, num_keyed_chunks: int,
                   before: int, offload_prompt_only: bool = True, max_offload_tokens: int | None = None,
                   refused: bool = False, drafter: bool = False) -> tuple:
    """One group at one ``_build_store_jobs`` call, the spec's whole answer: (horizon, None where the
    tier refused the store; whether a drafter group holds its trailing chunk back; its
    ``next_stored_chunk_idx`` after the call, None where the release asserts instead). A refused store
    advances nothing: every release retries its chunks later."""
    if refused:
        return None, False, before
    f = store_features(version)
    h = store_horizon(version, status, num_prompt_tokens, num_tokens, num_computed_tokens, num_scheduled_tokens,
                      offload_prompt_only, max_offload_tokens)
    holds = drafter and drafter_holds_tail(version, status, h, num_prompt_tokens)
    return h, holds, next_stored_chunk_idx(before, h, tokens_per_chunk, num_allocated_chunks,
                                           f.store_caps_at_allocated,
                                           num_keyed_chunks if f.store_caps_at_keyed else None, holds)


DENSE_KINDS = ("full_attention",)  # every chunk stored: the KV-cache manager's reachable_block_mask is None


def offer_violations(version: str, kind: str, cow: bool, before: int, after: int, offered, offered_null,
                     nulls) -> list[str]:
    """What a call's offer to ``prepare_store`` breaks, for one group whose frontier moved
    ``before`` -> ``after`` (as the spec says): every release offers only chunks below the frontier
    and never one whose GPU block is null (``if block_id == 0: continue``, 0.26.0
    ``offloading/scheduler.py:983``, 0.29.0 :1381, 0.30.0 :1596, 0.33.0 :1947); from 0.29 nothing of a
    copy-on-write source group (``requires_cow_source``: its state comes from the CoW hand-off,
    ``store_skips_cow_source``; 0.28 offers its block table's chunks); and a full-attention group every non-null chunk from
    ``before`` to ``after`` (its manager's ``reachable_block_mask`` is None, 0.30.0
    ``v1/core/single_type_kv_cache_manager.py:528-552``, 0.33.0 :545-569, not overridden by
    ``FullAttentionManager``; before 0.30 a group without a window is always reachable, 0.29.0
    ``offloading/scheduler.py:137-138``). Which of a window's or a Mamba group's chunks are reachable
    is the manager's mask (0.30.0 single_type_kv_cache_manager.py:1065, :1566): bounded here, not
    enumerated."""
    out = []
    past = [c for c in offered if c >= after]
    if past:
        out.append(f"offered chunk(s) {past} at or past the frontier {after}")
    if offered_null:
        out.append(f"offered chunk(s) {list(offered_null)} whose GPU block is null")
    if cow and offered and store_features(version).store_skips_cow_source:
        out.append(f"a copy-on-write source group offered chunk(s) {list(offered)}")
    if kind in DENSE_KINDS and not cow:  # (no full-attention group is a copy-on-write source)
        want = [c for c in range(before, after) if c not in set(nulls)]
        if [c for c in offered if before <= c < after] != want or any(c < before for c in offered):
            out.append(f"offered chunks {list(offered)}, a full-attention group stores {want}"
                       f" (every non-null chunk from {before} to {after})")
    return out


def computed_tokens(status: str, num_tokens: int, num_computed_tokens: int, num_scheduled_tokens: int = 0) -> int:
    """Tokens whose KV the forward has written once this step's batch ran: a running
    request's computed and scheduled tokens; a finished one never forwards its final
    sampled token; an aborted one stops at what it computed."""
    if status == RUNNING:
        return num_computed_tokens + num_scheduled_tokens
    if status == FINISHED:
        return min(num_computed_tokens, num_tokens - 1)
    return num_computed_tokens
