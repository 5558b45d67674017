"""This machine's pace against the machine the cost table was measured on.

``kvbound.options.PlanOptions`` turns a budget into requests per point by a fixed table, so two
runs of one command trace the same requests on any machine; but a machine half as fast takes
twice the seconds (CI's campaign, planned at 193 s, took 391 s on a slower 2-core machine,
docs/benchmarks.md "The plan at this machine's pace"). The pace scales the seconds a run is
said to take, never the requests it traces: the pace is a clock, and the plan of the traffic
has none.

Where this machine has run campaigns, the pace is what they took: the median, over the last
``PlanOptions.pace_runs`` local campaigns planned at ``pace_min_table_s`` or more, of seconds
taken over seconds planned by the table (kept in the cache directory, ``pace.json``). A probe
cannot say it alone: on a shared host the speed of a core swings by half within seconds (the
probe's rounds here: 12 ms, then 21 ms for a second and a half, then 12 ms again), and a
campaign keeps both cores busy for minutes. On a machine with no campaign yet, the probe below
times a fixed piece of the work a trace worker spends its time on (Python objects made and
dropped, dicts keyed by sha256 block hashes, sorting), against the same probe on the table's
machine (``PlanOptions.probe_s``): a first guess, said as one.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time


class _Block:
    __slots__ = ("block_id", "block_hash", "ref_cnt")

    def __init__(self, block_id: int, block_hash: bytes):
        self.block_id, self.block_hash, self.ref_cnt = block_id, block_hash, 0


def _round(n: int = 8000) -> int:
    table, prev = {}, b""
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        block = table[prev] = _Block(i, prev)
        block.ref_cnt += len(table) & 3
    free = sorted(table.values(), key=lambda b: (b.ref_cnt, b.block_id))
    return sum(b.block_id for b in free[::7])


def probe_seconds(rounds: int = 31) -> float:
    """The median wall seconds of one round of the probe, of ``rounds`` (about 0.3 s in all on
    the table's machine; wall, not CPU: a machine whose cores are shared runs the campaign slower
    too)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _round()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _history_file():
    from kvbound.conform.prepare import cache_dir

    return cache_dir() / "pace.json"


def _history() -> list:
    try:
        runs = json.loads(_history_file().read_text())
        return [r for r in runs if r["table_s"] > 0 and r["taken_s"] > 0]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or not ours: start again
        return []


def machine_pace(plan) -> tuple:
    """(the pace: this machine's seconds per second of the cost table ``plan``, 2 decimals; how
    it was found, in words)."""
    runs = _history()[-plan.pace_runs:]
    if runs:
        pace = statistics.median(r["taken_s"] / r["table_s"] for r in runs)
        return round(pace, 2), f"what the last {len(runs)} campaign(s) here took"
    return round(probe_seconds() / plan.probe_s, 2), "a 0.3-s probe, no campaign here yet"


def record(plan, table_s: float, taken_s: float) -> None:
    """Keep what a local campaign planned by the table at ``table_s`` took, where it was planned
    at ``plan.pace_min_table_s`` or more (below, worker starts and one finding's shrinking
    swing it), the last ``plan.pace_runs``."""
    if table_s < plan.pace_min_table_s:
        return
    runs = (_history() + [{"table_s": round(table_s, 1), "taken_s": round(taken_s, 1)}])[-plan.pace_runs:]
    path = _history_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(runs, indent=1) + "\n")
    except OSError:  # a read-only cache: the next run plans by the probe again
        pass
