"""The MultiConnector fence finding (docs/trace.md "The fence misses blocks another connector
allocated", and the default full-range campaign's table): a block freed under a store that has
not yet read it is handed to a request the P/D consumer serves; MultiConnector gives the
OffloadingConnector num_external_tokens 0 for it, so its allocation is never recorded
(0.29.0 offloading/scheduler.py:996 returns before :1017) and the store is not fenced before
the P/D load writes the block. On a sliding-window group the block can be one the window
dropped from a running request (remove_skipped_blocks, 0.29.0 v1/core/kv_cache_manager.py:503).
Each saved reproducer is replayed on releases inside and outside its range."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT

FOUND = ROOT / "docs" / "trace-findings"
WINDOW = FOUND / "0-29-0-swa-multi-pd-store-foreign-source-3req.json"  # reproduces on 0.23.0 - 0.29.0
FULL = FOUND / "0-30-0-swa-multi-pd-store-foreign-source-7req.json"  # a full-attention group: 0.30.0 - 0.32.0


def _kinds(workers, release, path):
    from kvbound.trace import runner as R

    doc = json.loads(path.read_text())
    seg = doc["segment"]
    _, w = workers(release)
    found, _ = R.check_result(release, doc["layout"], seg, w.job(dict(seg, max_steps=3000)))
    return {f.kind for f in found}


@pytest.mark.parametrize("release,reproduces", [("0.29.0", True), ("0.30.0", False)])
def test_the_window_form_stores_a_block_the_pd_load_rewrote(workers, release, reproduces):
    # 0.30.0's store reachability mask stores only the chunk that stays in the window
    assert ("store:foreign_source" in _kinds(workers, release, WINDOW)) is reproduces


@pytest.mark.parametrize("release,reproduces", [("0.32.0", True), ("0.33.0", False)])
def test_the_full_attention_form_ends_when_0_33_records_every_allocation(workers, release, reproduces):
    # 0.33.0 records a request's blocks before the num_external_tokens == 0 return (:1351-1362)
    assert ("store:foreign_source" in _kinds(workers, release, FULL)) is reproduces
