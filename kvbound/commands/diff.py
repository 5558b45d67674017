"""``kvbound diff``: the batched torch impl against the spec and against the Z3 encoding.

Against the spec every compared field must match (outcome, failing group and its
numbers, every planned group). Against the symbolic model each impl plan must be
*forced* by the encoding with the case's inputs fixed (the negated plan is unsat),
which checks the impl and the encoding at once. A solver ``unknown`` is reported as
inconclusive (exit 2), never as agreement. Every disagreement is drawn, shrunk and
saved as a case file in the corpus that the tests replay.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from kvbound.errors import EXIT_FAIL, EXIT_INPUT, EXIT_OK, UsageError
from kvbound.records import DiffDisagreement, DiffRecord
from kvbound.draw import draw_case
from kvbound.spec import PLAN_FIELDS, AssertName, Case, GroupKind, case_to_dict, dump_cases
from kvbound.spec.lookup_case import LookupCase
from kvbound.spec.strategies import ALL_FAMILIES, FAMILIES, family_of, random_cases
from kvbound.spec.verdicts import PLAN_CHECK_VERDICTS, Verdict

from . import add_variant_args, read_cases, selected_variants

DEFAULT_CORPUS = "corpus"
DEFAULT_CASES = 1000  # generated cases when neither case files nor --exhaustive are given
DEFAULT_SYMBOLIC_CASES = 2000
DEFAULT_BATCH = 10_000
AGAINST = ("spec", "symbolic")


def register(sub):
    p = sub.add_parser(
        "diff",
        help="differential run: batched torch impl vs the spec and vs the Z3 encoding",
        description="Run the batched torch implementation on case files, N generated cases and/or every "
        "case of a declared scope, and compare it with the executable spec (every field; the spec runs in "
        "worker processes) and with the symbolic model (Z3 must force exactly the impl's outputs). "
        "Disagreements are drawn, shrunk and saved to the corpus; exit 1 on any disagreement, 2 if the "
        "solver was inconclusive.",
    )
    p.add_argument("paths", nargs="*", metavar="CASE_FILE_OR_DIR", help="also diff these case files / directories")
    p.add_argument("--cases", type=int, default=None, metavar="N",
                   help=f"generated cases (default {DEFAULT_CASES}, or 0 when case files or --exhaustive are given)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the generated cases")
    p.add_argument("--family", choices=ALL_FAMILIES + ("all",),
                   help=f"generate one family only, or all (every family in turn); default: the v1 families "
                   f"{', '.join(FAMILIES)} in turn. The tensor generator draws the v1 families; the others, and "
                   "all, come from random_cases")
    p.add_argument("--generator", choices=("tensor", "python"), default="tensor",
                   help="tensor (default): kvbound.impl.generate draws whole batches in torch; python: "
                   "kvbound.spec.strategies.random_cases, one Case at a time (slower; the cases of older runs)")
    p.add_argument("--exhaustive", nargs="?", const="", default=None, metavar="SCOPE",
                   help="also check every case of a scope: comma list of key=value over groups, len, b, bpc, "
                   "step, prompt, sync, kinds; unnamed keys keep the default scope's value (the run prints the "
                   "scope and its size; docs/benchmarks.md)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the impl runs (default auto: cuda when available, else cpu)")
    p.add_argument("--workers", type=int, default=None, metavar="W",
                   help="processes running the spec (default: the CPU count; 0 runs it in this process)")
    p.add_argument("--against", default="spec,symbolic", metavar="LIST",
                   help="comma list of references: spec, symbolic (default both)")
    p.add_argument("--symbolic-cases", type=int, default=DEFAULT_SYMBOLIC_CASES, metavar="K",
                   help="check only the first K cases against the symbolic model (default %(default)s)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="Z3 timeout per symbolic check, seconds (default: kvbound.proofs.options.PLAN_CHECK's)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="B",
                   help="cases per impl batch (default %(default)s)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS, metavar="DIR",
                   help=f"save shrunk disagreements here (default {DEFAULT_CORPUS}/)")
    p.add_argument("--no-save", action="store_true", help="do not shrink or save disagreements")
    p.add_argument("--show", type=int, default=3, metavar="K", help="draw at most K disagreements")
    p.add_argument("--json", metavar="FILE", help="write counts, rates and every disagreement as JSON")
    p.add_argument("--mutants", action="store_true",
                   help="also plant each mutant of kvbound.proofs.mutants in the impl (at runtime) and check it is "
                   "killed (a disagreement with the spec) on the case files, 3000 cases of every family, 3000 "
                   "tensor-generated and a small exhaustive scope; the score goes in the JSON; exit 1 on a survivor")
    add_variant_args(p)
    return p


class Progress:
    """A bar on a terminal, a line per 10% otherwise; silent on short runs."""

    MIN_TOTAL = 2000  # shorter runs print no progress
    BAR_WIDTH = 25  # characters: one per 4%
    LINE_EVERY_PCT = 10  # off a terminal: a line per 10%

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done, self.t0 = total, label, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.shown = self.total >= self.MIN_TOTAL
        self.next_pct = self.LINE_EVERY_PCT

    def step(self, n: int) -> None:
        self.done += n
        if not self.shown or not self.total:
            return
        pct = 100 * self.done // self.total
        rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
        if self.tty:
            filled = pct * self.BAR_WIDTH // 100
            bar = "#" * filled + "." * (self.BAR_WIDTH - filled)
            print(f"\r{self.label} [{bar}] {self.done}/{self.total} {rate:,.0f}/s", end="", file=sys.stderr, flush=True)
            if self.done >= self.total:
                print(file=sys.stderr)
        elif pct >= self.next_pct:
            print(f"{self.label}: {self.done}/{self.total} ({pct}%) {rate:,.0f}/s", file=sys.stderr, flush=True)
            self.next_pct = pct // self.LINE_EVERY_PCT * self.LINE_EVERY_PCT + self.LINE_EVERY_PCT


def _parse_against(text: str) -> tuple:
    out = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in out if a not in AGAINST]
    if bad or not out:
        raise UsageError(f"--against: {', '.join(bad) or '(empty)'} is not a reference; choose from {', '.join(AGAINST)}")
    return out


def _load_cases_only(paths) -> list:
    """The load cases of the files; a lookup or store case has no impl to diff: one line each on stderr."""
    out = []
    for c in read_cases(paths):
        if isinstance(c, Case):
            out.append(c)
        else:
            kind = "lookup" if isinstance(c, LookupCase) else "store"
            print(f"{c.name}: a {kind} case: kvbound diff compares load plans only; skipped (kvbound plan, "
                  "explain and premises take it)", file=sys.stderr)
    return out


def _case_chunks(cases_iter, size: int, device):
    from kvbound.impl import CaseChunk

    chunk = []
    for c in cases_iter:
        chunk.append(c)
        if len(chunk) >= size:
            yield CaseChunk.of(chunk, device)
            chunk = []
    if chunk:
        yield CaseChunk.of(chunk, device)


def _family_counts(chunk) -> dict:
    if hasattr(chunk, "family_counts"):
        return chunk.family_counts()
    out: dict = {}
    for c in chunk.case_list:
        fam = family_of(c)
        out[fam] = out.get(fam, 0) + 1
    return out


def run(args) -> int:
    import os

    from kvbound.impl import BatchError, DiffStats, resolve_device, run_differential
    from kvbound.impl.exhaustive import Scope, ScopeError, scope_chunks
    from kvbound.impl.generate import generate_batch

    import torch

    against = _parse_against(args.against)
    variants = selected_variants(args)
    # one torch thread: the spec's worker processes take the other cores, and torch's
    # spinning intra-op threads on a busy machine cost the impl 20-100x (measured)
    torch.set_num_threads(1)
    try:
        device = resolve_device(None if args.device == "auto" else args.device)
    except BatchError as e:
        raise UsageError(f"--device {args.device}: {e.rule}") from None
    args.device_used = str(device)
    if args.batch < 1:
        raise UsageError("--batch: must be at least 1")
    workers = (os.cpu_count() or 1) if args.workers is None else args.workers
    if workers < 0:
        raise UsageError("--workers: must be non-negative")
    scope = None
    if args.exhaustive is not None:
        try:
            scope = Scope.parse(args.exhaustive)
        except ScopeError as e:
            raise UsageError(f"--exhaustive: {e}") from None
    files = _load_cases_only(args.paths) if args.paths else []
    n_gen = args.cases if args.cases is not None else (0 if files or scope else DEFAULT_CASES)
    if n_gen < 0:
        raise UsageError("--cases: must be non-negative")
    total = len(files) + n_gen + (scope.size if scope else 0)
    if not total:
        raise UsageError("nothing to diff: give case files, --cases N > 0 or --exhaustive")
    if scope:
        print(f"exhaustive scope: {scope.describe()}: {scope.size:,} cases", file=sys.stderr)

    def all_chunks():
        yield from _case_chunks(files, args.batch, device)
        if args.generator == "python" or (args.family is not None and args.family not in FAMILIES):
            yield from _case_chunks(random_cases(n_gen, seed=args.seed, family=args.family), args.batch, device)
        else:
            for first in range(0, n_gen, args.batch):
                yield generate_batch(min(args.batch, n_gen - first), args.seed, args.family, device, first=first)
        if scope:
            yield from scope_chunks(scope, args.batch, device)

    kinds_per_family: dict = {}
    sym = {"checked": 0, **{v.value: 0 for v in PLAN_CHECK_VERDICTS}, "seconds": 0.0}
    unknowns = []
    stats = DiffStats()
    sym_left = args.symbolic_cases if "symbolic" in against else 0
    bar = Progress(total, "diff")

    def counted(chunks):
        nonlocal sym_left
        for chunk in chunks:
            for fam, n in _family_counts(chunk).items():
                kinds_per_family[fam] = kinds_per_family.get(fam, 0) + n
            if sym_left > 0:
                n = min(sym_left, chunk.batch.shape[0])
                sym_left -= n
                t = time.perf_counter()
                _symbolic(chunk.cases(range(n)), variants, device, args.timeout, stats, sym, unknowns)
                sym["seconds"] += time.perf_counter() - t
            if "spec" not in against:
                stats.cases += chunk.batch.shape[0]
                bar.step(chunk.batch.shape[0])
                continue
            yield chunk

    t0 = time.perf_counter()
    timings = None
    if "spec" in against:
        stats, timings = run_differential(counted(all_chunks()), variants, device, workers=workers, stats=stats,
                                          on_chunk=bar.step)
        timings.generation -= sym["seconds"]  # the symbolic checks ran inside the chunk iterator
    else:
        for _ in counted(all_chunks()):
            pass
    elapsed = time.perf_counter() - t0

    mutation = _mutation_run(args, files, device, variants) if args.mutants else None
    saved = [] if args.no_save else _save_shrunk(stats.disagreements, Path(args.corpus))
    _print_report(args, stats, variants, against, sym, unknowns, kinds_per_family, elapsed, timings, workers)
    for d in stats.disagreements[: args.show]:
        print()
        _draw_disagreement(d)
    if len(stats.disagreements) > args.show:
        print(f"\n... {len(stats.disagreements) - args.show} more disagreement(s) not drawn (--show)")
    for path in saved:
        print(f"saved shrunk case: {path}")
    if args.json:
        report = _json_report(args, stats, variants, against, sym, unknowns, kinds_per_family, elapsed, timings, saved,
                              workers, scope, mutation)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if stats.disagreements or (mutation is not None and mutation["survivors"]):
        return EXIT_FAIL
    if unknowns:
        return EXIT_INPUT
    return EXIT_OK


def _mutation_run(args, files, device, variants) -> dict:
    """Every impl mutant of the one table, each planted and checked against the spec."""
    from kvbound.impl.mutants import IMPL_MUTANTS, kill_run, mutant_chunks
    from kvbound.proofs.mutants import applicable, score

    wanted = [m.name for m in applicable("impl")]
    missing = sorted(set(wanted) - set(IMPL_MUTANTS))
    t = time.perf_counter()
    chunks = mutant_chunks(args.seed, files, device)
    killed = kill_run(chunks, [n for n in wanted if n in IMPL_MUTANTS], variants)
    killed.update({n: None for n in missing})  # a mutant the impl cannot plant survives, by name
    result = score("impl", killed)
    n_cases = sum(ch.batch.shape[0] for ch in chunks)
    print(f"impl mutants: {result['killed']}/{result['total']} killed on {n_cases:,} cases in "
          f"{time.perf_counter() - t:.1f} s" + (f"; SURVIVED: {', '.join(result['survivors'])}" if result["survivors"]
                                                else ""))
    return result


def _symbolic(cases, variants, device, timeout_s, stats, sym, unknowns) -> None:
    """Each impl plan must be forced by the encoding with the case's inputs fixed."""
    from kvbound.impl import Disagreement, batch_from_cases, plan_variants, to_load_plans
    from kvbound.proofs.options import PLAN_CHECK
    from kvbound.proofs.symbolic import check_plan

    options = PLAN_CHECK if timeout_s is None else PLAN_CHECK.with_timeout(timeout_s)
    batch = batch_from_cases(cases, device=device)
    for v, out in plan_variants(batch, variants, check=False).items():
        for case, ip in zip(cases, to_load_plans(batch, out)):
            r = check_plan(case, v, ip.to_json(case.name), options)
            sym["checked"] += 1
            sym[r.verdict] = sym.get(r.verdict, 0) + 1
            if r.verdict is Verdict.NOT_FORCED:
                stats.disagreements.append(Disagreement(case, v, "symbolic", None, ip, r.detail))
            elif r.verdict is not Verdict.FORCED:
                unknowns.append((case, v, r.detail))


def _fails_again(d):
    """The predicate the shrinker keeps true: this kind of disagreement still happens."""
    from kvbound.impl import agrees_with_spec, batch_from_cases, plan_variants, to_load_plans

    if d.against == "spec":
        return lambda c: not agrees_with_spec(c, d.variant)
    from kvbound.proofs.symbolic import check_plan

    def fails(c):
        b = batch_from_cases([c], device="cpu")
        ip = to_load_plans(b, plan_variants(b, (d.variant,))[d.variant])[0]
        return check_plan(c, d.variant, ip.to_json(c.name)).verdict is Verdict.NOT_FORCED

    return fails


def _save_shrunk(disagreements, corpus: Path, limit: int = 10) -> list:
    from kvbound.impl import shrink_case

    saved = []
    seen = set()
    for d in disagreements[:limit]:
        small = shrink_case(d.case, _fails_again(d))
        body = case_to_dict(small)
        body.pop("name")
        digest = hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]
        if digest in seen:  # the same minimal case under another variant
            continue
        seen.add(digest)
        name = f"{d.against}-{d.variant.value}-{digest}"
        corpus.mkdir(parents=True, exist_ok=True)
        path = corpus / f"{name}.json"
        dump_cases([replace(small, name=name)], path)
        saved.append(str(path))
    return saved


def _outcome_cols(variants):
    return ["ok", *(name.value for name in AssertName), "unsupported"]


def _print_report(args, stats, variants, against, sym, unknowns, fams, elapsed, timings, workers) -> None:
    n_dis = {(d.variant, d.against): 0 for d in stats.disagreements}
    for d in stats.disagreements:
        n_dis[(d.variant, d.against)] += 1
    print(f"kvbound diff: {stats.cases} case(s) ({', '.join(f'{k} {v}' for k, v in sorted(fams.items()))}); "
          f"seed {args.seed}; impl on {args.device_used}; against {', '.join(against)}")
    cols = _outcome_cols(variants)
    head = f"{'variant':<11}{'cases':>8}" + "".join(f"{c:>14}" for c in cols)
    head += "".join(f"{'≠ ' + a:>12}" for a in against)
    print()
    print("outcomes (spec) and disagreements per variant")
    print(head)
    for v in variants:
        row = f"{v.value:<11}{stats.checks.get(v, stats.cases if 'spec' not in against else 0):>8}"
        row += "".join(f"{stats.outcomes.get((v, c), 0):>14}" for c in cols)
        row += "".join(f"{n_dis.get((v, a), 0):>12}" for a in against)
        print(row)
    if "spec" in against:
        print()
        print("groups planned and compared, per group kind")
        kinds = list(GroupKind)
        print(f"{'variant':<11}" + "".join(f"{k.value:>16}" for k in kinds))
        for v in variants:
            print(f"{v.value:<11}" + "".join(f"{stats.groups.get((v, k), 0):>16}" for k in kinds))
    print()
    if "spec" in against and timings and timings.wall:
        n = sum(stats.checks.values())
        tm = timings
        print(f"impl vs spec: {n:,} case-variant checks in {tm.wall:.1f} s = {n / tm.wall * 60:,.0f}/min "
              f"({stats.cases / tm.wall * 60:,.0f} cases/min, all {len(variants)} variants); "
              f"spec in {workers or 'no'} worker process(es)")
        print(f"  stages: generation/conversion {tm.generation:.1f} s, impl {tm.impl:.1f} s, compare "
              f"{tm.compare:.1f} s, waiting for the spec {tm.spec_wait:.1f} s (spec CPU {tm.spec_cpu:.1f} s "
              "summed over the workers)")
    if "symbolic" in against:
        rate = sym["checked"] / sym["seconds"] if sym["seconds"] else 0.0
        print(f"impl vs symbolic: {sym['checked']} checks: {sym['forced']} forced, {sym['not_forced']} not forced, "
              f"{sym['unknown']} inconclusive (solver unknown); {rate:,.0f} checks/s")
        for case, v, detail in unknowns[:5]:
            print(f"  inconclusive: {case.name} {v.value}: {detail}")
    print(f"total {elapsed:.1f} s (generation, impl, spec and symbolic)")
    verdict = "DISAGREEMENT" if stats.disagreements else ("INCONCLUSIVE" if unknowns else "agree")
    print(f"result: {verdict} ({len(stats.disagreements)} disagreement(s), {len(unknowns)} inconclusive)")


def _field_table(d) -> str:
    impl = d.impl.to_json(d.case.name)
    spec = d.expected.to_json(d.case.name) if d.expected is not None else None
    rows = [("field", "spec" if spec else "", "impl")]
    for f in PLAN_FIELDS:
        s = json.dumps(spec[f]) if spec else ""
        i = json.dumps(impl[f])
        mark = "  ≠" if spec and spec[f] != impl[f] else ""
        rows.append((f, s, i + mark))
    w0 = max(len(r[0]) for r in rows) + 2
    w1 = max(len(r[1]) for r in rows) + 2
    return "\n".join(f"  {a:<{w0}}{b:<{w1}}{c}" for a, b, c in rows)


def _draw_disagreement(d) -> None:
    print(f"DISAGREEMENT ({d.variant.value}, impl vs {d.against}): {d.case.name}: {d.detail}")
    print(_field_table(d))
    print()
    if d.expected is not None:
        print("spec:")
        print(draw_case(d.case, plans={d.variant: d.expected}))
        print()
    print("impl:")
    print(draw_case(d.case, plans={d.variant: d.impl}, legend=d.expected is None))


def _json_report(args, stats, variants, against, sym, unknowns, fams, elapsed, timings, saved, workers,
                 scope, mutation=None) -> dict:
    n_checks = sum(stats.checks.values())
    t_spec = timings.wall if timings else 0.0
    return DiffRecord(
        cases=stats.cases,
        seed=args.seed,
        device=args.device_used,
        against=list(against),
        families=fams,
        variants={
            v.value: {
                "checks": stats.checks.get(v, 0),
                "outcomes": {c: stats.outcomes.get((v, c), 0) for c in _outcome_cols(variants)},
                "groups_per_kind": {k.value: stats.groups.get((v, k), 0) for k in GroupKind},
                "disagreements": sum(1 for d in stats.disagreements if d.variant is v),
            }
            for v in variants
        },
        generator=args.generator,
        workers=workers,
        exhaustive=None if scope is None else {"scope": scope.describe(), "cases": scope.size},
        timings=timings.as_dict() if timings else None,
        spec_seconds=round(t_spec, 3),
        spec_checks_per_min=round(n_checks / t_spec * 60) if t_spec else None,
        symbolic=dict(sym, seconds=round(sym["seconds"], 3)),
        inconclusive=[{"case": c.name, "variant": v.value, "detail": det} for c, v, det in unknowns],
        disagreements=[
            DiffDisagreement(
                case=case_to_dict(d.case),
                variant=d.variant.value,
                against=d.against,
                spec=d.expected.to_json(d.case.name) if d.expected is not None else None,
                impl=d.impl.to_json(d.case.name),
                detail=d.detail,
            )
            for d in stats.disagreements
        ],
        saved=saved,
        elapsed_s=round(elapsed, 3),
        result=Verdict.DISAGREE if stats.disagreements else (Verdict.UNKNOWN if unknowns else Verdict.AGREE),
        mutants=mutation,
    ).to_json()
