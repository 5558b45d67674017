"""Every limit kvbound gives a worker process, in one object and one unit: seconds.

The solver's limits live beside these, in ``kvbound.proofs.options`` (``SolverOptions``):
that layer may not import the tool. ``ProcessOptions`` owns the rest: no other module
waits on a worker with a number of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessOptions:
    hello_timeout_s: float  # a worker importing vLLM, on a loaded 2-core machine
    case_timeout_s: float  # conform: one update_state_after_alloc case
    job_timeout_s: float  # trace: one segment of traffic (a fresh engine, hundreds of requests)
    # PYTHONHASHSEED of every worker: vLLM iterates sets of request ids (0.33.0
    # v1/core/sched/scheduler.py:246-262), so with string hashing randomised per process a
    # seeded trace frees and reports in another order and drifts (docs/trace.md)
    hash_seed: str = "0"


WORKERS = ProcessOptions(hello_timeout_s=300.0, case_timeout_s=120.0, job_timeout_s=600.0)
