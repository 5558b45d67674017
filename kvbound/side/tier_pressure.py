"""A secondary tier's backpressure on the engine's step clock (engine settings
``tier_backpressure`` and ``tier_store_slow_p``, layouts with the tiering spec's file tier, 0.31+;
docs/trace.md "Faults"), and the contract of its store decisions.

vLLM's ``EMABackpressureDetector`` (0.33.0 v1/kv_offload/tiering/backpressure.py:189-451) keeps an
EMA of a tier's store latency per MiB, measured with ``time.monotonic()`` from a job's
``submit_time`` to its completion (``update``, :148-159); over the high water mark the tier is
under pressure and its policy drops stores (``ThrottledDropPolicy`` in proportion to the
overshoot, :62-116; ``DropStorePolicy`` all of them, :55-59); with no completions the EMA decays
with a half-life of seconds (:325-339), and once pressure clears every other store is dropped for
a cooldown (:410-423). Every one of those is a wall-clock read, so here the detector's module
reads the step clock instead (``StepTime``: ``STEP_S`` modelled seconds per engine step), and the
latency of each store it measures is modelled (``update``'s ``submit_time`` moved back by the
job's bytes at ``FAST_S_PER_MIB``, or, with probability ``tier_store_slow_p``, at
``SLOW_S_PER_MIB``: a congested file system). The tier's reads and writes are its own; what the
detector decides from the modelled latencies is vLLM's, and the same command repeats it.

The contract (``store:backpressure_bypassed``): with a detector, the tiering manager asks it
before each store to the tier and submits the store exactly when it says yes, at once, with
the chunks it asked for (0.33.0 tiering/manager.py:551-557, :916-919, :972-975; 0.31.0
:347-353, :688, :744): a store the detector refused never reaches the tier, and one it allowed
always does. A refusal is the tier's promise that it will not be written.

Planted (tests only, the job's ``mutant``): ``backpressure_ignored``, the manager asks the
detector and stores all the same. Standard library only; vLLM's objects come in through the tap.
"""

import random
import sys

STEP_S = 0.1  # modelled seconds per engine step: the detector's 2-s half-life is 20 steps, its 1-s cooldown 10
START_S = 1000.0  # the step clock's reading before the first step (never 0.0, which the detector reads as unset)
MIB = 1 << 20
FAST_S_PER_MIB = 0.0005  # 2 GiB/s: under the local low water mark (0.002 s/MiB, 0.33.0 backpressure.py:249-250)
SLOW_S_PER_MIB = 0.05  # 20 MiB/s: five times the local high water mark (0.010 s/MiB)
POLICIES = {"throttled": "ThrottledDropPolicy", "drop": "DropStorePolicy"}  # backpressure.py's, by short name


def tier_config(par):
    """The ``backpressure`` entry of a secondary tier's config for the engine settings ``par``
    (0.33.0 tiering/factory.py:73-90 resolves the short class names in tiering/backpressure.py, and
    the detector's ``default_config`` fills the tier type's water marks, 0.33.0 tiering/backpressure.py:
    258-273), or None: no detector."""
    policy = par.get("tier_backpressure")
    if not policy:
        return None
    return {"backpressure_cls": "EMABackpressureDetector", "policy_cls": POLICIES[policy]}


class StepTime:
    """The ``time`` module as vLLM's backpressure module sees it: ``monotonic()`` reads the step
    clock; everything else is the real module's."""

    def __init__(self, module):
        # the real module even where a run that failed to build left its clock installed
        self.module, self.real, self.steps = module, getattr(module.time, "real", module.time), 0

    def monotonic(self):
        return START_S + self.steps * STEP_S

    def __getattr__(self, name):
        return getattr(self.real, name)


def subscribe(eng, tap):
    """Every secondary tier of the engine's manager that has a detector: the step clock, the
    modelled latencies, the contract (nothing where no tier has one)."""
    m = eng.csched.manager
    tiers = [t for t in getattr(m, "secondary_tiers", None) or () if getattr(t, "bp_detector", None) is not None]
    if not tiers:
        return
    module = sys.modules[type(tiers[0].bp_detector).__module__]
    clock = eng.step_time = StepTime(module)
    module.time = clock  # put back by restore(), at the run's end
    eng.stats.update(tier_stores_dropped=0, tier_stores_slow=0)

    def tick(call, *context):
        out = call(*context)
        clock.steps += 1
        return out

    tap.around(m, "on_schedule_end", tick)
    p = float(eng.par.get("tier_store_slow_p") or 0.0)
    for tier in tiers:
        rng = random.Random("%r-tier-store-slow-%s" % (eng.par.get("seed", 0), tier.tier_type))
        _measure(eng, tap, tier, clock, rng, p)
        _check(eng, tap, tier)
    if eng.mutant == "backpressure_ignored":  # planted: the manager asks, then stores all the same
        tap.around(m, "_should_store_to_tier", lambda call, tier, n: call(tier, n) or True)


def restore(eng):
    """The backpressure module's own ``time`` again (the worker process runs the next job)."""
    clock = getattr(eng, "step_time", None)
    if clock is not None:
        clock.module.time = clock.real


def _measure(eng, tap, tier, clock, rng, p):
    def update(call, submit_time, num_bytes):
        slow = p and rng.random() < p
        eng.stats["tier_stores_slow"] += bool(slow)
        latency = (SLOW_S_PER_MIB if slow else FAST_S_PER_MIB) * num_bytes / MIB
        return call(clock.monotonic() - latency, num_bytes)

    tap.around(tier.bp_detector, "update", update)


def _check(eng, tap, tier):
    allowed = []  # the chunks of the store the detector allowed last, until the tier receives it

    def should_store(call, num_blocks):
        ok = call(num_blocks)
        if allowed:
            _lost(eng, tier, allowed.pop())
        if ok:
            allowed.append(num_blocks)
        else:
            eng.stats["tier_stores_dropped"] += 1
        return ok

    def submit_store(call, job):
        n = len(job.keys)
        if allowed and allowed[-1] == n:
            allowed.pop()
        else:
            eng.violate("store:backpressure_bypassed", job.req_context.req_id,
                        "a store of %d chunks reached the %s tier, whose backpressure detector %s (the manager"
                        " submits a store only when should_store allows it, 0.33.0 tiering/manager.py:916-919,"
                        " :972-975)" % (n, tier.tier_type, "allowed %d chunks" % allowed[-1] if allowed else
                                        "refused it or was not asked"))
            del allowed[:]
        return call(job)

    tap.around(tier.bp_detector, "should_store", should_store)
    tap.around(tier, "submit_store", submit_store)


def _lost(eng, tier, n):
    eng.violate("store:backpressure_bypassed", None,
                "the %s tier's backpressure detector allowed a store of %d chunks that never reached the tier"
                " (an allowed store is submitted at once, 0.33.0 tiering/manager.py:916-919, :972-975)"
                % (tier.tier_type, n))
