"""The ``kvbound`` console script: one subcommand per module in ``kvbound.commands``.

Exit codes, for CI: 0 all good; 1 a check failed (an obligation missed its
verdict, a disagreement); 2 bad input or an inconclusive solver. A ``CaseError``
or other input error prints one line naming the field, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvbound import __version__
from kvbound.spec import CaseError, UnsupportedVersion

# Each name is a module kvbound.commands.<name> with register(subparsers) -> parser
# (which sets ``func``); order is the order ``kvbound --help`` lists them.
COMMANDS = ["plan", "explain", "prove", "report", "catalogue", "conform", "diff", "bench", "trace"]

EXIT_OK, EXIT_FAIL, EXIT_INPUT = 0, 1, 2


class UsageError(Exception):
    """A user-facing error: printed as one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvbound",
        description="Verification kit for vLLM's KV-offload load boundary (update_state_after_alloc).",
    )
    p.add_argument("--version", action="version", version=f"kvbound {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"kvbound.commands.{name}").register(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CaseError, UnsupportedVersion, UsageError) as e:
        print(f"kvbound {args.command}: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
