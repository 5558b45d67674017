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

from .callcheck import check_call
from .layouts import ENGINE, LAYOUTS, layout_support
from .workload import workload

STAT_KEYS = ("requests", "steps", "lookups", "loads", "partial_hits", "partial_tails", "stores",
             "preemptions", "aborts", "drafts", "accepted", "tier_pending", "tier_retry", "tier_evicted")


class TraceWorker(Worker):
    """conform's worker process, serving kvbound/side/trace_worker.py: one job per line."""

    def __init__(self, env: ReleaseEnv):
        super().__init__(env, "trace")

    def job(self, job: dict) -> dict:
        import json

        assert self.proc and self.proc.stdin
        try:
            self.proc.stdin.write(json.dumps({"id": 0, "job": job}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        line = self._readline(WORKERS.job_timeout_s)
        if not line:
            tail = self.stderr_tail()
            self.stop()
            raise TraceError(f"the trace worker for vllm {self.env.version} died or hung on a job;"
                             f" its stderr ends:\n{tail}")
        return json.loads(line)


# Every finding has a kind "<class>:<what>" (two v1 kinds keep their names), and its class
# says what went wrong. A harness fault (an exception raised in kvbound's own fakes or
# adapter) is its own class and never counted as a vLLM finding.
FINDING_CLASSES = ("crash", "plan", "data", "store", "lookup", "liveness", "lifecycle", "premise", "harness")
_V1_KINDS = {"vllm-exception": "crash", "spec-disagreement": "plan"}
# What costs work but not correctness: the engine recomputes what it could have loaded.
EFFICIENCY_KINDS = frozenset({"store:lost_chunk", "lookup:lost_hit", "lookup:needless_deferral"})


def finding_class(kind: str) -> str:
    if kind in _V1_KINDS:
        return _V1_KINDS[kind]
    cls = kind.split(":", 1)[0]
    if cls not in FINDING_CLASSES:
        raise ValueError(f"finding kind {kind!r}: its class {cls!r} is not one of {FINDING_CLASSES}")
    return cls


def violation_kind(check: str) -> str:
    """A worker violation's finding kind: a check named "<class>:<what>" is that kind;
    a bare name is a lifecycle check's."""
    return check if ":" in check else "lifecycle:" + check


@dataclass
class Finding:
    kind: str  # vllm-exception | spec-disagreement | premise:<id> | <class>:<check> (FINDING_CLASSES)
    release: str
    layout: str
    detail: dict
    segment: dict  # the job: layout, params, requests (what replays it)
    case: dict | None = None  # the captured call, when the finding is about one

    def key(self) -> str:
        """What a shrink must keep and what a campaign counts as one finding: the same kind
        and, where the detail says it, the same shape (a vLLM exception's site; the group
        kind and answers a deferral hangs on; the group kind a wrong read is in and what
        it found there), so two defects of one kind stay two findings."""
        if self.kind in ("vllm-exception", "harness:exception", "harness:setup", "crash:engine_build"):
            site = self.detail.get("assert_site") or {}
            return f"{self.kind}@{site.get('function')}:{site.get('statement') or self.detail.get('error')}"
        shape = self.shape()
        return f"{self.kind}[{shape}]" if shape else self.kind

    def shape(self) -> str | None:
        d = self.detail
        if self.kind == "lookup:needless_deferral" and d.get("deferred_on"):
            # "<group kind> <answer> <key>" each (lookup_checks.deferral_causes): the key dropped
            return "deferred on " + ", ".join(sorted({" ".join(c.split()[:2]) for c in d["deferred_on"]}))
        if self.kind == "data:wrong_kv" and isinstance(d.get("group"), int):
            groups = (self.segment.get("layout") or {}).get("groups") or ()
            kind = groups[d["group"]]["kind"] if d["group"] < len(groups) else "?"
            via = d.get("provenance") or ""
            found = ("the null block" if via == "the null block" else "unwritten") if d.get("found") is None \
                else "another prefix"
            return f"{kind}: {found}" + (", arrived by a load" if via.startswith("load job") else "")
        return None

    @property
    def finding_class(self) -> str:
        return finding_class(self.kind)

    @property
    def safety(self) -> bool:
        """False for an efficiency finding (work lost, nothing wrong read or served)."""
        return self.kind not in EFFICIENCY_KINDS

    def to_json(self) -> dict:
        return {"kind": self.kind, "class": self.finding_class, "safety": self.safety, "release": self.release, "layout": self.layout,
                "detail": self.detail, "case": self.case, "segment": self.segment}


@dataclass
class LayoutSummary:
    layout: str
    stats: dict = field(default_factory=lambda: {k: 0 for k in STAT_KEYS})
    cases: int = 0
    agree: int = 0
    undriven: int = 0
    findings: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the worker's CPU time stepping (one core), without vLLM's import
    first_finding_requests: int | None = None
    first_finding_seconds: float | None = None

    def add(self, stats: dict) -> None:
        for k in STAT_KEYS:
            self.stats[k] += int(stats.get(k, 0))


def make_job(layout_name: str, seed, n: int, first_id: int, sched: str, overrides=None) -> dict:
    layout = dict(LAYOUTS[layout_name], name=layout_name)
    params = dict(ENGINE[layout_name], **(overrides or {}))
    params["seed"] = repr(seed)
    params["async"] = sched == "async"
    return {"layout": layout, "params": params,
            "requests": workload(n, seed, layout, params, first_id)}


def check_result(release: str, layout_name: str, job: dict, res: dict) -> tuple[list[Finding], dict]:
    """Findings of one segment, and the per-case tallies (agree/undriven)."""
    out: list[Finding] = []
    tally = {"cases": 0, "agree": 0, "undriven": 0}

    def add(kind, detail, case=None):
        out.append(Finding(kind, release, layout_name, detail, job, case))

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
        add("harness:exception" if res.get("harness_fault") else "vllm-exception", detail)
    from .storecheck import judge_store_calls

    for d in judge_store_calls(release, job, res)[0]:  # the store spec (spec/store.py)
        add("store:spec_disagreement", d)
    for v in res.get("violations", ()):
        add("harness:capture" if v["check"] == "harness-capture" else violation_kind(v["check"]), v)
    from .lookup_checks import check_lookups  # the lookup contract at every captured lookup

    got, _ = check_lookups(release, res)
    for kind, detail, case in got:
        add(kind, dict(detail, lookup_case=case))  # a lookup case (spec/lookup.py), not a load case
    for c in res.get("cases", ()):
        tally["cases"] += 1
        verdict, got = check_call(release, c)
        if verdict == AGREE:
            tally["agree"] += 1
        elif verdict not in (None, DISAGREE):
            tally["undriven"] += 1
        for kind, detail in got:
            add(kind, detail, c["case"])
    return out, tally


def schedulers(which: str):
    return {"sync": ("sync",), "async": ("async",), "both": ("sync", "async")}[which]


def start_worker(env: ReleaseEnv) -> TraceWorker:
    w = TraceWorker(env)
    try:
        w.start()
    except WorkerError as e:
        raise TraceError(str(e)) from None
    return w


def run_trace(env: ReleaseEnv, layouts, n_requests: int, seed: int = 0, segment: int = 400,
              sched: str = "both", progress=None, stop_on_first: bool = False, overrides=None,
              worker: TraceWorker | None = None):
    """Run ``n_requests`` per layout; returns (summaries, findings). ``progress(layout,
    done, total, summary)`` is called after every segment. A given ``worker`` is reused
    (and left running)."""
    w = worker or start_worker(env)
    summaries, findings = [], []
    try:
        for name in layouts:
            why = layout_support(name, env.version)
            if why is not None:  # the caller says it in one line and goes on with the next layout
                raise LayoutUnsupported(why)
            s = LayoutSummary(name)
            summaries.append(s)
            t0 = time.monotonic()
            done, seg_i = 0, 0
            kinds = schedulers(sched)
            while done < n_requests:
                n = min(segment, n_requests - done)
                job = make_job(name, (seed, name, seg_i), n, done, kinds[seg_i % len(kinds)], overrides)
                res = w.job(job)
                got, tally = check_result(env.version, name, job, res)
                s.add(res.get("stats", {}))
                s.cpu_seconds += float(res.get("cpu_seconds", 0.0))
                s.cases += tally["cases"]
                s.agree += tally["agree"]
                s.undriven += tally["undriven"]
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
    if not steps:
        return len(job["requests"])
    first = min(steps)
    return sum(1 for r in job["requests"] if r["arrive"] <= first)


def rerun(w: TraceWorker, release: str, finding: Finding, requests: list) -> list[Finding]:
    job = dict(finding.segment, requests=requests)
    res = w.job(job)
    got, _ = check_result(release, finding.layout, job, res)
    return got
