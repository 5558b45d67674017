"""Subcommands of the ``kvbound`` console script (see ``kvbound.cli.COMMANDS``).

Each module has ``register(subparsers)``, returning its parser (``kvbound.cli`` sets its
``run`` as the parser's ``func``); ``run(args)`` returns an exit code or raises a
``kvbound.errors.KvboundError``. Commands never import ``kvbound.cli``.
"""

from __future__ import annotations

import argparse

from kvbound.spec import Variant, variant_for_version


def add_case_args(p: argparse.ArgumentParser, nargs: str = "+") -> None:
    """The CASE arguments of a command that reads case files (``kvbound.spec.load_case_paths``)."""
    p.add_argument("cases", nargs=nargs, metavar="CASE", help="case file (.json, .jsonl) or directory")


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
