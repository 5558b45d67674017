"""``kvbound campaign``: ``kvbound trace`` over every release × layout, as one matrix."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from kvbound.errors import EXIT_FAIL, EXIT_INPUT, EXIT_OK, KvboundError, PrepareError, ReportInputError, UsageError
from kvbound.options import CAMPAIGN_COVERAGE, CAMPAIGN_PLAN, CAMPAIGN_SHRINK, RunOptions, ShrinkOptions, TraceOptions
from kvbound.records import CampaignRecord
from kvbound.trace import space


def register(sub):
    p = sub.add_parser(
        "campaign",
        help="trace every release x layout: one matrix, each distinct finding once",
        description="Run kvbound trace's real-scheduler campaign on every release (and layout) named: the "
        "matrix of releases x layouts, each distinct finding once with the releases that have it (first, "
        "last) and where it stops, findings by class (crash, plan, data, store, lookup, liveness, "
        "lifecycle, premise, harness). Shards (a release and its layouts) run in a local process pool, or "
        "on a Ray cluster with --ray. The same command gives the same JSON, byte for byte, but for each finding's "
        "detect.cpu_s (the CPU time of the traffic before it was first seen, a measurement). Exit 1 on a "
        "finding, 2 on a harness fault or a release that cannot be prepared.",
    )
    p.add_argument("--vllm", action="append", default=[], metavar="X",
                   help="a release (0.33.0), a range (0.21.0..0.33.0) or a comma list; repeatable")
    p.add_argument("--vllm-src", metavar="DIR", help="a checkout's root (a fork): joins the matrix as one column,"
                   " judged as the newest release named")
    add_run_arguments(p)
    p.add_argument("--guided", type=int, default=0, metavar="ROUNDS",
                   help="coverage-guided exploration: after the points named (round 0), ROUNDS more rounds of"
                        " --explore N points each, drawn from the runs that reached new connector lines (mutate"
                        " one or two axes, re-seed the traffic, or move to another layout; docs/trace.md)."
                        " Implies --coverage")
    p.add_argument("--ray", metavar="ADDRESS", help="run the shards on Ray: auto (a running cluster), an"
                   " address, or local (a fresh local instance of --workers CPUs)")
    p.add_argument("--pace", type=float, default=None, metavar="F",
                   help="this machine's seconds per second of the cost table, for the seconds the run is said to"
                        " take (default: per release, what its shards here took, kvbound.trace.pace; a 0.3-s probe"
                        " of the work a worker does before any; give the workers' pace on Ray); never changes the"
                        " requests traced")
    p.add_argument("--out", default="campaign-findings", metavar="DIR", help="where trace files go")
    p.add_argument("--json", metavar="FILE", help="the campaign document (deterministic)")
    p.add_argument("--timings", metavar="FILE", help="wall-clock figures per shard and layout (not reproducible)")
    p.add_argument("--html", metavar="FILE", help="the matrix and the findings drawn, one HTML page")
    p.add_argument("--baseline", metavar="FILE", help="an earlier campaign's JSON: exit 1 only on a finding"
                   " (key, release) it does not hold, and name the ones it holds that are gone (for CI)")
    return p


def add_run_arguments(p) -> None:
    """What ``kvbound campaign`` and ``kvbound review`` share: the points (``--layout`` and the
    space's options), the traffic (``--budget`` or ``--requests``, ``--seed``), the local pool,
    shrinking, coverage, the progress bar."""
    from kvbound.trace.layouts import LAYOUTS, engine_help

    p.add_argument("--layout", action="append", choices=sorted(LAYOUTS), default=[],
                   help="repeatable; default: every layout, then the points of kvbound.trace.space.SWEEP (each axis value no"
                        " layout holds, docs/trace.md)")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="seconds the campaign is planned to take, turned into requests per layout by a fixed table"
                        " of costs (kvbound.options.PlanOptions: worker starts, each layout family's rate,"
                        " shrinking), so the run stays reproducible; default none: every point at the floor of"
                        f" {CAMPAIGN_PLAN.min_requests} requests, and the first line says the seconds it is planned at")
    p.add_argument("--requests", type=int, default=None, metavar="N", help="requests per layout (overrides --budget)")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--workers", type=int, default=None, metavar="W",
                   help="local worker processes (default: the CPU count)")
    p.add_argument("--shrink-budget", type=int, default=CAMPAIGN_SHRINK.budget, metavar="R",
                   help="reruns per distinct finding")
    p.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=None,
                   help="measure the line coverage of each release's connector code (line probes compiled into"
                        " its modules in the worker, coverage.py's analysis; the document's 'coverage', per file"
                        " and release). Default on: it keeps 96%% of the traffic rate (docs/benchmarks.md), and"
                        " --budget plans for it; --no-coverage for the plain traffic")
    p.add_argument("--engine", action="append", default=[], metavar="K=V", help=engine_help())
    space.add_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def engine_overrides(args) -> dict:
    """``--engine K=V``: the engine settings of every point (``layouts.parse_override``: a bad key or
    value is one line, exit 2)."""
    from kvbound.trace.layouts import parse_override

    return dict(parse_override(it) for it in args.engine)


def local_workers(args) -> int:
    """The local pool's size: --workers, else the CPU count."""
    return max(1, args.workers or os.cpu_count() or 1)


def pool_size(args) -> int:
    """The processes the shards share, as the plan costs them: Ray's --workers (default 2), else
    the local pool's."""
    return (args.workers or 2) if args.ray else local_workers(args)


def plan(args) -> tuple[list, list]:
    """(columns, shards) from the command line alone."""
    from kvbound.spec import variant_for_version
    from kvbound.spec.versions import expand_releases
    from kvbound.trace.campaign import Shard
    from kvbound.trace.session import checkout

    if not args.vllm and not args.vllm_src:
        raise UsageError("name releases with --vllm (e.g. --vllm 0.21.0..0.33.0) or a checkout with --vllm-src DIR")
    releases = expand_releases(args.vllm)
    for v in releases:
        variant_for_version(v)  # UnsupportedVersion: one line, exit 2
    # guided: round 0 is the points named, --explore N the points of each later round; --explore's
    # draws are points some release of the campaign runs (a checkout runs what its base runs)
    named = argparse.Namespace(**dict(vars(args), explore=0)) if args.guided else args
    layouts = tuple(space.chosen(named, sweep=True, runnable=space.runnable_on(releases, engine_overrides(args))))
    columns = list(releases)
    src_col = None
    if args.vllm_src:
        src = checkout(args.vllm_src)
        if not releases:
            raise UsageError("--vllm-src DIR needs --vllm X: the release whose spec the fork is judged by")
        src_col = f"src:{src.resolve().name}"
        columns.append(src_col)
    judged_as = releases + ([releases[-1]] if src_col else [])  # a checkout runs what its base runs
    options = trace_options(args, judged_as, layouts, pool_size(args))
    shards = [Shard(v, layouts, options, column=v) for v in releases]
    if src_col:
        shards.append(Shard(releases[-1], layouts, options, src=str(src.resolve()), column=src_col))
    return columns, shards


def trace_options(args, judged_as: list, layouts: tuple, pool: int) -> TraceOptions:
    """The options every shard runs with, from the command line alone: ``--requests`` per
    point, else ``--budget`` turned into requests per point by the fixed cost table for one
    column per entry of ``judged_as`` (the release each column is judged as) on ``pool``
    processes, else the floor (``PlanOptions.min_requests``); ``--seed``, ``--engine``, ``--coverage``,
    ``--shrink-budget``."""
    overrides = tuple(engine_overrides(args).items())
    coverage = coverage_of(args)
    if args.requests is not None:
        if args.requests < 1:
            raise UsageError("--requests must be >= 1")
        n = args.requests
    else:
        plan_options, costs, then = _costs(args, judged_as, layouts, coverage)
        n = plan_options.requests_per_layout(costs, args.shrink_budget, pool, then)
        planned = plan_options.seconds(costs, n, args.shrink_budget, pool, then)
        if args.budget is not None and planned > args.budget:  # the floor alone costs more: say so, run it
            print(f"kvbound {getattr(args, 'command', 'campaign')}: --budget {args.budget:.0f} is below"
                  f" what this campaign costs at the floor of {n} requests per layout (worker starts, shrinking):"
                  f" planned at {planned:.0f} s", file=sys.stderr)
    return TraceOptions(RunOptions(n, args.seed, overrides=overrides, coverage=coverage),
                        ShrinkOptions(args.shrink_budget))


def _costs(args, judged_as: list, layouts: tuple, coverage: bool):
    """(plan options, per shard the cost families of the points it runs, the guided rounds'
    shards): what ``PlanOptions`` plans a campaign from."""
    plan_options = CAMPAIGN_PLAN if args.budget is None else replace(CAMPAIGN_PLAN, budget_s=args.budget)
    if coverage:  # measured traffic runs slower, its workers start slower
        plan_options = plan_options.covered()
    overrides = engine_overrides(args)
    costs = [_families(layouts, v, overrides) for v in judged_as]
    # a guided round's points are drawn once the round before has run: each costed as the costliest
    then = [[[plan_options.costliest()] * args.explore for _ in judged_as]] * args.guided
    return plan_options, costs, then


def _families(layouts, release: str, overrides: dict) -> list:
    """The cost families of the points of ``layouts`` that ``release`` runs (an unsupported
    point costs nothing)."""
    from kvbound.trace.layouts import cost_family

    return [cost_family(space.resolve(l)) for l in layouts if space.support(l, release, overrides) is None]


def planned_seconds(args, shards: list, pool: int, paces=(None,)) -> list:
    """The seconds the cost table plans ``shards`` at on ``pool`` processes, once per entry of
    ``paces``: each shard's parts at its release's paces, or (None) the table's own
    (docs/benchmarks.md has the plan against what runs took). The costs are found once."""
    options = shards[0].options
    plan_options, costs, then = _costs(args, [sh.release for sh in shards], shards[0].layouts, options.run.coverage)
    return [plan_options.seconds(costs, options.run.requests, options.shrink.budget, pool, then, p) for p in paces]


def at_pace(args, shards: list, pool: int) -> tuple:
    """(the table's seconds, the seconds at this machine's pace, the words): what the campaign
    of ``shards`` takes on ``pool`` processes at this machine's pace (``--pace``, else
    ``kvbound.trace.pace``: per release, what its shards here took, or a probe), said as the
    first line ends; where that is past ``--budget`` by more than a fifth, one line on stderr
    with the budget that plans it here. The requests stay the table's: the pace is a clock, and
    the traffic is planned without one."""
    from kvbound.trace.pace import release_paces

    if args.pace is not None:
        paces, how = [(args.pace, args.pace)] * len(shards), "given"
    else:
        paces, how = release_paces(CAMPAIGN_PLAN, [sh.column for sh in shards], shards[0].options.shrink.budget)
    table_s, paced_s = planned_seconds(args, shards, pool, (None, paces))
    pace = paced_s / table_s if table_s else 1.0
    if args.budget is not None and paced_s > 1.2 * args.budget:
        print(f"kvbound {getattr(args, 'command', 'campaign')}: at this machine's pace (x{pace:.2f}) --budget"
              f" {args.budget:.0f} takes about {paced_s:,.0f} s; --budget {args.budget / pace:.0f} plans"
              f" about {args.budget:.0f} s here", file=sys.stderr)
    return table_s, paced_s, (f"planned at {paced_s:,.0f} s ({table_s:,.0f} s by the cost table x {pace:.2f},"
                              f" this machine's pace: {how})")


def record_pace(args, results: list) -> None:
    """Keep each shard's seconds, running and shrinking, against what the table planned it at
    (``kvbound.trace.pace.record``): the next campaign's pace."""
    from kvbound.trace.guide import label
    from kvbound.trace.pace import record

    kept = []
    for res in results:
        shard, tm = res["shard"], res.get("timings", {})
        opts = shard["options"]
        ran = {c["layout"] for c in res["cells"] if c.get("outcome") == "ran"}
        seeds = shard.get("seeds") or [opts["run"]["seed"]] * len(shard["layouts"])
        points = [p for p, seed in zip(shard["layouts"], seeds) if label(p, seed, opts["run"]["seed"]) in ran]
        if not points or "seconds" not in tm:  # a worker that did not start, a shard that ran nothing
            continue
        plan_options = CAMPAIGN_PLAN.covered() if opts["run"]["coverage"] else CAMPAIGN_PLAN
        fams = _families(points, shard["release"], dict(map(tuple, opts["run"]["overrides"])))
        table = plan_options.shard_parts(fams, opts["run"]["requests"], opts["shrink"]["budget"])
        kept.append((shard["column"], opts["shrink"]["budget"], table,
                     (tm["seconds"] - tm["shrink_seconds"], tm["shrink_seconds"])))
    record(CAMPAIGN_PLAN, kept)


def coverage_of(args) -> bool:
    """--coverage as given, else on for --guided (it steers by coverage) and the default
    otherwise; a UsageError for --guided with --no-coverage or a bad --guided/--explore."""
    rounds = args.guided
    if rounds < 0:
        raise UsageError(f"--guided {rounds}: must be >= 0 (rounds after the points named)")
    if not rounds:
        return CAMPAIGN_COVERAGE if args.coverage is None else args.coverage
    if args.coverage is False:
        raise UsageError(f"--guided {rounds}: steers by coverage, so it cannot run with --no-coverage")
    if args.explore < 1:
        raise UsageError(f"--guided {rounds}: needs --explore N >= 1, the points each round draws")
    return True


def planner(args, shards):
    """The guided campaign's planner: points drawn only where some release of the campaign runs them."""
    from kvbound.trace.guide import Planner

    return Planner(args.seed, args.explore,
                   space.runnable_on((sh.release for sh in shards), dict(shards[0].options.run.overrides)))


def _bar(quiet, t0):
    def progress(done, total, res):
        cells = res["cells"]
        nf = sum(len(c["findings"]) for c in cells)
        col = res["shard"]["column"]
        if quiet:
            print(f"  {col}: {len(cells)} layouts, {nf} distinct findings", file=sys.stderr, flush=True)
            return
        w = 30
        fill = int(w * done / max(total, 1))
        print(f"\r  [{'#' * fill}{'.' * (w - fill)}] {done}/{total} shards  {time.monotonic() - t0:,.0f} s"
              f"  last: {col} ({len(cells)} layouts, {nf} findings)   ",
              end="" if done < total else "\n", file=sys.stderr, flush=True)
    return progress


def run(args) -> int:
    from kvbound.conform.prepare import prepare_release
    from kvbound.trace import campaign as C

    if args.pace is not None and not (math.isfinite(args.pace) and args.pace > 0):
        raise UsageError(f"--pace {args.pace}: must be a positive finite factor (this machine's seconds per"
                         " second of the cost table)")
    columns, shards = plan(args)
    for sh in shards:  # prepare in this process, once, before the pool (cached afterwards)
        if sh.src:
            continue
        try:
            prepare_release(sh.release, lambda m: print(m, file=sys.stderr, flush=True))
        except PrepareError as e:
            print(f"kvbound campaign: vllm {sh.release} could not be prepared:\n  {e}", file=sys.stderr)
            return EXIT_INPUT
    n_cells = sum(len(s.layouts) for s in shards)
    _, planned, said = at_pace(args, shards, pool_size(args))
    rounds = f", then {args.guided} guided round(s) of {args.explore} points" if args.guided else ""
    print(f"kvbound campaign: {len(columns)} column(s) x {len(shards[0].layouts)} layouts = {n_cells} cells{rounds},"
          f" {shards[0].options.run.requests} requests each, seed {args.seed},"
          f"{''.join(f' --engine {k}={v},' for k, v in shards[0].options.run.overrides)}"
          f" {'Ray ' + args.ray if args.ray else f'{local_workers(args)} local worker(s)'};"
          f" {said}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    out_dir = str(Path(args.out).resolve())

    def execute(batch):
        if args.ray:
            return C.ray_shards(batch, args.ray, _bar(args.quiet, t0), out_dir, num_cpus=args.workers)
        return C.local_shards(batch, local_workers(args), _bar(args.quiet, t0), out_dir)

    with C.ended_by_signals():  # kill -TERM ends the pool (or Ray) and every vLLM worker: exit 143
        if args.guided:
            from kvbound.trace.guide import round_line

            guide = planner(args, shards)
            with C.ray_cluster(args.ray, args.workers) if args.ray else nullcontext():  # one Ray for every round
                results = C.guided(shards, guide, args.guided, execute,
                                   lambda rnd: print(f"  {round_line(rnd)}", file=sys.stderr, flush=True))
        else:
            results = execute(shards)
    doc = C.merge(columns, results, guide.rounds if args.guided else None)
    n_cells = sum(len(r["cells"]) for r in results)
    wall = time.monotonic() - t0
    print(render(doc))
    print(f"\n{n_cells} cells in {wall:.0f} s (planned at {planned:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc.to_json(), indent=1, sort_keys=True) + "\n")
    if args.timings:
        Path(args.timings).write_text(json.dumps({"seconds": round(wall, 1), "planned_seconds": round(planned, 1), "shards": [
            {"column": r["shard"]["column"], **r["timings"]} for r in results]}, indent=1) + "\n")
    if args.html:
        from kvbound.campaign_page import html_page

        Path(args.html).write_text(html_page(doc, args.out))
    if not args.ray:  # this machine's pace for the next plan (a Ray cluster's workers run elsewhere)
        record_pace(args, results)
    if any(f.finding_class == "harness" for f in doc.findings) or any(
            cell["outcome"] == "worker_failed" for col in doc.matrix.values() for cell in col.values()):
        return EXIT_INPUT
    if args.baseline:
        new, gone = against_baseline(doc, _read_baseline(args.baseline))
        for key, col in gone:
            print(f"baseline: {key} on {col} is no longer found")
        for key, col in new:
            print(f"NEW: {key} on {col} (not in the baseline {args.baseline})")
        print(f"baseline: {len(new)} new finding(s), {len(gone)} gone")
        return EXIT_FAIL if new else EXIT_OK
    return EXIT_FAIL if doc.findings else EXIT_OK


def _pairs(doc: CampaignRecord) -> set:
    return {(f.key, c) for f in doc.findings for c in f.columns}


def _read_baseline(path) -> CampaignRecord:
    try:
        return CampaignRecord.from_json(json.loads(Path(path).read_text()), f"--baseline {path}")
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"--baseline {path}: not a readable campaign JSON ({e})") from None
    except ReportInputError as e:
        raise UsageError(f"{e} (a kvbound campaign --json file)") from None


def against_baseline(doc: CampaignRecord, baseline: CampaignRecord) -> tuple[list, list]:
    """(new, gone): (finding key, column) pairs found now and not in the baseline, and those
    the baseline has on a column this run covered that are no longer found."""
    now, then = _pairs(doc), _pairs(baseline)
    cols = set(doc.columns)
    return sorted(now - then), sorted(p for p in then - now if p[1] in cols)


def _cell_text(cell) -> str:
    if cell is None:
        return "-"
    if cell["outcome"] == "unsupported":
        return "n/a"
    if cell["outcome"] != "ran":
        return "FAIL"
    return str(len(cell["findings"])) if cell["findings"] else "ok"


def render(doc: CampaignRecord) -> str:
    from kvbound.side.findings import CLASSES

    cols = doc.columns
    layouts = sorted({l for c in doc.matrix.values() for l in c})
    lines = ["", "== matrix: layouts x releases (ok; n/a: the release lacks what the layout needs; FAIL: the worker died; else the number of distinct findings) =="]
    w0 = max([len("layout")] + [len(l) for l in layouts])
    ws = [max(len(c), 4) for c in cols]
    lines.append("  ".join(["layout".ljust(w0)] + [c.rjust(w) for c, w in zip(cols, ws)]))
    for l in layouts:
        lines.append("  ".join([l.ljust(w0)] + [_cell_text(doc.matrix.get(c, {}).get(l)).rjust(w)
                                                 for c, w in zip(cols, ws)]))
    lines.append("")
    lines.append("== findings by class ==")
    lines.append("  ".join(["class".ljust(w0)] + [c.rjust(w) for c, w in zip(cols, ws)]))
    for k in CLASSES:
        lines.append("  ".join([k.ljust(w0)] + [str(doc.by_class.get(c, {}).get(k, 0)).rjust(w)
                                                 for c, w in zip(cols, ws)]))
    skips = [(c, l, cell["why"]) for c in cols for l, cell in sorted(doc.matrix.get(c, {}).items())
             if cell["outcome"] != "ran"]
    if skips:
        lines += ["", "== not run =="] + [f"  {c} {l}: {why}" for c, l, why in skips]
    if doc.findings:
        lines += ["", f"== {len(doc.findings)} distinct finding(s) =="]
        for f in doc.findings:
            where = ", ".join(sorted({c[1] for c in f.cells}))
            stop = f"; absent from {f.stops_at}" if f.stops_at else ""
            lines.append(f"  [{f.finding_class}{'' if f.safety else ', efficiency'}] {f.key}: {f.first}"
                         f" .. {f.last} ({len(f.columns)} release(s)){stop}; layouts {where}")
        lines += _time_to_detect(doc)
    if doc.guided:
        from kvbound.trace.guide import round_line

        lines += ["", "== guided rounds (runs that reached new connector lines join the corpus) =="]
        lines += [f"  {round_line(rnd)}" for rnd in doc.guided]
    if doc.coverage:
        from kvbound.trace.coverage import render as coverage_lines

        lines += coverage_lines(doc.coverage)
    return "\n".join(lines)


def _time_to_detect(doc: CampaignRecord) -> list:
    """The median over the distinct findings of the traffic before each was first seen."""
    from statistics import median

    seen = [f.detect for f in doc.findings if f.detect]
    if not seen:
        return []
    return [f"  time to detect (median of {len(seen)}): {median(d['requests'] for d in seen):g} requests,"
            f" {median(d['cpu_s'] for d in seen):.2f} CPU-s of traffic"]
