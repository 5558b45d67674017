"""Every kind of case, read side by side: a load case (``update_state_after_alloc``,
``cases.py``), a lookup case (``get_num_new_matched_tokens``, ``lookup_case.py``) and a store case
(``_build_store_jobs``, ``store_case.py``), told apart by their top-level field
(docs/case-format.md). One file or directory may hold all three.
"""

from __future__ import annotations

from .cases import case_from_dict, load_case_paths
from .lookup_case import is_lookup_case, lookup_case_from_dict
from .store_case import is_store_case, store_case_from_dict

LOAD, LOOKUP, STORE = "load", "lookup", "store"
KINDS = (LOAD, LOOKUP, STORE)


def kind_of(d) -> str:
    """Which call a case's JSON object is: ``lookup``, ``store`` or (any other object) ``load``."""
    if is_lookup_case(d):
        return LOOKUP
    if is_store_case(d):
        return STORE
    return LOAD


def case_of_any_kind(d, where: str = "?"):
    """A ``Case``, ``LookupCase`` or ``StoreCase`` from its JSON object (each validated by its reader)."""
    return {LOOKUP: lookup_case_from_dict, STORE: store_case_from_dict, LOAD: case_from_dict}[kind_of(d)](d, where)


def load_any_case_paths(paths, parse=case_of_any_kind) -> list:
    """Like ``cases.load_case_paths``, every kind of case in file order (``parse`` may unwrap more:
    the tool's reads trace finding files too)."""
    return load_case_paths(paths, parse)


__all__ = ["KINDS", "LOAD", "LOOKUP", "STORE", "case_of_any_kind", "kind_of", "load_any_case_paths"]
