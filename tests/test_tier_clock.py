"""The tiering manager on the engine's step clock (kvbound/side/tier_clock.py), on plain objects:
a job the file tier's pool finished is reported only after a drain waited for it, in job order,
whatever the pool's threads had finished when the tier was polled. (On a loaded machine a cascade
submitted by complete_store, between one schedule end and the next step's lookups, had been
reported at that step's first poll or not, and the same seed gave another schedule.)"""

from __future__ import annotations

import queue
import threading
import types

import pytest

from kvbound.side import tap as T
from kvbound.side import tier_clock as C


class Pool:
    """A pool whose threads have finished ``done`` (job id, success, seconds), in completion order."""

    def __init__(self):
        self.done, self.idle_waits = [], 0

    def get_finished(self):
        out, self.done = self.done, []
        return out

    def wait_idle(self):
        self.idle_waits += 1


class Tier:
    tier_type = "fs"

    def __init__(self):
        self._pool = Pool()

    def drain_jobs(self):
        self._pool.wait_idle()

    def get_finished_jobs(self):
        return [types.SimpleNamespace(job_id=j, success=ok) for j, ok, _ in self._pool.get_finished()]


def test_a_finished_job_is_reported_only_after_a_drain_in_job_order():
    tier = Tier()
    manager = types.SimpleNamespace(secondary_tiers=[tier], on_schedule_end=lambda *c: None)
    C.settle_tiers(manager, T.Tap())
    tier._pool.done += [(12, True, 0.1), (10, True, 0.2)]  # a cascade finished mid-step, before any drain
    assert tier.get_finished_jobs() == []  # the step's poll does not see it
    manager.on_schedule_end()  # the schedule end drains the pool
    assert tier._pool.idle_waits == 1
    assert [r.job_id for r in tier.get_finished_jobs()] == [10, 12]
    assert tier.get_finished_jobs() == []


def test_a_tier_without_a_pool_is_left_as_it_is():
    done = [types.SimpleNamespace(job_id=2), types.SimpleNamespace(job_id=1)]
    tier = types.SimpleNamespace(tier_type="x", drain_jobs=lambda: None, get_finished_jobs=lambda: done)
    manager = types.SimpleNamespace(secondary_tiers=[tier], on_schedule_end=lambda *c: None)
    C.settle_tiers(manager, T.Tap())
    assert [r.job_id for r in tier.get_finished_jobs()] == [1, 2]  # reported at once, in job order


class OldPool:
    """The file tier's pool before 0.24 (0.23.0 tiering/fs/thread_pool.py): jobs enqueued with their
    tasks, each run on a thread of its own after ``delay`` seconds, a job reported by ``get_finished``
    once its last task ran; no ``wait_idle``."""

    def __init__(self, delay):
        self.delay, self.finished, self.lock = delay, [], threading.Lock()

    def _enqueue(self, job_id, n_tasks, tasks):
        tasks = list(tasks)

        def run():
            threading.Event().wait(self.delay)
            for t in tasks:
                t()
            with self.lock:
                self.finished.append((job_id, True))

        if n_tasks:  # a job of no task never comes back (its count never reaches 0)
            threading.Thread(target=run, daemon=True).start()

    enqueue_store = enqueue_load = _enqueue

    def get_finished(self):
        with self.lock:
            out, self.finished = self.finished, []
        return out


class OldTier:
    tier_type = "fs_python"

    def __init__(self, delay):
        self._pool = OldPool(delay)

    def submit_store(self, job_id, n):
        self._pool.enqueue_store(job_id, n, (lambda: None for _ in range(n)))

    def get_finished(self):  # 0.22.1's name (tiering/base.py:143)
        return [types.SimpleNamespace(job_id=j, success=ok) for j, ok in self._pool.get_finished()]


def _old_manager(tier):
    """0.22.1's tiering manager: no on_schedule_end; take_events, a generator, ends the step."""
    def take_events():
        yield "event"
    return types.SimpleNamespace(secondary_tiers=[tier], take_events=take_events)


def test_before_0_24_the_step_waits_for_every_job_it_enqueued_and_reports_them_at_the_next_poll():
    tier = OldTier(delay=0.05)
    manager = _old_manager(tier)
    C.settle_tiers(manager, T.Tap())
    tier.submit_store(7, 2)
    tier.submit_store(5, 1)
    tier.submit_store(9, 0)  # no task: not waited for
    assert tier.get_finished() == []  # mid-step: the threads are still sleeping, and nothing is drained
    assert list(manager.take_events()) == ["event"]  # the step ends: vLLM's events, then the wait
    assert [r.job_id for r in tier.get_finished()] == [5, 7]  # both back, in job order
    assert tier.get_finished() == []
    assert list(manager.take_events()) == ["event"]  # nothing pending: the next step's end does not wait


def test_before_0_24_a_job_that_never_comes_back_is_one_line_not_a_hang(monkeypatch):
    tier = OldTier(delay=3600)
    manager = _old_manager(tier)
    C.settle_tiers(manager, T.Tap())
    tier.submit_store(1, 1)
    wait = C._wait
    monkeypatch.setattr(C, "_wait", lambda ready, what, timeout_s=60.0: wait(ready, what, 0.2))
    with pytest.raises(RuntimeError, match="the fs_python tier's jobs did not finish within 0 s"):
        list(manager.take_events())


class Lookups:
    """An AsyncLookupManager's scheduler-side surface (0.29.0 tiering/async_lookup.py:125-182): a
    step's probes flushed as one batch to a lookup thread that answers it after ``delay`` seconds
    with one batch of answers; ``drain_results`` applies every answer that has arrived."""

    def __init__(self, delay=0.0):
        self._lookup_batch, self._lookup_state, self.delay = [], {}, delay
        self._pending_results = queue.SimpleQueue()
        self.applied = []

    def lookup(self, key, req_id="r"):
        self._lookup_batch.append((key, None))
        self._lookup_state.setdefault(key, types.SimpleNamespace(request_ids=set())).request_ids.add(req_id)

    def flush(self):
        if self._lookup_batch:
            batch, self._lookup_batch = self._lookup_batch, []
            answer = [(k, True) for k, _ in batch]
            thread = threading.Timer(self.delay, self._pending_results.put, (answer,))
            thread.daemon = True
            thread.start()

    def drain_results(self):
        while True:
            try:
                self.applied.append([e[0] for e in self._pending_results.get_nowait()])
            except queue.Empty:
                return

    def shutdown(self):
        self.drain_results()  # 0.30.0 async_lookup.py:241-245


class Lookups030(Lookups):
    """0.30's: a probe carries its state's generation; ``flush`` drains first, then posts the
    probes whose state is still current (0.30.0 tiering/async_lookup.py:143-189)."""

    def lookup(self, key, req_id="r"):
        st = self._lookup_state.get(key)
        if st is None:
            st = self._lookup_state[key] = types.SimpleNamespace(request_ids=set(), generation=len(self.applied) * 100
                                                                 + len(self._lookup_batch))
            self._lookup_batch.append((key, None, st.generation))
        st.request_ids.add(req_id)

    def flush(self):
        self.drain_results()
        batch, self._lookup_batch = self._lookup_batch, []
        live = [(k, g, True) for k, _, g in batch
                if k in self._lookup_state and self._lookup_state[k].generation == g]
        if live:
            thread = threading.Timer(self.delay, self._pending_results.put, (live,))
            thread.daemon = True
            thread.start()


def _answers(lm, hold):
    tap = T.Tap()
    a = C.LookupAnswers(lm, tap, hold)
    a.published = []
    tap.subscribe("tier_lookup_late_answer", a.published.append)

    def step(*keys):  # a step's lookups, its schedule end (flush, then the clock's settle), the next drain
        for k in keys:
            lm.lookup(k)
        lm.flush()
        a.settle("the test tier's lookup batch")
        lm.drain_results()
        return lm.applied

    return a, step


def test_the_step_clock_waits_for_the_lookup_thread_and_the_next_drain_reads_its_answer():
    """However slow the thread, a step's answers are read by the next step's first drain (the
    idle schedule): settle waited for the one batch flushed, and no answer is held."""
    lm = Lookups(delay=0.05)
    a, step = _answers(lm, lambda: 0)
    assert step("k1") == [["k1"]]
    assert step() == [["k1"]] and a.flushed == a.answered == 1


def test_a_late_answer_is_held_its_steps_and_no_later_batch_overtakes_it():
    """tier_lookup_late_p: a batch held 2 steps is read 2 drains later; the next batch, due at once,
    waits behind it (the one lookup thread answers in order)."""
    lm = Lookups()
    holds = iter([2, 0])
    a, step = _answers(lm, lambda: next(holds))
    assert step("k1") == []
    assert step("k2") == []
    assert step() == [["k1"], ["k2"]]
    assert a.stats["tier_lookups_late"] == 1
    assert a.published == [["r"]]  # the requests asking a late batch's keys: their liveness bound restarts


def test_answers_on_time_publish_no_late_answer():
    lm = Lookups()
    a, step = _answers(lm, lambda: 0)
    assert step("k1") == [["k1"]] and a.published == []


def test_settle_never_ends_before_the_thread_has_answered():
    """The clock counts the batches flushed, not the keys in flight: a thread that never answers
    is a harness fault named after a bounded wait, never a step that reads a missing answer."""
    lm = Lookups(delay=3600)
    a = C.LookupAnswers(lm, T.Tap(), lambda: 0)
    lm.lookup("k1")
    lm.flush()
    with pytest.raises(RuntimeError, match="did not finish"):
        C._wait(a._take, "the test tier's lookup batch", timeout_s=0.2)


def test_from_0_30_a_flush_counts_only_when_a_current_probe_is_posted():
    """0.30's flush posts only the probes whose state is current; a batch all of whose states a
    cleanup dropped posts nothing, and the clock must not wait for its answer (it never comes)."""
    lm = Lookups030(delay=3600)  # a thread that never answers in this test
    a = C.LookupAnswers(lm, T.Tap(), lambda: 0)
    lm.lookup("k1")
    del lm._lookup_state["k1"]  # its request finished before the schedule end
    lm.flush()
    assert a.flushed == 0
    a.settle("the test tier's lookup batch")  # returns at once: nothing flushed, nothing awaited
    lm.lookup("k2")
    lm.lookup("k3")
    del lm._lookup_state["k3"]
    lm.flush()
    assert a.flushed == 1  # k2's probe went out


def test_a_late_answer_to_a_dropped_or_newer_state_restarts_no_wait():
    """Only an answer vLLM applies (its key's state, of its generation) restarts the liveness count
    of the requests asking it (0.30.0 async_lookup.py:201-204 discards the others)."""
    lm = Lookups030()
    a, step = _answers(lm, iter([2, 0, 0]).__next__)
    step("k1")  # held two steps
    lm._lookup_state["k1"] = types.SimpleNamespace(request_ids={"other"}, generation=999)  # a newer state
    step()
    step()
    assert lm.applied == [["k1"]] and a.published == []


def test_shutdown_applies_nothing_held_or_queued():
    """At the engine's end vLLM's shutdown drains once more (0.30.0 async_lookup.py:241-245); what the
    clock holds, or a run that ended inside a drain left queued, is dropped, never applied then."""
    lm = Lookups()
    a, step = _answers(lm, lambda: 5)
    step("k1")
    lm._pending_results.put([("k2", True)])  # left queued by a drain that raised
    lm.shutdown()
    assert lm.applied == [] and not a.held


@pytest.mark.parametrize("version", ["0.22.1", "0.23.0"])
def test_the_file_tier_of_0_22_and_0_23_runs_on_the_step_clock_with_its_faults(workers, version):
    """Real vLLM: where the file tier's pool has no wait_idle, every job it was given is back by the
    step's end, its failed promotions (files lost or torn) reach the tier's failure path, and the
    run is the same twice (the same command, the same schedule)."""
    from kvbound.trace import runner as R

    point = "full-tiering-fs@shadow=false,tier_lose_p=0.1,tier_torn_p=0.1"
    env, w = workers(version)
    runs = []
    for _ in range(2):
        job = R.make_job(point, (3, "tier-clock"), 60, 0, "sync")
        res = w.job(job)
        found, _ = R.check_result(version, point, job, res)
        assert res["ok"] and not [f for f in found if f.key().startswith("harness:")], res.get("error")
        runs.append((res["stats"], sorted(f.key() for f in found)))
    stats = runs[0][0]
    assert stats["steps"] > 0 and stats["tier_failed_reads"] > 0 and stats["tier_lost_files"] > 0, stats
    assert runs[0] == runs[1]
