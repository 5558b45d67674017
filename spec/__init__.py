"""kvbound.spec: the vocabulary and the executable reference of vLLM's load plan.

Directory ``spec/`` at the repository top, installed as ``kvbound.spec``: layer 0, the
reference the three relations check against (docs/architecture.md).

Imports nothing from the other layers (proofs, impl and the tool import it); its errors
are ``kvbound.errors``, the leaf every layer shares.
"""

from .case import Case
from .cases import (
    CaseError,
    case_from_dict,
    case_to_dict,
    dump_cases,
    load_case_paths,
    load_cases,
    parse_block,
    parse_table,
)
from .plan import boundary_key, load_start_gpu_block_idx, partial_tail_key_tokens, plan_for_version, plan_load, scan_from
from .versions import (
    RELEASES,
    REPRESENTATIVE,
    UnsupportedVersion,
    release_features,
    unsupported_reason,
    variant_features,
    variant_for_version,
)
from .vocab import (
    NULL,
    AssertName,
    Assertion,
    Block,
    BlockState,
    Group,
    GroupConfig,
    GroupKind,
    GroupPlan,
    H,
    KIND_CHUNKED,
    KIND_CODES,
    KIND_FULL,
    KIND_MAMBA,
    KIND_OF_CODE,
    KIND_SLIDING,
    LOAD_FIELDS,
    LoadPlan,
    PLAN_FIELDS,
    ReleaseFeatures,
    STATE_CODES,
    STATE_H,
    STATE_N,
    STATE_U,
    U,
    Variant,
    cdiv,
    eagle_proof_margin,
    get_num_skipped_tokens,
    lcm_all,
)

__all__ = [name for name in dir() if not name.startswith("_")]


def __getattr__(name):
    """The v1 names (``ReleaseAsserts``, ``LATEST_ASSERTS``, ``release_asserts``), each with a DeprecationWarning."""
    from . import versions, vocab

    for module in (vocab, versions):
        try:
            return module.__getattr__(name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
