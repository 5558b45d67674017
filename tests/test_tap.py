"""The tap (kvbound/side/tap.py): each vLLM method the trace observes is wrapped once, and every
checker subscribes to it; on a real engine no method carries a second wrapper."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import kvbound.side
from conftest import release_env_for
from kvbound.side.tap import Tap, TapError


class Pool:
    """Stands in for a vLLM object: one method, recording its calls."""

    def __init__(self):
        self.calls = []

    def take(self, n, who="vllm"):
        self.calls.append((n, who))
        return n * 10


def test_subscribers_nest_in_subscription_order_the_first_innermost():
    pool, tap, seen = Pool(), Tap(), []

    def inner(call, n, **k):
        seen.append(("inner", n))
        return call(n, **k) + 1

    def outer(call, n, **k):
        seen.append(("outer", n))
        return call(n + 1, **k) * 2  # an outer subscriber may change what the inner ones get

    tap.around(pool, "take", inner)
    tap.around(pool, "take", outer)
    assert pool.take(3, who="scheduler") == ((4 * 10) + 1) * 2
    assert seen == [("outer", 3), ("inner", 4)]
    assert pool.calls == [(4, "scheduler")]


def test_a_subscriber_may_keep_the_call_from_vllm():
    pool, tap = Pool(), Tap()
    tap.around(pool, "take", lambda call, n: -1)
    assert pool.take(5) == -1 and pool.calls == []


def test_one_wrapper_however_many_subscribers():
    pool, tap = Pool(), Tap()
    real = pool.take
    for _ in range(3):
        tap.around(pool, "take", lambda call, n: call(n))
    ((owner, name, orig),) = tap.wrapped()
    assert owner is pool and name == "take" and orig == real
    assert pool.take(2) == 20 and pool.calls == [(2, "vllm")]


def test_a_second_wrap_of_one_method_is_refused():
    pool = Pool()
    Tap().around(pool, "take", lambda call, n: call(n))
    with pytest.raises(TapError, match="another tap"):
        Tap().around(pool, "take", lambda call, n: call(n))


def test_events_reach_their_subscribers_in_order():
    tap, got = Tap(), []
    tap.subscribe("forward", lambda so: got.append(("a", so)))
    tap.subscribe("forward", lambda so: got.append(("b", so)))
    tap.publish("forward", 7)
    tap.publish("update_states", 8)  # no subscriber: nothing
    assert got == [("a", 7), ("b", 7)]


# --- real vLLM: one trace engine, every observed method wrapped once ------------------------

DRIVER = r"""
import inspect, json, os, sys
sys.path.insert(0, sys.argv[1])
import worker  # kvbound/side/worker.py: the side package by path
sys.path.pop(0)
from kvbound_side import tap as T
from kvbound_side.engine import Release

job = json.loads(sys.argv[2])
eng = Release().build(job["layout"], job["params"])
eng.run(job["requests"], 3000)
side = os.path.abspath(sys.argv[1])
cs = eng.csched
objects = {"scheduler": eng.sched, "connector": eng.sched.connector, "connector_scheduler": cs,
           "manager": cs.manager, "policy": getattr(cs.manager, "_policy", None),
           "kv_cache_manager": eng.sched.kv_cache_manager,
           "coordinator": eng.sched.kv_cache_manager.coordinator,
           "block_pool": eng.sched.kv_cache_manager.block_pool}
tapped, foreign = [], []
for where, obj in objects.items():
    for name, fn in sorted(vars(obj).items() if obj is not None else ()):
        code = getattr(fn, "__code__", None)
        if not callable(fn) or code is None or not os.path.abspath(code.co_filename).startswith(side) \
                or not hasattr(type(obj), name):
            continue  # vLLM's own attributes, or kvbound's own (the scripted tier's kvbound_*)
        if getattr(fn, T.TAPPED, None) is eng.tap:
            tapped.append(where + "." + name)
        else:
            foreign.append(where + "." + name)
origins = {}
for owner, name, orig in eng.tap.wrapped():
    f = getattr(orig, "__func__", orig)
    origins[type(owner).__name__ + "." + name] = [
        inspect.getsourcefile(f).replace(os.sep, "/").split("/vllm/", 1)[-1], getattr(orig, T.TAPPED, None) is not None]
print("KVBOUND-TAP " + json.dumps({"tapped": tapped, "foreign": foreign, "origins": origins,
                                   "stats": eng.stats}))
"""


def test_every_observed_vllm_method_is_wrapped_once_on_a_real_engine():
    """A scripted tier under shadow KV and the lifecycle checks (every subscriber there is):
    each method the trace observes carries exactly one kvbound wrapper, the tap's, around
    vLLM's own method; no other kvbound function stands in for a method of any observed object."""
    from kvbound.trace import runner as R

    env = release_env_for("0.33.0")
    job = R.make_job("full-scripted", (0, "tap"), 40, 0, "sync", None)
    r = subprocess.run([env.python, "-P", "-c", DRIVER, os.path.dirname(kvbound.side.__file__), json.dumps(job)],
                       env=dict(os.environ, PYTHONPATH=env.tree or "", VLLM_TARGET_DEVICE="cpu"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("KVBOUND-TAP ", 1)[1])
    assert out["stats"]["lookups"] > 0 and out["stats"]["stores"] > 0, out["stats"]
    assert out["foreign"] == [], out["foreign"]
    assert sorted(out["tapped"]) == sorted([  # full-scripted stalls no write: complete_store as vLLM has it
        "connector_scheduler.get_num_new_matched_tokens", "connector_scheduler.update_state_after_alloc",
        "connector_scheduler.build_connector_meta", "connector_scheduler.request_finished",
        "connector_scheduler._build_store_jobs",
        "manager.lookup", "manager.prepare_load", "manager.prepare_store", "manager.on_schedule_end",
        "policy.evict",
        "kv_cache_manager.allocate_slots", "coordinator.get_num_blocks_to_allocate", "coordinator.cache_blocks"])
    for name, (source, wrapped_twice) in out["origins"].items():
        assert source.startswith("v1/") or source.startswith("distributed/"), (name, source)
        assert not wrapped_twice, name
