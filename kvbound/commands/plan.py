"""``kvbound plan CASE...``: one JSON line per case, the fields vLLM's load job sees."""

from __future__ import annotations

import json

from kvbound.spec import Variant, plan_for_version, plan_load
from kvbound.spec.lookup import lookup_for_version
from kvbound.spec.lookup_case import LookupCase
from kvbound.spec.store_case import StoreCase, plan_store
from kvbound.spec.versions import LATEST

from . import add_case_args, add_variant_args, read_cases, selected_variants


def register(sub):
    p = sub.add_parser(
        "plan",
        help="print the load plan of each case as one JSON line",
        description="Run the executable spec on case files (.json / .jsonl / directories) and print one "
        "JSON line per case: name, outcome (ok, assertion_error or unsupported, with a reason), assertion, "
        "dst_block_ids, group_sizes, block_indices, keys ([group_idx, chunk_idx]; a partial tail's "
        "[group_idx, \"boundary\", key_tokens]). --vllm-version X plans as that release (scan, asserts, "
        "case-format-v2 features); --variant V as its last release (legacy 0.29, fixed 0.32, fixed-sync 0.33). "
        "A lookup case (docs/case-format.md, \"Lookup cases\") prints get_num_new_matched_tokens' answer instead: "
        "hit (tokens; null = deferred), partial_tail_boundary and the keys asked, as --vllm-version X "
        "(default: the release it was captured on, else 0.33.0). A store case (\"Store cases\") prints what "
        "_build_store_jobs does: the horizon, next_stored_chunk_idx before and after, the chunks stored, whether "
        "they end within the computed tokens, and, where the case records what the release did, whether it agrees "
        "(as --vllm-version X, default the case's release). A trace finding file gives the case it names.",
    )
    add_case_args(p)
    add_variant_args(p)
    return p


def run(args) -> int:
    (variant,) = selected_variants(args, default=(Variant.FIXED_SYNC,))
    for case in read_cases(args.cases):
        if isinstance(case, StoreCase):
            print(json.dumps(plan_store(case, args.vllm_version).to_json(case)), flush=True)
            continue
        if isinstance(case, LookupCase):
            version = args.vllm_version or case.release or LATEST
            line = lookup_for_version(case, version).to_json(case.name)
            line["vllm_version"] = version
            print(json.dumps(line), flush=True)
            continue
        if args.vllm_version:  # that release's scan and its window/keys asserts
            plan = plan_for_version(case, args.vllm_version)
        else:
            plan = plan_load(case, variant)
        line = plan.to_json(case.name)
        line["variant"] = variant.value
        print(json.dumps(line), flush=True)
    return 0
