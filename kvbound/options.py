"""Every limit kvbound gives a worker process, in one object and one unit: seconds; and
every budget and bound of the trace wing (``TraceOptions``, split by phase).

The solver's limits live beside these, in ``kvbound.proofs.options`` (``SolverOptions``):
that layer may not import the tool. ``ProcessOptions`` owns the rest: no other module
waits on a worker with a number of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """How ``--budget`` seconds become requests per layout: by a fixed planning rate, not a
    clock, so two runs of one command trace the same requests."""

    budget_s: float
    # Requests per second of wall time one worker is planned at (every check on, shrinking
    # included). Measured at 400-1,800 requests per CPU-second stepping (docs/benchmarks.md);
    # the rate leaves room for importing vLLM, shrinking and a loaded machine.
    requests_per_s: int = 60
    min_requests: int = 200  # below this a layout's traffic barely evicts: not worth a cell

    def requests_per_layout(self, n_cells: int, workers: int = 1) -> int:
        """Requests per layout so that ``n_cells`` release x layout cells fit the budget."""
        from kvbound.errors import UsageError

        if self.budget_s <= 0:
            raise UsageError(f"--budget {self.budget_s}: must be a positive number of seconds")
        per_cell = self.budget_s * self.requests_per_s * max(1, workers) / max(1, n_cells)
        return max(self.min_requests, int(per_cell) // 100 * 100)


@dataclass(frozen=True)
class RunOptions:
    """The traffic of every layout of one release."""

    requests: int  # per layout
    seed: int = 0
    segment: int = 400  # requests per engine (a fresh scheduler and CPU tier each)
    scheduler: str = "both"  # sync, async, or alternate segments
    stop_on_first: bool = False  # stop a layout at its first finding
    overrides: tuple = ()  # ((key, value), ...): engine settings of every layout (--engine)


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
# campaign is many, planned for an hour, each finding shrunk less.
TRACE_PLAN, CAMPAIGN_PLAN = PlanOptions(budget_s=300.0), PlanOptions(budget_s=3600.0)
TRACE_SHRINK, CAMPAIGN_SHRINK = ShrinkOptions(budget=150), ShrinkOptions(budget=60)
