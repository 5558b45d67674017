"""vLLM's asserts in ``update_state_after_alloc``: one table, owned by the spec.

Each row says, for one ``AssertName``: the numbers the spec reports when it fires
(``Assertion.values``), whether it fires for the request before any group, and how
the statement reads in a release's source (docs/vllm-semantics.md#asserts), so a real
``AssertionError`` is named by the same table. Its integer code (the encoding's and
the batched impl's outcome code; 0 = no assert) is its position in the table, which is
vLLM's order within a group. Everything else derives from here: ``proofs.encoding``
(``FAIL_CODE``), ``impl.plan`` (``ASSERT_CODES``, ``ASSERTION_VALUES``),
``conform.compare`` (the statement patterns). A new assert is a new ``AssertName``,
a row here, and its semantics in spec/plan.py, proofs/encoding.py and impl/plan.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from .vocab import AssertName

NO_ASSERT = 0  # the outcome code of a plan no assert stopped

_BLOCK = r"(?:tokens_per_block|gpu_block_size|block_size)"  # the block size's name, 0.20 – 0.33


@dataclass(frozen=True)
class AssertRow:
    name: AssertName
    values: tuple[str, ...]  # Assertion.values keys the spec reports when it fires
    source: str  # regex over the statement as the release writes it (whitespace collapsed)
    request_level: bool = False  # fires before the per-group loop: Assertion.group_index is None


ASSERTS = (
    AssertRow(AssertName.TABLE_LENGTH, ("table_length", "num_gpu_blocks"),
              r"^assert len\(\w*blocks\w*\) >= \w+$"),
    AssertRow(AssertName.BOUNDARY, ("num_locally_computed_tokens", "load_start_gpu_block_idx", "tokens_per_block",
                                    "first_fresh_gpu_block_idx"),
              rf"^assert num_locally_computed_tokens <= \w+ \* \w*{_BLOCK}\w*$"),
    AssertRow(AssertName.ALIGNMENT, ("num_locally_computed_tokens", "tokens_per_block", "load_start_gpu_block_idx"),
              rf"^assert num_locally_computed_tokens % \w*{_BLOCK}\w* == 0$"),
    # 0.27+ allow one block more than the window (``+ 1``, ReleaseFeatures.window_slack); 0.21 – 0.26 did not.
    AssertRow(AssertName.WINDOW_BOUND, ("num_pending_gpu_blocks", "sliding_window_size_in_chunks", "blocks_per_chunk",
                                        "load_start_gpu_block_idx"),
              r"^assert \w+ <= [\w.]*sliding_window_size_in_chunks \* [\w.]+( \+ 1)?$"),
    AssertRow(AssertName.KEYS_LENGTH, ("num_offload_keys", "end_chunk_idx", "load_start_gpu_block_idx"),
              r"^assert len\(\w*offload_keys\w*\) >= \w+$"),
    AssertRow(AssertName.PARTIAL_TAIL, ("partial_tail_boundary", "num_cached_tokens"),
              r"^assert partial_tail_boundary == num_cached_tokens$", request_level=True),
)

ROW = {row.name: row for row in ASSERTS}
ASSERT_CODE = {row.name: i + 1 for i, row in enumerate(ASSERTS)}  # name -> outcome code (NO_ASSERT: none)
ASSERT_OF_CODE = {code: name for name, code in ASSERT_CODE.items()}
REQUEST_ASSERTS = tuple(row.name for row in ASSERTS if row.request_level)

_missing = [n.value for n in AssertName if n not in ROW]
if _missing:
    raise ImportError(f"spec/asserts.py: AssertName {', '.join(_missing)} has no row in ASSERTS")
