"""This machine's pace against the machine the cost table was measured on.

``kvbound.options.PlanOptions`` turns a budget into requests per point by a fixed table, so two
runs of one command trace the same requests on any machine; but a machine half as fast takes
twice the seconds (CI's campaign, planned at 193 s, took 391 s on a slower 2-core machine,
docs/benchmarks.md "The plan at this machine's pace"). The pace scales the seconds a run is
said to take, never the requests it traces: the pace is a clock, and the plan of the traffic
has none.

Where this machine has run campaigns, the pace is what they took, per release and in two
parts, since neither the releases nor the two parts of a shard run at one pace: a shard's
running (its worker's start and traffic) and its shrinking (which follows what the release
finds; 0.33.0 finds the most). The default full range ran at x1.48 of the table in all, and CI's
campaign (0.29.0 + 0.33.0, a third of the shrink budget) at x2.0, so one factor for every
campaign missed one of them by a third (docs/benchmarks.md "The plan at this machine's pace").
Each part of a release's pace is the median, over its last ``PlanOptions.pace_runs`` shards
planned at ``pace_min_part_s`` or more for that part, of the seconds the shard's worker took
over the seconds the table planned (kept in the cache directory, ``pace.json``), the shrinking
per shrink budget (``parts``: it is not linear in the budget); a release not run here yet takes
the median of those that were. A probe cannot say it alone: on a shared
host the speed of a core swings by half within seconds (the probe's rounds here: 12 ms, then
21 ms for a second and a half, then 12 ms again), and a campaign keeps both cores busy for
minutes. On a machine with no campaign yet, the probe below times a fixed piece of the work a
trace worker spends its time on (Python objects made and dropped, dicts keyed by sha256 block
hashes, sorting), against the same probe on the table's machine (``PlanOptions.probe_s``): a
first guess, said as one.
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


def parts(shrink_budget: int) -> tuple:
    """The names a shard's two parts (``PlanOptions.shard_parts``) are kept under: its running, and
    its shrinking at ``shrink_budget`` reruns, which is not linear in the budget (the first reruns
    shrink the longest segments: 0.33.0 shrank at x1.9 of the table at 20 reruns, x1.0 - 1.2 at 60)."""
    return "run", f"shrink@{int(shrink_budget)}"


def _history() -> dict:
    """Per matrix column (a release, or ``src:<dir>``), per part (``parts``): the [table, taken]
    seconds of its last shards."""
    try:
        got = json.loads(_history_file().read_text())
        return {col: {part: [[float(t), float(k)] for t, k in runs if t > 0 and k > 0]
                      for part, runs in got[col].items() if part == "run" or part.startswith("shrink@")}
                for col in got}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, or not ours: start again
        return {}


def _median_ratio(runs) -> float | None:
    return statistics.median(k / t for t, k in runs) if runs else None


def release_paces(plan, columns, shrink_budget: int) -> tuple:
    """([(running, shrinking) pace of each of ``columns``, 2 decimals], how they were found, in
    words): a column's own shards where it has some, else the median of the columns that have;
    a shrinking at ``shrink_budget`` none has, the median of every column's shrinking at any
    budget; the probe where nothing is kept."""
    history = _history()
    names = parts(shrink_budget)
    ratios = {(col, part): _median_ratio(runs[-plan.pace_runs:]) for col, h in history.items() for part, runs in h.items()}
    if not ratios:
        probe = round(probe_seconds() / plan.probe_s, 2)
        return [(probe, probe)] * len(columns), "a 0.3-s probe, no campaign here yet"
    any_shrink = [r for (_, part), r in ratios.items() if part.startswith("shrink@")]
    fallback = []
    for part in names:
        known = [r for (_, q), r in ratios.items() if q == part] or any_shrink or list(ratios.values())
        fallback.append(statistics.median(known))
    paces = [tuple(round(ratios.get((col, part)) or fb, 2) for part, fb in zip(names, fallback)) for col in columns]
    said = names if shrink_budget else names[:1]  # no shrinking to say without a shrink budget
    measured = sum(1 for col in columns if all((col, part) in ratios for part in said))
    return paces, (f"what this release's last shards here took" if len(columns) == measured == 1 else
                   f"what the last shards here took, {measured} of {len(columns)} releases measured"
                   + ("" if measured == len(columns) else
                      (f" (both parts, shrinking at {int(shrink_budget)} reruns)" if shrink_budget else "")
                      + ", a part not measured at the median"
                      " of those measured"))


def record(plan, shards) -> None:
    """Keep what each shard of a local campaign took, ``shards`` being (column, its shrink budget,
    the table's (running, shrinking) seconds, the worker's (running, shrinking) seconds): each part
    the table planned at ``plan.pace_min_part_s`` or more (below, a worker's start or one finding's
    shrinking swings it), the last ``plan.pace_runs`` per column and part."""
    history = _history()
    for col, budget, table, taken in shards:
        for part, t, k in zip(parts(budget), table, taken):
            if t >= plan.pace_min_part_s and k > 0:
                runs = history.setdefault(col, {}).setdefault(part, [])
                runs[:] = (runs + [[round(t, 1), round(k, 1)]])[-plan.pace_runs:]
    path = _history_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(history, indent=1, sort_keys=True) + "\n")
    except OSError:  # a read-only cache: the next run plans by the probe again
        pass
