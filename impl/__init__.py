"""kvbound.impl: the load plan batched in torch, the fast oracle for millions of configurations.

Imports only ``kvbound.spec``; it is checked against the spec and against the
symbolic model by ``kvbound diff``.
"""

from .batch import BatchError, PlanBatch, batch_from_cases, cases_from_batch, resolve_device
from .plan import ASSERT_CODES, ASSERT_NAMES, CODE_OK, BatchPlan, plan_batch, plan_fields, to_load_plans

__all__ = [name for name in dir() if not name.startswith("_")]
