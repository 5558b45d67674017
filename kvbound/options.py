"""Every limit kvbound gives a worker process, in one object and one unit: seconds; and
every budget and bound of the trace wing (``TraceOptions``, split by phase).

The solver's limits live beside these, in ``kvbound.proofs.options`` (``SolverOptions``):
that layer may not import the tool. ``ProcessOptions`` owns the rest: no other module
waits on a worker with a number of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ProcessOptions:
    # a worker importing vLLM: no wall-clock limit while it makes progress (Worker.start): it
    # beats every heartbeat_s with its CPU seconds and modules imported, and fails only after
    # start_idle_s without start_progress_cpu_s more CPU or one more module
    start_idle_s: float
    case_timeout_s: float  # conform: one update_state_after_alloc case
    job_timeout_s: float  # trace: one segment of traffic (a fresh engine, hundreds of requests)
    # PYTHONHASHSEED of every worker: vLLM iterates sets of request ids (0.33.0
    # v1/core/sched/scheduler.py:246-262), so with string hashing randomised per process a
    # seeded trace frees and reports in another order and drifts (docs/trace.md)
    hash_seed: str = "0"
    heartbeat_s: float = 2.0
    start_progress_cpu_s: float = 0.05  # more than the heartbeat thread itself spends in start_idle_s


WORKERS = ProcessOptions(start_idle_s=120.0, case_timeout_s=120.0, job_timeout_s=600.0)


# --------------------------------------------------------------------------- the trace wing
# Every budget and bound of ``kvbound trace`` and ``kvbound campaign``, split by phase:
# planning the traffic, running it, shrinking what it found. A command's flags fill one
# ``TraceOptions``; ``kvbound.trace.session.run_release`` takes it whole.


@dataclass(frozen=True)
class PlanOptions:
    """How ``--budget`` seconds become requests per layout, and what a run is planned to take:
    by a fixed table of what a run costs on this 2-core machine, not by a clock, so two runs of
    one command trace the same requests. A shard (one release's worker) costs its start, then
    per layout it runs (a release's unsupported layouts cost nothing) its requests at its
    family's rate and the shrinking of what it finds; the shards share ``workers`` processes.
    Measured in docs/benchmarks.md ("Where a campaign's time goes", 2026-12-05): the figures
    there, not a guess. ``budget_s`` None: no budget, every layout at ``min_requests`` (the
    default campaign: what it takes is what ``seconds`` plans)."""

    budget_s: float | None
    # wall seconds of one worker per request traced, every check on, by the layout's family
    # (``kvbound.trace.layouts.cost_family``: its costliest group kind); 0.33.0, --requests 400
    # and 800 --shrink-budget 0, coverage on (these are its rates x coverage_rate_kept)
    seconds_per_request: tuple = (("full_attention", 0.0027), ("sliding_window", 0.0031),
                                  ("chunked_local", 0.0018), ("mamba", 0.0030))
    start_s: float = 7.0  # a worker's start: importing vLLM and the side (8.8-12.3 s measuring coverage)
    # wall seconds of shrinking per layout run and per rerun of the shrink budget: findings are
    # not known beforehand, so the mean over the default full-range campaign at the floor
    # (3,030 s of shrinking over its 631 layout runs at 60 reruns; 0.33.0 alone, which finds the
    # most, shrinks at 0.18 and runs at twice its plan, 0.21.0 - 0.25.1 at under 0.05)
    shrink_s_per_rerun: float = 0.080
    min_requests: int = 200  # below this a layout's traffic barely evicts: not worth a cell
    # the median round of kvbound.trace.pace's probe on the machine the rates above were measured
    # on: a run's seconds here are its planned seconds x (the probe here / this)
    probe_s: float = 0.0100
    pace_runs: int = 5  # the shards of a release each part of its pace is the median of (kvbound.trace.pace)
    pace_min_part_s: float = 20.0  # a shard's part the table plans shorter is not kept for it
    coverage_rate_kept: float = 0.96
    coverage_start_factor: float = 1.55

    def covered(self) -> "PlanOptions":
        """The plan of a run measuring coverage: each request at ``coverage_rate_kept`` of the
        rate, each worker's start ``coverage_start_factor`` as long."""
        return replace(self, seconds_per_request=tuple((f, s / self.coverage_rate_kept) for f, s in self.seconds_per_request),
                       start_s=self.start_s * self.coverage_start_factor)

    def shard_parts(self, fams, requests: int, shrink_budget: int) -> tuple:
        """(running, shrinking): the table's seconds of one shard whose layouts are of the
        families ``fams``: its worker's start and traffic, then the shrinking of what it finds."""
        rate = dict(self.seconds_per_request)
        return (self.start_s + sum(requests * rate[f] for f in fams),
                len(fams) * shrink_budget * self.shrink_s_per_rerun)

    def seconds(self, shards, requests: int, shrink_budget: int, workers: int = 1, then=(), paces=None) -> float:
        """The planned wall seconds of ``shards`` (per shard: the families of the layouts it
        runs) at ``requests`` per layout on ``workers`` processes, each shard taken in order
        by the first process free (as the pool and Ray hand them out): the last to finish.
        ``then``: further rounds of shards, each begun when the one before has ended (a guided
        campaign's; each round a shard per release, in the order of ``shards``). ``paces``: per
        shard, the (running, shrinking) factors of its release on this machine
        (``kvbound.trace.pace``); None: the table's own seconds."""
        free = [0.0] * max(1, workers)
        for k, fams in enumerate(shards):
            i = free.index(min(free))
            run, shrink = self.shard_parts(fams, requests, shrink_budget)
            run_pace, shrink_pace = paces[k] if paces else (1.0, 1.0)
            free[i] += run * run_pace + shrink * shrink_pace
        return max(free) + sum(self.seconds(r, requests, shrink_budget, workers, paces=paces) for r in then)

    def costliest(self) -> str:
        """The family of the highest rate: what a layout not known when planning is costed as."""
        return max(self.seconds_per_request, key=lambda fr: fr[1])[0]

    def requests_per_layout(self, shards, shrink_budget: int, workers: int = 1, then=()) -> int:
        """The most requests per layout (in hundreds, at least ``min_requests``) whose planned
        seconds fit the budget; ``min_requests`` without one."""
        from kvbound.errors import UsageError

        if self.budget_s is None:
            return self.min_requests
        if self.budget_s <= 0:
            raise UsageError(f"--budget {self.budget_s}: must be a positive number of seconds")
        fixed = self.seconds(shards, 0, shrink_budget, workers, then)
        per_request = self.seconds(shards, 1, shrink_budget, workers, then) - fixed
        # (a hair over the quotient: a count whose seconds land on the budget itself fits it)
        n = int((self.budget_s - fixed) / per_request + 1e-6) if per_request > 0 else self.min_requests
        return max(self.min_requests, n // 100 * 100)


@dataclass(frozen=True)
class RunOptions:
    """The traffic of every layout of one release."""

    requests: int  # per layout
    seed: int = 0
    segment: int = 400  # requests per engine (a fresh scheduler and CPU tier each)
    scheduler: str = "both"  # sync, async, or alternate segments
    stop_on_first: bool = False  # stop a layout at its first finding
    overrides: tuple = ()  # ((key, value), ...): engine settings of every layout (--engine)
    coverage: bool = False  # measure the connector code's line coverage (kvbound/side/cover.py)


@dataclass(frozen=True)
class ShrinkOptions:
    """Delta debugging of each distinct finding (``kvbound.trace.shrink``)."""

    budget: int  # reruns per distinct finding; 0: findings are kept as found
    min_gpu_blocks: int = 8  # the smallest GPU pool a shrink tries


@dataclass(frozen=True)
class TraceOptions:
    run: RunOptions
    shrink: ShrinkOptions


# Each command's defaults: a trace is one release, planned for minutes and shrunk hard; a
# campaign is many, each point at the floor of traffic (the default full range is planned at
# 1,885 s and took 2,046 s, docs/benchmarks.md), each finding shrunk less; --budget grows its traffic.
TRACE_PLAN, CAMPAIGN_PLAN = PlanOptions(budget_s=300.0), PlanOptions(budget_s=None)
TRACE_SHRINK, CAMPAIGN_SHRINK = ShrinkOptions(budget=150), ShrinkOptions(budget=60)
# Line coverage of the connector code (--coverage): on by default, as it costs less than the 30 % of
# the traffic rate a default may: its probes compiled into the connector's modules keep 96 % of the
# rate (no trace function, which would slow every frame of CPython 3.11, the side venv's Python:
# coverage.py's tracer kept 34 %; docs/benchmarks.md "Coverage"), and the plan costs it
# (PlanOptions.covered)
CAMPAIGN_COVERAGE = True
