"""``kvbound prove``: run the Z3 proof obligations, draw every witness, score the mutants.

Exit 0 iff every obligation met its expected verdict (and, on a full run, every
mutant was killed); 1 when one missed; 2 when the solver said unknown (a timeout
included) — never reported as proved.
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET

from kvbound.draw import draw_witness
from kvbound.errors import UsageError
from kvbound.proofs import mutants
from kvbound.records import ObligationRecord, ProveRecord



def register(sub):
    p = sub.add_parser(
        "prove",
        help="prove the load-boundary obligations in Z3; draw every witness; score mutants",
        description="Run every proof obligation (each within its declared bound: groups, table length, sizes; "
        "printed per obligation), check each proof is not vacuous, replay each witness through the executable "
        "spec, and kill the seeded mutants.",
    )
    p.add_argument("--only", nargs="+", metavar="ID", help="run only these obligations (mutants are skipped)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="per solver call, seconds (default: kvbound.proofs.options.PROVE's)")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="worker processes (default 2)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report (one test per obligation)")
    p.add_argument("--list", action="store_true", help="list the obligations and exit")
    return p


def run(args) -> int:
    from kvbound.proofs import OBLIGATIONS, run_all, solve_plan
    from kvbound.proofs.options import PROVE

    if args.list:
        for o in OBLIGATIONS:
            print(f"{o.id:40s} {o.expected:8s} {o.statement}")
        return 0
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive seconds, got {args.timeout}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    t0, cpu0 = time.perf_counter(), _cpu()
    try:
        options = PROVE if args.timeout is None else PROVE.with_timeout(args.timeout)
        report = run_all(args.only, options, mutants=not args.only, jobs=args.jobs)
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    total, cpu = time.perf_counter() - t0, _cpu() - cpu0

    width = max(len(r.obligation.id) for r in report.results)
    rw = max(len(_releases(r.obligation)) for r in report.results)
    print(f"{'obligation':{width}s}  {'expected':8s}  {'verdict':8s}  {'met':4s}  {'seconds':>7s}  "
          f"{'releases':{rw}s}  bound")
    for r in report.results:
        print(f"{r.obligation.id:{width}s}  {r.obligation.expected:8s}  {r.verdict:8s}  "
              f"{'yes' if r.met else 'NO':4s}  {r.seconds:7.2f}  {_releases(r.obligation):{rw}s}  "
              f"{r.obligation.bound.text()}")
    for r in report.results:
        problem = _problem(r)
        if r.witness is not None:
            print()
            print(f"witness for {r.obligation.id}: {r.obligation.statement}")
            if problem:
                print(f"  !! {problem}")
            print(draw_witness(r.witness))
            if r.obligation.about is not None:
                plan = solve_plan(r.witness, r.obligation.about)
                print(f"  the variant under test ({_knobs_text(r.obligation.about)}), as encoded, gives: {plan}")
        elif problem:
            print(f"\n{r.obligation.id}: {problem}")
    score = report.mutation_score
    print()
    if score is None:
        print("mutants: skipped (--only)")
    else:
        killed, n = score
        print(f"mutation score: {killed}/{n} ({100.0 * killed / n:.0f}%)")
        for m, by in report.mutants.items():
            print(f"  {m:26s} {'killed by ' + by if by else 'SURVIVED'}")
        for m, why in mutants.score("encoding", report.mutants)["not_applicable"].items():
            print(f"  {m:26s} not in the encoding: {why}")
    print(f"total: {total:.2f} s wall, {cpu:.2f} s CPU ({len(report.results)} obligations"
          f"{'' if score is None else f', {score[1]} mutants'}, {args.jobs} jobs)")

    if args.json:
        _write_json(args.json, report, total)
    if args.junit:
        _write_junit(args.junit, report, total)
    if report.unknown:
        ids = ", ".join(r.obligation.id for r in report.unknown)
        print(f"kvbound prove: solver unknown (timeout?) for: {ids}", file=sys.stderr)
        return 2
    return 0 if report.ok else 1


def _releases(o) -> str:
    """The release range, short (the obligation's text may say more after it)."""
    return (o.release_range or "—").split(" (")[0].replace(" – ", "–")


def _cpu() -> float:
    """CPU seconds of this process and its finished workers (the wall time depends on the machine's load)."""
    import resource

    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def _knobs_text(code) -> str:
    """A code as text: its release, and the mutations planted in it."""
    from dataclasses import fields

    from kvbound.proofs.encoding import Knobs

    base, knobs = Knobs(), code.knobs
    planted = [f"{f.name}={getattr(knobs, f.name)}" for f in fields(knobs) if getattr(knobs, f.name) != getattr(base, f.name)]
    return ", ".join([f"vLLM {code.release.release}", *planted])


def _problem(r) -> str:
    from kvbound.spec.verdicts import Verdict

    if r.met:
        return ""
    if r.verdict == Verdict.UNKNOWN:
        return r.detail or "solver unknown"
    if r.verdict != r.obligation.expected:
        return f"expected {r.obligation.expected}, got {r.verdict}"
    if r.verdict == Verdict.PROVED:
        return f"vacuous proof: {r.vacuity}"
    return f"the spec does not reproduce the witness: {r.replay}" if r.replay else r.detail


def _write_json(path, report, total) -> None:
    data = ProveRecord(
        obligations=[ObligationRecord.of(r) for r in report.results],
        mutants=report.mutants,
        # the one mutant table's score for this checker (kvbound.proofs.mutants): survivors by name, and
        # the mutants the encoding cannot express, each with why
        mutation_score=None if report.mutants is None else mutants.score("encoding", report.mutants),
        total_seconds=round(total, 3),
        ok=report.ok,
    )
    with open(path, "w") as f:
        json.dump(data.to_json(), f, indent=2)
        f.write("\n")


def _write_junit(path, report, total) -> None:
    failures = sum(not r.met for r in report.results)
    suite = ET.Element("testsuite", name="kvbound.prove", tests=str(len(report.results)),
                       failures=str(failures), time=f"{total:.3f}")
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname="kvbound.prove", name=r.obligation.id,
                             time=f"{r.seconds:.3f}")
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="bound", value=r.obligation.bound.text())
        ET.SubElement(props, "property", name="verdict", value=r.verdict)
        if not r.met:
            ET.SubElement(case, "failure", message=_problem(r)).text = r.obligation.statement
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
