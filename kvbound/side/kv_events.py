"""The offload tier's KV events, checked (engine setting ``kv_events``, docs/trace.md "KV events").

With KV cache events on (``KVEventsConfig(enable_kv_cache_events=True)``), the CPU tier records
what it holds as ``OffloadingEvent`` s: stored when a store completes, removed when it evicts
(0.33.0 ``v1/kv_offload/cpu/manager.py:346-355,402-419``; 0.21.0 ``:150-156,197-204``); the
connector's scheduler drains them (``take_events``, 0.33.0 ``:466-479``) and turns each into a
``BlockStored`` / ``BlockRemoved`` of the tier's medium (0.33.0
``offloading/scheduler.py:2378-2399``, ``offloading/events.py``; 0.21.0
``offloading/scheduler.py:861-880``), which the engine core's scheduler publishes beside the GPU
pool's events at the end of every ``update_from_output`` (0.33.0
``v1/core/sched/scheduler.py:2622-2637``; 0.21.0 ``:1464-1474``).

The promise checked: a consumer that applies the published events in order (the batch the
scheduler assembles: the KV-cache manager's, then the connector's; ``BlockStored`` adds its block
hashes to its medium, ``BlockRemoved`` drops them, ``AllBlocksCleared`` empties the medium it names,
or, naming none, every medium: the widest reading, so the GPU pool's clear after a reset it accepted
empties the CPU view too) holds exactly what the tier holds ready, each time the connector's events
are taken. The consumer counts announcements per block (as 0.33.0
``offloading/events.py:9-13`` expects of a consumer), keyed by the medium, the KV-cache group the
event names and the hash; where an event names no group (the placeholder events before 0.24
carry block hashes and the medium only) the view is compared by medium and hash. The tier's
content is read from the real manager at its drain: the keys its cache policy holds whose chunk
is ready (``is_ready``: a write still pending is announced when it completes). A mismatch is one
``store:stale_event`` (stale: the consumer lists a block the tier does not hold; missing: the tier
holds one the consumer does not list), after which the consumer re-reads the tier, so each loss
is reported once.

A file-system secondary tier of the tiering spec announces its own stores from 0.26.0 when its
config asks (``enable_kv_events``, 0.33.0 ``tiering/fs/manager.py:119-151``; 0.26.0 ``:113-145``;
``compose.tiering_config`` asks where KV events are on): a ``BlockStored`` of the storage medium
for each key of a store job it reports a success (``fs/manager.py:280-297``), and no removal (its
files outlive the engine, and a connector reset leaves them, ``tiering/manager.py:1141-1159``). The
promise checked on that medium, at the same moments: the blocks the consumer lists are exactly the
keys the tier wrote (``DiskTier``: the keys of the store jobs it reported finished whose file was
on disk then); a file lost later (the fault ``tier_lose_p``) stays listed, as the tier cannot know.
A clear the consumer applies to the medium forgets what was written before it.

Planted (tests only, the job's ``mutant``): ``event_drop_removed``, the tier drops its first
removal event; ``event_drop_stored``, its first stored event; ``failed_store_announced``, the file
tier announces a store job that failed. Standard library and vLLM only.
"""

import collections

from . import tier_clock

# How many keys a violation names (the rest are counted).
SHOWN = 4


def config(par):
    """The ``VllmConfig`` keyword of the engine setting ``kv_events``: KV cache events on, published
    nowhere (the "null" publisher); the CPU tier records them when the config enables them (0.33.0
    ``v1/kv_offload/cpu/spec.py:169``, ``v1/kv_offload/base.py:718-722``; 0.21.0 ``cpu/spec.py:59-67``)."""
    if not par.get("kv_events"):
        return {}
    from vllm.config import KVEventsConfig

    return {"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="null")}


def subscribe(eng, tap):
    """The check of the engine's tier, subscribed to ``tap`` (None: the setting is off)."""
    if not eng.par.get("kv_events"):
        return None
    check = KVEventCheck(eng)
    check.subscribe(tap)
    return check


def cpu_tier(mgr):
    """The manager whose cache policy holds the CPU tier's chunks: the connector's manager, a
    tiering manager's primary tier (0.30.0 - 0.33.0 ``tiering/manager.py`` ``primary_tier``), or
    the store-threshold wrapper's backing manager (0.21.0 ``v1/kv_offload/reuse_manager.py:60``);
    None where none holds a policy."""
    for m in (mgr, getattr(mgr, "primary_tier", None), getattr(mgr, "_backing", None)):
        if m is not None and getattr(m, "_policy", None) is not None:
            return m
    return None


def policy_chunks(policy):
    """Every (key, chunk status) the cache policy holds: LRU's table (``blocks`` before 0.30,
    ``chunks`` from 0.30), ARC's t1 and t2 (its ghost lists b1, b2 hold no chunk)."""
    for name in ("chunks", "blocks", "t1", "t2"):
        table = getattr(policy, name, None)
        if isinstance(table, dict):
            yield from table.items()


class EventView:
    """What a consumer of the connector's KV events holds: a count per (medium, group, hash)."""

    def __init__(self, classes, norm):
        self.stored, self.removed, self.cleared = classes
        self.norm = norm  # a hash as the view keys it
        self.counts = collections.Counter()
        self.group_named = True  # every event so far named its KV-cache group

    def apply(self, ev):
        if isinstance(ev, self.stored) or isinstance(ev, self.removed):
            group = getattr(ev, "group_idx", None)
            if group is None:
                self.group_named = False
            for h in ev.block_hashes:
                k = (ev.medium, group, self.norm(h))
                if isinstance(ev, self.stored):
                    self.counts[k] += 1
                elif self.counts[k] > 1:
                    self.counts[k] -= 1
                else:
                    self.counts.pop(k, None)
        elif isinstance(ev, self.cleared):
            medium = getattr(ev, "medium", None)
            for k in [k for k in self.counts if medium is None or k[0] == medium]:
                del self.counts[k]

    def project(self, counts):
        """``counts`` as the view compares them: by group where every event named one."""
        if self.group_named:
            return collections.Counter(counts)
        out = collections.Counter()
        for (medium, _, h), n in counts.items():
            out[(medium, None, h)] += n
        return out


def disk_tiers(mgr):
    """The file-system secondary tiers of a tiering manager that announce their stores (events
    enabled: ``events`` a list, 0.26.0 - 0.33.0 ``tiering/fs/manager.py``)."""
    return [t for t in tier_clock.file_tiers(mgr) if getattr(t, "events", None) is not None]


def medium_name(medium):
    """A tier's medium as its events carry it: the enum's value (0.27+ ``Medium``) or the string."""
    return getattr(medium, "value", medium)


class DiskTier:
    """What a file-system tier wrote, as its disk holds it: the keys of each store job it reported
    finished whose file was there when it did."""

    def __init__(self, tier, mutant, stats):
        self.tier, self.mutant, self.stats = tier, mutant, stats
        stats.setdefault("kv_events_disk_keys", 0)  # the keys the disk tiers wrote (what the check compared)
        self.medium = medium_name(tier.medium)
        self.jobs = {}  # store job id -> its keys, until the tier reports the job finished
        self.wrote = set()  # keys written since the consumer's last clear of the medium

    def subscribe(self, tap):
        tier = self.tier

        def submit_store(call, job):
            self.jobs[job.job_id] = list(job.keys)
            return call(job)

        def finished(call):
            results = list(call())
            for r in results:
                keys = self.jobs.pop(r.job_id, None) or ()
                landed = tier_clock.on_disk(tier, keys)
                self.stats["kv_events_disk_keys"] += len(landed)
                self.wrote.update(landed)
                if keys and not r.success and self.mutant == "failed_store_announced":  # planted
                    from vllm.v1.kv_offload.base import OffloadingEvent

                    tier.events.append(OffloadingEvent(keys=keys, medium=tier.medium, removed=False))
            return results

        tap.around(tier, "submit_store", submit_store)
        tap.around(tier, tier_clock.finished_jobs_method(tier), finished)

    def held(self, ob, norm):
        return collections.Counter({(self.medium, ob.get_offload_group_idx(k), norm(ob.get_offload_block_hash(k))): 1
                                    for k in self.wrote})


class KVEventCheck:
    def __init__(self, eng):
        from vllm.distributed import kv_events as ke
        from vllm.v1.core import kv_cache_utils as kcu

        self.eng = eng
        # A hash as the view keys it: the raw bytes a key carries, converted as the release converts
        # a hash for its events (maybe_convert_block_hash: the int form under
        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, 0.33.0 v1/core/kv_cache_utils.py:82-85), whether the
        # release's connector converted it (0.24.0 - 0.33.0 offloading/events.py) or not (0.21.0 -
        # 0.23.0 offloading/scheduler.py take_events: raw bytes)
        convert = getattr(kcu, "maybe_convert_block_hash", lambda h: h)
        self.norm = lambda h: convert(h) if isinstance(h, bytes) else h
        self.view = EventView((ke.BlockStored, ke.BlockRemoved, ke.AllBlocksCleared), self.norm)
        self.tier = cpu_tier(eng.csched.manager)
        if self.tier is None:  # a check that cannot read its tier must not pass as clean
            raise ValueError("kv_events: the connector's manager %s holds no cache policy kvbound can read"
                             % type(eng.csched.manager).__name__)
        self.disks = [DiskTier(t, eng.mutant, eng.stats) for t in disk_tiers(eng.csched.manager)]
        self.snapshot = None  # the tier's content at the manager's last drain
        self.reset_dropped = set()  # tier keys a reset dropped, not stored since
        self.dropped = False  # planted: the one event the tier dropped
        self.takes = 0

    def held(self):
        """The tier's ready chunks, as the events name them: (medium, group, hash) -> 1."""
        ob = self.eng.rel.obase
        m = self.tier
        medium = medium_name(m.medium)
        out = collections.Counter()
        for key, chunk in policy_chunks(m._policy):
            if chunk.is_ready:
                out[(medium, ob.get_offload_group_idx(key), self.norm(ob.get_offload_block_hash(key)))] += 1
        return out

    def subscribe(self, tap):
        eng, mgr = self.eng, self.eng.csched.manager

        def drop_one(call):  # planted (tests only): the tier drops its first removal (or stored) event
            evs = list(call())
            for i, ev in enumerate(evs):
                if ev.removed == removal and not getattr(ev, "metadata_only", False) and not self.dropped:
                    self.dropped = True
                    return evs[:i] + evs[i + 1:]
            return evs

        def drain(call):
            evs = list(call())
            self.snapshot = self.held() + sum((d.held(self.eng.rel.obase, self.norm) for d in self.disks),
                                              collections.Counter())
            self.reset_dropped -= set(self.snapshot)
            return evs

        def take_events(call):
            evs = list(call())
            self.takes += 1
            eng.stats["kv_events"] = eng.stats.get("kv_events", 0) + len(evs)
            for ev in evs:
                self.apply(ev)
            if self.snapshot is not None:
                self.check(self.snapshot)
                self.snapshot = None
            return evs

        def gpu_take(call, *a, **k):  # the batch's first part: the GPU pool's events (AllBlocksCleared)
            evs = call(*a, **k)
            for ev in evs or ():
                self.apply(ev)
            return evs

        def reset_cache(call, *a, **k):
            before = self.held()
            out = call(*a, **k)
            self.reset_dropped |= set(before) - set(self.held())
            return out

        removal = eng.mutant == "event_drop_removed"
        if removal or eng.mutant == "event_drop_stored":
            tap.around(mgr, "take_events", drop_one)
        tap.around(mgr, "take_events", drain)
        tap.around(eng.sched.kv_cache_manager, "take_events", gpu_take)
        tap.around(eng.csched, "take_events", take_events)
        if hasattr(self.tier, "reset_cache"):
            tap.around(self.tier, "reset_cache", reset_cache)
        for d in self.disks:
            d.subscribe(tap)

    def apply(self, ev):
        """``ev`` applied to the view; a clear of a disk tier's medium forgets what it wrote before."""
        self.view.apply(ev)
        if isinstance(ev, self.view.cleared):
            for d in self.disks:
                if getattr(ev, "medium", None) in (None, d.medium):
                    d.wrote.clear()

    def check(self, held):
        """``held`` (the primary tier's ready chunks, and each disk tier's written keys) against the
        view of each of those media: the primary's counted, a disk tier's by presence (it announces
        a key once per store job and never removes it); other media are applied and not compared."""
        view = self.view
        medium = medium_name(self.tier.medium)
        reset = set(view.project(collections.Counter(self.reset_dropped)))
        self.reset_dropped = set()  # what a reset dropped tells the next take only
        self._compare(medium, held, reset, count=True)
        for d in self.disks:
            self._compare(d.medium, held, (), count=False)

    def _compare(self, medium, held, reset, count):
        view = self.view
        mine = lambda c: collections.Counter({k: (n if count else 1) for k, n in c.items() if k[0] == medium and n > 0})
        want, got = view.project(mine(held)), view.project(mine(view.counts))
        if want == got:
            return
        stale = sorted((k for k in got if got[k] > want[k]), key=repr)
        missing = sorted((k for k in want if want[k] > got[k]), key=repr)
        for what, keys, via in (("stale", [k for k in stale if k not in reset], None),
                                ("stale", [k for k in stale if k in reset], "reset"),
                                ("missing", missing, None)):
            if keys:
                self._violate(medium, what, keys, via, want, got)
        # the consumer re-reads the tier: each loss is reported once
        view.counts = collections.Counter({k: n for k, n in view.counts.items() if k[0] != medium})
        view.counts.update(want)

    def _violate(self, medium, what, keys, via, want, got):
        eng = self.eng
        more = "held by the tier and not listed" if what == "missing" else \
            "listed by the events and not held by the tier" + (" (dropped by a connector reset)" if via else "")
        shown = [[g, h.hex()[:16] if isinstance(h, bytes) else h, got[(m, g, h)], want[(m, g, h)]]
                 for m, g, h in keys[:SHOWN]]
        eng.violations.append({
            "check": "store:stale_event", "step": eng.step_no, "request": None, "medium": str(medium),
            "view": what, "left_by": via, "blocks": len(keys), "take": self.takes, "keys": shown,
            "message": "after the connector's KV events were taken (take %d), %d %s block(s) %s; first"
                       " [group, hash, listed, held]: %s" % (self.takes, len(keys), medium, more, shown)})
