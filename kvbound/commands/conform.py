"""``kvbound conform``: replay cases on the real ``OffloadingConnectorScheduler`` of
pinned vLLM releases and compare each result with the spec variant of that release."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kvbound.errors import EXIT_FAIL, EXIT_INPUT, EXIT_OK, PrepareError, UsageError, WorkerError
from kvbound.conform import compare as C
from kvbound.conform import mutants as MUT
from kvbound.conform.mutants import SPEC_MUTANTS
from kvbound.conform.prepare import cache_dir, prepare_release
from kvbound.conform.runner import current_env, run_release
from kvbound.draw import draw_case
from kvbound.spec.strategies import ADVERSARIAL_FAMILIES
from kvbound.records import ConformCase, ConformRecord
from kvbound.spec import Case, case_to_dict, plan_for_version, variant_for_version
from kvbound.spec.lookup_case import LookupCase, lookup_case_to_dict
from kvbound.spec.verdicts import CONFORM_VERDICTS


def register(sub):
    p = sub.add_parser(
        "conform",
        help="check the spec against the real vLLM scheduler of pinned releases",
        description="Replay case files, N generated cases and every proof witness on vLLM's own "
        "OffloadingConnectorScheduler (only the offload tier faked), one worker process per "
        "release, and compare each result with the spec variant of that release. Each release is "
        f"prepared once under {cache_dir()} (a deps venv and the release's vllm/*.py) and reused "
        "offline. Exit 1 on a disagreement or fault outside the adversarial family, or a failed "
        "witness replay.",
    )
    p.add_argument("paths", nargs="*", metavar="CASE_FILE_OR_DIR", help="case files (.json, .jsonl) or directories")
    p.add_argument("--vllm", action="append", metavar="X", default=[],
                   help="a vLLM release, e.g. 0.29.0 (repeatable); default: the vllm importable here")
    p.add_argument("--cases", type=int, default=0, metavar="N",
                   help="also replay N generated cases of each family (--family)")
    p.add_argument("--family", action="append", metavar="F", default=[],
                   help="a generator family (kvbound.spec.strategies.ALL_FAMILIES; repeatable);"
                   " default: every family")
    p.add_argument("--lookup-cases", type=int, default=0, metavar="N",
                   help="also replay N generated lookup cases of each lookup family"
                   " (kvbound.spec.lookup_strategies: lookup/full, lookup/swa, lookup/mamba, lookup/eagle) on"
                   " the real get_num_new_matched_tokens")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the generated cases")
    p.add_argument("--no-witnesses", action="store_true", help="skip the replay of kvbound prove's witnesses")
    p.add_argument("--json", metavar="FILE", help="write every case's record, the matrix and the releases")
    p.add_argument("--spec-mutant", metavar="NAME", choices=[m.name for m in SPEC_MUTANTS],
                   help="judge with this spec mutant planted (kvbound/conform/mutants.py; applied at"
                   " runtime, no file edited): a sound checker then reports disagreements")
    p.add_argument("--spec-mutants", action="store_true",
                   help="after the run, judge the same real results once per spec mutant: the mutation"
                   " score (killed/total) and the survivors by name; exit 1 if one survives that is not"
                   " explained as equivalent")
    p.add_argument("--show", type=int, default=5, metavar="K",
                   help="draw at most K adversarial disagreements (all others are always drawn)")
    return p


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gather(args) -> list[tuple[Case, str, str]]:
    """(case, origin, family) for files, generated cases and witnesses."""
    items = []
    if args.paths:
        from kvbound.spec.strategies import family_of

        from kvbound.spec.lookup_case import LookupCase
        from kvbound.spec.store_case import StoreCase

        from . import read_cases

        for c in read_cases(args.paths):
            if isinstance(c, StoreCase):  # conform drives the load and the lookup; the trace drives stores
                _progress(f"{c.name}: a store case: kvbound conform drives update_state_after_alloc and "
                          "get_num_new_matched_tokens only; skipped (kvbound plan, explain and premises take it)")
                continue
            items.append((c, "file", "lookup" if isinstance(c, LookupCase) else family_of(c)))
    if args.cases:
        if args.cases < 0:
            raise UsageError("--cases must be >= 0")
        from kvbound.spec.strategies import ALL_FAMILIES, random_cases

        families = list(dict.fromkeys(args.family)) or list(ALL_FAMILIES)
        bad = [f for f in families if f not in ALL_FAMILIES]
        if bad:
            raise UsageError(f"--family {bad[0]!r} is not a generator family; one of {', '.join(ALL_FAMILIES)}")
        for fam in families:  # each family from its own seed stream: adding one changes no other
            items += [(c, "generated", fam) for c in random_cases(args.cases, args.seed, family=fam)]
    if getattr(args, "lookup_cases", 0):
        if args.lookup_cases < 0:
            raise UsageError("--lookup-cases must be >= 0")
        from kvbound.spec.lookup_strategies import LOOKUP_FAMILIES, random_lookup_cases

        for fam in LOOKUP_FAMILIES:
            items += [(c, "generated", fam) for c in random_lookup_cases(args.lookup_cases, args.seed, fam)]
    return items


def run(args) -> int:
    releases = list(dict.fromkeys(args.vllm))
    for r in releases:
        variant_for_version(r)  # UnsupportedVersion -> one line, exit 2
    items = gather(args)
    if not args.no_witnesses:
        from kvbound.proofs import witness_cases

        items += [(c, "witness", "witness") for c in witness_cases()]
    if not items:
        raise UsageError("nothing to replay: give case files/directories, --cases N, or keep the witnesses")
    cases = [c for c, _, _ in items]
    records, hellos, failed, jobs = [], {}, [], []
    for rel in releases or [None]:
        t0 = time.monotonic()
        try:
            env = prepare_release(rel, _progress) if rel else current_env()
            if rel is None:
                variant_for_version(env.version)
            hello, results = run_release(env, cases, _progress)
        except (PrepareError, WorkerError) as e:
            print(f"kvbound conform: vllm {rel or '(current environment)'} could not be prepared or"
                  f" started:\n  {e}", file=sys.stderr)
            failed.append(rel or "current")
            continue
        version = env.version
        hellos[version] = dict(hello, seconds=round(time.monotonic() - t0, 1))
        for (case, origin, fam), res in zip(items, results):
            if isinstance(case, LookupCase):  # the lookup: get_num_new_matched_tokens
                rec = C.judge_lookup(case, version, res)
                rec.update(origin=origin, family=fam, row=fam, case=lookup_case_to_dict(case),
                           worker={k: v for k, v in res.items() if k not in ("traceback", "id")})
                records.append(rec)
                continue
            if args.spec_mutant:
                with MUT.applied(args.spec_mutant):
                    rec = C.judge(case, version, res)
            else:
                rec = C.judge(case, version, res)
            rec.update(origin=origin, family=fam, row=C.row_of(case, origin, fam), case=case_to_dict(case),
                       worker={k: v for k, v in res.items() if k not in ("traceback", "id")})
            records.append(rec)
            jobs.append((case, version, res, rec["verdict"]))
    done = list(hellos)
    m = C.matrix(records, done)
    blocking = [r for r in records if C.is_blocking(r, r["row"])]
    if records:
        print(f"== version matrix: {len(cases)} cases x {len(done)} release(s) ==")
        print(C.render_matrix(m, done))
    _print_witnesses(records, done)
    _print_disagreements(items, records, args.show)
    mutation = None
    if args.spec_mutants and jobs:
        mutation = MUT.score(jobs, C.judge)
        _print_mutation(mutation)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        record = ConformRecord(
            command="kvbound conform " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["conform"] else sys.argv[1:]),
            releases=hellos, not_prepared=failed, matrix=m, blocking=len(blocking),
            undriven_blocking=sum(r["verdict"] == C.UNDRIVEN for r in blocking),
            spec_mutant=args.spec_mutant, spec_mutation=mutation,
            cases=[ConformCase.from_dict(r) for r in records])
        Path(args.json).write_text(json.dumps(record.to_json(), indent=1) + "\n")
    count = {v: sum(r["verdict"] == v for r in records) for v in CONFORM_VERDICTS}
    print(f"\nsummary: {count[C.AGREE]} agree, {count[C.DISAGREE]} disagree, {count[C.FAULT]} fault,"
          f" {count[C.UNDRIVEN]} not driven, {count[C.UNSUPPORTED]} refused by the release's config;"
          f" {len(blocking)} blocking (non-adversarial disagreement, fault or undriven case, or failed witness)")
    if failed:
        print(f"FAILED: could not prepare/start {', '.join(failed)} (see above)", file=sys.stderr)
        return EXIT_INPUT
    if mutation and mutation["unexplained_survivors"]:
        print(f"FAILED: spec mutant(s) not killed by real vLLM: {', '.join(mutation['unexplained_survivors'])}",
              file=sys.stderr)
        return EXIT_FAIL
    return EXIT_FAIL if blocking else EXIT_OK


def _print_mutation(mutation: dict) -> None:
    print(f"\n== spec mutants (kvbound.proofs.mutants) judged against the same real results:"
          f" {mutation['killed']}/{mutation['total']} killed ({mutation['percent']}%) ==")
    for name, v in mutation["details"].items():
        if mutation["killed_by"][name] is None:
            note = mutation["equivalent"].get(name)
            print(f"  {name:<24} SURVIVED  ({v['what']})" + (f"\n    equivalent: {note}" if note else ""))
        else:
            print(f"  {name:<24} killed by {mutation['killed_by'][name]}: {', '.join(v['diff'])}")
    for name, why in mutation["not_applicable"].items():
        print(f"  {name:<24} not applicable: {why}")
    if mutation["survivors"]:
        print(f"  survivors: {', '.join(mutation['survivors'])}"
              f" ({len(mutation['unexplained_survivors'])} not explained as equivalent)")


def _print_witnesses(records, releases) -> None:
    ws = [r for r in records if r["row"] == "witness"]
    if not ws:
        return
    print("\n== witness replay (real outcome vs the spec's, per release) ==")
    for name in dict.fromkeys(r["name"] for r in ws):
        parts = []
        for r in (x for x in ws if x["name"] == name):
            mark = {C.AGREE: "✓", C.UNDRIVEN: "(not driven: see --json 'why')",
                    C.UNSUPPORTED: "(config refused by the release)"}.get(r["verdict"], "✗")
            parts.append(f"{r['release']}: {C.outcome_label(r)} (spec {r['variant']}:"
                         f" {r['spec']['assertion'] or r['spec']['outcome']}) {mark}")
        print(f"  {name}:  " + "   ".join(parts))


def _print_disagreements(items, records, show_adversarial: int) -> None:
    by_name = {c.name: c for c, _, _ in items}
    shown_adv = 0
    bad = [r for r in records if r["verdict"] in (C.DISAGREE, C.FAULT)]
    if not bad:
        return
    print(f"\n== {len(bad)} disagreement(s)/fault(s) ==")
    for r in bad:
        if r["row"] in ADVERSARIAL_FAMILIES:
            shown_adv += 1
            if shown_adv > show_adversarial:
                continue
        case = by_name[r["name"]]
        print(f"\n-- {r['verdict']}: {r['name']} on vllm {r['release']} ({r['variant']}), row {r['row']}")
        if r["verdict"] == C.FAULT:
            print(r["fault"])
            continue
        if isinstance(case, LookupCase):
            print(f"  differs in: {', '.join(r['diff'])}\n  real: {json.dumps(r['real'])}\n"
                  f"  spec: {json.dumps(r['spec'])}\n  case: {json.dumps(lookup_case_to_dict(case))}")
            continue
        plan = plan_for_version(case, r["release"])
        print(draw_case(case, plans={plan.variant: plan}, legend=False))
        print(f"  differs in: {', '.join(r['diff'])}")
        print(f"  real vllm {r['release']}: {json.dumps(r['real'])}")
        if r.get("real_assert_site"):
            s = r["real_assert_site"]
            print(f"    assert at {s['file']}:{s['line']} group {s.get('group_index')}: {s['statement']}")
        print(f"  spec {r['variant']:<12}: {json.dumps(r['spec'])}")
    if shown_adv > show_adversarial:
        print(f"\n({shown_adv - show_adversarial} more adversarial disagreements: see --json)")
