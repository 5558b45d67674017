"""What --coverage costs the traffic rate, in one run: the same segment of each layout with
coverage off (a plain worker: its modules unprobed, as a campaign without coverage runs them),
traced over the whole job by coverage.py (``"coverage": "job"``) and recorded by the probes
compiled into the connector's modules (``"coverage": true``, what ``--coverage`` runs:
kvbound/side/cover.py ``probed``), the two measured in ONE worker started to measure, one job
after the other with the plain worker's (so the three share the machine's load), as requests
per CPU-second of the worker, and each measured rate over the rate off. A warm-up job first in
each worker (the first engine imports the CPU tier's modules).
The order of the three rotates from layout to layout and from round to round; with ``--repeat
N`` each job runs N times and the least CPU time counts (other processes on a shared machine
only ever add to a job's CPU time: its own work is the least of them).

    .venv/bin/python scripts/bench_coverage.py [--vllm 0.33.0] [--requests 200] [--repeat 3] [--layout L ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from kvbound.conform.prepare import prepare_release
from kvbound.trace.layouts import LAYOUTS
from kvbound.trace.runner import make_job, start_worker
from kvbound.trace.space import support

MODES = (("off", None), ("job", "job"), ("probes", True))  # the column, the job's "coverage"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm", default="0.33.0")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--layout", action="append", default=[])
    args = p.parse_args(argv)
    env = prepare_release(args.vllm, None)
    layouts = [n for n in (args.layout or LAYOUTS) if support(n, env.version) is None]
    plain = start_worker(env)
    w = start_worker(env, coverage=True)
    try:
        for worker in (plain, w):
            worker.job(make_job(layouts[0], (0, "warm-up"), 20, 0, "sync"))
        tot = {m: [0, 0.0] for m, _ in MODES}
        ratios = {"job": [], "probes": []}  # per layout: each traced rate over the rate off
        print(f"vllm {env.version}, {args.requests} requests per layout, requests per CPU-second of the worker"
              f" (the least CPU time of {args.repeat} runs)")
        print(f"  {'layout':<22} {'off':>8} {'job':>8} {'probes':>8} {'job/off':>8} {'probes/off':>10}")
        for i, name in enumerate(layouts):
            job = make_job(name, (0, name, 0), args.requests, 0, "sync" if i % 2 else "async")
            best = {}
            for r in range(args.repeat):
                for mode, cov in MODES[(i + r) % 3:] + MODES[:(i + r) % 3]:  # rotate which goes first
                    res = w.job(dict(job, coverage=cov)) if cov is not None else plain.job(job)
                    n, cpu = res.get("stats", {}).get("requests", 0), float(res.get("cpu_seconds", 0.0))
                    best[mode] = min(best.get(mode, (n, cpu)), (n, cpu), key=lambda x: x[1])
            rate = {}
            for mode, (n, cpu) in best.items():
                tot[mode][0] += n
                tot[mode][1] += cpu
                rate[mode] = n / cpu if cpu else 0.0
            off = max(rate["off"], 1e-9)
            for mode in ratios:
                ratios[mode].append(rate[mode] / off)
            print(f"  {name:<22} {rate['off']:8.0f} {rate['job']:8.0f} {rate['probes']:8.0f}"
                  f" {rate['job'] / off:8.2f} {rate['probes'] / off:10.2f}")
        r = {m: tot[m][0] / max(tot[m][1], 1e-9) for m in tot}
        off = max(r["off"], 1e-9)
        print(f"  {'all':<22} {r['off']:8.0f} {r['job']:8.0f} {r['probes']:8.0f}"
              f" {r['job'] / off:8.2f} {r['probes'] / off:10.2f}")
        print(f"  {'median of the layouts':<22} {'':>8} {'':>8} {'':>8} {statistics.median(ratios['job']):8.2f}"
              f" {statistics.median(ratios['probes']):10.2f}  (one slow run off moves 'all', not this)")
        for mode in ("job", "probes"):
            print(f"coverage {'traced over the whole job' if mode == 'job' else 'by probes'} keeps"
                  f" {100 * r[mode] / off:.0f}% of the traffic rate (costs {100 * (1 - r[mode] / off):.0f}%),"
                  f" {100 * statistics.median(ratios[mode]):.0f}% by the median layout")
    finally:
        w.stop()
        plain.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
