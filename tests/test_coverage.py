"""Coverage of the release's connector code (kvbound/side/cover.py measures in the worker,
kvbound/trace/coverage.py unions on the host) and each finding's time to detect: the line
ranges, the union, the campaign document's schema, and real 0.33.0 jobs and campaigns."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from kvbound.cli import main
from kvbound.records import CampaignRecord, reproducible
from kvbound.side import cover, unreached
from kvbound.trace import campaign as C
from kvbound.trace.coverage import (DECLARED, GPU_ONLY, NEEDS_EXTERNAL, NOT_YET, UNREACHED_CLASSES, Coverage,
                                    percent_reachable, ranges, render)

SCHED = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"


def test_missing_lines_are_runs_of_statements():
    st = [1, 2, 3, 5, 8, 9, 12]
    assert ranges({2, 3, 5, 9}, st) == [[2, 5], [9, 9]]  # 4 is no statement: [2, 5] holds 2, 3 and 5
    assert ranges(set(), st) == [] and ranges(set(st), st) == [[1, 12]]


def _job(executed, statements=range(1, 11), gpu=(9, 10), external=()):
    declared = {k: list(v) for k, v in ((GPU_ONLY, gpu), (NEEDS_EXTERNAL, external)) if v}
    return {"f.py": {"statements": list(statements), "executed": list(executed), "declared": declared}}


def test_the_union_counts_new_lines_and_classifies_what_stays_unreached():
    u = Coverage()
    assert u.add(_job([1, 2, 3])) == 3
    assert u.add(_job([2, 3, 4])) == 1  # only line 4 is new
    assert u.add(None) == 0
    (doc,) = u.document().values()
    assert (doc["statements"], doc["executed"]) == (10, 4)
    assert doc["missing"] == [[5, 10]]
    assert doc["unreached"] == {GPU_ONLY: [[9, 10]], NEEDS_EXTERNAL: [], "not-on-release": [], NOT_YET: [[5, 8]]}
    assert doc["unreachable_here"] == 2 and percent_reachable(doc) == 50.0  # 4 of the 8 reachable
    back = Coverage()
    back.add(u.to_json())
    assert back.document() == u.document()


def test_declared_code_that_ran_is_counted_run_not_unreachable():
    """A declared file's lines that do run (its definitions, at import) are executed, and only
    what stays unrun is unreachable here; each declared reason keeps its own lines."""
    u = Coverage()
    u.add(_job([1, 2, 7], gpu=(1, 2, 3), external=(7, 8)))
    (doc,) = u.document().values()
    assert doc["unreached"][GPU_ONLY] == [[3, 3]] and doc["unreached"][NEEDS_EXTERNAL] == [[8, 8]]
    assert doc["unreached"][NOT_YET] == [[4, 6], [9, 10]]
    assert doc["unreachable_here"] == 2 and doc["executed"] == 3
    (header, line) = render({"0.33.0": {"f.py": doc}})[1:]
    assert "3 of 10 statements (30%); of the 8 reachable on this host, 38%" in header
    assert "3 / 8 reachable here  37.5%" in line


def _shard(col, layout, cov=None, detect=None):
    f = {"kind": "crash:x", "class": "crash", "safety": True, "key": "crash:x", "count": 1, "release": col,
         "segment": {"requests": [{}]}, "file": None}
    if detect:
        f["detect"] = detect
    out = {"shard": {"column": col}, "timings": {},
           "cells": [{"layout": layout, "outcome": "ran", "stats": {}, "findings": [f]}]}
    if cov is not None:
        out["coverage"] = cov
    return out


def test_the_campaign_unions_a_releases_shards_and_names_the_fastest_detection():
    d = lambda n, p: {"point": p, "requests": n, "cpu_s": n / 100}  # noqa: E731
    results = [_shard("0.33.0", "full", _job([1, 2]), d(40, "layout full, seed 0, segment 0")),
               _shard("0.33.0", "swa", _job([3]), d(7, "layout swa, seed 0, segment 1"))]
    doc = C.merge(["0.33.0"], results)
    assert doc.coverage["0.33.0"]["f.py"]["executed"] == 3
    (f,) = doc.findings
    assert f.detect == {"point": "0.33.0, layout swa, seed 0, segment 1", "requests": 7, "cpu_s": 0.07}
    assert "detect" not in f.example  # one place: the finding's
    js = doc.to_json()
    assert CampaignRecord.from_json(json.loads(json.dumps(js))).to_json() == js
    assert "cpu_s" not in reproducible(js)["findings"][0]["detect"]
    assert "coverage" not in C.merge(["0.33.0"], [_shard("0.33.0", "full")]).to_json()  # not measured


def test_every_gpu_only_row_names_a_function_of_0_33(prepared):
    """The table is by (file, function or branch); each row resolves in the release it cites."""
    env = prepared("0.33.0")
    for row in unreached.UNREACHED:
        path = Path(env.tree) / row.file
        assert path.exists(), row.file
        assert row.function in ("*", unreached.ABSTRACT) or row.function in cover.spans(path.read_text()), row
        assert "0.33.0" in row.reason and row.why in UNREACHED_CLASSES


def _touch_calls(tree: Path) -> dict:
    """Every ``X.touch(...)`` call of a release's vllm package outside its tests: (relpath, the
    function it sits in) -> the receivers' source text."""
    calls: dict = {}
    for path in sorted((tree / "vllm").rglob("*.py")):
        rel = path.relative_to(tree).as_posix()
        if "/tests/" in rel:
            continue
        src = path.read_text()
        named = cover.spans(src)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "touch":
                inside = max((q for q, (a, b) in named.items() if a <= node.lineno <= b and "." in q and "@" not in q),
                             key=lambda q: named[q][0], default="")
                calls.setdefault((rel, inside), []).append(ast.unparse(node.func.value))
    return calls


@pytest.mark.parametrize("version,applies", [("0.29.0", False), ("0.33.0", True)])
def test_the_touch_rows_hold_where_they_apply(version, applies, prepared):
    """The not-on-release rows: from 0.31.0 no code of the release calls an offloading manager's
    touch (only the managers' own touch forwards it, and the policy base's on_store_miss /
    on_request_finished, which ARC overrides); on 0.29.0 the connector scheduler's _touch does,
    and the rows do not apply there."""
    env = prepared(version)
    tree = Path(env.tree)
    version_tuple = tuple(int(x) for x in version.split("."))
    rows = [r for r in unreached.UNREACHED if r.why == unreached.NOT_ON_RELEASE and r.function.endswith(".touch")]
    assert rows and all(unreached.applies(r, version_tuple) == applies for r in rows)
    assert not unreached.applies(rows[0], None)  # an unversioned checkout: never
    calls = _touch_calls(tree)
    ours = {k: v for k, v in calls.items() if k[0].startswith(cover.CONNECTOR_CODE)}
    callers = {fn for (_, fn) in ours}
    if applies:
        declared = {r.function for r in rows}
        assert callers <= declared | {"CachePolicy.on_store_miss", "CachePolicy.on_request_finished"}, callers
        arc = cover.spans((tree / "vllm/v1/kv_offload/cpu/policies/arc.py").read_text())
        assert {"ARCCachePolicy.on_store_miss", "ARCCachePolicy.on_request_finished"} <= set(arc)
        # outside the connector code, every .touch( is another object's: block pools, caches, paths
        others = {r.rsplit(".", 1)[-1].lower() for k, v in calls.items() if k not in ours for r in v}
        assert not any(w in o for o in others for w in ("manager", "tier", "policy", "offload")), others
    else:
        assert any(fn.endswith("._touch") for fn in callers), callers


def test_nothing_in_the_release_reads_the_connectors_scheduler_property(prepared):
    """The not-on-release row of OffloadingConnector.scheduler (0.30.0+): outside vLLM's tests, no
    ``X.scheduler`` read has a connector for X (every one is ``self``'s, a config's or the engine
    core's), and no getattr names it; on 0.29.0 the property is absent and the row is skipped."""
    (row,) = [r for r in unreached.UNREACHED if r.function == "OffloadingConnector.scheduler"]
    assert row.why == unreached.NOT_ON_RELEASE and unreached.applies(row, (0, 33, 0))
    assert not unreached.applies(row, (0, 29, 0))
    tree = Path(prepared("0.33.0").tree)
    assert "OffloadingConnector.scheduler" in cover.spans((tree / row.file).read_text())
    readers = []
    for path in sorted((tree / "vllm").rglob("*.py")):
        if "/tests/" in path.as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "scheduler":
                readers.append(ast.unparse(node.value))
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value == "scheduler":
                readers.append("getattr " + ast.unparse(node.args[0]))
    assert readers and not [r for r in readers if "conn" in r.lower() or r.startswith("getattr")], readers


def test_a_row_may_name_a_branch_of_a_function_or_of_the_module():
    """``cover.spans`` names an ``if``'s body and its ``else`` by the test's source, and a ``try``
    by the module it first imports, inside a function or at module level."""
    src = ("try:\n    from ext_C import f\n    HAS = True\nexcept ImportError:\n    HAS = False\n\n"
           "class T:\n    def io(self, x):\n        if HAS:\n            return f(x)\n        else:\n"
           "            y = x\n            return y\n")
    named = cover.spans(src)
    assert named["@try import ext_C"] == (3, 3)  # past the import, which runs (and raises)
    assert (named["T.io@if HAS"], named["T.io@else HAS"], named["T.io"]) == ((10, 10), (12, 13), (8, 13))


def test_abstract_bodies_are_declared_unless_something_calls_up_to_them(prepared):
    """The ``@abstract`` row: the body of an abstract method no code of the connector calls up
    to (``super().name(...)``, ``Base.name(...)``) has no caller on the release; on 0.33.0 these are
    SecondaryTierManager's six bodies with statements, which the file and example tiers override.
    A call up to one takes it out; a body of ``...`` alone is none (coverage.py counts none)."""
    tree = Path(prepared("0.33.0").tree)
    sources = [(tree / rel).read_text() for rel in cover.connector_files(str(tree))]
    base = (tree / "vllm/v1/kv_offload/tiering/base.py").read_text()
    named = cover.spans(base)
    up = unreached.called_up(sources)
    bodies = unreached.abstract_bodies(base, up)
    owners = {q for q, (a, b) in named.items() if q.count(".") == 1 and "@" not in q
              for first, last in bodies if a <= first and last <= b}
    assert len(bodies) == 6 and {q.split(".")[0] for q in owners} == {"SecondaryTierManager"}, owners
    method = sorted(owners)[0].split(".")[1]
    assert len(unreached.abstract_bodies(base, up | {method})) == 5
    assert len(unreached.abstract_bodies(base, up | {("SecondaryTierManager", method)})) == 5
    assert method in unreached.called_up([f"class A(B):\n    def g(self):\n        return super().{method}(1)\n"])
    assert unreached.abstract_bodies("import abc\nclass A(abc.ABC):\n    @abc.abstractmethod\n"
                                     "    def f(self):\n        \"\"\"Doc.\"\"\"\n        ...\n", set()) == []


@pytest.mark.parametrize("name,since", [("_transfer_jobs", "0.28.0"), ("get_num_chunks", "0.30.0")])
def test_the_no_reader_rows_hold(name, since, prepared):
    """The not-on-release rows of the tiering manager's ``_transfer_jobs`` property and the example
    tier's ``get_num_chunks``: outside vLLM's tests nothing in the release reads either name (its
    definition is no read); before ``since`` the rows do not apply (0.27.0 still reads its
    ``_transfer_jobs`` dict)."""
    (row,) = [r for r in unreached.UNREACHED if r.function.endswith("." + name)]
    assert row.why == unreached.NOT_ON_RELEASE and row.since == tuple(int(x) for x in since.split("."))
    reads = {}
    for version in ("0.27.0", "0.33.0"):
        tree = Path(prepared(version).tree)
        reads[version] = [p.relative_to(tree).as_posix() for p in sorted((tree / "vllm").rglob("*.py"))
                          if "/tests/" not in p.as_posix()
                          for node in ast.walk(ast.parse(p.read_text()))
                          if isinstance(node, ast.Attribute) and node.attr == name]
    assert reads["0.33.0"] == [] and unreached.applies(row, (0, 33, 0))
    assert not unreached.applies(row, (0, 27, 0)) and (name != "_transfer_jobs" or reads["0.27.0"])


def _calls(tree: Path, attr: str):
    """(the enclosing ifs' tests, the call, the enclosing functions) of every ``X.attr(...)`` of
    the connector code of ``tree``."""
    out = []

    def visit(node, ifs, fns):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.Call) and isinstance(ch.func, ast.Attribute) and ch.func.attr == attr:
                out.append((ifs, ch, fns))
            visit(ch, ifs + [ch.test] if isinstance(ch, ast.If) else ifs,
                  fns + [ch] if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)) else fns)

    for rel in cover.connector_files(str(tree)):
        visit(ast.parse((tree / rel).read_text()), [], [])
    return out


@pytest.mark.parametrize("version", ["0.21.0", "0.33.0"])
def test_no_caller_asks_a_policy_to_evict_nothing(version, prepared):
    """The ``evict@if n == 0`` rows: every call of a policy's evict in the connector code sits
    under an ``if C > 0`` on the count it passes."""
    tree = Path(prepared(version).tree)
    calls = _calls(tree, "evict")
    assert calls
    for ifs, call, _ in calls:
        count = ast.unparse(call.args[0])
        assert f"{count} > 0" in [ast.unparse(t) for t in ifs], ast.unparse(call)
    assert all(unreached.applies(r, tuple(map(int, version.split(".")))) for r in unreached.UNREACHED
               if r.function.endswith("evict@if n == 0"))


def test_nothing_fails_a_store_before_the_tiering_spec(prepared):
    """The 0.21.x rows of the CPU tier's failed store: every complete_store call of 0.21.0's
    connector code passes no success, or forwards the success of a complete_store it sits in; the
    rows stop at 0.22, whose tiering spec fails a promotion into the CPU tier."""
    tree = Path(prepared("0.21.0").tree)
    calls = _calls(tree, "complete_store")
    assert len(calls) >= 2
    for _, call, fns in calls:
        passed = call.args[2:] + [k.value for k in call.keywords if k.arg == "success"]
        assert not passed or (ast.unparse(passed[0]) == "success" and fns[-1].name == "complete_store"), ast.unparse(call)
    rows = [r for r in unreached.UNREACHED if r.until == (0, 22, 0)]
    assert len(rows) == 3 and all(unreached.applies(r, (0, 21, 0)) and not unreached.applies(r, (0, 22, 1))
                                  and not unreached.applies(r, None) for r in rows)
    promoted = (Path(prepared("0.22.1").tree) / "vllm/v1/kv_offload/tiering/manager.py").read_text()
    assert "self.complete_write = self.complete_store" in promoted and "completed_job.success" in promoted


def test_the_pure_python_tree_has_no_compiled_file_io():
    """The file tier's fs_io_C rows: no release tree kvbound runs holds the compiled module."""
    from kvbound.conform.prepare import cache_dir

    trees = sorted(cache_dir().glob("vllm-0.*/vllm"))
    assert trees and not [p for t in trees for p in t.glob("fs_io_C*")]


def _first_line_of(path: Path, qualname: str) -> int:
    """The first statement of a method's body, past its docstring."""
    cls, fn = qualname.split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and m.name == fn:
                    doc = isinstance(m.body[0], ast.Expr) and isinstance(m.body[0].value, ast.Constant)
                    return m.body[1 if doc else 0].lineno
    raise AssertionError(qualname)


def test_a_real_job_reports_the_connector_lines_it_ran(prepared):
    from kvbound.trace.runner import make_job, start_worker

    env = prepared("0.33.0")
    w = start_worker(env, coverage=True)
    try:
        assert w.hello["coverage"] is True
        job = make_job("full", (0, "full", 0), 120, 0, "sync")
        plain = w.job(job)
        a, b = w.job(dict(job, coverage=True)), w.job(dict(job, coverage=True))
    finally:
        w.stop()
    assert "coverage" not in plain and plain["step_cpu"]
    assert a["coverage"] == b["coverage"]  # the same job, the same lines
    sched = a["coverage"][SCHED]
    line = _first_line_of(Path(env.tree) / SCHED, "OffloadingConnectorScheduler.update_state_after_alloc")
    assert line in sched["executed"] and set(sched["executed"]) <= set(sched["statements"])
    assert len(sched["statements"]) > 1000
    # what needs CUDA is declared, and what of it did not run is classified so
    gpu_worker = a["coverage"]["vllm/v1/kv_offload/cpu/gpu_worker.py"]
    assert gpu_worker["declared"] == {GPU_ONLY: gpu_worker["statements"]}
    # the tiers beside the file-system one need what the host lacks: every file under them declared
    p2p = [f for rel, f in a["coverage"].items() if rel.startswith("vllm/v1/kv_offload/tiering/p2p/")]
    assert len(p2p) > 5 and all(f["declared"] == {NEEDS_EXTERNAL: f["statements"]} for f in p2p if f["statements"])
    assert "declared" in a["coverage"][SCHED] and not a["coverage"][SCHED]["declared"]
    # the file tier's calls into the compiled fs_io_C, and the abstract bodies nothing calls up to
    io = a["coverage"]["vllm/v1/kv_offload/tiering/fs/io.py"]
    guarded = cover.spans((Path(env.tree) / "vllm/v1/kv_offload/tiering/fs/io.py").read_text())
    first, last = guarded["batch_store_block@if _HAS_FSIO_C"]
    assert {ln for ln in io["statements"] if first <= ln <= last} <= set(io["declared"][NEEDS_EXTERNAL])
    tier_base = a["coverage"]["vllm/v1/kv_offload/tiering/base.py"]
    up = unreached.called_up((Path(env.tree) / rel).read_text() for rel in cover.connector_files(env.tree))
    bodies = unreached.abstract_bodies((Path(env.tree) / "vllm/v1/kv_offload/tiering/base.py").read_text(), up)
    abstract = {ln for ln in tier_base["statements"] for first, last in bodies if first <= ln <= last}
    assert len(abstract) == 6 and abstract <= set(tier_base["declared"][unreached.NOT_ON_RELEASE])
    u = Coverage()
    u.add(a["coverage"])
    spec = u.document()["vllm/v1/kv_offload/cpu/spec.py"]
    assert spec["unreached"][GPU_ONLY] and spec["executed"] > 0


def _valid_ranges(rs) -> set:
    assert all(isinstance(r, list) and len(r) == 2 and r[0] <= r[1] for r in rs), rs
    assert all(a[1] < b[0] for a, b in zip(rs, rs[1:])), rs  # sorted, disjoint
    return {ln for a, b in rs for ln in range(a, b + 1)}


def check_coverage_schema(coverage: dict) -> None:
    """The campaign document's coverage, as BRIEF25 and docs/trace.md "Coverage" write it."""
    for col, files in coverage.items():
        assert files, col
        for rel, f in files.items():
            assert rel.startswith("vllm/") and rel.endswith(".py"), rel
            assert set(f) == {"statements", "executed", "missing", "unreached", "unreachable_here"}
            assert isinstance(f["statements"], int) and 0 <= f["executed"] <= f["statements"]
            missing = _valid_ranges(f["missing"])
            assert (f["executed"] == f["statements"]) == (not f["missing"])
            assert set(f["unreached"]) == set(UNREACHED_CLASSES)
            parts = [_valid_ranges(f["unreached"][k]) for k in UNREACHED_CLASSES]
            assert all(p <= missing for p in parts)
            assert not any(parts[i] & parts[j] for i in range(len(parts)) for j in range(i + 1, len(parts)))
            assert 0 <= f["unreachable_here"] <= f["statements"] - f["executed"]
            assert (f["unreachable_here"] > 0) <= any(f["unreached"][k] for k in DECLARED)
            ends = {x for k in UNREACHED_CLASSES for r in f["unreached"][k] for x in r}
            assert all(a in ends and b in ends for a, b in f["missing"])


def test_a_campaign_with_coverage_repeats_itself_and_times_each_finding(tmp_path, prepared):
    prepared("0.33.0")
    docs = []
    for tag in ("a", "b"):
        out = tmp_path / f"{tag}.json"
        rc = main(["campaign", "--vllm", "0.33.0", "--layout", "full", "--layout", "mamba-block-sync",
                   "--requests", "120", "--seed", "2", "--shrink-budget", "4", "--quiet", "--workers", "1",
                   "--coverage", "--out", str(tmp_path / f"f-{tag}"), "--json", str(out)])
        assert rc == 1
        docs.append(json.loads(out.read_text()))
    assert json.dumps(reproducible(docs[0]), sort_keys=True) == json.dumps(reproducible(docs[1]), sort_keys=True)
    doc = docs[0]
    check_coverage_schema(doc["coverage"])
    sched = doc["coverage"]["0.33.0"][SCHED]
    assert 0 < sched["executed"] < sched["statements"]
    assert doc["findings"] and all(set(f["detect"]) == {"point", "requests", "cpu_s"} for f in doc["findings"])
    assert all(f["detect"]["point"].startswith("0.33.0, layout mamba-block-sync, seed 2, segment ")
               and 0 < f["detect"]["requests"] <= 120 for f in doc["findings"])
    # coverage is asked of the worker, never saved with a finding: its file replays on a plain worker
    saved = sorted((tmp_path / "f-a").glob("*.json"))
    assert saved and not any("coverage" in json.loads(p.read_text())["segment"] for p in saved)
    assert main(["trace", "--replay", str(saved[0]), "--vllm", "0.33.0"]) == 1


PROBE_LAYOUTS = ("full", "swa", "mamba", "mamba-eagle", "full-multi-pd", "full-tiering-fs", "full-faults")
CRASHES_ON_0_33 = "mamba528@offload_limit_p=0.3"  # docs/findings.md: an assert in _build_partial_tail_store_jobs
THREADED = "full-tiering-fs"  # the file-system tier's I/O threads run its transfers


def _line_diffs(whole: dict, probed: dict) -> dict:
    """Per file, the executed lines one of two coverage reports has and the other lacks."""
    out = {}
    for rel in sorted(set(whole) | set(probed)):
        a = set(whole.get(rel, {}).get("executed", ()))
        b = set(probed.get(rel, {}).get("executed", ()))
        if a != b:
            out[rel] = {"whole only": sorted(a - b), "probed only": sorted(b - a)}
    return out


def _line_tables(code) -> dict:
    """(qualified name, first line) -> the lines of each code object in ``code``, line 0 left out."""
    out, todo = {}, [code]
    while todo:
        c = todo.pop()
        out.setdefault((c.co_qualname, c.co_firstlineno), []).append(sorted({ln for _, _, ln in c.co_lines() if ln}))
        todo += [k for k in c.co_consts if isinstance(k, type(code))]
    return out


@pytest.mark.parametrize("release", ["0.33.0", "0.29.0"])
def test_probes_leave_every_code_objects_lines_as_they_were(prepared, release):
    """A probed module's code objects have the lines of its plain compile (its probes are line
    0's, cover._at0): a job traced whole over probed modules (the reference the probed jobs are
    held to) sees the lines the unprobed modules run, no line of the probes'. (The host's
    interpreter is the side venv's, 3.11: the same compiler.)"""
    root = Path(prepared(release).tree)
    files = cover.connector_files(str(root))
    assert len(files) > 20, files
    for rel in files:
        src = (root / rel).read_bytes()
        plain = compile(src, rel, "exec", dont_inherit=True)
        probed = compile(cover.probed(ast.parse(src, rel))[0], rel, "exec", dont_inherit=True)
        assert _line_tables(probed) == _line_tables(plain), rel


@pytest.mark.parametrize("release", ["0.33.0", "0.29.0"])
def test_a_probed_job_runs_the_lines_the_whole_job_runs(prepared, release):
    """``--coverage`` records the connector's lines by probes compiled into its modules
    (cover.probed, no trace function): each job of the layouts reports, file by file, the lines
    the same job traced whole by coverage.py reports, and the same results (coverage changes no
    finding: a crash's traceback too). Probes that miss what threads run (a planted defect,
    cover.PLANTS) are told apart: the file-system tier's I/O threads' lines go missing."""
    from kvbound.trace.runner import make_job, start_worker
    from kvbound.trace.space import support

    env = prepared(release)
    layouts = [n for n in PROBE_LAYOUTS + (CRASHES_ON_0_33,) if support(n, env.version) is None]
    assert len(layouts) >= 6, layouts
    threads = THREADED if THREADED in layouts else "full"  # 0.29.0 runs no file-system tier
    crashed = []
    w = start_worker(env, coverage=True)
    try:
        for i, name in enumerate(layouts):
            job = make_job(name, (0, name, 0), 60, 0, "async" if i % 2 else "sync")
            whole, probed = w.job(dict(job, coverage="job")), w.job(dict(job, coverage=True))
            assert not whole.get("setup_error") and not whole.get("harness_fault"), whole
            assert _line_diffs(whole["coverage"], probed["coverage"]) == {}, name
            assert whole["coverage"][SCHED]["executed"], name
            for k in ("ok", "error", "traceback", "assert_site", "step", "stats", "violations", "cases",
                      "lookups", "store_calls"):
                assert whole.get(k) == probed.get(k), (name, k)
            if not whole["ok"]:
                crashed.append(name)
        # (again: the lines later jobs' imports ran count for every job after, cover.Probe.imported)
        job = make_job(threads, (0, threads, 0), 60, 0, "sync")
        whole = w.job(dict(job, coverage="job"))
        planted = w.job(dict(job, coverage=True, coverage_plant="threads_unseen"))
        bad = w.job(dict(job, coverage=True, coverage_plant="nope"))
        again = w.job(dict(job, coverage=True))  # the refused job and the plant left the probes as before
    finally:
        w.stop()
    assert release != "0.33.0" or CRASHES_ON_0_33 in crashed, crashed
    missed = _line_diffs(whole["coverage"], planted["coverage"])
    if threads == THREADED:
        assert missed and all(not d["probed only"] for d in missed.values()), missed
        assert any("/tiering/fs/" in rel for rel in missed), missed
    assert "unknown coverage plant 'nope'" in bad["setup_error"] and bad["harness_fault"], bad
    assert _line_diffs(whole["coverage"], again["coverage"]) == {}
