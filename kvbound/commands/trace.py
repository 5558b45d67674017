"""``kvbound trace``: vLLM's real scheduler, allocator and offloading connector on
organic traffic, with the spec, the proofs' premises and lifecycle invariants
checked at every connector call."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from kvbound.conform.prepare import ReleaseEnv
from kvbound.errors import EXIT_FAIL, EXIT_INPUT, EXIT_OK, PrepareError, TraceError, UsageError
from kvbound.options import TRACE_PLAN, TRACE_SHRINK, RunOptions, ShrinkOptions, TraceOptions
from kvbound.records import TraceRecord
from kvbound.trace import space
from kvbound.spec import case_from_dict, plan_for_version, variant_for_version


def register(sub):
    from kvbound.trace.layouts import LAYOUTS, engine_help

    p = sub.add_parser(
        "trace",
        help="run vLLM's real scheduler on organic traffic and check every connector call",
        description="Step the real engine-core Scheduler (sync and AsyncScheduler) of a vLLM release with "
        "its real KVCacheManager, OffloadingConnector (both sides) and CPU offload tier on a seeded "
        "workload of requests sharing prefixes of varied lengths; only the model, its output and the "
        "transfer engine are faked. Every update_state_after_alloc call that loads is captured as a "
        "case and checked against the release's spec and the proofs' premises; lifecycle invariants "
        "and exceptions inside vLLM are findings. Findings are shrunk to a minimal set of requests, "
        "saved as trace files and drawn. Exit 1 on a finding.",
    )
    p.add_argument("--vllm", metavar="X", help="the vLLM release, e.g. 0.33.0 (prepared once, like conform)")
    p.add_argument("--vllm-src", metavar="DIR", help="run a checkout's vllm/ (a fork) instead; --vllm X names"
                   " the release whose spec it is checked against")
    p.add_argument("--layout", action="append", choices=sorted(LAYOUTS), default=[],
                   help="repeatable; default: every layout the release supports")
    p.add_argument("--budget", type=float, default=TRACE_PLAN.budget_s, metavar="S",
                   help=f"seconds the run is planned to take (default {TRACE_PLAN.budget_s:.0f}): turned into"
                        " requests per layout by a fixed cost table (kvbound.options.PlanOptions), so the run"
                        " stays reproducible")
    p.add_argument("--requests", type=int, default=None, metavar="N", help="requests per layout (overrides --budget)")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--segment", type=int, default=400, metavar="K",
                   help="requests per engine (a fresh scheduler and CPU tier each)")
    p.add_argument("--scheduler", choices=("sync", "async", "both"), default="both",
                   help="Scheduler, AsyncScheduler, or alternate segments (default)")
    p.add_argument("--engine", action="append", default=[], metavar="K=V", help=engine_help())
    p.add_argument("--stop-on-first", action="store_true", help="stop a layout at its first finding")
    p.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=False,
                   help="measure the line coverage of the release's connector code (line probes in the worker),"
                        " print it per file and add it to --json (default off: docs/benchmarks.md)")
    p.add_argument("--no-shrink", action="store_true", help="save findings unshrunk")
    p.add_argument("--shrink-budget", type=int, default=TRACE_SHRINK.budget, metavar="R", help="reruns per shrink")
    p.add_argument("--out", default="trace-findings", metavar="DIR", help="where trace files go")
    p.add_argument("--json", metavar="FILE", help="summary and findings as JSON (for CI; the same command"
                   " writes the same bytes)")
    p.add_argument("--timings", metavar="FILE", help="wall-clock and CPU figures per layout (not reproducible)")
    p.add_argument("--replay", metavar="F", help="rerun a trace file's requests and say if its finding reproduces")
    p.add_argument("--reshrink", action="store_true",
                   help="with --replay: shrink the reproduced finding further and save it under --out")
    space.add_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _env(args) -> ReleaseEnv:
    from kvbound.trace.session import checkout, release_env

    if args.vllm_src:
        if not args.vllm:
            raise UsageError("--vllm-src DIR needs --vllm X: the release whose spec the fork is checked against")
        src = checkout(args.vllm_src)
        variant_for_version(args.vllm)
        return release_env(args.vllm, str(src), _say)
    if not args.vllm:
        raise UsageError("name a release with --vllm X (e.g. --vllm 0.33.0) or a checkout with --vllm-src DIR")
    variant_for_version(args.vllm)  # UnsupportedVersion -> one line, exit 2
    return release_env(args.vllm, None, _say)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _bar(quiet):
    t0 = time.monotonic()

    def progress(layout, done, total, s):
        if quiet:  # one line per layout, for logs
            if done >= total:
                print(f"  {layout}: {done} requests, {s.stats['loads']} loads, {s.findings} findings,"
                      f" {s.seconds:.1f} s", file=sys.stderr, flush=True)
            return
        w = 30
        fill = int(w * done / max(total, 1))
        rate = done / max(time.monotonic() - t0, 1e-9)
        print(f"\r  {layout:<9} [{'#' * fill}{'.' * (w - fill)}] {done}/{total} requests"
              f"  {rate:,.0f} req/s  loads {s.stats['loads']}  findings {s.findings}   ",
              end="" if done < total else "\n", file=sys.stderr, flush=True)
    return progress


def run(args) -> int:
    from kvbound.trace.layouts import cost_family
    from kvbound.trace.session import RAN, run_release

    from .campaign import engine_overrides

    if args.replay:
        if args.engine:
            raise UsageError("--replay F reruns the file's requests with the file's own settings: give no --engine")
        return replay(args)
    if (args.requests is not None and args.requests < 1) or args.segment < 1:
        raise UsageError("--requests and --segment must be >= 1")
    layouts = space.chosen(args)
    shrink_budget = 0 if args.no_shrink else args.shrink_budget
    n = args.requests if args.requests is not None else replace(TRACE_PLAN, budget_s=args.budget).requests_per_layout(
        [[cost_family(space.resolve(l)) for l in layouts]], shrink_budget)
    overrides = tuple(engine_overrides(args).items())
    options = TraceOptions(RunOptions(n, args.seed, args.segment, args.scheduler, args.stop_on_first, overrides,
                                      args.coverage),
                           ShrinkOptions(shrink_budget))
    try:
        env = _env(args)
    except PrepareError as e:
        print(f"kvbound trace: vllm {args.vllm} could not be prepared:\n  {e}", file=sys.stderr)
        return EXIT_INPUT
    print(f"kvbound trace: vllm {env.version}, layouts {' '.join(layouts)}, {n} requests each,"
          f" seed {args.seed}, scheduler {args.scheduler}", file=sys.stderr)
    res = run_release(env, layouts, options, _bar(args.quiet), Path(args.out))
    if res.start_error:
        print(f"kvbound trace: {res.start_error}", file=sys.stderr)
        return EXIT_INPUT
    summaries = [c.summary for c in res.cells if c.outcome == RAN]
    skipped = [{"layout": c.layout, "why": c.why} for c in res.cells if c.outcome != RAN]
    for sk in skipped:  # the layout only (unsupported, or its worker died): one line
        print(f"  {sk['layout']}: skipped: {sk['why']}", file=sys.stderr, flush=True)
    wall = res.seconds - res.shrink_seconds
    print(render_table(summaries))
    for sk in skipped:
        print(f"skipped {sk['layout']}: {sk['why']}")
    kept = res.findings()
    n_found = sum(k.count for k in kept)
    if kept:
        print(f"\n== {n_found} finding(s), {len(kept)} distinct ==")
    for k in kept:
        print(describe(k.finding, str(k.path), k.shrunk_from))
    covered = {env.version: res.coverage.document()} if res.coverage is not None else None
    if covered:
        from kvbound.trace.coverage import render as coverage_lines

        print("\n".join(coverage_lines(covered)))
    total_req = sum(s.stats["requests"] for s in summaries)
    print(f"\n{total_req} requests in {wall:.1f} s ({total_req / max(wall, 1e-9):,.0f} requests/s on one"
          f" worker process), {n_found} finding(s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        doc = TraceRecord(env.version, args.seed, n, [_summary_json(s) for s in summaries], skipped, [
            {"kind": k.finding.kind, "class": k.finding.finding_class, "safety": k.finding.safety,
             "layout": k.finding.layout, "detail": _short(k.finding.detail), "file": str(k.path)} for k in kept],
            covered and covered[env.version])
        Path(args.json).write_text(json.dumps(doc.to_json(), indent=1) + "\n")
    if args.timings:
        Path(args.timings).write_text(json.dumps({"seconds": round(wall, 2), "layouts": [
            {"layout": s.layout, "seconds": round(s.seconds, 2), "cpu_seconds": round(s.cpu_seconds, 2),
             "requests_per_cpu_second": round(s.stats["requests"] / s.cpu_seconds, 1) if s.cpu_seconds else None,
             "first_finding_seconds": None if s.first_finding_seconds is None else round(s.first_finding_seconds, 2)}
            for s in summaries]}, indent=1) + "\n")
    if any(k.finding.finding_class == "harness" for k in kept):
        return EXIT_INPUT
    return EXIT_FAIL if kept else EXIT_OK


def _summary_json(s) -> dict:
    return {"layout": s.layout, **s.stats, "captured_calls": s.captured_calls, "spec_agree": s.spec_agree,
            "not_judged": s.not_judged, "findings": s.findings, "first_finding_requests": s.first_finding_requests}


def _short(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "traceback"}


COLUMNS = ("requests", "steps", "loads", "partial_hits", "partial_tails", "stores", "preemptions", "aborts")


def render_table(summaries) -> str:
    head = ["layout", *COLUMNS, "calls", "spec=", "findings", "s", "req/cpu-s"]
    rows = [[s.layout, *(str(s.stats[c]) for c in COLUMNS), str(s.captured_calls), str(s.spec_agree), str(s.findings),
             f"{s.seconds:.1f}", f"{s.stats['requests'] / s.cpu_seconds:,.0f}" if s.cpu_seconds else "-"]
            for s in summaries]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def describe(f, path: str, shrunk_from: int | None = None) -> str:
    from kvbound.draw import draw_case

    n = len(f.segment["requests"])
    lines = [f"\n-- {f.kind} on vllm {f.release}, layout {f.layout}: {n} request(s)"
             + (f" (shrunk from {shrunk_from})" if shrunk_from else "") + f"\n   {path}"]
    d = _short({k: v for k, v in f.detail.items() if k != "table"})
    lines.append("   " + json.dumps(d)[:1500])
    if isinstance(f.detail.get("table"), dict):  # a shadow-KV finding: the blocks' content
        from kvbound.draw import draw_content

        lines.append(draw_content(f.detail["table"]))
    if f.case is not None:
        try:
            case = case_from_dict(f.case, f.case.get("name", "?"))
        except ValueError:  # premise:valid-call: the call is no valid case; show its groups as given
            lines += [f"   group {i} {g.get('kind')}: {' '.join(map(str, g.get('blocks', [])))}"
                      for i, g in enumerate(f.case.get("groups", []))]
            return "\n".join(lines)
        plan = plan_for_version(case, f.release)
        lines.append(draw_case(case, plans={plan.variant: plan}, legend=True))
    return "\n".join(lines)


def replay(args) -> int:
    from kvbound.trace import tracefile as TF
    from kvbound.trace import session

    try:
        f = TF.load(args.replay)
    except ValueError as e:
        raise UsageError(str(e)) from None
    args.vllm = args.vllm or f.release
    why = space.support(f.layout, args.vllm, f.segment.get("params"))
    if why is not None:  # a release that lacks what the file's point needs: one line, not a clean rerun
        print(f"kvbound trace: cannot replay {args.replay}: {why}", file=sys.stderr)
        return EXIT_INPUT
    try:
        env = _env(args)
    except PrepareError as e:
        print(f"kvbound trace: vllm {args.vllm} could not be prepared:\n  {e}", file=sys.stderr)
        return EXIT_INPUT
    options = ShrinkOptions(args.shrink_budget) if args.reshrink else None
    try:
        got, shrunk = session.replay(env, f, options, Path(args.out))
    except TraceError as e:
        print(f"kvbound trace: {e}", file=sys.stderr)
        return EXIT_INPUT
    if shrunk is not None:
        print(f"reproduced on vllm {env.version}: {f.kind}; shrunk {shrunk.shrunk_from} -> "
              f"{len(shrunk.finding.segment['requests'])} requests")
        print(describe(shrunk.finding, str(shrunk.path), shrunk.shrunk_from))
        return EXIT_FAIL
    same = [g for g in got if g.key() == f.key()]
    if same:
        print(f"reproduced on vllm {env.version}: {f.kind}")
        print(describe(same[0], args.replay))
        return EXIT_FAIL
    print(f"not reproduced on vllm {env.version}: {f.kind} (found instead: "
          f"{', '.join(sorted({g.key() for g in got})) or 'nothing'})")
    for g in _first_per_key(got):  # what the same requests give now, drawn as a finding is
        print(describe(g, f"(the requests of {args.replay})"))
    return EXIT_OK


def _first_per_key(findings) -> list:
    """The first finding of each key, in key order."""
    first: dict = {}
    for g in findings:
        first.setdefault(g.key(), g)
    return [first[k] for k in sorted(first)]
