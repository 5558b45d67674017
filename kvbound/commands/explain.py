"""``kvbound explain CASE``: each group's table drawn, and what every variant does with it."""

from __future__ import annotations

from kvbound.draw import explain_case
from kvbound.draw_calls import explain_lookup, explain_store
from kvbound.spec.lookup_case import LookupCase
from kvbound.spec.store_case import StoreCase

from . import add_case_args, add_variant_args, read_cases, selected_variants

SEPARATOR_WIDTH = 100  # the rule between two cases' drawings


def register(sub):
    p = sub.add_parser(
        "explain",
        help="draw each group's block table and say what each variant does",
        description="Draw every group's block table ([H] hashed, [·] null, [U] unhashed below f, [F] fresh) "
        "with f, k and each variant's load start, then say which assert fires (with its numbers) or "
        "which blocks and keys are loaded. A lookup case: each group's keys on its own chunk grid with the tier's "
        "answers and the order asked, N, the hit's boundary and the chunks each group reads for it, and which "
        "clause of the lookup contract holds. A store case: the group's chunks computed, allocated, keyed and "
        "stored by each release's store spec (or --vllm-version X's), the horizon, and what the release did. A "
        "trace finding file: the case it names.",
    )
    add_case_args(p)
    add_variant_args(p)
    return p


def run(args) -> int:
    variants = selected_variants(args)
    for i, case in enumerate(read_cases(args.cases)):
        if i:
            print("\n" + "=" * SEPARATOR_WIDTH + "\n")
        if isinstance(case, LookupCase):
            print(explain_lookup(case, args.vllm_version))
        elif isinstance(case, StoreCase):
            print(explain_store(case, args.vllm_version))
        else:
            print(explain_case(case, variants, args.vllm_version))
    return 0
