"""vLLM defect, 0.28.0 - 0.29.0 (docs/findings.md; reached through the engine by kvbound's fault
tier_lookup_late_p): the file-system and object tiers'
lookup cache, ``AsyncLookupManager`` (v1/kv_offload/tiering/async_lookup.py), asserts when a
request's cleanup drops a key's lookup state while the key's probe is still on the lookup thread.

The calls are the ones the fs tier makes (0.29.0 tiering/fs/manager.py): ``lookup`` from its
lookup (:212), ``flush`` from ``on_schedule_end`` (:332), ``cleanup`` from
``on_request_finished`` (:328). The lookup thread is held by an Event so the interleaving is
the same on every run:

1. request X looks key K up and the step's flush hands the probe to the thread (held);
2. X finishes (aborted): ``cleanup`` deletes K's state, the probe still in flight;
3. request Y looks K up: the state is made again and a second probe is flushed;
4. the thread answers both; the first answer fills the new state, and the second trips
   ``drain_results``'s assert (0.28.0 - 0.29.0 async_lookup.py:177), an AssertionError on
   the scheduler's thread.

0.30.0 tags each probe with a generation and keeps in-flight states (0.30.0 async_lookup.py:49-56,
113). 0.24.0 - 0.27.0 have no assert and apply the late answer silently.

    PYTHONPATH=~/.cache/kvbound/vllm-0.29.0 VLLM_TARGET_DEVICE=cpu \\
        ~/.cache/kvbound/deps-*/bin/python scripts/repro_async_lookup_cleanup_race.py

Prints one line; exit 1 on the assert, 0 without it.
"""
import sys
import threading

import vllm
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager

held = threading.Event()


class HeldLookups(AsyncLookupManager):
    """The tier's lookup cache with a lookup thread that answers only once released."""

    batches = 0  # batches the thread has taken

    def batch_lookup(self, keys, req_context):
        HeldLookups.batches += 1
        held.wait()
        return [True for _ in keys]


def main():
    m = HeldLookups(tier_type="fs")
    key = b"K"
    m.lookup(key, ReqContext(req_id="X"))
    m.flush()  # the probe goes to the (held) thread
    m.cleanup("X")  # X finished: its state deleted, the probe in flight
    m.lookup(key, ReqContext(req_id="Y"))
    m.flush()  # a second probe of the same key
    held.set()
    # every flushed batch answered (0.30.0 and later keep the in-flight state: one batch only)
    while not (m._lookup_queue.empty() and m._pending_results.qsize() >= HeldLookups.batches):
        threading.Event().wait(0.01)
    try:
        m.lookup(key, ReqContext(req_id="Y"))  # drains both answers
    except AssertionError as e:
        print(f"FAIL: vllm {vllm.__version__}: drain_results asserts on a late lookup answer: {e}")
        return 1
    print(f"ok: vllm {vllm.__version__}: the late lookup answer is taken without an assert")
    return 0


if __name__ == "__main__":
    sys.exit(main())
