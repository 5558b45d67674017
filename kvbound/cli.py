"""The ``kvbound`` console script: one subcommand per module in ``kvbound.commands``.

Exit codes, for CI (``kvbound.errors``): 0 all good; 1 a check failed (an obligation
missed its verdict, a disagreement); 2 bad input, an unpreparable release or an
inconclusive solver. Every deliberate error is a ``kvbound.errors.KvboundError``:
``main`` prints it as one line naming the case, field or flag, never a traceback.

Commands import ``kvbound.errors``, never this module, so ``python -m kvbound.cli`` and
``python -m kvbound`` see the same error classes as the console script.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kvbound import __version__
from kvbound.errors import EXIT_OK, KvboundError

# Each name is a module kvbound.commands.<name> with register(subparsers) -> parser and
# run(args) -> exit code; order is the order ``kvbound --help`` lists them.
COMMANDS = ["plan", "explain", "prove", "premises", "report", "catalogue", "conform", "diff", "bench", "trace", "campaign", "review"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvbound",
        description="Verification kit for vLLM's KV-offload load boundary (update_state_after_alloc).",
    )
    p.add_argument("--version", action="version", version=f"kvbound {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        command = importlib.import_module(f"kvbound.commands.{name}")
        command.register(sub).set_defaults(func=command.run)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KvboundError as e:
        print(f"kvbound {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
