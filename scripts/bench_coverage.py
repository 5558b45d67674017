"""What --coverage costs the traffic rate, in one run: the same segment of each layout with
coverage off and on, one after the other in ONE worker (started to measure, so both halves
share the process and the machine's load), as requests per CPU-second of the worker, and the
ratio on / off. A warm-up job first (the first engine imports the CPU tier's modules).

    .venv/bin/python scripts/bench_coverage.py [--vllm 0.33.0] [--requests 200] [--layout L ...]
"""

from __future__ import annotations

import argparse
import sys

from kvbound.conform.prepare import prepare_release
from kvbound.trace.layouts import LAYOUTS, layout_support
from kvbound.trace.runner import make_job, start_worker


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm", default="0.33.0")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--layout", action="append", default=[])
    args = p.parse_args(argv)
    env = prepare_release(args.vllm, None)
    layouts = [n for n in (args.layout or LAYOUTS) if layout_support(n, env.version) is None]
    w = start_worker(env, coverage=True)
    try:
        w.job(make_job(layouts[0], (0, "warm-up"), 20, 0, "sync"))
        tot = {False: [0, 0.0], True: [0, 0.0]}
        print(f"vllm {env.version}, {args.requests} requests per layout, requests per CPU-second of the worker")
        print(f"  {'layout':<22} {'off':>8} {'on':>8} {'on/off':>7}")
        for i, name in enumerate(layouts):
            job = make_job(name, (0, name, 0), args.requests, 0, "sync" if i % 2 else "async")
            rate = {}
            for cov in ((False, True) if i % 2 else (True, False)):  # alternate which half goes first
                res = w.job(dict(job, coverage=cov))
                n, cpu = res.get("stats", {}).get("requests", 0), float(res.get("cpu_seconds", 0.0))
                tot[cov][0] += n
                tot[cov][1] += cpu
                rate[cov] = n / cpu if cpu else 0.0
            print(f"  {name:<22} {rate[False]:8.0f} {rate[True]:8.0f} {rate[True] / max(rate[False], 1e-9):7.2f}")
        off, on = (tot[c][0] / max(tot[c][1], 1e-9) for c in (False, True))
        print(f"  {'all':<22} {off:8.0f} {on:8.0f} {on / max(off, 1e-9):7.2f}")
        print(f"coverage on keeps {100 * on / max(off, 1e-9):.0f}% of the traffic rate"
              f" (costs {100 * (1 - on / max(off, 1e-9)):.0f}%)")
    finally:
        w.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
