"""A secondary tier that fails to start or to stop, and what the tiering spec promises then (engine
settings ``tier_start_fail`` and ``tier_stop_fail``).

A deployment's secondary tier can fail to start: a root directory the engine may not create, an
out-of-tree tier's bad config, a service it cannot reach. The tiering spec builds its tiers when
the connector's scheduler side first asks for its manager: the scheduler's shared region in
``/dev/shm`` (sized to the whole CPU tier), the CPU primary tier over it, then each secondary tier
in configuration order (0.33.0 v1/kv_offload/tiering/spec.py:386-430), and a tier's constructor
that raises ends the engine's start.

The promise (vLLM #51227, from 0.28.0; 0.33.0 tiering/spec.py:431-457): the secondary tiers
already started are shut down, in reverse order, then the primary tier (which cleans its region
up) or, without one, the region itself; and the start's own error reaches the caller. Before it
(0.22.1 - 0.27.0, 0.27.0 tiering/spec.py:171-211) nothing is released: the region's file stays in
``/dev/shm`` holding the CPU tier's bytes, and the started tiers' threads run on.

With ``tier_start_fail`` on, the harness first starts the run's engine with ``FAILING_TIER`` after
the layout's tiers (its constructor raises ``TierStartFailed``, as a tier that cannot start does),
expects that error, and reports what the failed start left behind, each a
``lifecycle:failed_start_unclean``: a secondary tier it started and did not shut down, its shared
region's file still in ``/dev/shm``, or another error in place of the start's own. The harness
then releases what was left (the run must not leak it) and the run's engine is started as the
layout says: the deployment restarted with its config mended.

A secondary tier can fail to stop as well (a file system gone read-only, a tier's service gone). The
promise (vLLM #52290, from 0.30.0; 0.33.0 v1/kv_offload/tiering/manager.py:1268-1269 and
``_shutdown_tiers`` :1287-1305): every secondary tier is given a shutdown attempt, the failure
reaches the caller, and the primary tier is kept (a failed tier may still read its region). Before
it (0.22.1 - 0.29.0 ``TieringOffloadingManager.shutdown``, 0.22.1 tiering/manager.py:501-505) the first
tier that fails ends the loop: every tier after it runs on. With ``tier_stop_fail`` on, the harness
first starts the run's engine with ``STUCK_TIER`` before the layout's tiers (its shutdown raises
``TierStopFailed``), tears the engine down as the engine core does, and reports each
``lifecycle:failed_stop_unclean``: a tier that was not given its shutdown, or the failure lost or
replaced. It then releases the tiers left and the primary tier, and the run goes on as above.

Part of the side package (standard library; vLLM's classes are imported when a run installs it).
"""

import contextlib
import os
import shutil
import sys

from . import adapter, sidecar

TIER_MODULE = "kvbound_trace_failing_tier"
FAILING_TIER = "KvboundFailingTier"
STUCK_MODULE = "kvbound_trace_stuck_tier"
STUCK_TIER = "KvboundStuckTier"


class TierStartFailed(RuntimeError):
    """What ``FAILING_TIER``'s constructor raises: the error a failed start must end with."""


class TierStopFailed(RuntimeError):
    """What ``STUCK_TIER``'s first shutdown raises: the error a failed stop must end with."""


def _tier_class():
    """``FAILING_TIER``: a secondary tier whose constructor notes the shared region of the spec it
    is built for and raises ``TierStartFailed``."""
    from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager

    class KvboundFailingTier(ExampleSecondaryTierManager):  # a concrete tier: its constructor is the one that fails
        regions = []  # the spec's shared region at each attempt, newest last (``attempt`` reads, clears)

        def __init__(self, *a, **k):
            spec = k.get("offloading_spec") or next((x for x in a if hasattr(x, "_scheduler_mmap")), None)
            type(self).regions.append(getattr(spec, "_scheduler_mmap", None))  # 0.28+ clears it at the failure
            raise TierStartFailed("kvbound's failing tier: this secondary tier cannot start")

    return KvboundFailingTier


def _stuck_class():
    """``STUCK_TIER``: a secondary tier whose first shutdown raises ``TierStopFailed`` (a later one, the
    harness's release, succeeds)."""
    from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager

    class KvboundStuckTier(ExampleSecondaryTierManager):
        def shutdown(self):
            if not getattr(self, "_kvbound_failed", False):
                self._kvbound_failed = True
                raise TierStopFailed("kvbound's stuck tier: this secondary tier cannot shut down")
            return super().shutdown()

    return KvboundStuckTier


def tier_config(par):
    """``FAILING_TIER``'s ``secondary_tiers`` entry for the failed start (``attempt``), else None."""
    if not par.get("_failing_tier"):
        return None
    return adapter.secondary_tier(FAILING_TIER, TIER_MODULE, _tier_class)


def tier_before(par):
    """``STUCK_TIER``'s ``secondary_tiers`` entry, first of all, for the failed stop (``attempt_stop``),
    else None."""
    if not par.get("_stuck_tier"):
        return None
    return adapter.secondary_tier(STUCK_TIER, STUCK_MODULE, _stuck_class)


@contextlib.contextmanager
def _watched_tiers():
    """[tier, shut, root directory] of every secondary tier the tier factory builds in the block:
    ``shut`` set once its ``shutdown`` ran (the factory's classmethod restored after)."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    kept = SecondaryTierFactory.__dict__["create_secondary_tier"]
    create, built = SecondaryTierFactory.create_secondary_tier, []

    def watched(*a, **k):
        tier = create(*a, **k)
        config = a[0] if a and isinstance(a[0], dict) else k.get("tier_config") or {}
        built.append([tier, False, config.get("root_dir")])
        entry, shutdown = built[-1], tier.shutdown

        def shut(*sa, **sk):
            entry[1] = True
            return shutdown(*sa, **sk)

        tier.shutdown = shut
        return tier

    SecondaryTierFactory.create_secondary_tier = staticmethod(watched)
    try:
        yield built
    finally:
        SecondaryTierFactory.create_secondary_tier = kept


def attempt(rel, lay, par, close):
    """Where engine setting ``tier_start_fail`` is on: the run's engine started once with
    ``FAILING_TIER`` after its tiers, and the violations of what that failed start left behind;
    None where the setting is off. Raises ``RuntimeError`` (a harness fault) where the failing tier
    was never built or found no shared region. What the start left is released in every case; an
    engine vLLM started all the same, by ``close`` (the worker's ``compose.close``)."""
    if not par.get("tier_start_fail"):
        return None
    adapter.secondary_tier(FAILING_TIER, TIER_MODULE, _tier_class)
    cls = getattr(sys.modules[TIER_MODULE], FAILING_TIER)
    cls.regions.clear()
    error, eng = None, None
    with _watched_tiers() as built, _planted(par.get("mutant")):
        try:
            eng = rel.build(lay, dict(par, tier_start_fail=False, _failing_tier=True))
        except Exception as e:  # noqa: BLE001 - the start is meant to fail; how is the check
            error = e
    region = cls.regions[-1] if cls.regions else None
    try:
        return _left(cls, built, region, error)
    finally:
        _release(eng, built, region, close)
        cls.regions.clear()


def attempt_stop(rel, lay, par, close, stop):
    """Where engine setting ``tier_stop_fail`` is on: the run's engine started with ``STUCK_TIER`` before
    its tiers and torn down by ``stop`` (the worker's ``runner_calls.shutdown``, the engine core's
    teardown), and the violations of that failed stop; None where the setting is off. What the stop
    left is released in every case: the tiers not shut down, the primary tier, then ``close``."""
    if not par.get("tier_stop_fail"):
        return None
    with _watched_tiers() as built, _planted(par.get("mutant")):
        try:
            eng = rel.build(lay, dict(par, tier_stop_fail=False, _stuck_tier=True))
        except BaseException:  # the tiers it started, released before the error goes on
            _release(None, built, None, close)
            raise
        error = None
        try:
            stop(eng)
        except Exception as e:  # noqa: BLE001 - the stop is meant to fail; how is the check
            error = e
    try:
        return _left_stop(built, error)
    finally:
        for tier, shut, _ in built:
            if not shut:
                tier.shutdown()
        if not eng.shut_down:  # the primary a failed stop keeps (0.30.0+) or never reached (before)
            eng.csched.manager.primary_tier.shutdown()
            eng.shut_down = True
        close(eng)


def _left_stop(built, error):
    """The violations of a failed stop: a tier not given its shutdown, the stop's error lost or replaced."""
    if not any(type(tier).__name__ == STUCK_TIER for tier, _, _ in built):
        raise RuntimeError("engine setting tier_stop_fail: the stuck tier was never started")
    left = _outcome(error, TierStopFailed, "shutdown", built, "the %s tier was never asked to shut down and runs on",
                    ("the shutdown's error lost", "the engine's teardown returned as if every tier had stopped"))
    return _violations("lifecycle:failed_stop_unclean", "a secondary tier failed to shut down and the tiering"
                       " manager left this", left)


def _outcome(error, expected, what, built, runs_on, none):
    """What a failed start or stop (``what``) left, judged alike: ``none`` where it raised nothing, its
    error replaced where it raised another than ``expected`` (one the harness raised goes on, a harness
    fault), and each tier of ``built`` whose shutdown never ran (``runs_on``, the tier's name in it)."""
    if error is not None and not isinstance(error, expected) and sidecar.raised_in_harness(error):
        raise error
    left = []
    if error is None:
        left.append(none)
    elif not isinstance(error, expected):
        raised = type(error).__name__
        left.append(("the %s's error replaced by %s" % (what, raised), "%s: %s" % (raised, error)))
    for tier, shut, _ in built:
        name = getattr(tier, "tier_type", type(tier).__name__)
        if not shut:
            left.append(("tier %s not shut down" % name, runs_on % name))
    return left


def _violations(check, lead, left):
    """``left``'s (what, why) as violations of ``check``, each message ``lead``: why."""
    return [{"check": check, "step": 0, "what": what, "message": "%s: %s" % (lead, why)} for what, why in left]


def _left(cls, built, region, error):
    """The violations: what the failed start left behind, judged before the harness releases it."""
    if not cls.regions:
        raise RuntimeError("engine setting tier_start_fail: the failing tier was never started (%s)"
                           % ("the engine started" if error is None else "%s: %s" % (type(error).__name__, error)))
    left = _outcome(error, TierStartFailed, "start", built, "the %s tier it started runs on",
                    ("a start that did not fail", "the engine started without the tier that could not start"))
    if region is None:
        raise RuntimeError("engine setting tier_start_fail: the tiering spec had no shared region when its"
                           " tiers were built (_scheduler_mmap): this release is not one the check reads")
    files = [f for f in _files(region) if os.path.exists(f)]
    if files:
        left.append(("its shared region left in /dev/shm", "%s (%d bytes) is still on /dev/shm"
                     % (", ".join(os.path.basename(f) for f in files), sum(os.path.getsize(f) for f in files))))
    return _violations("lifecycle:failed_start_unclean", "a secondary tier failed to start and the tiering spec left"
                       " this behind", left)


def _files(region):
    """The region's files: one, or its segments' (0.33.0 cpu/shared_offload_region.py:128-136)."""
    segments = getattr(region, "_segments", None)
    files = [seg[0] for seg in segments] if segments else [getattr(region, "mmap_path", None)]
    return [f for f in files if f]


def _release(eng, built, region, close):
    """The harness releases what the failed start left (the run must not leak it): an engine vLLM
    started all the same, the tiers it did not shut down, their directories, the region's files."""
    if eng is not None:
        close(eng)
    for tier, shut, root in built:
        if not shut:
            tier.shutdown()
        if root:
            shutil.rmtree(root, ignore_errors=True)
    files = [f for f in _files(region) if os.path.exists(f)]
    if files and hasattr(region, "cleanup"):
        region.cleanup()
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f)


@contextlib.contextmanager
def _planted(mutant):
    """Planted (tests only): ``failed_start_keeps_region``, the CPU primary tier's shutdown during the
    failed start leaves its shared region as it is; ``failed_stop_ends_early``, the tiering manager's
    teardown of its secondary tiers stops at the first that fails, as before vLLM #52290 (0.29.0
    v1/kv_offload/tiering/manager.py ``shutdown``)."""
    from vllm.v1.kv_offload.tiering import manager

    if mutant == "failed_start_keeps_region":
        cls, name = manager.CPUPrimaryTierOffloadingManager, "shutdown"

        def planted(self):
            return None
    elif mutant == "failed_stop_ends_early":
        cls, name = manager.TieringOffloadingManager, "_shutdown_tiers"

        def planted(self):
            for tier in self.secondary_tiers:
                tier.shutdown()
            self.primary_tier.shutdown()
    else:
        yield
        return
    kept = cls.__dict__[name]
    setattr(cls, name, planted)
    try:
        yield
    finally:
        setattr(cls, name, kept)
