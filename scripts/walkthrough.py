#!/usr/bin/env python3
"""Keep docs/walkthrough.md's pasted output real: rerun every ``$ command`` in its
``console`` blocks (bash, repository root, this interpreter's bin/ first on PATH) and
write (``--write``) or compare (``--check``) what they print.

    scripts/walkthrough.py --write             # rerun all, paste the real output
    scripts/walkthrough.py --check [--fast]    # exit 1 if any output changed

Timings (``0.42 s``, ``(11 s)``, ``seconds``) are masked when comparing, with the spaces that pad
them to a column (a faster or slower machine prints a wider or narrower number); nothing else.
``--fast`` skips commands that run or read conform (prepared vLLM releases, ~30 s).
Each block is one command; its stdout is pasted, then ``[exit N]``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "walkthrough.md"
BLOCK = re.compile(r"```console\n\$ ([^\n]*)\n(.*?)```", re.S)
TIMING = re.compile(r"\b\d+(?:\.\d+)?(?= ?s\b)|\b\d+\.\d+\b")
MASK = "\u27e8t\u27e9"  # what a timing becomes; no command prints it
PADDED = re.compile(" *" + MASK + " *")


def masked(text: str) -> str:
    """``text`` with every timing, and the column padding around it, made one mask."""
    return PADDED.sub(" " + MASK + " ", TIMING.sub(MASK, text))


def run(command: str) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    r = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return r.stdout.rstrip("\n") + f"\n[exit {r.returncode}]\n"


def slow(command: str) -> bool:
    return "conform" in command


def blocks(text: str):
    return list(BLOCK.finditer(text))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    ap.add_argument("--fast", action="store_true", help="skip conform commands")
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    text = args.doc.read_text()
    out, last, failed = [], 0, 0
    for m in blocks(text):
        command, pasted = m.group(1), m.group(2)
        out.append(text[last:m.start()])
        last = m.end()
        if args.fast and slow(command):
            out.append(m.group(0))
            print(f"skipped (--fast): {command}")
            continue
        real = run(command)
        out.append(f"```console\n$ {command}\n{real}```")
        if args.check:
            a, b = masked(pasted), masked(real)
            if a != b:
                failed += 1
                print(f"CHANGED: {command}")
                sys.stdout.writelines(difflib.unified_diff(
                    a.splitlines(True), b.splitlines(True), "pasted", "now", n=1))
            else:
                print(f"same: {command}")
        else:
            print(f"ran: {command}")
    out.append(text[last:])
    if args.write:
        args.doc.write_text("".join(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
