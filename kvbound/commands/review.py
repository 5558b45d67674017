"""``kvbound review``: what a patch to vLLM changes in what the trace finds.

The patch (a unified diff, ``kvbound.trace.patchfile``) is applied to a copy of the prepared
release tree (``--vllm X``) or of a checkout (``--vllm-src DIR --base X``); the base and the
patched tree then run the same campaign points, traffic and seeds, as two shards of one
campaign (``kvbound.trace.campaign``: the patched tree is a ``src`` shard, judged by the base
release's spec, or with ``--models NAME`` by the release table's row for that patch,
``spec/versions.py`` ``PATCHES``: a patch that changes what the spec models), and the
findings are compared by key: gone (the base has it, the patched tree not), new, kept. Exit 1 on a new finding, 0 otherwise, 2 on bad input (a patch that does not
apply: one line naming the file and the hunk), a harness fault, or a point that did not run on
either tree (a patched tree whose vLLM does not import has no findings, and none of the base's
is "gone" for that).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvbound.errors import EXIT_FAIL, EXIT_INPUT, EXIT_OK, PrepareError, UsageError
from kvbound.records import CampaignRecord, reproducible

PATCHED = "patched"  # the patched tree's column
REVIEW_FORMAT = 1


def register(sub):
    from .campaign import add_run_arguments

    p = sub.add_parser(
        "review",
        help="a patch to vLLM: findings gone, new and kept against the tree it applies to",
        description="Apply a unified diff (git diff or diff -u, paths vllm/..., a/ and b/ prefixes accepted) to a "
        "copy of the prepared release tree (--vllm X) or of a checkout (--vllm-src DIR --base X), run the same "
        "campaign points and seeds on the base and the patched tree, and print the findings gone, new and kept "
        "(by finding key) and, with --coverage, the change in the connector's line coverage. Exit 1 on a new "
        "finding, 0 otherwise, 2 on bad input (a patch that does not apply), a harness fault or a dead worker.",
    )
    p.add_argument("--vllm", metavar="X", help="the release the patch applies to (its prepared tree, copied)")
    p.add_argument("--vllm-src", metavar="DIR", help="a checkout's root the patch applies to (its vllm/, copied)")
    p.add_argument("--base", metavar="X", help="with --vllm-src: the release whose spec both trees are judged by")
    p.add_argument("--patch", required=True, metavar="FILE", help="the unified diff")
    p.add_argument("--models", metavar="NAME", help="the patch changes what kvbound's spec models: judge the"
                   " patched tree by the release table's PATCHES[NAME] (spec/versions.py), its release's row with"
                   " the columns the patch changes; without it, both trees are judged by the release's own row")
    add_run_arguments(p)
    p.set_defaults(guided=0)  # the shared run options read --guided; a review runs the points named only
    p.add_argument("--out", default="review-findings", metavar="DIR",
                   help="where trace files go: DIR/base and DIR/patched")
    p.add_argument("--keep-tree", metavar="DIR", help="keep the patched tree at DIR (it must not exist), so a"
                   " new finding replays: kvbound trace --vllm X --vllm-src DIR --replay FILE")
    p.add_argument("--json", metavar="FILE", help="the review document (deterministic): the base's and the"
                   " patched tree's campaign documents, the keys gone, new and kept")
    p.add_argument("--html", metavar="FILE", help="both trees in one campaign page, the review at its top")
    p.add_argument("--replay", action="append", default=[], metavar="F",
                   help="repeatable: instead of a campaign, rerun a trace file's requests (a saved reproducer of the"
                        " same release) on both trees, as kvbound trace --replay does, and compare what each finds;"
                        " the findings of the patched tree are drawn")
    return p


def _sources(args) -> tuple:
    """(the release both are judged by, the base tree's root, the base's src for its shard
    (None: the prepared release), the base's column)."""
    from kvbound.conform.prepare import prepare_release
    from kvbound.spec import variant_for_version
    from kvbound.trace.session import checkout

    if args.vllm_src:
        if args.vllm or not args.base:
            raise UsageError("--vllm-src DIR takes --base X (the release whose spec it is judged by), not --vllm")
        variant_for_version(args.base)
        src = checkout(args.vllm_src).resolve()
        return args.base, src, str(src), f"src:{src.name}"
    if args.base:
        raise UsageError("--base X goes with --vllm-src DIR; for a release give --vllm X alone")
    if not args.vllm or "," in args.vllm or ".." in args.vllm:
        raise UsageError("name one release with --vllm X (e.g. --vllm 0.33.0) or a checkout with --vllm-src DIR"
                         " --base X")
    variant_for_version(args.vllm)
    env = prepare_release(args.vllm, lambda m: print(m, file=sys.stderr, flush=True))
    return args.vllm, Path(env.tree), None, args.vllm


def compare(base: CampaignRecord, patched: CampaignRecord) -> dict:
    """{"gone", "new", "kept"}: finding keys the base has and the patched tree not, the
    reverse, and both; each sorted."""
    b, p = {f.key for f in base.findings}, {f.key for f in patched.findings}
    return {"gone": sorted(b - p), "new": sorted(p - b), "kept": sorted(b & p)}


def coverage_change(base: CampaignRecord, patched: CampaignRecord) -> dict | None:
    """Per file: [executed, statements] on the base and on the patched tree, for the files
    whose figures differ, and the totals; None when coverage was not measured."""
    if not base.coverage or not patched.coverage:
        return None
    b, p = next(iter(base.coverage.values())), next(iter(patched.coverage.values()))
    fig = lambda files, rel: [files[rel]["executed"], files[rel]["statements"]] if rel in files else None  # noqa: E731
    files = {rel: {"base": fig(b, rel), "patched": fig(p, rel)} for rel in sorted(set(b) | set(p))
             if fig(b, rel) != fig(p, rel)}
    total = lambda files: [sum(f[k] for f in files.values()) for k in ("executed", "statements")]  # noqa: E731
    return {"files": files, "total": {"base": total(b), "patched": total(p)}}


def render(base_col: str, review: dict, both: CampaignRecord, cov: dict | None) -> str:
    by_key = {f.key: f for f in both.findings}
    lines = ["", f"== review: {base_col} against {PATCHED} =="]
    for what in ("gone", "new", "kept"):
        lines.append(f"{what}: {len(review[what])}")
        for key in review[what]:
            f = by_key[key]
            where = "; ".join(f"{col}: {', '.join(sorted({c[1] for c in f.cells if c[0] == col}))}"
                              for col in f.columns)
            lines.append(f"  [{f.finding_class}{'' if f.safety else ', efficiency'}] {key}  ({where})")
    if cov is not None:
        from kvbound.trace.coverage import percent

        pct = lambda ex, st: percent({"executed": ex, "statements": st})  # noqa: E731
        (be, bs), (pe, ps) = cov["total"]["base"], cov["total"]["patched"]
        lines.append(f"coverage: {be} / {bs} statements ({pct(be, bs):.1f}%) -> {pe} / {ps} ({pct(pe, ps):.1f}%)")
        for rel, f in cov["files"].items():
            side = lambda x: "absent" if x is None else f"{x[0]} / {x[1]}"  # noqa: E731
            lines.append(f"  {rel}: {side(f['base'])} -> {side(f['patched'])}")
    return "\n".join(lines)


def _prefix_files(result: dict, sub: str) -> dict:
    """A shard's result with each trace file named under its own subdirectory of --out."""
    for cell in result["cells"]:
        for f in cell["findings"]:
            if f.get("file"):
                f["file"] = f"{sub}/{f['file']}"
    return result


def run(args) -> int:
    from dataclasses import replace

    from kvbound.trace import campaign as C
    from kvbound.trace import space
    from kvbound.trace.patchfile import copy_and_apply
    from kvbound.trace.session import NOT_RUN, WORKER_FAILED

    from .campaign import _bar, engine_overrides, local_workers, trace_options

    patch = Path(args.patch)
    if args.replay and (args.layout or args.requests is not None or args.html or args.engine):
        raise UsageError("--replay F reruns the file's own requests at its own layout and settings: give no"
                         " --layout, --requests, --engine or --html with it")
    try:
        release, tree, base_src, base_col = _sources(args)
    except PrepareError as e:
        print(f"kvbound review: vllm {args.vllm} could not be prepared:\n  {e}", file=sys.stderr)
        return EXIT_INPUT
    replays = _replay_files(args.replay, release)
    judged = patched_release(release, args.models)
    layouts = tuple(space.chosen(args, sweep=True, runnable=space.runnable_on([release], engine_overrides(args))))
    workers = min(local_workers(args), 2)
    options = trace_options(args, [release, release], layouts, workers)
    if args.keep_tree and Path(args.keep_tree).exists():
        raise UsageError(f"--keep-tree {args.keep_tree}: exists already (give a new directory)")
    work = Path(args.keep_tree) if args.keep_tree else Path(tempfile.mkdtemp(prefix="kvbound-review-")) / "tree"
    try:
        changed, skipped = copy_and_apply(tree, work, patch)
        for rel in skipped:
            print(f"kvbound review: {rel} left out: outside vllm/, no run imports it", file=sys.stderr)
        engine = "".join(f", --engine {k}={v}" for k, v in options.run.overrides)
        what = (f"{len(args.replay)} trace file(s) replayed" if args.replay else
                f"{len(layouts)} point(s), {options.run.requests} requests each, seed {args.seed}{engine}")
        print(f"kvbound review: {patch} applied to a copy of {base_col} ({len(changed)} file(s)); {what}, on both",
              file=sys.stderr, flush=True)
        if args.replay:
            return replay(args, replays, release, judged, base_src, base_col, str(work.resolve()), patch, changed,
                          skipped)
        base = C.Shard(release, layouts, options, src=base_src, column=base_col)
        shards = [base, replace(base, release=judged, src=str(work.resolve()), column=PATCHED)]
        out = Path(args.out).resolve()
        t0 = time.monotonic()
        with C.ended_by_signals():
            results = C.local_shards(shards, workers, _bar(args.quiet, t0),
                                     [str(out / "base"), str(out / PATCHED)])
    finally:
        if not args.keep_tree:
            shutil.rmtree(work.parent, ignore_errors=True)
    results = [_prefix_files(r, sub) for r, sub in zip(results, ("base", PATCHED))]
    base_doc, patched_doc = C.merge([base_col], results[:1]), C.merge([PATCHED], results[1:])
    both = C.merge([base_col, PATCHED], results)
    review = compare(base_doc, patched_doc)
    cov = coverage_change(base_doc, patched_doc)
    print(render(base_col, review, both, cov))
    print(f"\n{2 * len(layouts)} cells in {time.monotonic() - t0:.0f} s")
    if args.json:
        doc = {"format": REVIEW_FORMAT, "release": release, "base": base_col, "patched_judged_as": judged,
               "engine": dict(options.run.overrides),
               "patch": {"file": args.patch, "sha256": hashlib.sha256(patch.read_bytes()).hexdigest(),
                         "changed": changed, "left_out": skipped},
               "base_doc": reproducible(base_doc.to_json()), "patched_doc": reproducible(patched_doc.to_json()),
               **review, **({"coverage": cov} if cov is not None else {})}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if args.html:
        from kvbound.campaign_page import html_page, review_section

        Path(args.html).write_text(html_page(both, args.out, lead=[review_section(base_col, PATCHED, review, both,
                                                                                   cov)]))
    failed = [(col, layout, cell.get("why")) for col, cells in both.matrix.items() for layout, cell in cells.items()
              if cell["outcome"] in (WORKER_FAILED, NOT_RUN)]
    for col, layout, why in failed:  # a tree that did not run has no findings to compare: never "gone"
        print(f"kvbound review: {layout} did not run on {col}: {why}", file=sys.stderr)
    if failed or any(f.finding_class == "harness" for f in both.findings):
        return EXIT_INPUT
    return EXIT_FAIL if review["new"] else EXIT_OK


def patched_release(release: str, models: str | None) -> str:
    """The release the patched tree is judged as: ``release``, or with ``--models NAME`` the
    release table's patched row ``"<release>+NAME"``; a ``UsageError`` for a name the table lacks, an
    ``UnsupportedVersion`` for a patch modelled on another release's code (each one line, exit 2)."""
    if models is None:
        return release
    from kvbound.spec import release_features
    from kvbound.spec.versions import PATCHES

    if models not in PATCHES:
        raise UsageError(f"--models {models}: no patch {models!r} in the release table's PATCHES"
                         f" (spec/versions.py: {', '.join(sorted(PATCHES))})")
    release_features(f"{release}+{models}")
    return f"{release}+{models}"


def _replay_files(paths: list, release: str) -> list:
    """[(path, the finding it holds)] for ``--replay``; a UsageError for a file that is no trace
    file or is one of another release."""
    from kvbound.trace import tracefile as TF

    files = []
    for path in paths:
        try:
            f = TF.load(path)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if f.release != release:
            raise UsageError(f"--replay {path}: release {f.release}, but the patch is reviewed against {release}"
                             " (replay a trace file of that release)")
        files.append((path, f))
    return files


def replay(args, files: list, release: str, judged: str, base_src: str | None, base_col: str, patched_src: str,
           patch: Path, changed: list, skipped: list) -> int:
    """``--replay F``: each trace file's requests rerun on the base and on the patched tree
    (``kvbound.trace.session.replay``, what ``kvbound trace --replay`` runs), the finding keys
    compared per file; the patched tree's findings drawn (``kvbound trace``'s ``describe``)."""
    from kvbound.errors import TraceError
    from kvbound.trace.session import release_env
    from kvbound.trace.session import replay as rerun

    from .trace import _first_per_key, describe

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    envs = {base_col: release_env(release, base_src, say), PATCHED: release_env(judged, patched_src, say)}
    out, doc, harness = [], [], False
    for path, f in files:
        got = {}
        for col, env in envs.items():
            try:
                got[col] = rerun(env, f)[0]
            except TraceError as e:
                print(f"kvbound review: --replay {path} did not run on {col}: {e}", file=sys.stderr)
                return EXIT_INPUT
            harness = harness or any(g.finding_class == "harness" for g in got[col])
        b, p = {g.key() for g in got[base_col]}, {g.key() for g in got[PATCHED]}
        review = {"gone": sorted(b - p), "new": sorted(p - b), "kept": sorted(b & p)}
        doc.append({"file": path, "kind": f.kind, "key": f.key(), **review})
        out.append(f"\n== review of {path} ({len(f.segment['requests'])} requests, layout {f.layout}):"
                   f" {base_col} against {PATCHED} ==")
        for what in ("gone", "new", "kept"):
            out.append(f"{what}: {len(review[what])}" + "".join(f"\n  {k}" for k in review[what]))
        for g in _first_per_key(got[PATCHED]):
            out.append(describe(g, f"(on {PATCHED}, the requests of {path})"))
    print("\n".join(out))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"format": REVIEW_FORMAT, "release": release, "base": base_col, "patched_judged_as": judged,
             "patch": {"file": args.patch, "sha256": hashlib.sha256(patch.read_bytes()).hexdigest(),
                       "changed": changed, "left_out": skipped},
             "replay": doc}, indent=1, sort_keys=True) + "\n")
    if harness:
        return EXIT_INPUT
    return EXIT_FAIL if any(r["new"] for r in doc) else EXIT_OK
