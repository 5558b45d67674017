"""``kvbound premises CASE...``: check the premises the proofs assume on concrete calls.

Each premise of ``kvbound.proofs.premises`` (its one term, folded on the case) runs on every group
of every case; a case captured from a running vLLM (``side/capture.py``) so shows
whether real calls meet what the obligations assume. Exit 0 when every premise holds
on every case, 1 when one fails (each failure names the case, group, premise and
the blocks at fault), 2 on bad input.
"""

from __future__ import annotations

import json
import sys

from kvbound.errors import UsageError

from . import add_case_args


def register(sub):
    p = sub.add_parser(
        "premises",
        help="check the proofs' premises (allocator, scheduler, lookup facts) on case files",
        description="Evaluate every premise the proof obligations assume (each read from vLLM's source, "
        "listed with --list) on every group of every case: the cases in examples/, or calls captured from a "
        "running vLLM. Exit 1 when a premise fails on a case.",
    )
    add_case_args(p, nargs="*")  # none with --list
    p.add_argument("--only", nargs="+", metavar="ID", help="check only these premises")
    p.add_argument("--json", metavar="FILE", help="write every check as JSON")
    p.add_argument("--list", action="store_true", help="list the premises with the vLLM lines they were read from")
    p.add_argument("--vllm-version", metavar="X", help="a lookup or store case as release X (default: its own)")
    p.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    return p


def _checks(case, args):
    """(checks, the kind of each check's group, or "store" for a store call) of one case of any kind."""
    from kvbound.proofs.case_premises import evaluate_lookup, evaluate_store
    from kvbound.proofs.premises import evaluate
    from kvbound.spec.lookup_case import LookupCase
    from kvbound.spec.store_case import StoreCase

    if isinstance(case, LookupCase):
        return evaluate_lookup(case, args.vllm_version, args.only), lambda c: case.groups[c.group_index].kind
    if isinstance(case, StoreCase):
        return evaluate_store(case, args.vllm_version, args.only), lambda c: "store"
    return evaluate(case, args.only), lambda c: case.groups[c.group_index].config.kind.value


def run(args) -> int:
    from kvbound.proofs.premises import BY_ID, PREMISES
    from kvbound.proofs.store_premises import STORE_BY_ID, STORE_PREMISES

    from . import read_cases

    if args.list:
        for p in (*PREMISES, *STORE_PREMISES):
            print(f"{p.id}  ({p.kinds_label})\n  {p.statement}\n  {p.math}")
            for src in p.sources:
                print(f"  read from: {src}")
        return 0
    if not args.cases:
        raise UsageError("give at least one CASE file or directory (or --list)")
    unknown = [i for i in args.only or () if i not in BY_ID and i not in STORE_BY_ID]
    if unknown:
        raise UsageError(f"--only: unknown premise {unknown[0]!r}; known: {', '.join([*BY_ID, *STORE_BY_ID])}")
    cases = read_cases(args.cases)
    rows, failed, checked, skipped = [], 0, 0, 0
    for case in cases:
        checks, kind_of = _checks(case, args)
        if not checks:
            skipped += 1
            if not args.quiet:
                print(f"{case.name}: {_nothing(case)}: nothing assumed")
            continue
        for c in checks:
            checked += 1
            failed += not c.holds
            kind = kind_of(c)
            if not c.holds or not args.quiet:
                mark = "holds" if c.holds else f"FAILS: {c.detail}"
                where = (f"store call ({case.status}, {case.scheduler})" if kind == "store"
                         else f"group {c.group_index} {kind:14s}")
                print(f"{case.name}  {where}  {c.premise.id:22s}  {mark}")
            rows.append({"case": case.name, "group": c.group_index, "kind": kind, "premise": c.premise.id,
                         "holds": c.holds, "detail": c.detail})
    print(f"premises: {checked - failed}/{checked} checks hold on {len(cases)} case(s)"
          f"{f' ({skipped} without a load)' if skipped else ''}"
          f"{'' if not failed else f'; {failed} FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checks": rows, "failed": failed, "total": checked}, f, indent=2)
            f.write("\n")
    if failed:
        print(f"kvbound premises: {failed} check(s) fail: the proofs do not cover these calls", file=sys.stderr)
    return 1 if failed else 0


def _nothing(case) -> str:
    from kvbound.spec.lookup_case import LookupCase
    from kvbound.spec.store_case import StoreCase

    if isinstance(case, LookupCase):
        return "no hit, no load"
    if isinstance(case, StoreCase):
        return "a release before the store spec"
    return "M = 0, no load"
