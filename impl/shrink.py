"""Shrink a failing case to a minimal one that still fails, greedily.

Random batches have no Hypothesis to shrink them, so a disagreement found there is
cut down here before it is saved to the corpus: fewer groups, shorter tables,
nulls for blocks, smaller numbers, small block ids. A candidate that is not a
valid ``Case`` is skipped (``CaseError``), so every step stays a real input.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable, Iterator

from kvbound.spec import NULL, Block, Case, CaseError, Group


def _with_groups(case: Case, groups) -> Case:
    return replace(case, groups=tuple(groups))


def _with_table(case: Case, gi: int, blocks) -> Case:
    groups = list(case.groups)
    groups[gi] = Group(groups[gi].config, tuple(blocks))
    return _with_groups(case, groups)


def _candidates(case: Case) -> Iterator[Callable[[], Case]]:
    """Smaller neighbours, biggest cuts first, as thunks: building one may raise ``CaseError``."""
    n = len(case.groups)
    for gi in range(n):
        if n > 1:
            yield partial(_with_groups, case, case.groups[:gi] + case.groups[gi + 1:])
    for fld in ("num_locally_computed_tokens", "num_external_tokens", "num_prompt_tokens"):
        v = getattr(case, fld)
        for smaller in sorted({0, v // 2, v - 1}):
            if 0 <= smaller < v:
                yield partial(replace, case, **{fld: smaller})
    for gi, g in enumerate(case.groups):
        blocks = list(g.blocks)
        if blocks:
            yield partial(_with_table, case, gi, blocks[: len(blocks) // 2])
            yield partial(_with_table, case, gi, blocks[:-1])
    if case.sync_load:
        yield partial(replace, case, sync_load=False)
    if case.blocks_per_chunk > 1:
        yield partial(replace, case, blocks_per_chunk=1)
    for gi, g in enumerate(case.groups):
        blocks = list(g.blocks)
        for i, blk in enumerate(blocks):
            if not blk.is_null:
                yield partial(_with_table, case, gi, blocks[:i] + [NULL] + blocks[i + 1:])
    # small, dense block ids in table order
    ids = [b.block_id for g in case.groups for b in g.blocks if not b.is_null]
    if ids != list(range(1, len(ids) + 1)):
        it = iter(range(1, len(ids) + 1))
        groups = [
            Group(g.config, tuple(b if b.is_null else Block(b.state, next(it)) for b in g.blocks))
            for g in case.groups
        ]
        yield partial(_with_groups, case, groups)


def shrink_case(case: Case, fails: Callable[[Case], bool], max_steps: int = 3000) -> Case:
    """The smallest case reached by accepting any smaller neighbour that still ``fails``."""
    steps = 0
    improved = True
    while improved and steps < max_steps:
        improved = False
        for cand in _iter_valid(case):
            steps += 1
            if fails(cand):
                case, improved = cand, True
                break
            if steps >= max_steps:
                break
    return case


def _iter_valid(case: Case) -> Iterator[Case]:
    for build in _candidates(case):
        try:
            yield build()
        except CaseError:
            continue
