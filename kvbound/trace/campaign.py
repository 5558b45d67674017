"""A campaign: ``kvbound trace`` over releases × layouts, as one reproducible document.

The unit of work is a *shard*: one release (or a checkout, ``--vllm-src``), some of its
layouts and the trace options (``kvbound.options.TraceOptions``). A shard is one trace
session (``session.run_release``: one worker process, its layouts, each distinct finding
shrunk and kept) and returns plain JSON. Shards run in a local process pool, or on a Ray
cluster (``ray_shards``); both run the same ``run_shard`` on the same shard JSON, so the
merged document (``merge``) is the same, byte for byte, wherever it ran, but for each finding's
``detect.cpu_s``, a measurement (``kvbound.records.reproducible`` leaves it out).

Reproducible: the shard plan is computed from the command line alone. ``--budget`` is
turned into requests per layout by a fixed cost table (``kvbound.options.PlanOptions``),
not by a clock, so two runs of one command trace the same requests; the worker runs
with a fixed ``PYTHONHASHSEED`` (``kvbound.options.WORKERS.hash_seed``). Wall-clock
figures never enter the document; they go to ``timings`` beside it. With ``--coverage`` each
shard also returns the union of its jobs' connector coverage (``kvbound/trace/coverage.py``).
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from kvbound.errors import Terminated, UsageError
from kvbound.options import RunOptions, ShrinkOptions, TraceOptions
from kvbound.records import CampaignFinding, CampaignRecord


@dataclass(frozen=True)
class Shard:
    release: str  # the release whose spec and features apply (with src: the fork's base)
    layouts: tuple
    options: TraceOptions
    src: str | None = None  # a checkout's root (--vllm-src), else the prepared release
    column: str = ""  # the matrix column: the release, or "src:<dir name>"
    seeds: tuple = ()  # each layout's traffic seed (a guided round's); empty: the options' seed

    def to_json(self) -> dict:
        return {"release": self.release, "layouts": list(self.layouts), "options": asdict(self.options),
                "src": self.src, "column": self.column, "seeds": list(self.seeds)}

    @classmethod
    def from_json(cls, d: dict) -> "Shard":
        run = dict(d["options"]["run"])
        run["overrides"] = tuple(tuple(kv) for kv in run["overrides"])
        options = TraceOptions(RunOptions(**run), ShrinkOptions(**d["options"]["shrink"]))
        return cls(d["release"], tuple(d["layouts"]), options, d["src"], d["column"], tuple(d.get("seeds", ())))


def run_shard(shard_json: dict, progress=None, out_dir: str | None = None) -> dict:
    """One shard, start to end (``session.run_release``): the JSON ``merge`` takes."""
    from .session import release_env, run_release

    shard = Shard.from_json(shard_json)
    res = run_release(release_env(shard.release, shard.src), shard.layouts, shard.options, progress,
                      Path(out_dir) if out_dir else None, shard.seeds)
    timings = {c.layout: {"seconds": round(c.seconds, 2), "shrink_seconds": round(c.shrink_seconds, 2),
                          "cpu_seconds": round(c.summary.cpu_seconds, 2)}
               for c in res.cells if c.summary is not None}
    timings["seconds"] = round(res.seconds, 2)
    timings["shrink_seconds"] = round(res.shrink_seconds, 2)
    out = {"shard": shard.to_json(), "cells": [c.to_json() for c in res.cells], "timings": timings}
    if res.coverage is not None:
        out["coverage"] = res.coverage.to_json()
        out["point_coverage"] = {name: c.to_json() for name, c in res.point_coverage.items()}
    return out


# ------------------------------------------------------------------------------ executors


@contextmanager
def ended_by_signals():
    """SIGTERM (what ``timeout`` and CI runners send) and SIGINT become ``Terminated`` in the
    main thread, so the executors below end what they started on the way out: the local
    pool's processes are killed, a Ray instance is shut down, and every vLLM worker, tied to
    its parent (``sidecar.die_with_parent``), dies with the process that started it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; the caller's own then apply
        return

    def end(signum, _frame):
        for s in (signal.SIGTERM, signal.SIGINT):  # a second signal does not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        raise Terminated(signum)

    old = {s: signal.signal(s, end) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _pool_process() -> None:
    """Each pool process: the default action on SIGTERM and SIGINT (not the handler it
    inherits from the main process), and death with its parent."""
    from kvbound.side.sidecar import die_with_parent

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)
    die_with_parent()


def local_shards(shards: list, workers: int, progress=None, out_dir: str | list | None = None) -> list:
    """Every shard in a pool of ``workers`` processes; results in shard order. Trace files go
    under ``out_dir``, or (a list) under each shard's own (``kvbound review``: the base and the
    patched tree find the same findings under the same names). Ended early (``Terminated``, an
    error), it kills the pool's processes, and their workers die with them."""
    out_dirs = list(out_dir) if isinstance(out_dir, (list, tuple)) else [out_dir] * len(shards)
    if workers <= 1 or len(shards) <= 1:
        out = []
        for i, sh in enumerate(shards):
            out.append(run_shard(sh.to_json(), None, out_dirs[i]))
            if progress:
                progress(i + 1, len(shards), out[-1])
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    res = [None] * len(shards)
    with ProcessPoolExecutor(max_workers=workers, initializer=_pool_process) as ex:
        try:
            futs = {ex.submit(run_shard, sh.to_json(), None, out_dirs[i]): i for i, sh in enumerate(shards)}
            for done, fut in enumerate(as_completed(futs), 1):
                res[futs[fut]] = fut.result()
                if progress:
                    progress(done, len(shards), res[futs[fut]])
        except BaseException:
            ex.shutdown(wait=False, cancel_futures=True)
            for p in multiprocessing.active_children():  # the pool's processes: nothing else here starts one
                p.kill()
                p.join()
            raise
    return res


@contextmanager
def ray_cluster(address: str, num_cpus: int | None = None):
    """Ray, initialised for what runs inside ("auto": the running cluster; "local": a fresh
    local instance of ``num_cpus``) and shut down after; nothing when Ray is already
    initialised (a guided campaign's rounds share one)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'kvbound[ray]'") from None
    if ray.is_initialized():
        yield ray
        return
    # Ray puts the driver's current directory first on every worker's sys.path unless the job
    # has a working_dir; run from a checkout, the workers would import that tree's kvbound (whose
    # layers are not mapped: ModuleNotFoundError kvbound.spec) instead of the installed one. An
    # empty working_dir makes every worker, on any node, import the installed kvbound.
    empty = tempfile.mkdtemp(prefix="kvbound-ray-")
    try:
        kw = {"include_dashboard": False, "log_to_driver": False, "runtime_env": {"working_dir": empty}}
        ours = signal.getsignal(signal.SIGTERM)
        if address == "local":
            ray.init(num_cpus=num_cpus or 2, **kw)
        else:
            ray.init(address=address, **kw)
        try:
            if ours is not None:  # ray.init sets its own (sys.exit(15)); ended_by_signals' stays
                signal.signal(signal.SIGTERM, ours)
            yield ray
        finally:
            ray.shutdown()
    finally:
        os.rmdir(empty)


def ray_shards(shards: list, address: str, progress=None, out_dir: str | None = None,
               num_cpus: int | None = None) -> list:
    """Every shard as a Ray task (one CPU each) on the cluster at ``address`` (``ray_cluster``);
    results in shard order. The task is ``run_shard`` itself, so a shard's JSON is the same as
    a local run's."""
    with ray_cluster(address, num_cpus) as ray:
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


def guided(shards: list, planner, rounds: int, execute, on_round=None) -> list:
    """A coverage-guided campaign (``kvbound/trace/guide.py``): round 0 runs ``shards``' points,
    then each of ``rounds`` more runs what ``planner`` draws from the corpus, every column's
    shard of a round through ``execute`` (``local_shards`` or ``ray_shards``, as an unguided
    campaign runs its shards), a barrier: the next round is planned once every shard of this
    one has returned. Returns every round's shard results (``merge`` takes them);
    ``planner.rounds`` holds what each round ran and the new lines each run reached."""
    columns = [sh.column for sh in shards]
    runs = planner.first(shards[0].layouts)
    results: list = []
    for r in range(rounds + 1):
        if r:
            runs = planner.next()
        batch = [replace(sh, layouts=tuple(x.point for x in runs), seeds=tuple(x.seed for x in runs))
                 for sh in shards]
        got = execute(batch) if runs else []
        results += got
        rnd = planner.record(runs, {res["shard"]["column"]: res.get("point_coverage", {}) for res in got}, columns)
        if on_round:
            on_round(rnd)
    return results


# ------------------------------------------------------------------------------ the document


def merge(columns: list, results: list, rounds: list | None = None) -> CampaignRecord:
    """The campaign document: the matrix (column × layout: outcome, counters, findings),
    each distinct finding once with the columns that have it (first, last, where it
    stops) and when it was first seen (``detect``: the cell that saw it after the fewest
    requests), the count of findings by class per column, and (shards that measured it) the
    coverage of each column's connector code, the union over its shards
    (``kvbound/trace/coverage.py``). Deterministic: sorted keys, no wall-clock figure; the one
    measurement, each detect's ``cpu_s``, is what ``records.reproducible`` leaves out.
    ``rounds``: a guided campaign's rounds (``guide.Planner.rounds``), kept as they are."""
    from kvbound.side.findings import CLASSES

    from .coverage import Coverage

    matrix: dict = {}
    distinct: dict = {}  # key -> (the first example, its cells)
    detects: dict = {}  # key -> the detect of the fewest requests (the first such cell in order)
    order = {c: i for i, c in enumerate(columns)}
    results = sorted(results, key=lambda r: order.get(r["shard"]["column"], len(order)))
    for res in results:
        col = res["shard"]["column"]
        for cell in sorted(res["cells"], key=lambda c: c["layout"]):
            row = {k: v for k, v in cell.items() if k != "findings"}
            row["findings"] = sorted(f["key"] for f in cell["findings"])
            matrix.setdefault(col, {})[cell["layout"]] = row
            for f in cell["findings"]:
                distinct.setdefault(f["key"], ({k: v for k, v in f.items() if k != "detect"}, []))[1].append(
                    [col, cell["layout"], f["count"], len(f["segment"]["requests"]), f.get("file")])
                if f.get("detect"):
                    seen = dict(f["detect"], point=f"{col}, {f['detect']['point']}")
                    if f["key"] not in detects or seen["requests"] < detects[f["key"]]["requests"]:
                        detects[f["key"]] = seen
    covered: dict = {}
    for res in results:
        if res.get("coverage") is not None:
            covered.setdefault(res["shard"]["column"], Coverage()).add(res["coverage"])
    found = []
    for key in sorted(distinct):
        example, cells = distinct[key]
        cells.sort(key=lambda c: (order.get(c[0], len(order)), c[1]))
        have = sorted({c[0] for c in cells}, key=lambda c: order.get(c, len(order)))
        last = order.get(have[-1], -1)
        layouts = {c[1] for c in cells}
        # where it stops: the first later column whose run of the same layouts was clean
        stops = next((c for c in columns[last + 1:]
                      if any((matrix.get(c, {}).get(l) or {}).get("outcome") == "ran" for l in layouts)
                      and c not in have), None)
        found.append(CampaignFinding(key, example["kind"], example["class"], example["safety"], have, have[0],
                                     have[-1], stops, cells, example, detects.get(key)))
    by_class = {col: {c: 0 for c in CLASSES} for col in columns}
    for f in found:
        for c in f.cells:
            by_class.setdefault(c[0], {k: 0 for k in CLASSES})[f.finding_class] += 1
    coverage = {c: covered[c].document() for c in columns if c in covered} if covered else None
    return CampaignRecord(list(columns), matrix, found, by_class, coverage, rounds)


