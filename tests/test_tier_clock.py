"""The tiering manager on the engine's step clock (kvbound/side/tier_clock.py), on plain objects:
a job the file tier's pool finished is reported only after a drain waited for it, in job order,
whatever the pool's threads had finished when the tier was polled. (On a loaded machine a cascade
submitted by complete_store, between one schedule end and the next step's lookups, had been
reported at that step's first poll or not, and the same seed gave another schedule.)"""

from __future__ import annotations

import types

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
