"""The tiering offload manager on the engine's step clock: the harness's one hold over the
threads of a ``TieringOffloadingManager``'s secondary tiers, so the same command runs the
same schedule, and the one place that schedule is made slower on purpose (the fault
``tier_lookup_late_p``: a tier's lookup answers arrive ``late_steps`` steps late).

Part of the side package (standard library only; vLLM's objects come in through the tap).
Subscribed by ``engine.py`` when the connector's manager has secondary tiers (the tiering
spec: its file-system and example tiers from 0.22.1); everything the tiers do
(their reads and writes, on a temporary directory) is vLLM's own.
"""
import collections
import queue
import random
import time

from .fakes import LATE_STEPS


def settle_tiers(m, tap, eng=None):
    """A ``TieringOffloadingManager`` (``m``) on the engine's step clock: its secondary tiers do
    their I/O on threads (the file-system tier's pool, 0.33.0 v1/kv_offload/tiering/fs/manager.py:
    190-194; its lookups, tiering/async_lookup.py:120-126), so at each schedule end, after the
    manager has submitted the step's promotions and cascades and flushed the lookups
    (tiering/manager.py:1083-1107), wait for every job and every lookup batch to finish, and
    hand a tier's finished jobs over in job order (the pool reports them in completion order,
    fs/thread_pool.py:130-136): the same command then runs the same schedule. The reads and
    writes themselves are the tier's own, on a temporary directory. ``eng``: the engine (its
    settings ``tier_lookup_late_p``, ``late_steps`` and ``seed``, its planted defect, its stats:
    ``tier_lookups_late``, the answer batches held); None: no fault."""
    par = getattr(eng, "par", {})
    answers = {}
    for tier in m.secondary_tiers:
        lm = getattr(tier, "_lookup_manager", None)
        if lm is not None:
            answers[id(tier)] = LookupAnswers(lm, tap, _late(par, tier.tier_type), getattr(eng, "mutant", None))
    if answers and par.get("tier_lookup_late_p"):
        eng.stats["tier_lookups_late"] = 0
        for a in answers.values():
            a.stats = eng.stats

    drains = {id(tier): _finish_when_drained(tier, tap) for tier in m.secondary_tiers}

    def settle():
        for tier in m.secondary_tiers:
            if drains[id(tier)] is not None:  # the example tier has no pool: its jobs are done at once
                drains[id(tier)]()
            if id(tier) in answers:
                answers[id(tier)].settle("the %s tier's lookup batch" % tier.tier_type)

    def on_schedule_end(call, *context):
        call(*context)
        settle()

    def take_events(call):  # 0.22.1: the manager's end-of-step hook flushes the promotions
        yield from call()  # (0.22.1 tiering/manager.py:469-499, consumed each step: scheduler.py:1557-1563)
        settle()

    def get_finished_jobs(call):
        return sorted(call(), key=lambda r: r.job_id)

    if hasattr(m, "on_schedule_end"):  # 0.23+
        tap.around(m, "on_schedule_end", on_schedule_end)
    else:
        tap.around(m, "take_events", take_events)
    for tier in m.secondary_tiers:
        tap.around(tier, finished_jobs_method(tier), get_finished_jobs)


def file_tiers(mgr):
    """The file-system secondary tiers of a tiering manager (those that map keys to files,
    ``file_mapper``: 0.22.1 - 0.33.0 ``tiering/fs/manager.py``)."""
    return [t for t in getattr(mgr, "secondary_tiers", None) or () if hasattr(t, "file_mapper")]


def on_disk(tier, keys):
    """The keys among ``keys`` whose block file is on the file tier's disk (a file lands whole: vLLM
    writes a temporary file and renames it, 0.33.0 ``fs/io.py:90-138``)."""
    import os

    return [k for k in keys if os.path.exists(tier.file_mapper.get_file_name(k))]


def finished_jobs_method(tier):
    """The name of a secondary tier's method that reports its finished jobs: ``get_finished_jobs``,
    ``get_finished`` in 0.22.1 (tiering/base.py:143)."""
    return "get_finished_jobs" if hasattr(tier, "get_finished_jobs") else "get_finished"


def _late(par, tier_type):
    """Steps to hold each answer batch of a tier's lookup thread: 0, or, with probability
    ``tier_lookup_late_p`` per batch, ``late_steps`` (default ``fakes.LATE_STEPS``), drawn from the seed."""
    p = float(par.get("tier_lookup_late_p") or 0.0)
    if not p:
        return lambda: 0
    steps = int(par.get("late_steps") or LATE_STEPS)
    rng = random.Random("%r-lookup-late-%s" % (par.get("seed", 0), tier_type))
    return lambda: steps if rng.random() < p else 0


class LookupAnswers:
    """A secondary tier's ``AsyncLookupManager`` (``lm``) on the step clock. ``flush`` posts the
    step's probes to the lookup thread as one batch (0.29.0 tiering/async_lookup.py:147-158;
    from 0.30, the probes whose state is still current, 0.30.0 :166-189); the thread answers each
    batch with one batch of results, in order (0.29.0 :214-249); ``drain_results`` applies what
    has arrived (:160-182), and is the only reader of the answers' queue. At each schedule end
    ``settle`` waits until the thread has answered every batch flushed so far and takes the
    answers; each is handed back to the queue just before the ``drain_results`` that follows
    its release step: the step it arrived (the idle schedule: the answer of a step's probes is
    read by the next step's first lookup), or ``hold()`` steps later (the fault: a slow file
    system; a later batch never overtakes an earlier one, as the one thread answers in order).
    Every schedule held here is one vLLM can produce (a thread that answers that late). A late
    batch handed back publishes ``tier_lookup_late_answer`` with the requests asking its keys, for
    whom the liveness bound starts again (side/lookups.py ``STUCK_BOUND_LOOKUPS``)."""

    def __init__(self, lm, tap, hold, mutant=None):
        self.lm, self.hold, self.tap = lm, hold, tap
        self.flushed = self.answered = self.step = 0
        self.held = collections.deque()  # (release step, answer batch, held late), in the thread's order
        self.stats = collections.Counter()  # tier_lookups_late: the answer batches held
        tap.around(lm, "flush", self._flush)
        if mutant == "stale_lookup_applied":  # innermost: it reads the answers the release below hands back
            tap.around(lm, "drain_results", self._stale_applied)
            tap.around(lm, "cleanup", self._drop_in_flight)
        tap.around(lm, "drain_results", self._drain_results)
        tap.around(lm, "shutdown", self._shutdown)

    def _flush(self, call):
        batch = list(self.lm._lookup_batch)
        out = call()
        self.flushed += any(len(e) == 2 or self._current(e[0], e[2]) for e in batch)
        return out

    def _current(self, key, generation):
        state = self.lm._lookup_state.get(key)
        return state is not None and state.generation == generation

    def settle(self, what):
        self.step += 1
        _wait(self._take, what)

    def _take(self):
        for batch in _take_all(self.lm._pending_results):
            self.answered += 1
            late = self.hold()
            self.stats["tier_lookups_late"] += late > 0
            due = max(self.step + late, self.held[-1][0]) if self.held else self.step + late
            self.held.append((due, batch, late > 0 or due > self.step))
        return self.answered >= self.flushed

    def _drain_results(self, call):
        late = set()  # the requests asking the keys of a late batch handed back now
        while self.held and self.held[0][0] <= self.step:
            _, batch, was_late = self.held.popleft()
            self.lm._pending_results.put(batch)
            for e in batch if was_late else ():  # an answer vLLM applies: to its key's state, of its
                st = self.lm._lookup_state.get(e[0])  # generation from 0.30 (0.30.0 async_lookup.py:201-204)
                if st is not None and (len(e) == 2 or st.generation == e[1]):
                    late.update(st.request_ids)
        if late:
            self.tap.publish("tier_lookup_late_answer", sorted(late))
        return call()

    def _shutdown(self, call, *a):
        """The engine is done: what is held or queued is dropped, so vLLM's own last drain (0.30.0
        async_lookup.py:241-245) applies nothing a run that ended inside a drain left behind."""
        self.held.clear()
        _take_all(self.lm._pending_results)
        return call(*a)

    def _drop_in_flight(self, call, req_id, *a):
        """Planted (with ``_stale_applied``): a request's cleanup drops a key's state its probe is
        still in flight for, as 0.28-0.29 did (0.29.0 async_lookup.py:193-203; 0.30 keeps it until
        the answer, 0.30.0 :229-240)."""
        keys = list(self.lm._req_keys.get(req_id, ()))
        out = call(req_id, *a)
        for k in keys:
            st = self.lm._lookup_state.get(k)
            if st is not None and not st.request_ids:
                del self.lm._lookup_state[k]
        return out

    def _stale_applied(self, call):
        """Planted: answers applied by key alone, a stale generation's to the key's current state
        (the generation check of 0.30.0 tiering/async_lookup.py:201-204 dropped)."""
        state = self.lm._lookup_state
        out = [[(e[0], getattr(state.get(e[0]), "generation", e[1]), e[2]) if len(e) == 3 else e for e in batch]
               for batch in _take_all(self.lm._pending_results)]
        for batch in out:
            self.lm._pending_results.put(batch)
        return call()


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
    orders in which a cascade finishes before the next step's lookups are not reached. Returns
    the tier's drain: vLLM's ``drain_jobs`` (0.24+: the pool's ``wait_idle``, fs/thread_pool.py:
    129-139), or, for the file tier of 0.22.1 - 0.23.0, whose pool has no ``wait_idle``, a wait
    until every job enqueued on the pool with a task has come back from it (its last task done,
    0.23.0 fs/thread_pool.py:151-158; a job of no task never comes back there, so it is not waited
    for); None for a tier with no such pool."""
    pool = getattr(tier, "_pool", None)
    if pool is None or not hasattr(pool, "get_finished"):
        return None
    finished = pool.get_finished  # vLLM's: every job finished so far, in completion order
    drained = []

    def get_finished(call):
        out = list(drained)
        del drained[:]
        return out

    tap.around(pool, "get_finished", get_finished)
    if hasattr(tier, "drain_jobs"):
        def drain_jobs(call):
            call()  # the pool's wait_idle: every job submitted has finished
            drained.extend(finished())
            drained.sort(key=lambda r: r[0])

        tap.around(tier, "drain_jobs", drain_jobs)
        return tier.drain_jobs
    pending = set()

    def enqueue(call, job_id, n_tasks, *a, **k):
        out = call(job_id, n_tasks, *a, **k)
        if n_tasks:  # after the enqueue: only the scheduler's thread reads the results, at the drain
            pending.add(job_id)
        return out

    def returned():
        got = finished()
        drained.extend(got)
        pending.difference_update(job_id for job_id, _ in got)
        return not pending

    def drain():
        _wait(returned, "the %s tier's jobs" % tier.tier_type)
        drained.sort(key=lambda r: r[0])

    tap.around(pool, "enqueue_store", enqueue)
    tap.around(pool, "enqueue_load", enqueue)
    return drain


def _take_all(q):
    """Every item a queue holds now, in order (it is left empty)."""
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def _wait(ready, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError("kvbound: %s did not finish within %d s" % (what, timeout_s))
        time.sleep(0.0005)
