"""``kvbound bench``: figures, not a timed test. The batched impl against the per-request
Python spec on the same inputs, and the rates of the two differential runs.

Every ratio is measured in one run on one machine; a spec time is only extrapolated
when ``--spec-limit`` says so, and the output then says "extrapolated from n=...".
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from kvbound.errors import UsageError
from kvbound.spec import Variant, plan_load

DEFAULT_SIZES = (1_000, 10_000, 100_000, 1_000_000)
SMALL_RUN = 100_000  # request-groups up to which a size is timed best of REPEATS_SMALL
REPEATS_SMALL, REPEATS_LARGE = 5, 3


def register(sub):
    p = sub.add_parser(
        "bench",
        help="benchmark: batched impl vs the per-request Python spec, and the differential rates",
        description="Time the batched torch impl and the per-request Python spec (plan_load) on the same "
        "generated inputs at 1e3..1e6 request-groups (all three variants on both sides) and print the "
        "ratio per size; then the symbolic-differential rate and the impl-vs-spec differential rate.",
    )
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), metavar="LIST",
                   help="request-group counts (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the generated inputs")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the impl runs (default auto: cuda when available, else cpu)")
    p.add_argument("--threads", type=int, default=1, metavar="T",
                   help="torch CPU threads (default 1: on a shared 2-core machine 2 threads thrash)")
    p.add_argument("--spec-limit", type=int, default=0, metavar="N",
                   help="time the spec on at most N request-groups per size and extrapolate (default 0: "
                   "measure every size in full)")
    p.add_argument("--symbolic-cases", type=int, default=200, metavar="K", help="cases for the symbolic rate")
    p.add_argument("--diff-cases", type=int, default=100_000, metavar="K",
                   help="cases for the end-to-end differential rate (generation in tensors, the spec in worker "
                   "processes, as kvbound diff runs it; default 100000)")
    p.add_argument("--workers", type=int, default=None, metavar="W",
                   help="spec worker processes of the end-to-end run (default: the CPU count)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    return p


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _generate(n_groups: int, seed: int, device):
    """Generated batches (tensor generator, 20k cases each) until ``n_groups`` request-groups."""
    from kvbound.impl.generate import generate_batch

    out, total, first = [], 0, 0
    while total < n_groups:
        gb = generate_batch(20_000, seed, device=device, first=first)
        out.append(gb)
        total += int(gb.batch.num_groups.sum())
        first += 20_000
    return out


def _prefix(gens, n_groups: int):
    """The first rows of the generated batches holding >= ``n_groups`` request-groups, as one batch
    (and the GeneratedBatch pieces, to build the Case views from)."""
    from kvbound.impl import concat_batches

    pieces, total = [], 0
    for gb in gens:
        counts = torch_cumsum(gb.batch.num_groups)
        need = n_groups - total
        if int(counts[-1]) >= need:
            rows = int((counts < need).sum()) + 1
            pieces.append((gb, rows))
            total += int(counts[rows - 1])
            break
        pieces.append((gb, gb.batch.shape[0]))
        total += int(counts[-1])
    return concat_batches([gb.batch.rows(0, r) for gb, r in pieces]), pieces, total


def torch_cumsum(t):
    import torch

    return torch.cumsum(t.to(torch.int64), 0)


def run(args) -> int:
    from kvbound.impl import BatchError, plan_variants, resolve_device, run_differential, spec_side, record
    from kvbound.impl import DiffStats, to_load_plans
    from kvbound.impl.generate import generate_batch

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
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"kvbound bench: device {device} ({platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)); all {len(variants)} variants on both sides")

    # generation: the tensor generator, timed on its own
    t = time.perf_counter()
    gens = _generate(max(sizes), args.seed, device)
    sync()
    t_gen = time.perf_counter() - t
    n_cases = sum(g.batch.shape[0] for g in gens)
    n_rg = sum(int(g.batch.num_groups.sum()) for g in gens)
    print(f"generation: {n_cases:,} cases ({n_rg:,} request-groups) in {t_gen:.1f} s = {n_cases / t_gen:,.0f} cases/s "
          f"(kvbound.impl.generate, seed {args.seed}, v1 families in turn)")
    rows = []
    print()
    print(f"{'request-groups':>14}{'cases':>10}{'cells':>11}{'slots R*G*L':>13}{'convert s':>11}{'impl s':>10}"
          f"{'spec s':>10}{'compare s':>11}{'ratio':>9}")
    for n in sizes:
        batch, pieces, total = _prefix(gens, n)
        sync()
        # conversion: the Case views the spec needs (validated by Case itself)
        t = time.perf_counter()
        cases = [c for gb, r in pieces for c in gb.cases(range(r), validate=False)]
        t_convert = time.perf_counter() - t
        repeats = REPEATS_SMALL if total <= SMALL_RUN else REPEATS_LARGE

        def impl():
            plan_variants(batch, variants, check=False)
            sync()

        impl()  # warm-up
        t_impl = _best_of(impl, repeats)
        t = time.perf_counter()
        for c in cases:
            for v in variants:
                plan_load(c, v)
        t_spec = time.perf_counter() - t
        # compare: the spec's plans flattened (its own plan_load time taken out) and checked against the impl's
        outs = plan_variants(batch, variants, check=False)
        t = time.perf_counter()
        stats = DiffStats()
        for v in variants:
            record(stats, batch, outs[v], spec_side(cases, v), lambda rs: [cases[r] for r in rs])
        t_compare = max(0.0, time.perf_counter() - t - t_spec)
        R, G, L = batch.shape
        cells = sum(int(o.cells.size) for o in list(outs.values())[:1])
        row = {
            "request_groups": total, "cases": len(cases), "cells": cells, "shape": [R, G, L],
            "convert_s": t_convert, "impl_s": t_impl, "spec_s": t_spec, "compare_s": t_compare,
            "ratio": t_spec / t_impl, "disagreements": len(stats.disagreements),
            "padded_slots_per_s": R * G * L * len(variants) / t_impl,
            "request_groups_per_s": total * len(variants) / t_impl,
        }
        rows.append(row)
        print(f"{total:>14,}{len(cases):>10,}{cells:>11,}{R * G * L:>13,}{t_convert:>11.3f}{t_impl:>10.4f}"
              f"{t_spec:>10.2f}{t_compare:>11.2f}{t_spec / t_impl:>8.0f}x")
        del batch, cases, outs
    print("(impl s: best of repeats, plan_variants on the padded batch for all variants, compaction to the "
          "real cells included; spec s: plan_load per case and variant; convert s: tensors -> Case views; "
          "compare s: the spec's plans laid into tensors and compared, beyond plan_load; ratio = spec s / impl s)")

    # the symbolic differential: impl plans checked by Z3, per case-variant
    from kvbound.proofs.symbolic import check_plan

    gb = generate_batch(args.symbolic_cases, args.seed, device=device)
    sym_cases = gb.cases()
    outs = plan_variants(gb.batch, variants, check=False)
    t = time.perf_counter()
    verdicts: dict = {}
    for v, out in outs.items():
        for c, p in zip(sym_cases, to_load_plans(gb.batch, out)):
            r = check_plan(c, v, p.to_json(c.name))
            verdicts[str(r.verdict.value if hasattr(r.verdict, "value") else r.verdict)] = \
                verdicts.get(str(r.verdict.value if hasattr(r.verdict, "value") else r.verdict), 0) + 1
    t_sym = time.perf_counter() - t
    n_sym = len(sym_cases) * len(variants)
    print()
    print(f"symbolic differential: {n_sym} case-variant checks ({len(sym_cases)} cases) in {t_sym:.2f} s = "
          f"{n_sym / t_sym:,.0f} checks/s = {len(sym_cases) / t_sym:,.0f} cases/s (all variants); verdicts {verdicts}")

    # end to end, as kvbound diff runs it
    workers = (os.cpu_count() or 1) if args.workers is None else args.workers
    n = args.diff_cases
    chunks = (generate_batch(min(10_000, n - i), args.seed, device=device, first=i) for i in range(0, n, 10_000))
    stats, tm = run_differential(chunks, variants, device, workers=workers)
    n_checks = n * len(variants)
    print(f"end-to-end differential ({workers} spec worker(s)): {n:,} cases x {len(variants)} variants in "
          f"{tm.wall:.1f} s = {n / tm.wall * 60:,.0f} cases/min = {n_checks / tm.wall * 60:,.0f} checks/min; "
          f"{len(stats.disagreements)} disagreement(s)")
    print(f"  stages: generation {tm.generation:.1f} s ({n / max(tm.generation, 1e-9):,.0f} cases/s), impl "
          f"{tm.impl:.1f} s, compare {tm.compare:.1f} s, waiting for the spec {tm.spec_wait:.1f} s; spec CPU "
          f"{tm.spec_cpu:.1f} s in the workers ({n / max(tm.spec_cpu, 1e-9):,.0f} cases/s per worker: Case views "
          "and plan_load)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "seed": args.seed,
            "generation": {"cases": n_cases, "request_groups": n_rg, "seconds": t_gen, "cases_per_s": n_cases / t_gen},
            "sizes": rows,
            "symbolic": {"checks": n_sym, "cases": len(sym_cases), "seconds": t_sym,
                         "checks_per_s": n_sym / t_sym, "cases_per_s": len(sym_cases) / t_sym, "verdicts": verdicts},
            "end_to_end": {"cases": n, "checks": n_checks, "workers": workers, "timings": tm.as_dict(),
                           "cases_per_min": n / tm.wall * 60, "checks_per_min": n_checks / tm.wall * 60,
                           "disagreements": len(stats.disagreements)},
        }, indent=2) + "\n")
    return 0
