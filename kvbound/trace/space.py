"""The configuration space ``kvbound trace`` and ``kvbound campaign`` explore.

A *point* is a named layout (its model: groups, block sizes, hash unit, drafter; and its
settings) with a value on every axis, plus the seed its traffic is drawn from. A named layout
(``layouts.LAYOUTS``) is the point whose axes all keep the layout's own values, so a point is
spelled ``<layout>`` or ``<layout>@<axis>=<value>,...`` (axes in ``AXES`` order, only those
moved off the layout's value): ``mamba-eagle-untagged@prefix_burst_p=0.5``. That name is what
a campaign cell, a finding and its trace file carry; ``resolve`` turns it back into the
``Layout`` record the worker builds, so every point replays from its name.

Each axis declares its values and, per value, what it needs of a release (a ``Need``: a column
of the one release table, with the vLLM lines) and of the layout (``applies``): a point a
release cannot run is one line saying why (``support``), never a traceback.

``--axis K=V1,V2`` pins (one value) or widens (several) an axis on the command line: the run
then covers every base layout times every combination (``points``); ``--explore N`` adds N
points drawn from the whole space with the run's seed (``explore``), with no clock involved,
so the same command gives the same points.

A campaign's default (no ``--layout``, ``--point`` or ``--axis``) is every named layout and the
``SWEEP``: points that put each axis value no named layout holds on the layouts where it acts,
so the default campaign runs every axis on each release that supports it (a value no campaign
release runs, such as a failed transfer, is left out: ``support`` says why on every release).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass

from kvbound.errors import UsageError
from kvbound.side import tier_pressure

from . import layouts as L

MAMBA_KINDS = (L.MAMBA,)


def _has_mamba(lay: L.Layout) -> bool:
    return any(g["kind"] in MAMBA_KINDS for g in lay.groups)


def _always(lay: L.Layout) -> bool:
    return True


def _tiering_fs(lay: L.Layout) -> bool:
    return lay.offload_spec == "tiering-fs"


_TIERING_FS_DOC = "the tiering spec's file-system tier (offload_spec tiering-fs)"
_TIERING_DOC = "the tiering spec (offload_spec tiering-fs or tiering-example)"


def _tiering(lay: L.Layout) -> bool:
    return lay.offload_spec in ("tiering-fs", "tiering-example")


def _multi_pd_one_group(lay: L.Layout) -> bool:
    return lay.composition == "multi-pd" and len(lay.groups) == 1


@dataclass(frozen=True)
class Axis:
    """One axis: its values as the command line spells them, where a value goes (a ``Layout``
    field, or ``engine`` for an engine setting of ``layouts.ENGINE_PARAMS``), what each value
    needs of a release, and which layouts it applies to."""

    name: str
    values: tuple  # strings, the first one each layout's default unless it sets its own
    doc: str
    target: str  # "field" (a Layout field) or "engine" (an ENGINE_PARAMS setting)
    needs: dict = dataclasses.field(default_factory=dict)  # value -> (Need, ...)
    applies: object = _always  # Layout -> bool
    applies_doc: str = ""

    def parse(self, text: str):
        if self.target == "engine":
            return L.OVERRIDES[self.name].parse(text)  # every engine axis is an --engine key
        return int(text) if text.isdigit() else text

    def value_of(self, lay: L.Layout) -> str:
        """The layout's own value on this axis, as the command line spells it."""
        v = lay.params().get(self.name) if self.target == "engine" else getattr(lay, self.name)
        if v is None:
            return self.values[0]
        return str(v).lower() if isinstance(v, bool) else str(v)

    def apply(self, lay: L.Layout, text: str) -> L.Layout:
        value = self.parse(text)
        if self.target == "engine":
            return dataclasses.replace(lay, engine=dict(lay.engine, **{self.name: value}),
                                       needs=lay.needs + self.needs.get(text, ()))
        if text == self.values[0] and _LAYOUT_DEFAULTS[self.name] is None:  # a field's None is its first value
            value = None
        return dataclasses.replace(lay, needs=lay.needs + self.needs.get(text, ()), **{self.name: value})


_LAYOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(L.Layout)}

AXES = (
    Axis("blocks_per_chunk", ("1", "2", "4"), "GPU blocks per offloaded chunk", "field"),
    Axis("mamba_cache_mode", ("align", "all"), "CacheConfig.mamba_cache_mode", "field",
         {"all": (L.MAMBA_CACHE_ALL,)}, _has_mamba, "Mamba layouts only"),
    Axis("composition", ("alone", "multi-pd"), "the OffloadingConnector alone, or in a MultiConnector after a"
         " P/D consumer (side/pd_connector.py)", "field", {"multi-pd": (L.MULTI_CONNECTOR,)}),
    Axis("pd_hma", ("true", "false"), "the P/D consumer beside it declares SupportsHMA (false: one that predates"
         " the hybrid allocator; vLLM then turns the hybrid allocator off and the MultiConnector finishes"
         " requests through each child's request_finished)", "engine",
         applies=_multi_pd_one_group, applies_doc="composition multi-pd on one KV-cache group (a MultiConnector with a child that is not"
                     " HMA asserts one group, 0.33.0 kv_connector/v1/multi_connector.py:618-622)"),
    Axis("offload_spec", ("cpu", "tiering-fs", "tiering-example"), "CPUOffloadingSpec, or TieringOffloadingSpec"
         " with its file-system tier, or with its example tier (in memory, every job done at once; shadow off)",
         "field", {"tiering-fs": (L.TIERING_SPEC,), "tiering-example": (L.TIERING_SPEC,)}),
    Axis("shadow", ("true", "false"), "shadow KV on, or off (the lifecycle, lookup, store-call and liveness checks"
         " only): off, the tiering spec runs where shadow KV cannot follow its file tier (layouts.SHADOW_NEEDS)",
         "engine"),
    Axis("offload_prompt_only", ("true", "false"), "offload the prompt only, or decoded tokens too", "engine",
         {"true": (L.OFFLOAD_PROMPT_ONLY,)}),
    Axis("scheduler", ("run", "sync", "async"), "the scheduler of every segment (run: as the run says, --scheduler;"
         " a campaign alternates sync and async per segment)", "field", applies=lambda lay: lay.scheduler is None,
         applies_doc="layouts that leave it to the run (hisparse-swa runs the synchronous scheduler only: vLLM"
         " refuses its max_model_len under async scheduling)"),
    Axis("prefix_burst_p", ("0.0", "0.3", "0.5"), "the share of requests that start a shared-prefix burst",
         "engine"),
    Axis("abort_p", ("0.04", "0.0", "0.2"), "the share of requests aborted 0..8 steps after arrival", "engine"),
    # faults (their release needs: layouts.PARAM_NEEDS, checked by support for any setting that is on)
    Axis("evict_p", ("0.0", "0.1", "0.3"), "the scripted tier evicts chunks a lookup just confirmed", "engine"),
    Axis("stall_p", ("0.0", "0.05"), "the scripted tier's writes that never complete", "engine"),
    Axis("refuse_p", ("0.0", "0.1", "0.3"), "the scripted tier's prepare_store refuses (answers None)", "engine"),
    Axis("late_p", ("0.0", "0.1"), "a transfer job's completion arrives late_steps steps late", "engine"),
    Axis("fail_p", ("0.0", "0.05"), "a load job fails (TransferResult success=False)", "engine"),
    Axis("store_fail_p", ("0.0", "0.05"), "a store job fails (TransferResult success=False)", "engine"),
    Axis("tier_lose_p", ("0.0", "0.1"), "the secondary tier loses a key a promotion is about to read: the file"
         " tier's file is removed (the read fails there and vLLM keeps the blocks before it), the example tier"
         " forgets the key (the job fails) (side/tier_faults.py)", "engine",
         applies=_tiering, applies_doc=_TIERING_DOC),
    Axis("tier_torn_p", ("0.0", "0.1"), "a file a promotion is about to read is cut to half its bytes (a torn"
         " write, a bad disk): the read comes up short and vLLM removes the file (side/tier_faults.py)", "engine",
         applies=_tiering_fs, applies_doc=_TIERING_FS_DOC),
    Axis("tier_store_fail_p", ("0.0", "0.3"), "a store job to the file-system tier fails as a full disk fails it"
         " (ENOSPC in the tier's I/O thread; side/tier_faults.py)", "engine", applies=_tiering_fs,
         applies_doc=_TIERING_FS_DOC),
    Axis("tier_lookup_late_p", ("0.0", "0.5"), "the file-system tier's lookup thread answers a step's probes"
         " late_steps steps late (a slow file system; side/tier_clock.py)", "engine",
         applies=_tiering_fs, applies_doc=_TIERING_FS_DOC),
    Axis("tier_backpressure", ("off", *tier_pressure.POLICIES), "the file-system tier's backpressure detector (vLLM's"
         " EMABackpressureDetector, asked before each store to the tier) with ThrottledDropPolicy or"
         " DropStorePolicy; the latency it measures is modelled on the step clock (side/tier_pressure.py)",
         "engine", applies=_tiering_fs, applies_doc=_TIERING_FS_DOC),
    Axis("tier_store_slow_p", ("0.0", "0.3"), "a store to the file-system tier runs at 20 MiB/s instead of 2 GiB/s"
         " as the backpressure detector measures it, with this probability per store (a congested file system;"
         " side/tier_pressure.py; refused without tier_backpressure, which measures it)", "engine",
         applies=_tiering_fs, applies_doc=_TIERING_FS_DOC),
    Axis("request_tier_p", ("0.0", "0.5"), "a second secondary tier, after the layout's own, that asks for"
         " request-level offload (every chunk of a request, its hits too, as the peer-to-peer tier asks on a P/D"
         " producer leg) on this share of requests, and is checked to get them (side/request_tier.py)", "engine",
         applies=_tiering, applies_doc=_TIERING_DOC),
    Axis("tier_start_fail", ("false", "true"), "the run's engine is first started with a secondary tier that"
         " cannot start after the layout's own, and what that failed start left behind is checked (its tiers"
         " shut down, its shared region's file gone from /dev/shm; side/failed_start.py)", "engine",
         applies=_tiering, applies_doc=_TIERING_DOC),
    Axis("tier_stop_fail", ("false", "true"), "the run's engine is first started with a secondary tier that"
         " cannot shut down before the layout's own and torn down, and the teardown is checked (every other tier"
         " given its shutdown, the failure reaching the caller; side/failed_start.py)", "engine",
         applies=_tiering, applies_doc=_TIERING_DOC),
    # the CPU tier's knobs, the scheduler's, and traffic (docs/trace.md "The configuration space")
    Axis("cpu_chunks", ("256", "32", "4"), "the CPU tier's capacity in chunks, exactly (32: pool pressure, the tier evicts:"
         " cpu/manager.py's eviction and the policies' evict paths; 4: fewer chunks than a prompt holds,"
         " so a store finds every idle chunk protected and the eviction fails, cpu/manager.py:321-337)",
         "engine"),
    Axis("eviction_policy", ("lru", "arc"), "the CPU tier's cache policy (kv_connector_extra_config)", "engine"),
    Axis("store_threshold", ("0", "2"), "offers of a chunk before the CPU tier stores it", "engine"),
    Axis("log_stats", ("false", "true"), "the scheduler keeps its stats (connector stats, hits by tier)", "engine"),
    Axis("retention_interval", ("0", "dense"), "CacheConfig.prefix_cache_retention_interval (dense: None)",
         "engine"),
    Axis("reset_p", ("0.0", "0.02", "0.1"), "per step, reset_prefix_cache(reset_connector=True) between steps",
         "engine"),
    Axis("load_tiers_p", ("0.0", "0.3"), "the share of requests with a tier filter (kv_load_tiers)", "engine"),
    Axis("load_limit_p", ("0.0", "0.3"), "the share of requests with a load limit (max_load_tokens)", "engine"),
    Axis("offload_limit_p", ("0.0", "0.3"), "the share of requests with an offload limit (max_offload_tokens)",
         "engine"),
    Axis("prompt_logprobs_p", ("0.0", "0.1"), "the share of requests asking prompt logprobs (skip reading the"
         " prefix cache)", "engine"),
    Axis("kv_events", ("false", "true"), "KV cache events on (KVEventsConfig enable_kv_cache_events): the offload"
         " tier's events checked against what it holds (side/kv_events.py)", "engine"),
)
BY_NAME = {a.name: a for a in AXES}


# The default campaign's points beside the named layouts (``chosen(..., sweep=True)``), each axis
# value no named layout holds put on the layouts where it acts: a hybrid's partial tails, a sliding
# window's freed blocks, the full-attention baseline. Spelled as ``point_name`` spells them.
SWEEP = (
    "full@blocks_per_chunk=4",
    "mamba@blocks_per_chunk=2",  # chunks of two blocks over a Mamba group's partial tails
    "mamba@composition=multi-pd",
    "full-multi-pd@pd_hma=false",  # a P/D consumer without SupportsHMA: each child's request_finished
    "swa@offload_spec=tiering-fs",
    "mamba@offload_spec=tiering-fs",
    "mamba@offload_prompt_only=false",
    "full@scheduler=async",  # async scheduling on every segment: a campaign's 200 requests are one sync segment
    "swa@scheduler=async",
    "mamba@scheduler=async",
    "mamba-eagle@scheduler=async",
    "full-faults@scheduler=async",
    "mamba-eagle@scheduler=sync",
    "full@prefix_burst_p=0.5",
    "mamba528@prefix_burst_p=0.5",  # shared-prefix bursts on a hash unit below the block size
    "mamba-eagle@prefix_burst_p=0.3",
    "full@abort_p=0.0",  # no aborts: every request runs to its end
    "full@abort_p=0.2",
    "mamba@abort_p=0.2",
    "full-scripted@evict_p=0.3",
    "swa-scripted@refuse_p=0.3",
    "swa-scripted@late_p=0.1",
    "full@cpu_chunks=32",
    "full@cpu_chunks=32,eviction_policy=arc",
    "swa@cpu_chunks=32,eviction_policy=arc",
    "mamba@cpu_chunks=32",
    "full@cpu_chunks=4",  # a tier smaller than a prompt: stores refused for want of an evictable chunk
    "full@prefix_burst_p=0.5,cpu_chunks=4,eviction_policy=arc",  # ... and ARC's failed evict, under bursts
    "full@eviction_policy=arc,store_threshold=2,log_stats=true",
    "mamba@log_stats=true",
    "mamba-sync@log_stats=true",  # the sync-load path's stats (0.33.0)
    "swa@retention_interval=dense",
    "mamba@retention_interval=dense",
    "full@reset_p=0.02",
    "swa@reset_p=0.1",
    "mamba@reset_p=0.1",
    "full-tiering-fs@log_stats=true,reset_p=0.1,load_tiers_p=0.3",
    "full-tiering-fs@shadow=false,log_stats=true,reset_p=0.1",  # ... the tiering manager's reset on 0.22.1 - 0.29.0
    "full@load_tiers_p=0.3",  # tier filters on the CPU spec: 0.27.0 - 0.29.0, which run no tiering-fs
    "full-tiering-fs@tier_lose_p=0.1,kv_events=true",  # failed promotions (partial keep) and their events
    "full-tiering-fs@tier_torn_p=0.1",  # promotions that read a torn file: vLLM removes it (0.33.0 fs/io.py:152-160)
    # ... both with shadow off on 0.22.1 - 0.29.0 (a failed promotion's partial keep and mark_miss there); and
    # failed promotions of the example tier, from 0.22.1: the CPU tier's complete_store(success=False)
    "full-tiering-fs@shadow=false,tier_lose_p=0.1,tier_torn_p=0.1,kv_events=true",
    "full@offload_spec=tiering-example,shadow=false,tier_lose_p=0.1,cpu_chunks=32,log_stats=true",
    "full-tiering-fs@shadow=false",  # the tiering spec on 0.22.1 - 0.29.0, where shadow KV cannot follow it
    "full-tiering-fs@shadow=false,log_stats=true",  # ... its metric definitions and stats there (0.29.0 spec.py:101-252)
    # the tiering manager behind the example tier, every job done at once (0.22.1 - 0.33.0)
    "full@offload_spec=tiering-example,shadow=false,cpu_chunks=32",
    "full-tiering-fs@tier_lookup_late_p=0.5",  # the file tier's lookup answers late, shadow KV judging the data
    # ... and on 0.24.0 - 0.29.0, aborts and shared prefixes: a request finishing while its probe is out
    "full-tiering-fs@shadow=false,prefix_burst_p=0.5,abort_p=0.2,tier_lookup_late_p=0.5",
    # the file tier's backpressure detector (0.31+): pressure from slow stores, throttled drops, idle decay and
    # cooldown; and DropStorePolicy through its healthy path, connector resets and the stats it reports
    "full-tiering-fs@tier_backpressure=throttled,tier_store_slow_p=0.3",
    "full-tiering-fs@tier_backpressure=drop,log_stats=true,reset_p=0.02",
    # failed stores to the file tier (a full disk): the manager's failed cascades, and from 0.33 the detector's
    # failure threshold; the same with shadow off on 0.22.1 - 0.29.0, the tier's own store events (0.26+)
    # checked against its disk
    "full-tiering-fs@tier_store_fail_p=0.3,tier_backpressure=throttled",
    "full-tiering-fs@shadow=false,tier_store_fail_p=0.3,kv_events=true",
    # a request-level tier beside the layout's own (a P/D producer's peer-to-peer tier): under shared-prefix
    # bursts a chunk is often offered while another request's write of it is in flight; 0.23.0 - 0.29.0 on the
    # example tier, 0.30.0 - 0.33.0 on the file tier with shadow KV
    "full@offload_spec=tiering-example,shadow=false,prefix_burst_p=0.5,request_tier_p=0.5",
    "full-tiering-fs@prefix_burst_p=0.5,request_tier_p=0.5",
    # a secondary tier that cannot start after the file tier: what the failed start leaves (0.22.1 - 0.33.0)
    "full-tiering-fs@shadow=false,tier_start_fail=true",
    "full-tiering-fs@shadow=false,tier_stop_fail=true",
    "full@load_limit_p=0.3,prompt_logprobs_p=0.1",
    "swa@load_limit_p=0.3",
    "mamba@load_limit_p=0.3",  # a load limit under partial tails
    "full@offload_limit_p=0.3",
    "swa@offload_limit_p=0.3",
    "mamba528@offload_limit_p=0.3",
    "full@cpu_chunks=32,kv_events=true",  # the tier's KV events checked while it evicts (stored and removed)
    "mamba@kv_events=true",  # ... on a hybrid's two groups of one hash, partial tails' keys among them
    "full@reset_p=0.1,kv_events=true",  # ... across connector resets (the reset that announces nothing)
    "full@eviction_policy=arc,reset_p=0.1",  # ARC's clear at a connector reset (0.33.0 cpu/policies/arc.py:142-147)
)


def runnable_on(releases, overrides=None):
    """The test a drawn point passes: some release of ``releases`` runs it (``support``, with the
    ``--engine`` ``overrides``)."""
    releases = tuple(releases)
    return lambda point: any(support(point, v, overrides) is None for v in releases)


def parse_axis(item: str) -> tuple:
    """One ``--axis K=V1,V2``: (axis, (values...)), or a UsageError naming the axis or value
    and what is allowed."""
    k, sep, v = item.partition("=")
    if not sep or k not in BY_NAME:
        raise UsageError(f"--axis {item!r}: expected K=V[,V...] with K one of {', '.join(BY_NAME)}")
    values = tuple(dict.fromkeys(x.strip().lower() for x in v.split(",") if x.strip()))
    bad = [x for x in values if x not in BY_NAME[k].values]
    if bad or not values:
        raise UsageError(f"--axis {item!r}: {k} takes {', '.join(BY_NAME[k].values)}")
    return k, values


def point_name(base: str, moved: dict) -> str:
    """The point's name: the layout, then the axes moved off the layout's own values."""
    lay = L.LAYOUTS[base]
    parts = [f"{a.name}={moved[a.name]}" for a in AXES if a.name in moved and moved[a.name] != a.value_of(lay)]
    return base + ("@" + ",".join(parts) if parts else "")


def split(name: str) -> tuple:
    """(layout, {axis: value}) of a point's name; a UsageError names what is wrong."""
    base, _, rest = name.partition("@")
    if base not in L.LAYOUTS:
        raise UsageError(f"point {name!r}: layout {base!r} is not one of {', '.join(sorted(L.LAYOUTS))}")
    moved = {}
    for item in filter(None, rest.split(",")):
        k, sep, v = item.partition("=")
        if not sep or k not in BY_NAME or v not in BY_NAME[k].values:
            allowed = f"{k} takes {', '.join(BY_NAME[k].values)}" if k in BY_NAME else f"K one of {', '.join(BY_NAME)}"
            raise UsageError(f"point {name!r}: {item!r} is not an axis value K=V ({allowed})")
        moved[k] = v
    return base, moved


def resolve(name: str) -> L.Layout:
    """The ``Layout`` record a point's name stands for (a named layout: itself)."""
    base, moved = split(name)
    lay = L.LAYOUTS[base]
    for a in AXES:
        if a.name in moved and moved[a.name] != a.value_of(L.LAYOUTS[base]):
            lay = a.apply(lay, moved[a.name])
    return dataclasses.replace(lay, name=point_name(base, moved))


def support(name: str, version: str, overrides=None) -> str | None:
    """None when vLLM ``version`` can run the point ``name`` (with the ``--engine`` ``overrides``,
    a dict); else one line saying why not: an axis value its layout cannot take, or what the
    release lacks (the release table's row for ``version``, with the vLLM lines) for the point's
    needs and those of each fault setting it turns on (``layouts.PARAM_NEEDS``)."""
    from kvbound.spec import release_features

    base, moved = split(name)
    lay = L.LAYOUTS[base]
    for a in AXES:  # each moved axis on the layout the axes before it made (offload_spec, then a tier's)
        if a.name in moved and moved[a.name] != a.value_of(L.LAYOUTS[base]):
            if not a.applies(lay):
                return f"point {name}: {a.name} applies to {a.applies_doc}"
            lay = a.apply(lay, moved[a.name])
    lay = resolve(name)
    own = lay.params()
    clash = sorted(k for k in set(moved) & set(overrides or ()) if overrides[k] != own.get(k))
    if clash:  # the cell would carry a name its run does not have (a replay's own params agree with it)
        return f"point {name}: --engine {clash[0]} would replace the value the point gives it; pin it with --axis"
    par = dict(own, **(overrides or {}))
    if lay.offload_spec is not None and any(par.get(k) for k in L.SCRIPT_KEYS):
        return f"point {name}: the scripted tier ({', '.join(L.SCRIPT_KEYS)}) is a CPU spec, not {lay.offload_spec}"
    if par.get("tier_store_slow_p") and not par.get("tier_backpressure"):
        return f"point {name}: tier_store_slow_p slows what a backpressure detector measures; set tier_backpressure"
    feats = release_features(version)
    needs = lay.needs + tuple(L.PARAM_NEEDS[k] for k in L.PARAM_NEEDS if par.get(k))
    if par.get("shadow") is not False and lay.offload_spec in L.SHADOWLESS:
        return f"point {name}: {L.SHADOWLESS[lay.offload_spec]}"
    if par.get("shadow") is not False and lay.composition in L.SHADOWLESS:
        return f"point {name}: {L.SHADOWLESS[lay.composition]}"
    if par.get("shadow") is not False and lay.offload_spec in L.SHADOW_NEEDS:
        needs += (L.SHADOW_NEEDS[lay.offload_spec],)
    missing = list(dict.fromkeys(need.why for need in needs if not getattr(feats, need.column)))
    if not missing:
        return None
    return f"vllm {version} cannot run layout {name}: " + "; ".join(missing)


def points(bases, pinned: dict) -> list:
    """Every base layout times every combination of the pinned axes' values (``--axis``), as
    point names, in order: bases first, then the axes in ``AXES`` order."""
    axes = [a for a in AXES if a.name in pinned]
    out = []
    for base in bases:
        for combo in itertools.product(*(pinned[a.name] for a in axes)):
            out.append(point_name(base, {a.name: v for a, v in zip(axes, combo)}))
    return list(dict.fromkeys(out))


EXPLORE_TRIES = 64  # draws of one point before ``explore`` gives up on it (none was runnable)


def explore(bases, n: int, seed, runnable=None) -> list:
    """``n`` points drawn from the whole space with ``seed``: a base layout, then on each axis
    that applies to it one of its values (the layout's own value half the time). With
    ``runnable`` (a point -> bool, e.g. ``runnable_on``) a draw it refuses is drawn again, up to
    ``EXPLORE_TRIES`` times, so the points are ones the run can run; without it, the first draw."""
    rng = random.Random(f"explore-{seed!r}")
    out = []
    for _ in range(n):
        for _ in range(EXPLORE_TRIES):
            base = rng.choice(list(bases))
            lay = L.LAYOUTS[base]
            moved = {a.name: rng.choice(a.values) for a in AXES if a.applies(lay) and rng.random() < 0.5}
            point = point_name(base, moved)
            if runnable is None or runnable(point):
                out.append(point)
                break
    return list(dict.fromkeys(out))


def add_arguments(p) -> None:
    """The space's options of ``kvbound trace`` and ``kvbound campaign``."""
    p.add_argument("--axis", action="append", default=[], metavar="K=V[,V]",
                   help="pin (one value) or widen (several) an axis over every layout run: "
                        + "; ".join(f"{a.name} ({'|'.join(a.values)})" for a in AXES) + " (docs/trace.md)")
    p.add_argument("--point", action="append", default=[], metavar="NAME",
                   help="run a point by name, as a finding names it: LAYOUT[@K=V,...]; repeatable")
    p.add_argument("--explore", type=int, default=0, metavar="N",
                   help="add N points drawn from the whole space with the run's seed")


def chosen(args, sweep: bool = False, runnable=None) -> list:
    """The points a command line names: each --layout (every layout, unless only --point is
    given) times the --axis values, then each --point, then --explore's draws (only points
    ``runnable`` passes, where given). ``sweep`` (a campaign's): with no --layout, --point or
    --axis, every named layout and then ``SWEEP``."""
    if args.explore < 0:
        raise UsageError("--explore must be >= 0")
    pinned = dict(parse_axis(item) for item in args.axis)
    named = [point_name(*split(name)) for name in args.point]
    bases = list(dict.fromkeys(args.layout)) or ([] if named and not pinned else list(L.LAYOUTS))
    swept = list(SWEEP) if sweep and not (args.layout or named or pinned) else []
    drawn = explore(L.LAYOUTS, args.explore, args.seed, runnable)
    return list(dict.fromkeys(points(bases, pinned) + swept + named + drawn))
