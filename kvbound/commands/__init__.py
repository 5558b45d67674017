"""Subcommands of the ``kvbound`` console script (see ``kvbound.cli.COMMANDS``).

Each module has ``register(subparsers)``, returning its parser (``kvbound.cli`` sets its
``run`` as the parser's ``func``); ``run(args)`` returns an exit code or raises a
``kvbound.errors.KvboundError``. Commands never import ``kvbound.cli``.
"""

from __future__ import annotations

import argparse

from kvbound.errors import CaseError
from kvbound.spec import Variant, variant_for_version
from kvbound.spec.case_kinds import case_of_any_kind, load_any_case_paths

# the cases a trace finding file (kvbound.records.TraceFileRecord) may name, most specific first
FINDING_CASES = ("detail.store_case", "detail.lookup_case", "case")


def add_case_args(p: argparse.ArgumentParser, nargs: str = "+") -> None:
    """The CASE arguments of a command that reads case files (``read_cases``)."""
    p.add_argument("cases", nargs=nargs, metavar="CASE",
                   help="case file (.json, .jsonl: load, lookup or store cases, or a trace finding file) or directory")


def case_of_file_object(d, where: str = "?"):
    """A case of any kind from one JSON object; a trace finding file gives the case it names
    (``FINDING_CASES``): a store or lookup finding's replayable case, else the captured load call."""
    from kvbound.records import TRACE_FILE_FORMAT

    if not (isinstance(d, dict) and d.get("format") == TRACE_FILE_FORMAT):
        return case_of_any_kind(d, where)
    for path in FINDING_CASES:
        obj = d
        for part in path.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else None
        if isinstance(obj, dict):
            return case_of_any_kind(obj, f"{where}: {path}")
    raise CaseError(where, "(trace file)", f"the finding ({d.get('kind')}) names no case (none of "
                    f"{', '.join(FINDING_CASES)}): replay it with kvbound trace --replay")


def read_cases(paths) -> list:
    """Every case of every kind in the files and directories, in file order (trace finding files
    give the case they name)."""
    return load_any_case_paths(paths, case_of_file_object)


def add_variant_args(p: argparse.ArgumentParser, default=None) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--variant", choices=[v.value for v in Variant], help="spec variant to run")
    g.add_argument("--vllm-version", metavar="X", help="run the variant vLLM release X uses, e.g. 0.29.0")


def selected_variants(args, default=tuple(Variant)) -> tuple:
    if getattr(args, "variant", None):
        return (Variant(args.variant),)
    if getattr(args, "vllm_version", None):
        return (variant_for_version(args.vllm_version),)
    return tuple(default)
