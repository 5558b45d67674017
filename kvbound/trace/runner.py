"""Host side of ``kvbound trace``: segments of traffic through the release's worker,
and the checks at every connector call.

A trace is cut into segments (a fresh engine each: real scheduler, real CPU tier,
its own seed), so a finding reproduces from one segment's requests alone and
shrinking reruns only those. Every ``update_state_after_alloc`` call that loads is
captured as a kvbound case and checked (``callcheck.check_call``, which the vLLM
plugin's live monitor shares) (a) against the spec of that release
(``conform.compare.judge``), (b) against the premises of the proofs; the worker
reports (c) lifecycle violations and any exception inside vLLM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvbound.conform.compare import AGREE, DISAGREE
from kvbound.conform.prepare import ReleaseEnv
from kvbound.conform.runner import Worker
from kvbound.errors import LayoutUnsupported, TraceError, WorkerError
from kvbound.options import WORKERS
from kvbound.side import findings

from .callcheck import check_call
from .space import resolve, support
from .workload import workload

STAT_KEYS = ("requests", "steps", "lookups", "loads", "partial_hits", "partial_tails", "stores",
             "preemptions", "aborts", "drafts", "accepted", "tier_pending", "tier_retry", "tier_evicted")


class TraceWorker(Worker):
    """conform's worker process, serving kvbound/side/trace_worker.py: one job per line.
    ``coverage``: started to measure the connector code's coverage (kvbound/side/cover.py)."""

    def __init__(self, env: ReleaseEnv, coverage: bool = False):
        super().__init__(env, "trace")
        if coverage:
            from kvbound.side.cover import ENV

            self.extra_env[ENV] = "1"

    def job(self, job: dict) -> dict:
        import json

        self.send({"id": 0, "job": job})
        line = self._readline(WORKERS.job_timeout_s)
        if not line:
            tail = self.stderr_tail()
            self.stop()
            raise TraceError(f"the trace worker for vllm {self.env.version} died or hung on a job;"
                             f" its stderr ends:\n{tail}")
        return json.loads(line)


@dataclass
class Finding:
    kind: str  # a row of the findings table (kvbound/side/findings.py)
    release: str
    layout: str
    detail: dict
    segment: dict  # the job: layout, params, requests (what replays it)
    case: dict | None = None  # the captured call, when the finding is about one
    detect: dict | None = None  # where and after how much traffic the trace first saw it (detect)

    def __post_init__(self):
        self.row = findings.row(self.kind)  # ValueError: a kind the table lacks

    def key(self) -> str:
        """What a shrink must keep and what a campaign counts as one finding: the same kind
        and, where the table's row names a shape, the same shape (a vLLM exception's site;
        the group kind and answers a deferral hangs on; the group kind a wrong read is in
        and what it found there), so two defects of one kind stay two findings."""
        return self.row.key(self.kind, self.detail, self._groups())

    def file_part(self) -> str | None:
        """The part of the shape a trace file's name carries (two shapes, two files)."""
        return self.row.shape.file_part(self.detail, self._groups()) if self.row.shape else None

    def _groups(self):
        return (self.segment.get("layout") or {}).get("groups") or ()

    @property
    def finding_class(self) -> str:
        return self.row.finding_class

    @property
    def safety(self) -> bool:
        """False for an efficiency finding (work lost, nothing wrong read or served)."""
        return self.row.safety

    def to_json(self) -> dict:
        return {"kind": self.kind, "class": self.finding_class, "safety": self.safety, "release": self.release, "layout": self.layout,
                "detail": self.detail, "case": self.case, "segment": self.segment}


@dataclass
class LayoutSummary:
    layout: str
    stats: dict = field(default_factory=lambda: {k: 0 for k in STAT_KEYS})
    captured_calls: int = 0  # update_state_after_alloc calls that load, each a case
    spec_agree: int = 0  # of those, the calls the release's spec gives exactly
    not_judged: int = 0  # the calls the spec judge could not drive (neither agree nor disagree)
    findings: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the worker's CPU time stepping (one core), without vLLM's import
    first_finding_requests: int | None = None
    first_finding_seconds: float | None = None
    new_lines: list = field(default_factory=list)  # per segment: statements new to run_trace's ``coverage``

    def add(self, stats: dict) -> None:
        for k in STAT_KEYS:
            self.stats[k] += int(stats.get(k, 0))


def make_job(layout_name: str, seed, n: int, first_id: int, sched: str, overrides=None) -> dict:
    point = resolve(layout_name)
    layout = point.job_layout()
    params = dict(point.params(), **(overrides or {}))
    params["seed"] = repr(seed)
    params["async"] = sched == "async"
    return {"layout": layout, "params": params,
            "requests": workload(n, seed, layout, params, first_id)}


def check_result(release: str, layout_name: str, job: dict, res: dict) -> tuple[list[Finding], dict]:
    """Findings of one segment, and the per-call tallies (LayoutSummary's counters)."""
    out: list[Finding] = []
    tally = {"captured_calls": 0, "spec_agree": 0, "not_judged": 0}

    def add(kind, detail, case=None):
        out.append(Finding(kind, release, layout_name, detail, job, case))

    def add_reported(kind, detail):  # a kind the worker reported: one the table lacks is a harness fault
        try:
            findings.row(kind)
        except ValueError as e:
            kind, detail = "harness:exception", dict(detail, error=str(e))
        add(kind, detail)

    if res.get("setup_error"):
        # The engine could not be built for a layout the release table says it supports
        # (run_trace skips the others first): raised in kvbound's adapter it is a harness
        # fault; raised inside vLLM's own validation it is a finding to investigate.
        add("harness:setup" if res.get("harness_fault") else "crash:engine_build",
            {"error": res["setup_error"], "traceback": res.get("traceback", ""),
             "assert_site": res.get("assert_site")})
        return out, tally

    if not res.get("ok", True):
        detail = {k: res.get(k) for k in ("error", "assert_site", "step", "traceback")}
        add("harness:exception" if res.get("harness_fault") else "crash:exception", detail)
    from .storecheck import check_store_premises, judge_store_calls

    for d in judge_store_calls(release, job, res)[0]:  # the store spec (spec/store.py)
        add(d["check"], d)
    for d in check_store_premises(release, job, res)[0]:  # the store premises (proofs/store_premises.py)
        add(d["check"], d)
    for v in res.get("violations", ()):
        add_reported(v["check"], v)
    from .lookup_checks import check_lookups  # the lookup contract at every captured lookup

    got, _ = check_lookups(release, res)
    for kind, detail, case in got:
        add(kind, dict(detail, lookup_case=case))  # a lookup case (spec/lookup.py), not a load case
    for c in res.get("cases", ()):
        tally["captured_calls"] += 1
        verdict, got = check_call(release, c)
        if verdict == AGREE:
            tally["spec_agree"] += 1
        elif verdict not in (None, DISAGREE):
            tally["not_judged"] += 1
        for kind, detail in got:
            add(kind, detail, c["case"])
    return out, tally


def schedulers(which: str):
    return {"sync": ("sync",), "async": ("async",), "both": ("sync", "async")}[which]


def start_worker(env: ReleaseEnv, coverage: bool = False) -> TraceWorker:
    w = TraceWorker(env, coverage)
    try:
        w.start()
    except WorkerError as e:
        raise TraceError(str(e)) from None
    return w


def run_trace(env: ReleaseEnv, layouts, n_requests: int, seed: int = 0, segment: int = 400,
              sched: str = "both", progress=None, stop_on_first: bool = False, overrides=None,
              worker: TraceWorker | None = None, coverage=None):
    """Run ``n_requests`` per layout; returns (summaries, findings). ``progress(layout,
    done, total, summary)`` is called after every segment. A given ``worker`` is reused
    (and left running). ``coverage`` (a ``kvbound.trace.coverage.Coverage``, the worker started
    to measure): every segment measures, its lines join it, its new lines go to the summary.
    Each finding's ``detect``: the point and the traffic (requests, worker CPU) before it."""
    w = worker or start_worker(env, coverage is not None)
    summaries, findings = [], []
    try:
        for name in layouts:
            why = support(name, env.version, overrides)
            if why is not None:  # the caller says it in one line and goes on with the next layout
                raise LayoutUnsupported(why)
            s = LayoutSummary(name)
            summaries.append(s)
            t0 = time.monotonic()
            done, seg_i = 0, 0
            kinds = schedulers(resolve(name).scheduler or sched)  # the point's own, else the run's
            while done < n_requests:
                n = min(segment, n_requests - done)
                job = make_job(name, (seed, name, seg_i), n, done, kinds[seg_i % len(kinds)], overrides)
                # Coverage is asked of the worker, never kept in the job: the job is the finding's
                # segment, and its replay starts a worker without coverage.
                res = w.job({**job, "coverage": True} if coverage is not None else job)
                got, tally = check_result(env.version, name, job, res)
                for f in got:
                    f.detect = detect(f, f"layout {name}, seed {seed}, segment {seg_i}", done, s.cpu_seconds, job, res)
                if coverage is not None:
                    s.new_lines.append(coverage.add(res.get("coverage")))
                s.add(res.get("stats", {}))
                s.cpu_seconds += float(res.get("cpu_seconds", 0.0))
                s.captured_calls += tally["captured_calls"]
                s.spec_agree += tally["spec_agree"]
                s.not_judged += tally["not_judged"]
                s.seconds = time.monotonic() - t0
                if got and s.first_finding_requests is None:
                    s.first_finding_requests = done + _requests_until(res, job)
                    s.first_finding_seconds = s.seconds
                s.findings += len(got)
                findings += got
                done += n
                seg_i += 1
                if progress:
                    progress(name, done, n_requests, s)
                if got and stop_on_first:
                    break
    finally:
        if worker is None:
            w.stop()
    return summaries, findings


def _requests_until(res: dict, job: dict) -> int:
    """Requests that had arrived by the step of the segment's first finding."""
    steps = [res.get("step")] if not res.get("ok", True) else []
    steps += [v.get("step") for v in res.get("violations", ())]
    steps = [s for s in steps if s is not None]
    return _arrived_by(job, min(steps) if steps else None)


def _arrived_by(job: dict, step) -> int:
    """Requests of the segment that had arrived by ``step`` (None: all of them)."""
    if step is None:
        return len(job["requests"])
    return sum(1 for r in job["requests"] if r["arrive"] <= step)


def detect(f: Finding, point: str, done: int, cpu_before: float, job: dict, res: dict) -> dict:
    """When a finding of a segment was first seen: the point, the requests of the point before
    its step (``done`` in earlier segments, and those of this one that had arrived) and the
    worker's CPU seconds of traffic until then (earlier segments', and this one's up to the
    start of that step: ``step_cpu``; the whole segment's when the finding names no step).
    ``cpu_s`` is a measurement: no two runs share it (records.reproducible leaves it out)."""
    step = f.detail.get("step") if isinstance(f.detail.get("step"), int) else None
    cpu = res.get("step_cpu") or []
    seg_cpu = cpu[step - 1] if step is not None and 0 < step <= len(cpu) else float(res.get("cpu_seconds", 0.0))
    return {"point": point, "requests": done + _arrived_by(job, step), "cpu_s": round(cpu_before + seg_cpu, 3)}


def rerun(w: TraceWorker, release: str, finding: Finding, requests: list) -> list[Finding]:
    job = dict(finding.segment, requests=requests)
    res = w.job(job)
    got, _ = check_result(release, finding.layout, job, res)
    return got
