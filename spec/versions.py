"""Which vLLM release does what: the one release table (``RELEASES``), and the one place that
orders releases.

Every behaviour is written once, at the first release that has it, with the vLLM lines it
was read from (that release's wheel; docs/vllm-semantics.md "Load contract", docs/lookup.md
and docs/trace.md "Shadow KV" have the lines around them):

- ``ARRIVALS``: a behaviour that arrives and stays (column -> its first release, the source);
- ``STEPS``: a column whose value changes rather than arrives (the scan variant, the window
  assert's slack, ...): each value from its first release on, with the source.

``RELEASES`` has one row (``ReleaseFeatures``) per release where something changes; a release
runs the last row at or before it (``release_features``). The ``allocator`` column is derived:
the first release of the run of rows over which the ``allocator_*`` columns hold.

Release order is this module's alone (nothing else in kvbound compares versions,
tests/test_spec.py holds it): ``Span`` (a run of releases, printed ``first – last``),
``between``, ``spans`` (the runs over which some columns hold), ``first_release`` /
``last_release`` and ``expand_releases`` (the ``--vllm A..B`` syntax).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Callable

from kvbound.errors import UnsupportedVersion, UsageError

from .case import Case
from .vocab import ReleaseFeatures, Variant

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")
_CONNECTOR_FIRST = "0.19.0"  # the first release with an offloading connector scheduler (before the table)

_S = "offloading/scheduler.py"  # vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py
_STM = "v1/core/single_type_kv_cache_manager.py"  # MambaManager, align mode

# A behaviour that arrives and stays: column -> (first release, where it was read).
ARRIVALS: dict[str, tuple[str, str]] = {
    # update_state_after_alloc and case format v2 (docs/vllm-semantics.md, "Load contract")
    "partial_tails": ("0.28.0", f"RequestOffloadState.partial_tail_boundary (0.28.0 {_S}:332) and its assert "
                                "(:1005); never with an EAGLE group (supports_partial_tail, :271-290); 0.27.0 has none"),
    "eagle_partial_tails": ("0.33.0", f"EAGLE groups allowed, keyed at boundary + margin (_eagle_proof_margins, 0.33.0 "
                                      f"{_S}:603-621; 0.32.0 :313 refuses them)"),
    "extra_retained_tokens": ("0.28.0", "SlidingWindowSpec.extra_retained_tokens (0.28.0 v1/kv_cache_interface.py:544; "
                                        "absent in 0.27.0); the offload window ignores it"),
    "window_counts_retained": ("0.31.0", f"the window in chunks counts extra_retained_tokens (0.31.0 {_S}:127-137; "
                                         "0.30.0 :124-128 cdiv(w, tpc))"),
    "group_subsets": ("0.30.0", "configs carry group_idx: the tables are blocks.blocks[group_idx] (before: by position)"),
    "sync_loads": ("0.33.0", f"the connector may load synchronously (0.33.0 {_S}:1277 `... and not sync_load`; "
                             "0.28 - 0.32 return `bool(num_hit_tokens)`, always async: 0.29.0 :991, 0.32.0 :1097)"),
    # what an engine of the release can be built with (kvbound trace's layouts need them)
    "mamba_external_kv": ("0.23.0", "Mamba takes connector tokens: 0.22.1 v1/core/sched/scheduler.py:286 `assert "
                                    "num_external_computed_tokens == 0` in _mamba_block_aligned_split is gone"),
    "multi_connector": ("0.21.0", "MultiConnector(KVConnectorBase_V1, SupportsHMA) takes an out-of-tree child by "
                                  "kv_connector_module_path (0.21.0 kv_connector/v1/multi_connector.py:128, "
                                  "vllm/config/kv_transfer.py:63; the first tree kvbound prepares)"),
    "tiering_spec": ("0.22.1", "TieringOffloadingSpec with its two secondary tiers: the file-system tier, whose"
                               " thread pool kvbound holds on the step clock (0.22.1"
                               " v1/kv_offload/tiering/fs/manager.py,"
                               " fs/thread_pool.py; wait_idle from 0.24.0, fs/thread_pool.py:129-139), and the example"
                               " tier, an in-memory reference tier that completes every job at once"
                               " (tiering/example/manager.py); both registered in tiering/factory.py:56-57; 0.21.0 has"
                               " no tiering spec"),
    "tier_async_lookup": ("0.24.0", "the file-system tier answers lookups on a thread, FsAsyncLookupManager"
                                    " (0.24.0 v1/kv_offload/tiering/fs/manager.py:45,133); before, a lookup is"
                                    " the file's os.path.exists, answered at once (0.23.0"
                                    " tiering/fs/manager.py:118-122)"),
    "request_level_tier": ("0.23.0", "a secondary tier may ask for request-level offload: OffloadPolicy.REQUEST_LEVEL"
                                     " (0.23.0 v1/kv_offload/base.py; 0.33.0 :130-141), which the tiering manager"
                                     " cascades chunks already in the primary tier to (0.23.0"
                                     " tiering/manager.py:433-444; 0.33.0 :862-935) and the connector answers by"
                                     f" offering hit chunks too (0.33.0 {_S}:1467-1471); 0.22.1 has no OffloadPolicy"),
    "hisparse": ("0.30.0", "HiSparse beside the OffloadingConnector: a MultiConnector of HiSparseConnector"
                           " (0.30.0 kv_connector/v1/hisparse/connector.py) and the connector, which offloads the"
                           " indexer group alone and bounds each load by the groups it does not offload"
                           " (0.30.0 offloading_connector.py:54-66,168-185 _max_loadable_tokens); vLLM's builder"
                           " v1/hisparse/layout.py; 0.29.0 has no v1/hisparse"),
    "hisparse_mla_only": ("0.31.0", "vLLM's builder lays HiSparse out for a model of sparse-MLA layers alone (0.31.0"
                                    " v1/hisparse/layout.py:70 `if not mla_specs`); 0.30.0's only beside another"
                                    " attention layer (0.30.0 :64 `if not mla_specs or not other_specs: return None`)"),
    "tiering_backpressure": ("0.31.0", "a secondary tier's backpressure detector, configured per tier"
                                       " (\"backpressure\": {\"backpressure_cls\", \"policy_cls\"}, 0.31.0"
                                       " v1/kv_offload/tiering/factory.py:73-90), asked before each store to the"
                                       " tier (tiering/manager.py:347-353, :688, :744); 0.30.0 has no"
                                       " tiering/backpressure.py"),
    "tiering_fs": ("0.30.0", "TieringOffloadingSpec's secondary-tier jobs name the primary chunks they copy, "
                             "TransferJob(keys, chunk_ids) (0.30.0 v1/kv_offload/tiering/base.py:60-67), which is "
                             "what shadow KV follows a file-system tier's copies by; the spec and its file-system "
                             "tier exist from 0.22.1 (tiering/spec.py, tiering/fs/manager.py), but 0.28.0-0.29.0 "
                             "jobs carry no chunk ids and 0.22.1-0.27.0 have no TransferJob"),
    "connector_reset_cache": ("0.22.1", "OffloadingConnector.reset_cache, which reset_prefix_cache(reset_connector=True)"
                                        " calls (0.22.1 kv_connector/v1/offloading_connector.py:177-180,"
                                        " v1/core/sched/scheduler.py:1896; 0.33.0 offloading_connector.py:241-244,"
                                        f" {_S}:2401-2459; 0.21.0 has none)"),
    "load_tier_filter": ("0.27.0", "a request's kv_transfer_params kv_load_tiers, parsed into ReqContext.load_tier_filter"
                                   f" (0.27.0 {_S}:61,387; 0.33.0 {_S}:72,496-552, applied by the tiering manager,"
                                   " v1/kv_offload/tiering/manager.py:647; 0.26.0 has none)"),
    "max_load_tokens": ("0.31.0", f"a request's kv_transfer_params max_load_tokens caps its hit (0.31.0 {_S}:367,391-393;"
                                  f" 0.33.0 {_S}:384-396,866-870,1097-1101; 0.30.0 has none)"),
    "max_offload_tokens": ("0.23.0", f"a request's kv_transfer_params max_offload_tokens caps what it offloads (0.23.0"
                                     f" {_S}:183,197-207,737-739; 0.33.0 {_S}:399-410,762-768,1662-1668; 0.22.1 has"
                                     " none)"),
    "retention_interval": ("0.30.0", "the connector reads CacheConfig.prefix_cache_retention_interval (0.30.0"
                                     f" {_S}:176; 0.33.0 {_S}:206,1852-1901; 0.29.0 has the config field,"
                                     " vllm/config/cache.py:156, but no connector line reads it)"),
    "schedule_end_hook": ("0.23.0", "OffloadingManager.on_schedule_end (0.23.0 v1/kv_offload/base.py:260)"),
    "offload_prompt_only": ("0.23.0", "kv_connector_extra_config offload_prompt_only (0.23.0 v1/kv_offload/base.py:397; "
                                      "no 0.22.1 file names it)"),
    "prefix_match_unit": ("0.26.0", "CacheConfig.prefix_match_unit (0.26.0 vllm/config/cache.py:56; 0.25.1's pydantic "
                                    "CacheConfig refuses the keyword)"),
    "chunked_local_offload": ("0.28.0", f"the connector offloads chunked local attention (0.28.0 {_S}:116; 0.27.0 "
                                        ":118 `assert isinstance(kv_cache_spec, FullAttentionSpec)`)"),
    "single_attention_hybrid": ("0.29.0", "HybridKVCacheCoordinator takes a single attention spec (0.28.0 "
                                          "v1/core/kv_cache_coordinator.py:682 \"requires at least two attention "
                                          "groups\" is gone)"),
    # the lookup (docs/lookup.md has the lines)
    "lookup_eagle": ("0.24.0", f"EAGLE groups pop their trailing chunk, Mamba align caps the hit (0.29.0 {_S}:715-717)"),
    "lookup_defers_on_transfers": ("0.24.0", f"defer while transfer_jobs; skip_reading_prefix_cache (0.29.0 "
                                             f"{_S}:962-966, :973)"),
    "lookup_result_enum": ("0.25.0", "LookupResult: RETRY; HIT_PENDING extends a sliding-window run (0.25.1 "
                                     f"{_S}:390-410; 0.21.0 v1/kv_offload/cpu/manager.py:87-93 True/None/False)"),
    "lookup_swa_gap_clears_pending": ("0.30.0", f"a gap clears a sliding window's pending flag (0.30.0 {_S}:706-713)"),
    "lookup_eagle_widens_every_group": ("0.30.0", f"EAGLE widening for every group (#52735; 0.30.0 {_S}:825-831)"),
    "lookup_load_window": ("0.30.0", f"load_window_size_in_chunks widens the first window (0.30.0 {_S}:107-121)"),
    "lookup_partial_tail_bridge": ("0.33.0", "the partial-tail bridge chunk and a second search block with EAGLE proof "
                                             f"margins (0.33.0 {_S}:1068-1152, :1154-1158)"),
    # the store (_build_store_jobs; spec/store.py, docs/trace.md "Shadow KV")
    "next_stored_chunk_idx": ("0.26.0", f"RequestGroupState.next_stored_chunk_idx (0.26.0 {_S}:238; 0.25.1 :229 "
                                        "counts blocks, next_stored_block_idx)"),
    "store_aborted_at_computed": ("0.27.0", f"an aborted request's horizon is num_computed_tokens (0.27.0 "
                                            f"{_S}:1038-1041; 0.26.0 :941-945 num_tokens)"),
    "store_caps_at_allocated": ("0.27.0", f"storable_chunks caps at the allocated chunks (0.27.0 {_S}:338-364; 0.26.0 "
                                          ":975 `assert len(offload_keys) == len(offload_block_ids)`)"),
    "store_finished_clamp": ("0.30.0", "a finished request's horizon is max(num_prompt_tokens, num_tokens - 1) (0.30.0 "
                                       f"{_S}:1482-1485)"),
    "store_caps_at_keyed": ("0.30.0", f"storable_chunks caps at the keyed chunks, len(offload_keys): a chunk whose block "
                                      f"hash has not arrived waits (0.30.0 {_S}:450-451; 0.33.0 :472-473; 0.29.0 "
                                      ":382-408 caps at the allocated chunks only)"),
    "store_skips_cow_source": ("0.29.0", f"_build_store_jobs offers nothing of a copy-on-write source group "
                                         f"(requires_cow_source, Mamba align: its state comes from the CoW hand-off) "
                                         f"(0.29.0 {_S}:1359-1360; 0.33.0 :1904-1905; 0.28.0 :1278-1287 offers its "
                                         "block table's chunks)"),
    "store_drafter_tail_at_finish": ("0.30.0", f"storable_chunks lifts a drafter (EAGLE/MTP) group's trailing-chunk "
                                               f"hold-back once the request has finished (0.30.0 {_S}:442-446; 0.33.0 "
                                               ":464-468; 0.26.0 :324-327 and 0.29.0 :401-404 hold it back while "
                                               "decoding, finished or not)"),
    "untagged_groups_non_draft": ("0.30.0", f"speculative decoding (use_eagle_block_drop) with no group tagged "
                                            f"is_eagle_group: every group is non-draft (0.30.0 {_S}:218-243; 0.33.0 "
                                            ":208-232; 0.29.0 :220-231 and 0.26.0 :180-191: use_eagle() makes every "
                                            "group a drafter's)"),
    # the allocator: MambaManager's align-mode code (proofs/allocator.py)
    "allocator_checkpoints": ("0.29.0", f"a prefill checkpoint block: MambaManager._needs_internal_checkpoint (0.29.0 "
                                        f"{_STM}:1565; 0.28.0 has none)"),
    "allocator_early_return_needs_no_checkpoint": ("0.30.0", "allocate_new_blocks returns [] only without a "
                                                             "checkpoint block"),
    "allocator_new_blocks_clamped": ("0.30.0", "num_new_blocks = max(num_required_blocks - len(req_blocks), 0)"),
    "allocator_cap_is_min": ("0.31.0", "get_num_blocks_to_allocate takes min(num_new_blocks, physical_block_cap); "
                                       "before, num_new_blocks = cap"),
}

_L, _F, _FS = Variant.LEGACY, Variant.FIXED, Variant.FIXED_SYNC

# A column whose value changes: column -> ((first release, value from it on, where it was read), ...).
STEPS: dict[str, tuple] = {
    "variant": (
        ("0.20.0", _L, "the load-start scan from 0, then `assert N <= start * b`"),
        ("0.30.0", _F, "the scan from cdiv(N, b), then `assert N % b == 0`"),
        ("0.33.0", _FS, "as fixed; a sync load matches any non-null block by position"),
    ),
    # what an engine of the release can be built with (kvbound trace's fault settings need it)
    "transfer_failures": (
        ("0.20.0", False, "the worker asserts every job succeeded (0.33.0 offloading/worker.py:299-301 `# we "
                          "currently do not support job failures` / `assert transfer_result.success`; 0.21.0 :327); "
                          f"the scheduler never calls complete_store(success=False) (0.33.0 {_S}:2291)"),
    ),
    "window_slack": (
        ("0.20.0", None, "no window assert"),
        ("0.21.0", 0, "the window assert `pending <= window * bpc`"),
        ("0.27.0", 1, "`pending <= window * bpc + 1`"),
    ),
    "keys_every_group": (
        ("0.20.0", True, "every group's keys are checked, pending blocks or not"),
        ("0.28.0", False, "keys checked only where blocks are pending"),
    ),
    # the allocator (None: not modelled; the model covers 0.28 on)
    "allocator_relocation": (
        ("0.20.0", None, "not modelled"),
        ("0.28.0", "skipped", "_relocate_speculative_block moves the blocks below the skipped blocks"),
        ("0.30.0", "no-checkpoint", "only on a step without a checkpoint block"),
        ("0.32.0", "below-checkpoint", "below skipped - checkpoint (0.33 changes only the checkpoint position's "
                                       "arguments, which the model leaves free)"),
    ),
    "allocator_checkpoint_keeps_count": (
        ("0.20.0", False, "no such step"),
        ("0.30.0", True, "a running request's checkpoint step keeps the uncapped count"),
        ("0.31.0", False, "the cap is a min"),
    ),
    # what an engine of the release can be built with: CacheConfig.mamba_cache_mode "all" (a Mamba state
    # cached at every block boundary; kvbound trace's mamba-all layouts)
    "mamba_cache_all": (
        ("0.20.0", True, "MambaCacheMode = Literal[\"all\", \"align\", \"none\"] (0.21.0 vllm/config/cache.py:36, "
                         "the first tree kvbound prepares; deprecated with a warning in 0.30.0 cache.py:323-330)"),
        ("0.32.0", False, "MambaCacheMode = Literal[\"align\", \"none\"] (0.32.0 vllm/config/cache.py:63): \"all\" "
                          "is gone"),
    ),
    # a column no release has yet: what a proposed patch changes (PATCHES below)
    "lookup_deferral_keeps_bound": (
        ("0.20.0", False, f"a full-attention group that defers answers None and its count is thrown away "
                          f"(0.33.0 {_S}:773-803 `return hit_count if not defer_lookup else None`, :981-982): "
                          "its chunks up to the first miss never bound the hit"),
    ),
    "allocator_spec_blocks_with_checkpoint": (
        ("0.20.0", False, "no such step"),
        ("0.30.0", True, "a running request's checkpoint step also adds num_speculative_blocks"),
        ("0.32.0", False, "num_speculative_blocks no longer added on checkpoint steps"),
    ),
}

# A patch kvbound proposes to vLLM that changes what a column models: name -> (the release it is
# written against, {column: its value with the patch}, the patch). A tree with the patch applied is
# judged as ``"<release>+<name>"`` (``release_features``; ``kvbound review --models NAME``): the
# release's row with those values, so the spec models the patched code, not the release's.
PATCHES: dict[str, tuple[str, dict, str]] = {
    "lookup-defers-on-unusable-pending-chunk": (
        "0.33.0", {"lookup_deferral_keeps_bound": True},
        "docs/upstream/lookup-defers-on-unusable-pending-chunk/patch.diff: _maximal_prefix_lookup counts every "
        f"chunk up to the first miss and says whether it deferred; the deferral is OR-ed in after the group "
        f"bounds the hit, and an EAGLE group whose own chunks defer is not marked verified ({_S}:777-803, "
        ":947-996 patched)"),
}

_ALLOCATOR_COLUMNS = tuple(f.name for f in fields(ReleaseFeatures) if f.name.startswith("allocator_"))


def parse_version(version: str) -> tuple[int, int, int]:
    m = _VERSION.match(version.strip()) if isinstance(version, str) else None
    if not m:
        raise UnsupportedVersion(f"vLLM version {version!r} is not of the form MAJOR.MINOR[.PATCH], e.g. 0.29.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _value(column: str, release: str):
    if column in ARRIVALS:
        return parse_version(release) >= parse_version(ARRIVALS[column][0])
    value = None
    for first, v, _ in STEPS[column]:
        if parse_version(first) <= parse_version(release):
            value = v
    return value


def _rows() -> tuple:
    firsts = {first for first, _ in ARRIVALS.values()} | {s[0] for steps in STEPS.values() for s in steps}
    out, code = [], None
    for r in sorted(firsts, key=parse_version):
        row = ReleaseFeatures(**{c: _value(c, r) for c in (*ARRIVALS, *STEPS)}, release=r)
        if row.allocator_relocation is None:
            code = None
        elif code is None or any(getattr(row, c) != getattr(out[-1], c) for c in _ALLOCATOR_COLUMNS):
            code = r
        out.append(replace(row, allocator=code))
    return tuple(out)


assert set(ARRIVALS) | set(STEPS) | {"allocator", "release"} == {f.name for f in fields(ReleaseFeatures)}
RELEASES: tuple[ReleaseFeatures, ...] = _rows()
LATEST = RELEASES[-1].release  # the newest release the table knows
assert RELEASES[-1] == replace(ReleaseFeatures(), release=LATEST)  # the dataclass defaults are the latest row

# The release of each minor version a campaign traces (``kvbound campaign --vllm A..B``):
# the newest patch release of that minor on PyPI when it was pinned. 0.21 is the first with
# a hybrid-capable offloading connector that kvbound drives (docs/trace.md).
CAMPAIGN_RELEASES = ("0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.0", "0.28.0",
                     "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0")
_ROW_RELEASES = tuple(f.release for f in RELEASES)
_ROW_KEYS = tuple((parse_version(f.release), f) for f in RELEASES)


def _minor(release: str) -> str:
    """How a message names a release's minor version: 0.28.0 -> 0.28."""
    return "%d.%d" % parse_version(release)[:2]


def arrived(column: str) -> str:
    """The minor version a behaviour of ``ARRIVALS`` arrived in, as messages name it (0.28)."""
    return _minor(ARRIVALS[column][0])


@lru_cache(maxsize=None)
def release_features(version: str) -> ReleaseFeatures:
    """The row of ``RELEASES`` that ``version`` runs. Pre-releases map by their base.
    ``"<release>+<patch>"`` with a name of ``PATCHES``: that release's row with the columns the
    patch changes; any other ``+label`` is a PEP 440 local version (a build of the release, as
    vLLM's ``0.29.0+cu130`` wheels are) and runs the release's row."""
    version, _, label = version.partition("+")
    patch = label.rpartition("+")[2]  # "0.33.0+cu130+<patch>": a build of the release, patched
    if patch in PATCHES:
        return _patched_row(version, patch)
    v = parse_version(version)
    if v[:2] < parse_version(_CONNECTOR_FIRST)[:2]:
        raise UnsupportedVersion(f"vLLM {version} has no offloading connector scheduler (it arrived in "
                                 f"{_minor(_CONNECTOR_FIRST)})")
    if v[:2] < _ROW_KEYS[0][0][:2]:
        raise UnsupportedVersion(
            f"vLLM {version} counts hashed blocks of group 0 only (no scan); kvbound models"
            f" {_minor(RELEASES[0].release)} and later"
        )
    return [f for key, f in _ROW_KEYS if key[:2] <= v[:2]][-1]


def _patched_row(version: str, patch: str) -> ReleaseFeatures:
    base, values, _ = PATCHES[patch]
    row = release_features(version)
    if row is not release_features(base):
        raise UnsupportedVersion(f"vLLM {version}+{patch}: the patch {patch} is modelled on vLLM {base}'s code,"
                                 f" and {version} runs another row of the release table")
    return replace(row, **values, release=f"{row.release}+{patch}")


def first_release(test: Callable[[ReleaseFeatures], object]) -> str:
    """The first row of ``RELEASES`` that passes ``test``."""
    return next(f.release for f in RELEASES if test(f))


def last_release(test: Callable[[ReleaseFeatures], object]) -> str:
    """The last row of ``RELEASES`` that passes ``test``."""
    return [f.release for f in RELEASES if test(f)][-1]


# What ``plan_load(case, variant)`` models when no release is named: the variant's last release.
REPRESENTATIVE = {v: last_release(lambda f, v=v: f.variant is v) for v in Variant}


# --- release order ---------------------------------------------------------------------

@dataclass(frozen=True)
class Span:
    """A run of releases the table knows (rows or campaign releases), ``first`` to ``last``
    inclusive; ``str`` prints it as the docs do: ``0.28.0 – 0.33.0`` (one release: ``0.33.0``)."""

    first: str
    last: str = ""  # default: ``first``

    def __post_init__(self):
        if not self.last:
            object.__setattr__(self, "last", self.first)
        for r in (self.first, self.last):
            if r not in _ROW_RELEASES and r not in CAMPAIGN_RELEASES:
                raise ValueError(f"vLLM {r} is neither a row of RELEASES nor a campaign release")
        if parse_version(self.first) > parse_version(self.last):
            raise ValueError(f"releases {self.first} – {self.last} run backwards")

    @property
    def features(self) -> ReleaseFeatures:
        """The row its first release runs."""
        return release_features(self.first)

    def __str__(self) -> str:
        return self.first if self.first == self.last else f"{self.first} – {self.last}"


def between(lo: str, hi: str, among=CAMPAIGN_RELEASES) -> list[str]:
    """The releases of ``among`` from ``lo`` to ``hi`` inclusive, in release order."""
    a, b = parse_version(lo), parse_version(hi)
    return sorted((r for r in among if a <= parse_version(r) <= b), key=parse_version)


def spans(columns, among=_ROW_RELEASES) -> list[Span]:
    """The maximal runs of ``among`` (in release order) over which ``columns`` each hold one value."""
    out, key = [], None
    for r in sorted(among, key=parse_version):
        k = tuple(getattr(release_features(r), c) for c in columns)
        if out and k == key:
            out[-1] = Span(out[-1].first, r)
        else:
            out.append(Span(r))
        key = k
    return out


def expand_releases(specs: list) -> list:
    """``--vllm`` values: a release (0.29.0), a range (0.21.0..0.33.0: every release of
    ``CAMPAIGN_RELEASES`` between them, inclusive), or a comma list."""
    out = []
    for spec in specs:
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            if ".." in part:
                lo, _, hi = part.partition("..")
                if parse_version(lo) > parse_version(hi):
                    raise UsageError(f"--vllm {part}: the range runs backwards ({lo} > {hi})")
                got = between(lo, hi)
                if not got:
                    raise UsageError(f"--vllm {part}: no release of the campaign list lies in it"
                                     f" ({', '.join(CAMPAIGN_RELEASES)})")
                out += got
            else:
                parse_version(part)
                out.append(part)
    return list(dict.fromkeys(out))


# --- what a release runs ---------------------------------------------------------------

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
                f" (group {off} is not offloaded; group subsets arrived in {arrived('group_subsets')})")
    if not feats.extra_retained_tokens:
        for i, g in enumerate(case.groups):
            if g.config.extra_retained_tokens:
                return (f"{r} has no SlidingWindowSpec.extra_retained_tokens (group {i} retains"
                        f" {g.config.extra_retained_tokens}; the field arrived in {arrived('extra_retained_tokens')})")
    if case.partial_tail_boundary is not None:
        if not feats.partial_tails:
            return f"{r} has no partial tails (partial_tail_boundary arrived in {arrived('partial_tails')})"
        if not feats.eagle_partial_tails:
            why = case.partial_tail_refusal(eagle_groups_allowed=False)
            if why is not None:
                return f"{r}: supports_partial_tail is False: {why}"
    return None
