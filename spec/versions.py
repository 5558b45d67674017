"""Which vLLM release does what: the one feature-by-release table (``RELEASES``).

Each row is the first release of a behaviour and holds until the next row. Every
fact was read from that release's wheel; file:line are in docs/vllm-semantics.md
("Load contract") and beside each row below.
"""

from __future__ import annotations

import re
from dataclasses import replace

from kvbound.errors import UnsupportedVersion

from .case import Case
from .vocab import ReleaseFeatures, Variant

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


_L, _F, _S = Variant.LEGACY, Variant.FIXED, Variant.FIXED_SYNC
_COLUMNS = ("variant", "window_slack", "keys_every_group", "partial_tails", "eagle_partial_tails",
            "extra_retained_tokens", "window_counts_retained", "group_subsets", "sync_loads", "allocator",
            "mamba_external_kv", "schedule_end_hook", "offload_prompt_only", "prefix_match_unit",
            "chunked_local_offload",
            "single_attention_hybrid",
            "lookup_eagle", "lookup_defers_on_transfers", "lookup_result_enum", "lookup_swa_gap_clears_pending",
            "lookup_eagle_widens_every_group", "lookup_load_window", "lookup_partial_tail_bridge")

# The first release of each behaviour; it holds until the next row. Sources (docs/vllm-semantics.md):
#  0.20 scan from 0 + `N <= start*b`; no window assert; keys checked for every group
#  0.21 window assert `pending <= window*bpc`;  0.27 `... + 1`
#  0.28 keys checked only where pending; partial tails (never with an EAGLE group);
#       SlidingWindowSpec.extra_retained_tokens exists, the offload window ignores it
#  0.30 fixed scan from cdiv(N, b) + `N % b == 0`; configs carry group_idx: blocks.blocks[group_idx]
#  0.31 the window in chunks counts extra_retained_tokens
#  0.33 sync loads match by position; partial tails with EAGLE groups, keyed at boundary + margin;
#       the connector may load synchronously (offloading/scheduler.py:1277 `... and not sync_load`;
#       0.28 - 0.32 return `bool(num_hit_tokens)`, always async: 0.29.0 :991, 0.32.0 :1097)
# The allocator column: MambaManager's align-mode code (v1/core/single_type_kv_cache_manager.py),
# by the first release of each version of it (proofs/allocator.py, AllocatorCode, says what
# changed): 0.28 no checkpoint block; 0.29 checkpoint block; 0.30 checkpoint restructured;
# 0.31 min(num_new, cap); 0.32 num_speculative_blocks no longer added on checkpoint steps (0.33
# changes only the checkpoint position's arguments, which the model leaves free).
# What an engine can be built with (kvbound.trace.layouts.NEEDS; each release read):
#  0.23 Mamba takes connector tokens: 0.22.1 v1/core/sched/scheduler.py:286
#       `assert num_external_computed_tokens == 0` ("External KV connector is not verified
#       yet") in _mamba_block_aligned_split is gone; OffloadingManager.on_schedule_end
#       arrives (0.23.0 v1/kv_offload/base.py:260), and so does the extra config
#       offload_prompt_only (0.23.0 v1/kv_offload/base.py:397; no 0.22.1 file names it)
#  0.26 CacheConfig.prefix_match_unit (0.26.0 vllm/config/cache.py:56; 0.25.1's pydantic
#       CacheConfig refuses the keyword)
#  0.28 the connector offloads chunked local attention (0.28.0 offloading/scheduler.py:116;
#       0.27.0 offloading/scheduler.py:118 `assert isinstance(kv_cache_spec, FullAttentionSpec)`)
#  0.29 HybridKVCacheCoordinator takes a single attention spec (0.28.0
#       v1/core/kv_cache_coordinator.py:682 "requires at least two attention groups" is gone)
# The lookup columns (offloading/scheduler.py; docs/lookup.md has the lines):
#  0.24 EAGLE groups pop their trailing chunk, Mamba align caps the hit; defer while transfer_jobs
#  0.25 LookupResult (RETRY; HIT_PENDING extends a sliding-window run)
#  0.30 a gap clears a sliding window's pending flag; EAGLE widening for every group; load windows
#  0.33 the partial-tail bridge chunk and a second search block with EAGLE proof margins
_T, _N = True, False
RELEASES: tuple = tuple(
    ((int(v.split(".")[0]), int(v.split(".")[1])), ReleaseFeatures(**dict(zip(_COLUMNS, row)), release=v))
    for v, *row in (
        # release  variant slack keys_every partial eagle_pt retained win_retained subsets sync alloc
        #          | mamba_ext sched_end prompt_only pmu chunked one_attn | lookup: eagle transfers enum gap_clears widen_all load_window bridge
        ("0.20.0", _L, None, _T, _N, _N, _N, _N, _N, _N, None, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N),
        ("0.21.0", _L, 0, _T, _N, _N, _N, _N, _N, _N, None, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N),
        ("0.23.0", _L, 0, _T, _N, _N, _N, _N, _N, _N, None, _T, _T, _T, _N, _N, _N, _N, _N, _N, _N, _N, _N, _N),
        ("0.24.0", _L, 0, _T, _N, _N, _N, _N, _N, _N, None, _T, _T, _T, _N, _N, _N, _T, _T, _N, _N, _N, _N, _N),
        ("0.25.0", _L, 0, _T, _N, _N, _N, _N, _N, _N, None, _T, _T, _T, _N, _N, _N, _T, _T, _T, _N, _N, _N, _N),
        ("0.26.0", _L, 0, _T, _N, _N, _N, _N, _N, _N, None, _T, _T, _T, _T, _N, _N, _T, _T, _T, _N, _N, _N, _N),
        ("0.27.0", _L, 1, _T, _N, _N, _N, _N, _N, _N, None, _T, _T, _T, _T, _N, _N, _T, _T, _T, _N, _N, _N, _N),
        ("0.28.0", _L, 1, _N, _T, _N, _T, _N, _N, _N, "0.28.0", _T, _T, _T, _T, _T, _N, _T, _T, _T, _N, _N, _N, _N),
        ("0.29.0", _L, 1, _N, _T, _N, _T, _N, _N, _N, "0.29.0", _T, _T, _T, _T, _T, _T, _T, _T, _T, _N, _N, _N, _N),
        ("0.30.0", _F, 1, _N, _T, _N, _T, _N, _T, _N, "0.30.0", _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _N),
        ("0.31.0", _F, 1, _N, _T, _N, _T, _T, _T, _N, "0.31.0", _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _N),
        ("0.32.0", _F, 1, _N, _T, _N, _T, _T, _T, _N, "0.32.0", _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _N),
        ("0.33.0", _S, 1, _N, _T, _T, _T, _T, _T, _T, "0.32.0", _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T, _T),
    )
)
assert RELEASES[-1][1] == replace(ReleaseFeatures(), release="0.33.0")  # the dataclass defaults are 0.33

# The release of each minor version a campaign traces (``kvbound campaign --vllm A..B``):
# the newest patch release of that minor on PyPI when it was pinned. 0.21 is the first with
# a hybrid-capable offloading connector that kvbound drives (docs/trace.md).
CAMPAIGN_RELEASES = ("0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.0", "0.28.0",
                     "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")

# What ``plan_load(case, variant)`` models when no release is named: the variant's last release.
REPRESENTATIVE = {Variant.LEGACY: "0.29.0", Variant.FIXED: "0.32.0", Variant.FIXED_SYNC: "0.33.0"}


def parse_version(version: str) -> tuple[int, int, int]:
    m = _VERSION.match(version.strip()) if isinstance(version, str) else None
    if not m:
        raise UnsupportedVersion(f"vLLM version {version!r} is not of the form MAJOR.MINOR[.PATCH], e.g. 0.29.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def release_features(version: str) -> ReleaseFeatures:
    """The row of ``RELEASES`` that ``version`` runs. Pre-releases map by their base."""
    major, minor, _ = parse_version(version)
    if (major, minor) < (0, 19):
        raise UnsupportedVersion(f"vLLM {version} has no offloading connector scheduler (it arrived in 0.19)")
    if (major, minor) < (0, 20):
        raise UnsupportedVersion(
            f"vLLM {version} counts hashed blocks of group 0 only (no scan); kvbound models 0.20 and later"
        )
    row = RELEASES[0][1]
    for first, feats in RELEASES:
        if (major, minor) >= first:
            row = feats
    return row


def variant_for_version(version: str) -> Variant:
    """0.20-0.29 legacy; 0.30-0.32 fixed; 0.33+ fixed-sync."""
    return release_features(version).variant


def __getattr__(name):
    """``release_asserts``, the v1 name of ``release_features``, behind a DeprecationWarning."""
    if name == "release_asserts":
        import warnings

        warnings.warn("kvbound.spec.release_asserts is the v1 name of release_features", DeprecationWarning,
                      stacklevel=2)
        return release_features
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def variant_features(variant: Variant | str) -> ReleaseFeatures:
    """The features ``plan_load`` gives a variant when no release is named: its last release's."""
    return _VARIANT_FEATURES[Variant(variant)]


_VARIANT_FEATURES = {v: release_features(r) for v, r in REPRESENTATIVE.items()}


def unsupported_reason(case: Case, feats: ReleaseFeatures) -> str | None:
    """Why the release cannot have made this call (a v2 feature it lacks), or None."""
    r = f"vLLM {feats.release}"
    if not feats.group_subsets and not all(g.config.offloaded for g in case.groups):
        off = next(i for i, g in enumerate(case.groups) if not g.config.offloaded)
        return (f"{r} offloads every KV-cache group and pairs its configs with blocks.blocks by position"
                f" (group {off} is not offloaded; group subsets arrived in 0.30)")
    if not feats.extra_retained_tokens:
        for i, g in enumerate(case.groups):
            if g.config.extra_retained_tokens:
                return (f"{r} has no SlidingWindowSpec.extra_retained_tokens (group {i} retains"
                        f" {g.config.extra_retained_tokens}; the field arrived in 0.28)")
    if case.partial_tail_boundary is not None:
        if not feats.partial_tails:
            return f"{r} has no partial tails (partial_tail_boundary arrived in 0.28)"
        if not feats.eagle_partial_tails:
            why = case.partial_tail_refusal(eagle_groups_allowed=False)
            if why is not None:
                return f"{r}: supports_partial_tail is False: {why}"
    return None


def plan_for_version(case, version: str, asserts: bool = True):
    """The spec's plan of ``case`` as vLLM ``version`` computes it."""
    from .plan import plan_load

    feats = release_features(version)
    return plan_load(case, feats.variant, asserts, feats)
