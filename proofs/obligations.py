"""The index: the properties kvbound proves, one module each, and every obligation in one list.

As seL4's l4v maps its proofs by the relation each establishes, this maps ours. Every property
relates the executable spec (or the vLLM code a model of it was read from) to a claim, through
the Z3 encoding; each module holds its builders, its spec replays and its ``Obligation`` entries
(``problem.Obligation``), and ``runner`` runs any of them. The other two relations of
docs/architecture.md (impl ↔ spec, real vLLM ↔ spec) are checks, not obligations.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from . import alignment, copy_contract, group_plan, lookup, reservation, safe_load, store
from .problem import Obligation


@dataclass(frozen=True)
class Property:
    name: str
    says: str
    relation: str  # what the claim relates
    module: ModuleType  # its builders, replays and OBLIGATIONS

    @property
    def obligations(self) -> list[Obligation]:
        return self.module.OBLIGATIONS


PROPERTIES: tuple[Property, ...] = (
    Property("safe load", "on every hybrid model the release's plan fires no assert, loads exactly the fresh "
             "blocks and requests only keys inside the lookup's range", "encoding ↔ spec (load plan)", safe_load),
    Property("one group's plan", "the scan and its asserts, group by group: boundary, null skip, destinations, "
             "keys, window bounds, the sync rule, partial tails", "encoding ↔ spec (load plan)", group_plan),
    Property("alignment", "the scheduler's LCM rounding makes N a multiple of every group's block size (the "
             "premise n-aligned)", "premise ↔ vLLM's scheduler", alignment),
    Property("reservation", "allocate_slots never takes more blocks than get_num_blocks_to_allocate reserved",
             "allocator model ↔ vLLM's allocator", reservation),
    Property("lookup window", "the sliding-window lookup defers only when it must, and its hit is exact",
             "encoding ↔ spec (lookup) and the lookup contract", lookup),
    Property("store", "every chunk _build_store_jobs stores was computed by the forward",
             "encoding ↔ spec (store)", store),
    Property("copy contract", "every token a partial-hit copy carries was computed before the step",
             "step model ↔ vLLM's KV-cache manager", copy_contract),
)

OBLIGATIONS: list[Obligation] = [o for p in PROPERTIES for o in p.obligations]

__all__ = ["OBLIGATIONS", "PROPERTIES", "Property"]
