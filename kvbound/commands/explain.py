"""``kvbound explain CASE``: each group's table drawn, and what every variant does with it."""

from __future__ import annotations

from kvbound.draw import explain_case
from kvbound.spec import load_case_paths

from . import add_case_args, add_variant_args, selected_variants

SEPARATOR_WIDTH = 100  # the rule between two cases' drawings


def register(sub):
    p = sub.add_parser(
        "explain",
        help="draw each group's block table and say what each variant does",
        description="Draw every group's block table ([H] hashed, [·] null, [U] unhashed below f, [F] fresh) "
        "with f, k and each variant's load start, then say which assert fires (with its numbers) or "
        "which blocks and keys are loaded.",
    )
    add_case_args(p)
    add_variant_args(p)
    return p


def run(args) -> int:
    variants = selected_variants(args)
    for i, case in enumerate(load_case_paths(args.cases)):
        if i:
            print("\n" + "=" * SEPARATOR_WIDTH + "\n")
        print(explain_case(case, variants, args.vllm_version))
    return 0
