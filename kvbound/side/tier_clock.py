"""The tiering offload manager on the engine's step clock: the harness's one hold over the
threads of a ``TieringOffloadingManager``'s secondary tiers, so the same command runs the
same schedule.

Part of the side package (standard library only; vLLM's objects come in through the tap).
Subscribed by ``engine.py`` when the connector's manager has secondary tiers (the tiering
spec, 0.24+); everything the tiers do (their reads and writes, on a temporary directory) is
vLLM's own.
"""
import queue
import time


def settle_tiers(m, tap):
    """A ``TieringOffloadingManager`` (``m``) on the engine's step clock: its secondary tiers do
    their I/O on threads (the file-system tier's pool, 0.33.0 v1/kv_offload/tiering/fs/manager.py:
    190-194; its lookups, tiering/async_lookup.py:120-126), so at each schedule end, after the
    manager has submitted the step's promotions and cascades and flushed the lookups
    (tiering/manager.py:1083-1107), wait for every job and every lookup batch to finish, and
    hand a tier's finished jobs over in job order (the pool reports them in completion order,
    fs/thread_pool.py:130-136): the same command then runs the same schedule. The reads and
    writes themselves are the tier's own, on a temporary directory."""

    def on_schedule_end(call, *context):
        call(*context)
        for tier in m.secondary_tiers:
            tier.drain_jobs()  # the pool's wait_idle (0.33.0 fs/manager.py:334-336)
            lm = getattr(tier, "_lookup_manager", None)
            if lm is not None:
                awaited = {_probe(k, st) for k, st in lm._lookup_state.items() if _in_flight(st)}
                if awaited:
                    _wait(lambda: awaited <= _posted(lm._pending_results),
                          "the %s tier's lookup batch" % tier.tier_type)

    def get_finished_jobs(call):
        return sorted(call(), key=lambda r: r.job_id)

    tap.around(m, "on_schedule_end", on_schedule_end)
    for tier in m.secondary_tiers:
        _finish_when_drained(tier, tap)
        tap.around(tier, "get_finished_jobs", get_finished_jobs)


def _finish_when_drained(tier, tap):
    """A job the tier's pool finished is reported only once a drain has waited for it: the
    jobs on_schedule_end drains, and those vLLM's own reset_cache drains (tiering/manager.py:
    1164-1169, which asserts every job reported after it). Not every job is submitted in
    on_schedule_end: ``complete_store`` cascades each store the workers report done to the tier
    (0.33.0 tiering/manager.py:969-975), called from ``update_connector_output``
    (offloading/scheduler.py:2291), between one schedule end and the next step's first lookup;
    that step's lookups and prepare_stores poll the tier (tiering/manager.py:624, :851), and
    whether the write thread has finished the cascade by then is the threads' timing. A finished
    cascade unpins its primary chunks (``complete_read``, :546), so it decides what a promotion
    can allocate (:713) and what a store evicts (:857). Held here, the cascade is reported at
    the first poll after the next schedule end, as idle runs report it. The hold is on the
    pool (fs/thread_pool.py:130-136), under the tier's own ``get_finished_jobs``, so the tier
    does what it does with a finished job (events, a failed promotion's misses) when it is
    reported. The hold picks one schedule vLLM can produce (a pool slower than the step); the
    orders in which a cascade finishes before the next step's lookups are not reached. A tier
    with no such pool is left as it is."""
    pool = getattr(tier, "_pool", None)
    if pool is None or not hasattr(pool, "get_finished") or not hasattr(tier, "drain_jobs"):
        return
    finished = pool.get_finished  # vLLM's: every job finished so far, in completion order
    drained = []

    def drain_jobs(call):
        call()  # the pool's wait_idle: every job submitted has finished
        drained.extend(finished())
        drained.sort(key=lambda r: r[0])

    def get_finished(call):
        out = list(drained)
        del drained[:]
        return out

    tap.around(tier, "drain_jobs", drain_jobs)
    tap.around(pool, "get_finished", get_finished)


def _in_flight(state):
    """A lookup probe submitted to the tier's thread and not yet answered: 0.30 gave each probe a
    ``LookupPhase`` (0.30.0 v1/kv_offload/tiering/async_lookup.py:53, ``IN_FLIGHT``); before, a
    probe without a result is in flight once ``flush`` has submitted the batch (0.29.0
    async_lookup.py:47-50,147-158). Probed by feature."""
    phase = getattr(state, "phase", None)
    return phase.name == "IN_FLIGHT" if phase is not None else state.result is None


def _probe(key, state):
    """A probe as the lookup thread answers it: (key, generation) from 0.30 (0.30.0
    tiering/async_lookup.py:113), the key alone before."""
    gen = getattr(state, "generation", None)
    return key if gen is None else (key, gen)


def _posted(results):
    """The probes the lookup thread has answered and the scheduler not yet drained: the queue's
    batches taken and put back (each probe is answered once and drain_results applies a batch by
    its probes, 0.33.0 tiering/async_lookup.py:196-218, so their order does not matter). Waiting
    for every in-flight probe's answer, not for any answer: a batch whose probes a reset dropped
    is answered too, and discarded (:203-204), and must not stand in for the step's own."""
    batches = []
    while True:
        try:
            batches.append(results.get_nowait())
        except queue.Empty:
            break
    for b in batches:
        results.put(b)
    return {(e[0], e[1]) if len(e) == 3 else e[0] for b in batches for e in b}


def _wait(ready, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError("kvbound: %s did not finish within %d s" % (what, timeout_s))
        time.sleep(0.0005)
