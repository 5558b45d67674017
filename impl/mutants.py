"""The impl side of the mutant table: each named fault planted in the torch impl at
runtime, by swapping one step function of ``kvbound.impl.plan`` for a faulty one
(the source is never edited; ``applied`` restores it).

The names, what each fault is and its class are ``kvbound.proofs.mutants.MUTANTS``
(the one table; the tool checks every name here against it). Each entry below only
says how the fault reads in the impl's steps.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch

from kvbound.spec import AssertName, ReleaseFeatures, Variant
from kvbound.spec.asserts import ASSERT_CODE

from . import plan as P
from kvbound.spec import STATE_N

from .batch import PLANE_NONNULL, floordiv, pack_slots
from .cells import cell_blocks


def _start_in(lo_offset: int = 0, hi_offset: int = 0):
    """load_start over range(scan_from + lo_offset, k + hi_offset) (default start k); a
    loop past k reads blocks[k], which past a table of length k raises (IndexError):
    stashed for ``assert_codes`` to report as table_length."""
    def load_start(cells, geo, variant, words):
        lo = geo.f if variant is not Variant.LEGACY else torch.zeros_like(geo.f)
        lo = (lo + lo_offset).clamp(min=0)
        first = P.first_set_slot(words, P.keep_from(lo, words.shape[0]), cells.L).to(geo.k.dtype)
        hi = geo.k + hi_offset
        start = torch.where(first < hi, first, geo.k)
        cells.past_end = (first >= geo.k) & (cells.table_length <= geo.k) if hi_offset > 0 else None
        return start
    return load_start


def _codes_with_past_end(orig):
    def assert_codes(cells, geo, variant, release, asserts, start, pending, window):
        code = orig(cells, geo, variant, release, asserts, start, pending, window)
        past = getattr(cells, "past_end", None)
        if past is None:
            return code
        return torch.where((code == 0) & past, ASSERT_CODE[AssertName.TABLE_LENGTH], code).to(torch.uint8)
    return assert_codes


def _scan_words(extra=None, nonnull_only=False, sync=True):
    def make(orig):
        def scan_words(cells, variant, unhashed):
            if nonnull_only:
                return cells.plane(PLANE_NONNULL)
            words = orig(cells, variant if sync else (Variant.FIXED if variant is Variant.FIXED_SYNC else variant),
                         unhashed)
            if extra is not None:
                words = words | pack_slots(extra(cells).to(torch.uint8))
            return words
        return scan_words
    return make


def _then(change):
    """A step ``orig(arg)`` followed by ``change(arg, result)`` in place (a geometry or
    cells field replaced)."""
    def make(orig):
        def step(arg):
            out = orig(arg)
            change(arg, out)
            return out
        return step
    return make


def _by_position(batch, cells) -> None:
    """0.29's pairing: the i-th offloaded config reads blocks.blocks[i], not [group_idx]."""
    rank = torch.arange(cells.size, device=cells.request.device) - cells.start.index_select(0, cells.request)
    flat = cells.request * cells.G + rank
    R, G, L = batch.shape
    cells.table_flat = flat
    cells.state, cells.words = cell_blocks(batch, flat)
    cells.table_length = batch.table_length.reshape(R * G).index_select(0, flat).to(cells.table_length.dtype)


def _floor_f(cells, geo) -> None:
    geo.f = floordiv(cells.N, cells.b)


def _floor_end(cells, geo) -> None:
    end = floordiv(cells.T, geo.tpc)
    geo.num_chunks = end
    geo.end_chunk_limit = end if cells.tail is None else end - cells.tail


def _tail_chunk_kept(cells, geo) -> None:
    geo.end_chunk_limit = geo.num_chunks


def _keys_from_prompt(batch, cells) -> None:
    cells.num_tokens = batch.num_prompt_tokens.index_select(0, cells.request).to(cells.num_tokens.dtype)


def _no_margin(batch, cells) -> None:
    if cells.requests is not None:
        cells.boundary_key = cells.requests.boundary.index_select(0, cells.request).to(cells.N.dtype)


def _assert_order(orig):
    """The fixed variants check the window bound before the alignment assert."""
    def assert_codes(cells, geo, variant, release, asserts, start, pending, window):
        code = orig(cells, geo, variant, release, asserts, start, pending, window)
        if not asserts or variant is Variant.LEGACY or release.window_slack is None:
            return code
        over = geo.windowed & (pending > window * cells.bpc + release.window_slack)
        swap = (code == ASSERT_CODE[AssertName.ALIGNMENT]) & over
        return torch.where(swap, ASSERT_CODE[AssertName.WINDOW_BOUND], code).to(torch.uint8)
    return assert_codes


def _release(**changes):
    def make(orig):
        def step(*args):
            args = list(args)
            for i, a in enumerate(args):
                if isinstance(a, ReleaseFeatures):
                    args[i] = replace(a, **changes)
            return orig(*args)
        return step
    return make


def _no_scan_assert(which: Variant):
    def make(orig):
        def assert_codes(cells, geo, variant, release, asserts, start, pending, window):
            if which is Variant.LEGACY and variant is Variant.LEGACY:  # N <= start * b always holds
                return orig(cells, geo, variant, release, asserts, torch.full_like(start, 2**14), pending, window)
            if which is not Variant.LEGACY and variant is not Variant.LEGACY:
                geo = replace(geo, misaligned=torch.zeros_like(geo.misaligned))
            return orig(cells, geo, variant, release, asserts, start, pending, window)
        return assert_codes
    return make


def _key_start(shift):
    def make(orig):
        def offload_key_chunks(cells, geo, start, pending):
            return orig(cells, geo, start + shift(cells), pending)
        return offload_key_chunks
    return make


def _pending(offset: int):
    def make(orig):
        def pending_blocks(geo, start):
            return orig(geo, start) + offset
        return pending_blocks
    return make


def _tail_assert_dropped(orig):
    def request_outcome(cells, release, asserts):
        out = orig(cells, release, False)  # keeps "unsupported", drops the partial_tail assert
        return out
    return request_outcome


# name (kvbound.proofs.mutants) -> [(step function name in kvbound.impl.plan, make(original) -> faulty)]
IMPL_MUTANTS = {
    "scan-from-zero": [("load_start", lambda orig: lambda c, g, v, w: orig(c, g, Variant.LEGACY, w))],
    "scan-nulls": [("scan_words", _scan_words(extra=lambda c: c.states() == STATE_N))],
    "floor-f": [("group_geometry", _then(_floor_f))],
    "unhashed-test-dropped": [("scan_words", _scan_words(nonnull_only=True))],
    "start-equals-f": [("load_start", lambda orig: lambda c, g, v, w: torch.minimum(g.f, g.k))],
    "loop-from-f+1": [("load_start", lambda orig: _start_in(lo_offset=1))],
    "loop-from-f-1": [("load_start", lambda orig: _start_in(lo_offset=-1))],
    "loop-to-k-1": [("load_start", lambda orig: _start_in(hi_offset=-1))],
    "loop-to-k+1": [("load_start", lambda orig: _start_in(hi_offset=1)), ("assert_codes", _codes_with_past_end)],
    "assert-order": [("assert_codes", _assert_order)],
    "window-slack": [("assert_codes", _release(window_slack=0))],
    "window-retained": [("window_in_chunks", _release(window_counts_retained=False))],
    "alignment-dropped": [("assert_codes", _no_scan_assert(Variant.FIXED))],
    "boundary-dropped": [("assert_codes", _no_scan_assert(Variant.LEGACY))],
    "sync-rule": [("scan_words", _scan_words(sync=False))],
    "keys-slice-start": [("offload_key_chunks", _key_start(lambda c: c.bpc - 1))],  # floor((s+bpc-1)/bpc)
    "keys-from-start//bpc+1": [("offload_key_chunks", _key_start(lambda c: c.bpc))],
    "keys-slice-end": [("group_geometry", _then(_floor_end))],
    "keys-prompt-only": [("real_cells", _then(_keys_from_prompt))],
    "pending+1": [("pending_blocks", _pending(1))],
    "pending-1": [("pending_blocks", _pending(-1))],
    "partial-tail-chunk": [("group_geometry", _then(_tail_chunk_kept))],
    "partial-tail-margin": [("real_cells", _then(_no_margin))],
    "partial-tail-assert": [("request_outcome", _tail_assert_dropped)],
    "group-iteration": [("real_cells", _then(_by_position))],
}


@contextmanager
def applied(name: str):
    """Plant mutant ``name`` in ``kvbound.impl.plan`` for the duration of the block."""
    if name not in IMPL_MUTANTS:
        raise KeyError(f"no impl mutant {name!r}; known: {', '.join(IMPL_MUTANTS)}")
    saved = []
    try:
        for attr, make in IMPL_MUTANTS[name]:
            orig = getattr(P, attr)
            saved.append((attr, orig))
            setattr(P, attr, make(orig))
        yield
    finally:
        for attr, orig in reversed(saved):
            setattr(P, attr, orig)


def kill_run(chunks, names=None, variants=tuple(Variant), on_mutant=None) -> dict:
    """Each mutant planted in turn and run against the spec's plans of ``chunks`` (computed
    once, in this process): name -> the first case (and variant) that disagrees, or None
    (it survived)."""
    from .differential import mismatched_rows, spec_side

    chunks = list(chunks)
    sides = [[spec_side(ch.cases(validate=False), v) for v in variants] for ch in chunks]
    killed = {}
    for name in names or IMPL_MUTANTS:
        killed[name] = None
        with applied(name):
            for ch, chunk_sides in zip(chunks, sides):
                outs = P.plan_variants(ch.batch, variants, check=False)
                for side in chunk_sides:
                    rows = mismatched_rows(ch.batch, outs[side.variant], side)
                    if rows:
                        killed[name] = f"{ch.cases(rows[:1])[0].name} ({side.variant.value})"
                        break
                if killed[name]:
                    break
        if on_mutant:
            on_mutant(name, killed[name])
    return killed


MUTANT_SCOPE = "len=4,bpc=1,sync=0,prompt=0,kinds=SCM"  # unaligned N beside a broken window: assert-order


def mutant_chunks(seed: int = 0, files=(), device=None) -> list:
    """The cases a mutation run checks: ``files``, 3,000 cases of every family (random_cases,
    "all"), 3,000 from the tensor generator and every case of ``MUTANT_SCOPE``."""
    from kvbound.spec.strategies import random_cases

    from .differential import CaseChunk
    from .exhaustive import Scope, scope_chunks
    from .generate import generate_batch

    return ([CaseChunk.of(list(files) + list(random_cases(3000, seed=seed, family="all")), device),
             generate_batch(3000, seed, device=device)]
            + list(scope_chunks(Scope.parse(MUTANT_SCOPE), 10_000, device)))
