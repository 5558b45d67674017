"""A campaign: ``kvbound trace`` over releases × layouts, as one reproducible document.

The unit of work is a *shard*: one release (or a checkout, ``--vllm-src``), some of its
layouts, a request count and a seed. A shard imports vLLM once (one worker process),
runs its layouts segment by segment (``runner.run_trace``), shrinks each distinct
finding it saw and returns plain JSON. Shards run in a local process pool, or on a Ray
cluster (``ray_shards``); both run the same ``run_shard`` on the same shard JSON, so the
merged document (``merge``) is the same, byte for byte, wherever it ran.

Reproducible: the shard plan is computed from the command line alone. ``--budget`` is
turned into requests per layout by a fixed planning rate (``PLANNING_REQUESTS_PER_S``),
not by a clock, so two runs of one command trace the same requests; the worker runs
with a fixed ``PYTHONHASHSEED`` (``kvbound.options.WORKERS.hash_seed``). Wall-clock
figures never enter the document; they go to ``timings`` beside it.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbound.errors import LayoutUnsupported, TraceError, UsageError

# Requests per second of wall time one worker is planned at (every check on, shrinking
# included). Measured here at 400-1,800 requests per CPU-second stepping (docs/benchmarks.md);
# the planning rate leaves room for importing vLLM, shrinking and a loaded machine.
PLANNING_REQUESTS_PER_S = 60
MIN_REQUESTS_PER_LAYOUT = 200  # below this a layout's traffic barely evicts: not worth a cell


@dataclass(frozen=True)
class Shard:
    release: str  # the release whose spec and features apply (with src: the fork's base)
    layouts: tuple
    requests: int  # per layout
    seed: int = 0
    segment: int = 400
    scheduler: str = "both"
    overrides: tuple = ()  # ((key, value), ...) engine overrides
    shrink_budget: int = 60
    src: str | None = None  # a checkout's root (--vllm-src), else the prepared release
    column: str = ""  # the matrix column: the release, or "src:<dir name>"

    def to_json(self) -> dict:
        d = asdict(self)
        d["layouts"], d["overrides"] = list(self.layouts), [list(kv) for kv in self.overrides]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Shard":
        return cls(**dict(d, layouts=tuple(d["layouts"]), overrides=tuple(tuple(kv) for kv in d["overrides"])))


def requests_for_budget(budget_s: float, n_cells: int, workers: int = 1) -> int:
    """Requests per layout so that ``n_cells`` release × layout cells fit ``budget_s``."""
    if budget_s <= 0:
        raise UsageError(f"--budget {budget_s}: must be a positive number of seconds")
    per_cell = budget_s * PLANNING_REQUESTS_PER_S * max(1, workers) / max(1, n_cells)
    return max(MIN_REQUESTS_PER_LAYOUT, int(per_cell) // 100 * 100)


def env_of(shard: Shard, progress=None):
    from kvbound.conform.prepare import ReleaseEnv, deps_venv, prepare_release

    if shard.src:
        return ReleaseEnv(shard.release, str(deps_venv(progress) / "bin" / "python"), shard.src)
    return prepare_release(shard.release, progress)


def run_shard(shard_json: dict, progress=None, out_dir: str | None = None) -> dict:
    """One shard, start to end: the JSON ``merge`` takes. Never raises for a layout the
    release refuses or a harness fault: those are outcomes of the cell."""
    from . import runner as R
    from . import shrink as S
    from . import tracefile as TF

    shard = Shard.from_json(shard_json)
    t0 = time.monotonic()
    cells, timings = [], {}
    env = env_of(shard)
    try:
        w = R.start_worker(env)
    except TraceError as e:
        line = str(e).splitlines()[0]
        return {"shard": shard.to_json(), "cells": [
            {"layout": name, "outcome": "not_run", "why": line, "findings": []} for name in shard.layouts],
            "timings": {"seconds": round(time.monotonic() - t0, 2)}}
    try:
        for name in shard.layouts:
            c0 = time.monotonic()
            try:
                summaries, findings = R.run_trace(env, [name], shard.requests, shard.seed, shard.segment,
                                                  shard.scheduler, progress, False, dict(shard.overrides),
                                                  worker=w)
            except LayoutUnsupported as e:  # the release lacks what the layout needs: one line
                cells.append({"layout": name, "outcome": "unsupported", "why": str(e).splitlines()[0],
                              "findings": []})
                continue
            except TraceError as e:  # the worker died or hung on this layout
                if not w.alive:
                    w = R.start_worker(env)
                cells.append({"layout": name, "outcome": "worker_failed", "why": str(e).splitlines()[0],
                              "findings": []})
                continue
            s = summaries[0]
            distinct = {}
            for f in findings:
                distinct.setdefault(f.key(), f)
            shown = []
            for key in sorted(distinct):
                f = distinct[key]
                n0 = len(f.segment["requests"])
                if shard.shrink_budget:
                    reqs, _ = S.shrink(w, f, shard.shrink_budget)
                    again = [g for g in R.rerun(w, env.version, f, reqs) if g.key() == key]
                    if again:
                        f = again[0]
                entry = dict(f.to_json(), key=key, shrunk_from=n0,
                             count=sum(1 for g in findings if g.key() == key))
                if out_dir:
                    entry["file"] = str(TF.save(f, Path(out_dir), n0).name)
                shown.append(entry)
            cells.append({"layout": name, "outcome": "ran", "stats": dict(s.stats), "captured_calls": s.cases,
                          "spec_agree": s.agree, "not_judged": s.undriven, "findings": shown})
            timings[name] = {"seconds": round(time.monotonic() - c0, 2), "cpu_seconds": round(s.cpu_seconds, 2)}
    finally:
        w.stop()
    timings["seconds"] = round(time.monotonic() - t0, 2)
    return {"shard": shard.to_json(), "cells": cells, "timings": timings}


# ------------------------------------------------------------------------------ executors


def local_shards(shards: list, workers: int, progress=None, out_dir: str | None = None) -> list:
    """Every shard in a pool of ``workers`` processes; results in shard order."""
    if workers <= 1 or len(shards) <= 1:
        out = []
        for i, sh in enumerate(shards):
            out.append(run_shard(sh.to_json(), None, out_dir))
            if progress:
                progress(i + 1, len(shards), out[-1])
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    res = [None] * len(shards)
    with ProcessPoolExecutor(max_workers=workers) as ex:
        futs = {ex.submit(run_shard, sh.to_json(), None, out_dir): i for i, sh in enumerate(shards)}
        for done, fut in enumerate(as_completed(futs), 1):
            res[futs[fut]] = fut.result()
            if progress:
                progress(done, len(shards), res[futs[fut]])
    return res


def ray_shards(shards: list, address: str, progress=None, out_dir: str | None = None,
               num_cpus: int | None = None) -> list:
    """Every shard as a Ray task (one CPU each) on the cluster at ``address`` ("auto": the
    running cluster; "local": a fresh local instance of ``num_cpus``); results in shard
    order. The task is ``run_shard`` itself, so a shard's JSON is the same as a local run's."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'kvbound[ray]'") from None
    started, empty = False, None
    if not ray.is_initialized():
        # Ray puts the driver's current directory first on every worker's sys.path unless the job
        # has a working_dir; run from a checkout, the workers would import that tree's kvbound (whose
        # layers are not mapped: ModuleNotFoundError kvbound.spec) instead of the installed one. An
        # empty working_dir makes every worker, on any node, import the installed kvbound.
        kw = {"include_dashboard": False, "log_to_driver": False,
              "runtime_env": {"working_dir": (empty := tempfile.mkdtemp(prefix="kvbound-ray-"))}}
        if address == "local":
            ray.init(num_cpus=num_cpus or 2, **kw)
        else:
            ray.init(address=address, **kw)
        started = True
    try:
        task = ray.remote(num_cpus=1)(run_shard)
        refs = [task.remote(sh.to_json(), None, out_dir) for sh in shards]
        index = {r: i for i, r in enumerate(refs)}
        res = [None] * len(shards)
        pending, done = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                res[index[r]] = ray.get(r)
                done += 1
                if progress:
                    progress(done, len(shards), res[index[r]])
        return res
    finally:
        if started:
            ray.shutdown()
        if empty:
            os.rmdir(empty)


# ------------------------------------------------------------------------------ the document


@dataclass
class DistinctFinding:
    key: str
    kind: str
    finding_class: str
    safety: bool
    cells: list = field(default_factory=list)  # [column, layout, count, requests after shrinking, file]
    example: dict | None = None


def merge(columns: list, results: list) -> dict:
    """The campaign document: the matrix (column × layout: outcome, counters, findings),
    each distinct finding once with the columns that have it (first, last, where it
    stops), and the count of findings by class per column. Deterministic: sorted keys,
    no wall-clock figure."""
    from .runner import FINDING_CLASSES

    matrix: dict = {}
    distinct: dict = {}
    order = {c: i for i, c in enumerate(columns)}
    results = sorted(results, key=lambda r: order.get(r["shard"]["column"], len(order)))
    for res in results:
        col = res["shard"]["column"]
        for cell in sorted(res["cells"], key=lambda c: c["layout"]):
            row = {k: v for k, v in cell.items() if k != "findings"}
            row["findings"] = sorted(f["key"] for f in cell["findings"])
            matrix.setdefault(col, {})[cell["layout"]] = row
            for f in cell["findings"]:
                d = distinct.get(f["key"])
                if d is None:
                    d = distinct[f["key"]] = DistinctFinding(f["key"], f["kind"], f["class"], f["safety"])
                    d.example = f
                d.cells.append([col, cell["layout"], f["count"], len(f["segment"]["requests"]), f.get("file")])
    out_findings = []
    for key in sorted(distinct):
        d = distinct[key]
        d.cells.sort(key=lambda c: (order.get(c[0], len(order)), c[1]))
        have = sorted({c[0] for c in d.cells}, key=lambda c: order.get(c, len(order)))
        last = order.get(have[-1], -1)
        layouts = {c[1] for c in d.cells}
        # where it stops: the first later column whose run of the same layouts was clean
        stops = next((c for c in columns[last + 1:]
                      if any((matrix.get(c, {}).get(l) or {}).get("outcome") == "ran" for l in layouts)
                      and c not in have), None)
        out_findings.append({"key": key, "kind": d.kind, "class": d.finding_class, "safety": d.safety,
                             "columns": have, "first": have[0], "last": have[-1], "stops_at": stops,
                             "cells": d.cells, "example": d.example})
    by_class = {col: {c: 0 for c in FINDING_CLASSES} for col in columns}
    for f in out_findings:
        for c in f["cells"]:
            by_class.setdefault(c[0], {k: 0 for k in FINDING_CLASSES})[f["class"]] += 1
    return {"format": "kvbound-campaign/1", "columns": list(columns), "matrix": matrix,
            "findings": out_findings, "by_class": by_class}


def expand_releases(specs: list) -> list:
    """``--vllm`` values: a release (0.29.0), a range (0.21.0..0.33.0: every release of
    ``kvbound.spec.versions.CAMPAIGN_RELEASES`` between them, inclusive), or a comma list."""
    from kvbound.spec.versions import expand_releases as expand

    return expand(specs)
