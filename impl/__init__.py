"""kvbound.impl: the load plan batched in torch, the fast oracle for millions of configurations.

Directory ``impl/`` at the repository top, installed as ``kvbound.impl``: layer 1,
the impl ↔ spec relation (docs/architecture.md).

Imports only ``kvbound.spec``; it is checked against the spec and against the
symbolic model by ``kvbound diff``.
"""

import warnings

# torch warns at import when numpy is absent; kvbound never hands tensors to numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

from .batch import BatchError, PlanBatch, concat_batches, resolve_device
from .convert import batch_from_cases, cases_from_batch
from .differential import (CaseChunk, DiffStats, Disagreement, SpecSide, Timings, agrees_with_spec, diff_against_spec,
                           mismatched_rows, record, run_differential, spec_side)
from .cells import Cells, real_cells
from .plan import GROUP_FIELDS, BatchPlan, plan_batch, plan_fields, plan_variants, to_load_plans
from .shrink import shrink_case

__all__ = [name for name in dir() if not name.startswith("_")]
