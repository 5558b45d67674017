"""``python -m kvbound.proofs.bench [N]``: check_plan's rate on generated cases.

Prints cases/s (wall and per CPU second) over the spec's three case families, every
variant, and that every spec plan came back "forced".
"""

from __future__ import annotations

import sys
import time

from kvbound.spec import Variant, plan_load
from kvbound.spec.strategies import random_cases

from .symbolic import check_plan


def main(n: int = 300, seed: int = 1) -> int:
    cases = list(random_cases(n, seed=seed))
    plans = [(c, v, plan_load(c, v).to_json(c.name)) for c in cases for v in Variant]
    wall, cpu = time.perf_counter(), time.process_time()
    verdicts = [check_plan(c, v, p).verdict for c, v, p in plans]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    groups = max(len(c.groups) for c in cases)
    blocks = max(len(g.blocks) for c in cases for g in c.groups)
    print(f"check_plan: {len(plans)} plans ({n} cases x {len(Variant)} variants, up to {groups} groups, "
          f"tables up to {blocks} blocks)")
    print(f"  {len(plans) / wall:.0f} cases/s wall, {len(plans) / cpu:.0f} cases/s per CPU second "
          f"({wall:.2f} s wall, {cpu:.2f} s CPU)")
    print(f"  forced: {verdicts.count('forced')}/{len(verdicts)}")
    return 0 if verdicts.count("forced") == len(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
