"""The impl against the spec on many cases: compared as tensors, explained as plans.

The spec runs per case in Python (that is the point of the comparison); its plans
are laid into tensors shaped like the impl's and compared in one go. Only the
requests that differ are converted back into ``LoadPlan``s, so a clean run never
pays for per-block Python on the impl side.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbound.spec import Case, LoadPlan, Variant, plan_load

from .batch import KIND_CODES, batch_from_cases
from .plan import ASSERT_CODES, ASSERTION_VALUE_FIELDS, GROUP_FIELDS, plan_fields, plan_variants, to_load_plans

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
    """The spec's plans of one batch under one variant, as flat lists (cheap to pickle
    from a worker process): per request the failing group, its code and how many
    groups were planned; per planned group, in order, the ``GROUP_FIELDS`` and its
    destination block ids; the failing group's assertion values."""

    variant: Variant
    failing: list
    code: list
    reached: list
    fields: list  # len(GROUP_FIELDS) ints per planned group
    dst_count: list  # per planned group
    dst: list
    values: list  # (row, key index, value)
    outcomes: dict  # "ok" | assertion name -> count


def spec_side(cases, variant: Variant, asserts: bool = True) -> SpecSide:
    """Run the spec on ``cases`` and flatten its plans (``plan_load``, per case, in Python)."""
    variant = Variant(variant)
    side = SpecSide(variant, [], [], [], [], [], [], [], {})
    for r, case in enumerate(cases):
        plan = plan_load(case, variant, asserts=asserts)
        a = plan.assertion
        side.failing.append(-1 if a is None else a.group_index)
        side.code.append(0 if a is None else ASSERT_CODES[a.name])
        side.reached.append(len(plan.groups))
        for gp in plan.groups:
            side.fields += [getattr(gp, f) for f in GROUP_FIELDS]
            side.dst_count.append(len(gp.dst_block_ids))
            side.dst += gp.dst_block_ids
        if a is not None:
            side.values += [(r, _VALUE_KEYS.index(k), v) for k, v in a.values.items()]
        key = "ok" if a is None else a.name.value
        side.outcomes[key] = side.outcomes.get(key, 0) + 1
    return side


def mismatched_rows(batch, out, spec: SpecSide) -> list[int]:
    """Rows whose impl outputs differ from the spec's in any compared field (what
    ``plan_fields`` compares: outcome, failing group and its values, every planned
    group's fields and destination ids). All in tensors, on the CPU."""
    cells = out.cells
    i64 = torch.int64
    bad = out.failing_group.cpu() != torch.tensor(spec.failing, dtype=i64)
    bad |= out.request_code.cpu() != torch.tensor(spec.code, dtype=i64)
    reached = torch.tensor(spec.reached, dtype=i64)
    impl_reached = torch.where(out.ok, cells.G, out.failing_group).cpu().clamp(max=cells.count.cpu())
    bad |= impl_reached != reached
    # the spec's planned groups as cells: request r's groups 0 .. reached[r] - 1
    R = cells.R
    n = int(reached.sum())
    row = torch.repeat_interleave(torch.arange(R), reached, output_size=n)
    first = torch.cumsum(reached, 0) - reached
    gi = torch.arange(n) - first.index_select(0, row)
    at = (cells.start.cpu().index_select(0, row) + gi).clamp(max=max(cells.size - 1, 0))
    if n:
        want = torch.tensor(spec.fields, dtype=i64).view(n, len(GROUP_FIELDS))
        got = torch.stack([getattr(out, f).cpu().to(i64).index_select(0, at) for f in GROUP_FIELDS], -1)
        bad.index_fill_(0, row[(got != want).any(-1)], True)
        # destination ids of the same groups
        of = torch.zeros(cells.size, dtype=torch.bool)
        of[at] = True
        ids, count = out.dst_block_ids(batch.block_id, of.to(batch.device))
        ids, count = ids.cpu().to(i64), count.cpu().index_select(0, at)
        want_count = torch.tensor(spec.dst_count, dtype=i64)
        differ = count != want_count
        bad.index_fill_(0, row[differ], True)
        if not bool(differ.any()):
            wrong = ids != torch.tensor(spec.dst, dtype=i64)
            bad.index_fill_(0, torch.repeat_interleave(row, count)[wrong], True)
        else:  # misaligned lists: compare group by group (only when something already differs)
            got_ids, want_ids = ids.tolist(), spec.dst
            g_off = w_off = 0
            for j, (c, w) in enumerate(zip(count.tolist(), want_count.tolist())):
                if c != w or got_ids[g_off:g_off + c] != want_ids[w_off:w_off + w]:
                    bad[row[j]] = True
                g_off, w_off = g_off + c, w_off + w
    if spec.values:
        v = torch.tensor(spec.values, dtype=i64)
        fail = torch.tensor(spec.failing, dtype=i64).index_select(0, v[:, 0])
        cell = (cells.start.cpu().index_select(0, v[:, 0]) + fail).clamp(max=max(cells.size - 1, 0))
        stacked = torch.stack([out.value(k).cpu().to(i64) for k in _VALUE_KEYS], -1)
        got = stacked[cell, v[:, 1]]
        bad.index_fill_(0, v[got != v[:, 2], 0], True)
    return bad.nonzero().flatten().tolist()


def record(stats: DiffStats, batch, out, spec: SpecSide, cases_of_rows) -> None:
    """Count one variant's outcomes and groups, and turn every mismatched row into a
    ``Disagreement`` (``cases_of_rows(rows)`` gives the ``Case`` views of just those rows)."""
    v = spec.variant
    stats.add(stats.checks, v, len(spec.failing))
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
