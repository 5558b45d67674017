"""The impl against the spec on many cases: compared as tensors, explained as plans.

The spec runs per case in Python (that is the point of the comparison); its plans
are laid into tensors shaped like the impl's and compared in one go. Only the
requests that differ are converted back into ``LoadPlan``s, so a clean run never
pays for per-block Python on the impl side.
"""

from __future__ import annotations

import io
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from kvbound.spec import Case, LoadPlan, Variant, plan_load

from kvbound.spec import KIND_CODES

from .batch import PlanBatch
from .convert import batch_from_cases, cases_from_batch
from kvbound.spec.asserts import ASSERT_CODE

from .plan import (ASSERTION_VALUE_FIELDS, CODE_UNSUPPORTED, GROUP_FIELDS, NO_KEY, plan_fields,
                   plan_variants, to_load_plans)

_VALUE_KEYS = tuple(ASSERTION_VALUE_FIELDS)


@dataclass
class Disagreement:
    """One case and variant where two implementations of the load plan differ."""

    case: Case
    variant: Variant
    against: str  # "spec" or "symbolic"
    expected: LoadPlan | None  # the spec's plan (None when the reference is the symbolic model)
    impl: LoadPlan
    detail: str = ""


@dataclass
class DiffStats:
    """Counts for the report: per variant the outcomes, per group kind the groups checked."""

    cases: int = 0
    checks: dict = field(default_factory=dict)  # variant -> cases compared
    outcomes: dict = field(default_factory=dict)  # (variant, "ok" | assertion name) -> count
    groups: dict = field(default_factory=dict)  # (variant, kind) -> groups the plan reached
    disagreements: list = field(default_factory=list)

    def add(self, key_dict: dict, key, n: int = 1) -> None:
        key_dict[key] = key_dict.get(key, 0) + n


@dataclass
class SpecSide:
    """The spec's plans of one batch under one variant, flat (built where the spec ran,
    so a worker process hands back a few tensors): per request the failing group, its
    code and how many groups were planned; per planned group, in order, the
    ``GROUP_FIELDS`` and its destination block ids; the failing group's assertion values."""

    variant: Variant
    failing: torch.Tensor  # [R]
    code: torch.Tensor  # [R]
    reached: torch.Tensor  # [R]
    fields: torch.Tensor  # [planned groups, len(GROUP_FIELDS)]
    dst_count: torch.Tensor  # [planned groups]
    dst: torch.Tensor  # flat
    values: torch.Tensor  # [n, 3]: (row, key index, value)
    outcomes: dict  # "ok" | assertion name -> count


def spec_side(cases, variant: Variant, asserts: bool = True) -> SpecSide:
    """Run the spec on ``cases`` and flatten its plans (``plan_load``, per case, in Python)."""
    variant = Variant(variant)
    failing, code, reached, fields, dst_count, dst, values, outcomes = [], [], [], [], [], [], [], {}
    for r, case in enumerate(cases):
        plan = plan_load(case, variant, asserts=asserts)
        a = plan.assertion
        failing.append(-1 if a is None or a.group_index is None else a.group_index)
        code.append(CODE_UNSUPPORTED if plan.unsupported is not None else 0 if a is None else ASSERT_CODE[a.name])
        reached.append(len(plan.groups))
        for gp in plan.groups:
            fields += [getattr(gp, f) for f in GROUP_FIELDS[:-1]]
            fields.append(NO_KEY if gp.boundary_key_tokens is None else gp.boundary_key_tokens)
            dst_count.append(len(gp.dst_block_ids))
            dst += gp.dst_block_ids
        if a is not None:
            values += [(r, _VALUE_KEYS.index(k), v) for k, v in a.values.items()]
        key = "unsupported" if plan.unsupported is not None else "ok" if a is None else a.name.value
        outcomes[key] = outcomes.get(key, 0) + 1
    i64 = torch.int64
    return SpecSide(variant, torch.tensor(failing, dtype=i64), torch.tensor(code, dtype=i64),
                    torch.tensor(reached, dtype=i64), torch.tensor(fields, dtype=i64).view(-1, len(GROUP_FIELDS)),
                    torch.tensor(dst_count, dtype=i64), torch.tensor(dst, dtype=i64),
                    torch.tensor(values, dtype=i64).view(-1, 3), outcomes)


def mismatched_rows(batch, out, spec: SpecSide) -> list[int]:
    """Rows whose impl outputs differ from the spec's in any compared field (what
    ``plan_fields`` compares: outcome, failing group and its values, every planned
    group's fields and destination ids). All in tensors, on the CPU."""
    cells = out.cells
    i64 = torch.int64
    bad = out.failing_group.cpu() != spec.failing
    bad |= out.request_code.cpu() != spec.code
    reached = spec.reached
    impl_reached = torch.zeros(cells.R, dtype=i64).index_add_(0, cells.request.cpu(), out.reached.cpu().to(i64))
    bad |= impl_reached != reached
    # the spec's planned groups as cells: request r's groups 0 .. reached[r] - 1
    R = cells.R
    n = int(reached.sum())
    row = torch.repeat_interleave(torch.arange(R), reached, output_size=n)
    first = torch.cumsum(reached, 0) - reached
    gi = torch.arange(n) - first.index_select(0, row)
    at = (cells.start.cpu().index_select(0, row) + gi).clamp(max=max(cells.size - 1, 0))
    if n:
        want = spec.fields
        got = torch.stack([getattr(out, f).cpu().to(i64).index_select(0, at) for f in GROUP_FIELDS], -1)
        bad.index_fill_(0, row[(got != want).any(-1)], True)
        # destination ids of the same groups
        of = torch.zeros(cells.size, dtype=torch.bool)
        of[at] = True
        ids, count = out.dst_block_ids(batch.block_id, of.to(batch.device))
        ids, count = ids.cpu().to(i64), count.cpu().index_select(0, at)
        want_count = spec.dst_count
        differ = count != want_count
        bad.index_fill_(0, row[differ], True)
        if not bool(differ.any()):
            wrong = ids != spec.dst
            bad.index_fill_(0, torch.repeat_interleave(row, count)[wrong], True)
        else:  # misaligned lists: compare group by group (only when something already differs)
            got_ids, want_ids = ids.tolist(), spec.dst.tolist()
            g_off = w_off = 0
            for j, (c, w) in enumerate(zip(count.tolist(), want_count.tolist())):
                if c != w or got_ids[g_off:g_off + c] != want_ids[w_off:w_off + w]:
                    bad[row[j]] = True
                g_off, w_off = g_off + c, w_off + w
    if spec.values.shape[0]:
        v = spec.values
        fail = spec.failing.index_select(0, v[:, 0]).clamp(min=0)  # a request-level assert: its first cell
        cell = (cells.start.cpu().index_select(0, v[:, 0]) + fail).clamp(max=max(cells.size - 1, 0))
        stacked = torch.stack([out.value(k).cpu().to(i64) for k in _VALUE_KEYS], -1)
        got = stacked[cell, v[:, 1]]
        bad.index_fill_(0, v[got != v[:, 2], 0], True)
    return bad.nonzero().flatten().tolist()


def record(stats: DiffStats, batch, out, spec: SpecSide, cases_of_rows) -> None:
    """Count one variant's outcomes and groups, and turn every mismatched row into a
    ``Disagreement`` (``cases_of_rows(rows)`` gives the ``Case`` views of just those rows)."""
    v = spec.variant
    stats.add(stats.checks, v, spec.failing.shape[0])
    for name, n in spec.outcomes.items():
        stats.add(stats.outcomes, (v, name), n)
    reached_kinds = out.cells.kind[out.reached].cpu()
    counts = torch.bincount(reached_kinds.to(torch.int64), minlength=len(KIND_CODES)).tolist()
    for kind, code in KIND_CODES.items():
        stats.add(stats.groups, (v, kind), counts[code])
    rows = mismatched_rows(batch, out, spec)
    if rows:
        cases = cases_of_rows(rows)
        impl_plans = to_load_plans(batch, out, rows)
        for case, ip in zip(cases, impl_plans):
            sp = plan_load(case, v, asserts=out.asserts)
            stats.disagreements.append(Disagreement(case, v, "spec", sp, ip, _what_differs(sp, ip)))


def diff_against_spec(cases, variants=tuple(Variant), device=None, asserts: bool = True,
                      stats: DiffStats | None = None) -> DiffStats:
    """Run impl and spec on ``cases`` (one batch) and record every disagreement."""
    cases = list(cases)
    stats = stats or DiffStats()
    batch = batch_from_cases(cases, device=device)
    outs = plan_variants(batch, variants, asserts=asserts, check=False)
    stats.cases += len(cases)
    for v, out in outs.items():
        record(stats, batch, out, spec_side(cases, v, asserts), lambda rows: [cases[r] for r in rows])
    return stats


# --- many chunks, the spec side in worker processes ---------------------------------

@dataclass
class CaseChunk:
    """A chunk of ready ``Case``s (case files) in the form the runner takes: the batch,
    and the ``Case``s of any rows."""

    case_list: list
    batch: PlanBatch

    @classmethod
    def of(cls, cases, device=None) -> "CaseChunk":
        cases = list(cases)
        return cls(cases, batch_from_cases(cases, device=device))

    def cases(self, rows=None, validate: bool = True) -> list:
        return list(self.case_list) if rows is None else [self.case_list[r] for r in rows]


@dataclass
class Timings:
    """Seconds per stage of a differential run (wall in this process; the spec's own
    CPU seconds summed over the workers)."""

    generation: float = 0.0  # drawing or converting the chunks
    impl: float = 0.0
    compare: float = 0.0
    spec_cpu: float = 0.0  # plan_load and building the Case views, in the workers
    spec_wait: float = 0.0  # this process waiting for the workers
    wall: float = 0.0

    def as_dict(self) -> dict:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


def _payload(batch: PlanBatch) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.cpu() for k, v in batch.tensors().items()}, buf)
    return buf.getvalue()


def _init_worker() -> None:
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    torch.set_num_threads(1)


def spec_sides(payload: bytes, variants, asserts: bool) -> tuple:
    """The worker's job: the spec's plans of one chunk (sent as tensors), every variant.
    Rows come from a generator or from validated ``Case``s, so they are trusted."""
    t = time.process_time()
    batch = PlanBatch(**torch.load(io.BytesIO(payload)))
    cases = cases_from_batch(batch, validate=False)
    sides = [spec_side(cases, v, asserts) for v in variants]
    buf = io.BytesIO()
    torch.save(sides, buf)
    return buf.getvalue(), time.process_time() - t


def run_differential(chunks, variants=tuple(Variant), device=None, asserts: bool = True, workers: int = 2,
                     stats: DiffStats | None = None, on_chunk=None) -> tuple:
    """impl vs spec over an iterator of chunks (``GeneratedBatch``, ``CaseChunk``, or
    anything with ``.batch`` and ``.cases(rows)``). The impl plans each chunk here while
    ``workers`` processes (``concurrent.futures``) run the spec on the chunks before it;
    ``workers=0`` runs the spec in this process. ``on_chunk(n)`` is called as each chunk
    of n cases is compared (progress). Returns (DiffStats, Timings)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    variants = [Variant(v) for v in variants]
    stats = stats or DiffStats()
    tm = Timings()
    t_start = time.perf_counter()
    pool = None
    if workers > 0:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker)
    in_flight: deque = deque()

    def finish(item) -> None:
        chunk, batch, outs, fut = item
        t = time.perf_counter()
        sides, cpu = fut.result() if pool else fut
        sides = torch.load(io.BytesIO(sides), weights_only=False)
        tm.spec_wait += time.perf_counter() - t
        tm.spec_cpu += cpu
        t = time.perf_counter()
        stats.cases += batch.shape[0]
        for side in sides:
            record(stats, batch, outs[side.variant], side, lambda rows: chunk.cases(rows))
        tm.compare += time.perf_counter() - t
        if on_chunk:
            on_chunk(batch.shape[0])

    try:
        it = iter(chunks)
        while True:
            t = time.perf_counter()
            chunk = next(it, None)
            tm.generation += time.perf_counter() - t
            if chunk is None:
                break
            batch = chunk.batch
            payload = _payload(batch)
            fut = pool.submit(spec_sides, payload, variants, asserts) if pool else spec_sides(payload, variants, asserts)
            t = time.perf_counter()
            outs = plan_variants(batch, variants, asserts=asserts, check=False)
            tm.impl += time.perf_counter() - t
            in_flight.append((chunk, batch, outs, fut))
            while in_flight and (len(in_flight) > 2 * max(workers, 1) or (pool and in_flight[0][3].done())):
                finish(in_flight.popleft())
        while in_flight:
            finish(in_flight.popleft())
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    tm.wall = time.perf_counter() - t_start
    return stats, tm


def _what_differs(spec: LoadPlan, impl: LoadPlan) -> str:
    s, i = plan_fields(spec), plan_fields(impl)
    if s[0] != i[0]:
        return f"outcome: spec {s[0]} vs impl {i[0]}"
    for a, b in zip(s[1], i[1]):
        if a != b:
            return f"group {a.group_index}: spec {a} vs impl {b}"
    return "groups planned: spec %d vs impl %d" % (len(s[1]), len(i[1]))


def agrees_with_spec(case: Case, variant: Variant, asserts: bool = True) -> bool:
    """One case, the slow clear way (no tensors compared): for shrinking and tests."""
    batch = batch_from_cases([case], device="cpu")
    out = plan_variants(batch, (variant,), asserts=asserts)[Variant(variant)]
    return plan_fields(to_load_plans(batch, out)[0]) == plan_fields(plan_load(case, variant, asserts=asserts))
