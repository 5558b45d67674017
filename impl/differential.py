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
from .plan import ASSERT_CODES, ASSERTION_VALUE_FIELDS, plan_fields, plan_variants, to_load_plans

_VALUE_KEYS = tuple(ASSERTION_VALUE_FIELDS)
_GROUP_FIELDS = ("num_gpu_blocks", "first_fresh_gpu_block_idx", "load_start_gpu_block_idx",
                 "num_pending_gpu_blocks", "start_chunk_idx", "end_chunk_idx")


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


def _spec_tensors(cases, plans, G: int):
    """The spec's plans laid out as the impl's tensors: [R] outcome, [R, G] group fields
    (with the reached mask), the flat dst ids, and the failing group's assertion values."""
    R = len(cases)
    failing = [-1] * R
    code = [0] * R
    at: list = []  # flat r * G + g of every reached group
    cols: dict = {f: [] for f in _GROUP_FIELDS}
    dst: list = []
    values = []  # (row, group, key index, value)
    for r, plan in enumerate(plans):
        for gp in plan.groups:
            at.append(r * G + gp.group_index)
            for f in _GROUP_FIELDS:
                cols[f].append(getattr(gp, f))
        a = plan.assertion
        if a is not None:
            failing[r], code[r] = a.group_index, ASSERT_CODES[a.name]
            values += [(r, a.group_index, _VALUE_KEYS.index(k), v) for k, v in a.values.items()]
        else:
            dst += [i for gp in plan.groups for i in gp.dst_block_ids]
    at_t = torch.tensor(at, dtype=torch.int64)
    reached = torch.zeros(R * G, dtype=torch.bool)
    reached[at_t] = True
    t = {}
    for f, v in cols.items():
        full = torch.zeros(R * G, dtype=torch.int64)
        full[at_t] = torch.tensor(v, dtype=torch.int64)
        t[f] = full.view(R, G)
    return (torch.tensor(failing), torch.tensor(code), reached.view(R, G), t,
            torch.tensor(dst, dtype=torch.int64), values)


def mismatched_rows(batch, out, cases, plans) -> list[int]:
    """Rows whose impl outputs differ from the spec's ``plans`` in any compared field
    (what ``plan_fields`` compares: outcome, failing group and its values, every
    reached group's fields and destination ids)."""
    R, G, _ = batch.shape
    failing, code, reached, cols, dst, values = _spec_tensors(cases, plans, G)
    bad = (out.failing_group.cpu() != failing) | (out.request_code.cpu() != code)
    bad |= (out.reached.cpu() != reached).any(1)
    for f, want in cols.items():
        got = getattr(out, f).cpu().to(torch.int64)
        bad |= ((got != want) & reached).any(1)
    if values:
        v = torch.tensor(values, dtype=torch.int64)
        stacked = torch.stack([out.value(k).cpu().to(torch.int64) for k in _VALUE_KEYS], -1)
        got = stacked[v[:, 0], v[:, 1], v[:, 2]]
        bad.index_put_((v[got != v[:, 3], 0],), torch.tensor(True), accumulate=False)
    ok_rows = out.ok.cpu()
    mask = out.dst_mask.cpu() & reached.unsqueeze(-1) & ok_rows.view(R, 1, 1)
    got_dst = batch.block_id.cpu()[mask].to(torch.int64)
    if got_dst.shape != dst.shape or bool((got_dst != dst).any()):
        # the flat lists differ somewhere: compare row by row to say where
        per_row = mask.sum((1, 2)).tolist()
        want_rows = [sum(len(gp.dst_block_ids) for gp in p.groups) if p.ok else 0 for p in plans]
        g_off = w_off = 0
        for r in range(R):
            if per_row[r] != want_rows[r] or got_dst[g_off:g_off + per_row[r]].tolist() != dst[w_off:w_off + want_rows[r]].tolist():
                bad[r] = True
            g_off += per_row[r]
            w_off += want_rows[r]
    return bad.nonzero().flatten().tolist()


def diff_against_spec(cases, variants=tuple(Variant), device=None, asserts: bool = True,
                      stats: DiffStats | None = None) -> DiffStats:
    """Run impl and spec on ``cases`` (one batch) and record every disagreement."""
    cases = list(cases)
    stats = stats or DiffStats()
    batch = batch_from_cases(cases, device=device)
    outs = plan_variants(batch, variants, asserts=asserts, check=False)
    stats.cases += len(cases)
    for v, out in outs.items():
        plans = [plan_load(c, v, asserts=asserts) for c in cases]
        stats.add(stats.checks, v, len(cases))
        for p in plans:
            stats.add(stats.outcomes, (v, "ok" if p.ok else p.assertion.name.value))
        kinds = batch.kind.cpu()
        reached = out.reached.cpu()
        for kind, code in KIND_CODES.items():
            stats.add(stats.groups, (v, kind), int((reached & (kinds == code)).sum()))
        rows = mismatched_rows(batch, out, cases, plans)
        if rows:
            impl_plans = to_load_plans(batch, out, rows)
            for r, ip in zip(rows, impl_plans):
                stats.disagreements.append(
                    Disagreement(cases[r], v, "spec", plans[r], ip, _what_differs(plans[r], ip))
                )
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
