"""One trace session: a release's worker, its layouts, its distinct findings, kept.

``run_release(env, points, options)`` is what ``kvbound trace`` runs and what every shard
of ``kvbound campaign`` runs: it starts the release's worker (and restarts it when it
dies on a layout), says which layouts the release cannot run, traces the others segment
by segment (``runner.run_trace``), and keeps each distinct finding of a layout (its key:
``kvbound/side/findings.py``) shrunk (``shrink``), rerun on the shrunk requests and saved
as a trace file. ``replay`` reruns a trace file's requests. The commands parse and print.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from kvbound.conform.prepare import ReleaseEnv
from kvbound.errors import LayoutUnsupported, TraceError, UsageError
from kvbound.options import ShrinkOptions, TraceOptions

from . import runner as R
from . import shrink as S
from . import tracefile as TF
from .coverage import Coverage

RAN, UNSUPPORTED, WORKER_FAILED, NOT_RUN = "ran", "unsupported", "worker_failed", "not_run"


def release_env(release: str, src: str | None = None, progress=None) -> ReleaseEnv:
    """The venv a release's worker runs in: the prepared release, or (``src``) a checkout's
    vllm/ in the deps venv, judged by ``release``'s spec."""
    from kvbound.conform.prepare import deps_venv, prepare_release

    if src:
        return ReleaseEnv(release, str(deps_venv(progress) / "bin" / "python"), str(src))
    return prepare_release(release, progress)


def checkout(path: str) -> Path:
    """A ``--vllm-src`` checkout's root, or a UsageError."""
    src = Path(path)
    if not (src / "vllm" / "__init__.py").exists():
        raise UsageError(f"--vllm-src {src}: no vllm/__init__.py there (give the checkout's root)")
    return src


@dataclass
class Kept:
    """One distinct finding of a layout, as kept: shrunk and rerun when shrinking found it again."""

    finding: R.Finding
    key: str
    count: int  # findings of this key in the layout's run
    shrunk_from: int  # requests of the segment it was first seen in
    reruns: int | None  # the shrink's reruns; None: not shrunk
    path: Path | None  # its trace file; None: not saved
    seen: int  # the order it was first seen in, among the layout's distinct findings
    detect: dict | None = None  # the earliest of its kind's findings in the run (runner.detect)


@dataclass
class Cell:
    """One layout of the release: how it went and what it found."""

    layout: str
    outcome: str  # RAN | UNSUPPORTED | WORKER_FAILED | NOT_RUN
    why: str | None = None  # the one line saying why it did not run
    summary: R.LayoutSummary | None = None
    kept: list = field(default_factory=list)  # [Kept], by key
    seconds: float = 0.0  # tracing and shrinking
    shrink_seconds: float = 0.0  # of ``seconds``, shrinking what it found

    def to_json(self) -> dict:
        """The cell as a campaign shard returns it (``campaign.merge`` takes it)."""
        if self.outcome != RAN:
            return {"layout": self.layout, "outcome": self.outcome, "why": self.why, "findings": []}
        s = self.summary
        return {"layout": self.layout, "outcome": RAN, "stats": dict(s.stats), "captured_calls": s.captured_calls,
                "spec_agree": s.spec_agree, "not_judged": s.not_judged,
                "findings": [dict(k.finding.to_json(), key=k.key, shrunk_from=k.shrunk_from, count=k.count,
                                  **({"file": k.path.name} if k.path else {}),
                                  **({"detect": k.detect} if k.detect else {})) for k in self.kept]}


@dataclass
class ReleaseResult:
    release: str
    cells: list  # [Cell], in the order of the points
    start_error: str | None = None  # the worker could not start: every cell NOT_RUN
    seconds: float = 0.0
    coverage: Coverage | None = None  # options.run.coverage: the union of every layout's segments
    point_coverage: dict = field(default_factory=dict)  # options.run.coverage: cell layout -> its own Coverage

    @property
    def shrink_seconds(self) -> float:
        """Of ``seconds``, the cells' shrinking."""
        return sum(c.shrink_seconds for c in self.cells)

    def findings(self) -> list:
        """Every cell's kept findings, each layout's in the order first seen."""
        return [k for c in self.cells for k in sorted(c.kept, key=lambda k: k.seen)]


def run_release(env: ReleaseEnv, points, options: TraceOptions, progress=None,
                out_dir: Path | None = None, seeds=()) -> ReleaseResult:
    """Every layout of ``points`` on ``env``'s release. Never raises for a layout the
    release refuses or a worker that dies on one: those are outcomes of the cell.
    ``seeds``: each point's traffic seed (default: ``options.run.seed``); a point on another
    seed is the cell ``guide.label`` names. With coverage, each cell's own coverage is kept
    beside the union (``point_coverage``: what a guided campaign steers by)."""
    from .guide import label

    t0 = time.monotonic()
    run = options.run
    result = ReleaseResult(env.version, [], coverage=Coverage() if run.coverage else None)
    try:
        w = R.start_worker(env, run.coverage)
    except TraceError as e:
        result.start_error = str(e)
        result.cells = [Cell(name, NOT_RUN, str(e).splitlines()[0]) for name in points]
        result.seconds = time.monotonic() - t0
        return result
    try:
        for i, point in enumerate(points):
            seed = seeds[i] if seeds else run.seed
            name = label(point, seed, run.seed)
            c0 = time.monotonic()
            mine = Coverage() if run.coverage else None
            try:
                summaries, found = R.run_trace(env, [point], run.requests, seed, run.segment, run.scheduler,
                                               progress, run.stop_on_first, dict(run.overrides), worker=w,
                                               coverage=mine)
            except LayoutUnsupported as e:  # the release lacks what the layout needs: one line
                result.cells.append(Cell(name, UNSUPPORTED, str(e).splitlines()[0]))
                continue
            except TraceError as e:  # the worker died or hung on this layout
                if not w.alive:
                    w = R.start_worker(env, run.coverage)
                result.cells.append(Cell(name, WORKER_FAILED, str(e).splitlines()[0]))
                continue
            finally:
                if mine is not None:
                    result.coverage.add(mine.to_json())
                    result.point_coverage[name] = mine
            s0 = time.monotonic()
            kept = keep(w, env, found, options.shrink, out_dir)
            result.cells.append(Cell(name, RAN, summary=summaries[0], kept=kept, seconds=time.monotonic() - c0,
                                     shrink_seconds=time.monotonic() - s0))
    finally:
        w.stop()
    result.seconds = time.monotonic() - t0
    return result


def keep(w: R.TraceWorker, env: ReleaseEnv, found: list, options: ShrinkOptions, out_dir: Path | None) -> list:
    """Each distinct finding of one layout's run, by key: shrunk, rerun on the shrunk
    requests (the rerun's finding is kept when it has the same key), saved."""
    distinct: dict = {}
    for f in found:
        distinct.setdefault(f.key(), f)
    seen = {key: i for i, key in enumerate(distinct)}
    kept = []
    for key in sorted(distinct):
        f = distinct[key]
        n0 = len(f.segment["requests"])
        reruns = None
        if options.budget:
            reqs, reruns = S.shrink(w, f, options)
            again = [g for g in R.rerun(w, env.version, f, reqs) if g.key() == key]
            if again:
                f = again[0]
        path = TF.save(f, out_dir, n0, reruns) if out_dir is not None else None
        first = min((g.detect for g in found if g.key() == key and g.detect),
                    key=lambda d: d["requests"], default=None)
        kept.append(Kept(f, key, sum(1 for g in found if g.key() == key), n0, reruns, path, seen[key], first))
    return kept


def replay(env: ReleaseEnv, finding: R.Finding, options: ShrinkOptions | None = None,
           out_dir: Path | None = None) -> tuple[list, Kept | None]:
    """(the findings of a rerun of ``finding``'s requests, the finding shrunk further and
    saved under ``out_dir`` when ``options`` ask for it and the shrunk requests still give it)."""
    w = R.start_worker(env)
    try:
        got = R.rerun(w, env.version, finding, finding.segment["requests"])
        same = [g for g in got if g.key() == finding.key()]
        if not same or options is None:
            return got, None
        n0 = len(finding.segment["requests"])
        reqs, reruns = S.shrink(w, same[0], options)
        again = [g for g in R.rerun(w, env.version, same[0], reqs) if g.key() == finding.key()]
        if not again:
            return got, None
        path = TF.save(again[0], out_dir, n0, reruns) if out_dir is not None else None
        return got, Kept(again[0], finding.key(), 1, n0, reruns, path, 0)
    finally:
        w.stop()
