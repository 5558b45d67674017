"""Shadow KV: what the real KV cache would hold, per block, and the checks on it.

Part of the side package (standard library only; vLLM's objects come in through ``eng``),
imported by ``engine.py``. Three parts, wired here to one engine and its tap: the content
model (``content.py`` ``ContentModel``: prefix identities, the forward's writes, the read
check), the tier's transfers (``tier.py`` ``TierTransfers``: the connector's jobs as the tap
shows them, the CPU tier's copies) and the store contract (``store_contract.py``
``StoreContract``: what a store may copy, the fence, what the tier must hold after drain).
"""

import random

from .content import ContentModel, Report
from .store_contract import StoreContract
from .tier import TierTransfers


class ShadowKV:
    """The three parts on one engine, subscribed to its tap."""

    def __init__(self, eng):
        self.eng = eng
        self.stats = {}
        kvm = eng.sched.kv_cache_manager
        self.report = Report(eng.violations, lambda: eng.step_no)
        self.content = ContentModel(kvm.coordinator.single_type_managers, [g["kind"] for g in eng.lay["groups"]],
                                    eng.sched, self.report, self.stats)
        bpc = eng.lay.get("blocks_per_chunk", 1)
        self.contract = StoreContract(eng, self.content, self.report, bpc)
        self.transfers = TierTransfers(bpc, self.content, self.contract, self.report,
                                       random.Random(repr(eng.par.get("seed", 0)) + "/shadow"), self.stats)
        self.contract.tier = self.transfers
        self.content.guard = self.contract.guard_write

    def subscribe(self, tap):
        self.transfers.subscribe(tap, self.eng)
        tap.subscribe("update_states", self.content.update_states)
        tap.subscribe("forward", self.content.forward)
