"""``kvbound bench``: figures, not a timed test. The batched impl against the per-request
Python spec on the same inputs, and the rates of the two differential runs.

Every ratio is measured in one run on one machine; a spec time is only extrapolated
when ``--spec-limit`` says so, and the output then says "extrapolated from n=...".
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from kvbound.errors import UsageError
from kvbound.spec import Variant, plan_load
from kvbound.spec.strategies import random_cases

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000)


def register(sub):
    p = sub.add_parser(
        "bench",
        help="benchmark: batched impl vs the per-request Python spec, and the differential rates",
        description="Time the batched torch impl and the per-request Python spec (plan_load) on the same "
        "generated inputs at 1e3..1e6 request-groups (all three variants on both sides) and print the "
        "ratio per size; then the symbolic-differential rate and the impl-vs-spec differential rate.",
    )
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), metavar="LIST",
                   help="request-group counts (default 1000,10000,100000,1000000)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the generated inputs")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the impl runs (default auto: cuda when available, else cpu)")
    p.add_argument("--threads", type=int, default=1, metavar="T",
                   help="torch CPU threads (default 1: on a shared 2-core machine 2 threads thrash)")
    p.add_argument("--spec-limit", type=int, default=0, metavar="N",
                   help="time the spec on at most N request-groups per size and extrapolate (default 0: "
                   "measure every size in full)")
    p.add_argument("--symbolic-cases", type=int, default=200, metavar="K", help="cases for the symbolic rate")
    p.add_argument("--diff-cases", type=int, default=20_000, metavar="K", help="cases for the impl-vs-spec rate")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.set_defaults(func=run)
    return p


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _cases_for(n_groups: int, seed: int):
    """Generated cases whose groups add up to at least ``n_groups`` (a prefix per size)."""
    out, total = [], 0
    for c in random_cases(10**9, seed=seed):
        out.append(c)
        total += len(c.groups)
        if total >= n_groups:
            return out


def run(args) -> int:
    from kvbound.impl import BatchError, batch_from_cases, diff_against_spec, plan_variants, resolve_device
    from kvbound.impl import to_load_plans

    import torch  # after kvbound.impl, which quiets torch's numpy warning

    try:
        sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--sizes: {args.sizes!r} is not a comma list of integers") from None
    if not sizes or min(sizes) < 1:
        raise UsageError("--sizes: give positive request-group counts")
    try:
        device = resolve_device(None if args.device == "auto" else args.device)
    except BatchError as e:
        raise UsageError(f"--device {args.device}: {e.rule}") from None
    torch.set_num_threads(max(1, args.threads))
    variants = tuple(Variant)
    print(f"kvbound bench: device {device} ({platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)); all {len(variants)} variants on both sides")
    t = time.perf_counter()
    all_cases = _cases_for(max(sizes), args.seed)
    print(f"generated {len(all_cases)} cases ({sum(len(c.groups) for c in all_cases)} request-groups) "
          f"in {time.perf_counter() - t:.1f} s (random_cases, seed {args.seed})")
    rows = []
    print()
    print(f"{'request-groups':>14}{'cases':>9}{'slots R*G*L':>13}{'convert s':>11}{'impl s':>10}"
          f"{'impl+mask s':>13}{'spec s':>10}{'ratio':>9}")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for n in sizes:
        cases, total = [], 0
        for c in all_cases:
            cases.append(c)
            total += len(c.groups)
            if total >= n:
                break
        t = time.perf_counter()
        batch = batch_from_cases(cases, device=device)
        sync()
        t_convert = time.perf_counter() - t
        repeats = 5 if total <= 100_000 else 3

        def impl():
            plan_variants(batch, variants, check=False)
            sync()

        def impl_mask():
            for o in plan_variants(batch, variants, check=False).values():
                o.dst_mask
            sync()

        impl()  # warm-up
        t_impl = _best_of(impl, repeats)
        t_mask = _best_of(impl_mask, repeats)
        # the spec, on the same cases (or a prefix of them, stated)
        spec_cases, spec_groups = cases, total
        if args.spec_limit and total > args.spec_limit:
            spec_cases, spec_groups = [], 0
            for c in cases:
                spec_cases.append(c)
                spec_groups += len(c.groups)
                if spec_groups >= args.spec_limit:
                    break
        t = time.perf_counter()
        for c in spec_cases:
            for v in variants:
                plan_load(c, v)
        t_spec_measured = time.perf_counter() - t
        t_spec = t_spec_measured * total / spec_groups
        extrapolated = spec_groups < total
        R, G, L = batch.shape
        row = {
            "request_groups": total, "cases": len(cases), "shape": [R, G, L],
            "convert_s": t_convert, "impl_s": t_impl, "impl_with_dst_mask_s": t_mask,
            "spec_s": t_spec, "spec_measured_request_groups": spec_groups, "spec_extrapolated": extrapolated,
            "ratio": t_spec / t_impl, "ratio_with_dst_mask": t_spec / t_mask,
            "padded_slots_per_s": R * G * L * len(variants) / t_impl,
        }
        rows.append(row)
        note = f"   spec time extrapolated from n={spec_groups} request-groups" if extrapolated else ""
        print(f"{total:>14,}{len(cases):>9,}{R * G * L:>13,}{t_convert:>11.3f}{t_impl:>10.4f}{t_mask:>13.4f}"
              f"{t_spec:>10.2f}{t_spec / t_impl:>8.0f}x{note}")
        del batch
    print("(impl s: best of repeats, plan for all variants from the batch; impl+mask s: also materialises the "
          "[R,G,L] destination masks; convert s: Case objects -> padded tensors, once; ratio = spec s / impl s)")

    # the symbolic differential: impl plans checked by Z3, per case-variant
    from kvbound.proofs.symbolic import check_plan

    sym_cases = all_cases[: args.symbolic_cases]
    b = batch_from_cases(sym_cases, device=device)
    t = time.perf_counter()
    verdicts: dict = {}
    for v, out in plan_variants(b, variants, check=False).items():
        for c, p in zip(sym_cases, to_load_plans(b, out)):
            r = check_plan(c, v, p.to_json(c.name))
            verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
    t_sym = time.perf_counter() - t
    n_sym = len(sym_cases) * len(variants)
    print()
    print(f"symbolic differential: {n_sym} case-variant checks ({len(sym_cases)} cases) in {t_sym:.2f} s = "
          f"{n_sym / t_sym:,.0f} checks/s = {len(sym_cases) / t_sym:,.0f} cases/s (all variants); verdicts {verdicts}")

    # impl vs spec differential, as kvbound diff runs it (generation excluded)
    diff_cases = all_cases[: args.diff_cases]
    t = time.perf_counter()
    stats = None
    for i in range(0, len(diff_cases), 10_000):
        stats = diff_against_spec(diff_cases[i:i + 10_000], variants, device=device, stats=stats)
    t_diff = time.perf_counter() - t
    n_diff = len(diff_cases) * len(variants)
    print(f"impl-vs-spec differential: {len(diff_cases)} cases x {len(variants)} variants in {t_diff:.2f} s = "
          f"{n_diff / t_diff * 60:,.0f} case-variant checks/min = {len(diff_cases) / t_diff * 60:,.0f} cases/min; "
          f"{len(stats.disagreements)} disagreement(s)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "seed": args.seed, "sizes": rows,
            "symbolic": {"checks": n_sym, "cases": len(sym_cases), "seconds": t_sym,
                         "checks_per_s": n_sym / t_sym, "cases_per_s": len(sym_cases) / t_sym, "verdicts": verdicts},
            "impl_vs_spec": {"cases": len(diff_cases), "checks": n_diff, "seconds": t_diff,
                             "checks_per_min": n_diff / t_diff * 60, "cases_per_min": len(diff_cases) / t_diff * 60,
                             "disagreements": len(stats.disagreements)},
        }, indent=2) + "\n")
    return 0
