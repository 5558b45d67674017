"""A unified diff applied to a copy of a vLLM tree (``kvbound review --patch FILE``).

Pure Python, so it runs where neither ``patch`` nor ``git`` is installed (a bare Debian image,
the CI's fresh clone). It reads what ``diff -u`` and ``git diff`` write: ``---``/``+++``
headers (a tab and a timestamp after the path are dropped; ``a/`` and ``b/`` prefixes, ``-p1``,
are stripped), ``@@ -l,s +l,s @@`` hunks, ``\\ No newline at end of file``, new files (from
``/dev/null``) and deleted ones (to ``/dev/null``); git's extended header lines (``diff --git``,
``index``, modes) are skipped. Each hunk must match its context and removed lines exactly, at
its line or shifted (the nearest place after the previous hunk, as ``patch`` does with an
offset), never with fuzz: a hunk that does not match is a ``UsageError`` naming the patch,
the file and the hunk, and the tree is left as it was only in the sense that the caller
throws the copy away (``copy_and_apply`` writes into a fresh copy, never into its source).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from kvbound.errors import UsageError

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
DEV_NULL = "/dev/null"
PACKAGE = "vllm"  # what a run imports from a tree: the only part copied and patched


@dataclass
class Hunk:
    header: str  # the @@ line as written
    old_start: int
    old: list = field(default_factory=list)  # context and removed lines, with their line ends
    new: list = field(default_factory=list)  # context and added lines


@dataclass
class FileDiff:
    old_path: str | None  # None: a new file
    new_path: str | None  # None: a deleted file
    hunks: list = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path


def _header_path(line: str, where: str) -> str | None:
    raw = line[4:].rstrip("\n").split("\t", 1)[0].strip()
    if raw.startswith('"'):
        raise UsageError(f"{where}: quoted path {raw} (a name git had to escape) is not supported")
    if raw == DEV_NULL:
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    p = PurePosixPath(raw)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise UsageError(f"{where}: path {raw!r} must be relative to the tree's root (vllm/...), inside it")
    return str(p)


def parse(text: str, name: str) -> list:
    """The file diffs of a unified diff, or a UsageError naming the patch, the line and the rule."""
    lines = text.splitlines(keepends=True)
    out: list = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            where = f"patch {name} line {i + 1}"
            fd = FileDiff(_header_path(line, where), _header_path(lines[i + 1], where))
            if fd.old_path is None and fd.new_path is None:
                raise UsageError(f"{where}: both sides are {DEV_NULL}")
            if fd.old_path and fd.new_path and fd.old_path != fd.new_path:
                raise UsageError(f"{where}: renames ({fd.old_path} -> {fd.new_path}) are not supported")
            out.append(fd)
            i += 2
            continue
        m = HUNK.match(line)
        if m:
            if not out:
                raise UsageError(f"patch {name} line {i + 1}: a hunk before any ---/+++ file header")
            i = _read_hunk(lines, i, m, out[-1], name)
            continue
        i += 1  # git's extended headers, prose between files
    if not out:
        raise UsageError(f"patch {name}: no file diff in it (expected ---/+++ headers and @@ hunks)")
    for fd in out:
        if not fd.hunks:
            raise UsageError(f"patch {name}: {fd.path} has a header and no hunk")
    return out


def _read_hunk(lines: list, i: int, m, fd: FileDiff, name: str) -> int:
    old_n = int(m.group(2)) if m.group(2) is not None else 1
    new_n = int(m.group(4)) if m.group(4) is not None else 1
    h = Hunk(lines[i].rstrip("\n"), int(m.group(1)))
    seen_old = seen_new = 0
    j = i + 1
    last = None  # the list the last body line went to, for "\ No newline at end of file"
    while j < len(lines) and (seen_old < old_n or seen_new < new_n or lines[j].startswith("\\")):
        body = lines[j]
        tag, rest = body[:1], body[1:]
        if tag == "\\":
            for side in last or ():
                side[-1] = side[-1].rstrip("\n")
            j += 1
            continue
        if body in ("\n", "\r\n"):  # an empty context line some editors strip to nothing
            tag, rest = " ", body
        if tag == " ":
            h.old.append(rest)
            h.new.append(rest)
            seen_old += 1
            seen_new += 1
            last = (h.old, h.new)
        elif tag == "-":
            h.old.append(rest)
            seen_old += 1
            last = (h.old,)
        elif tag == "+":
            h.new.append(rest)
            seen_new += 1
            last = (h.new,)
        else:
            break
        j += 1
    if seen_old != old_n or seen_new != new_n:
        raise UsageError(f"patch {name}: {fd.path} hunk {len(fd.hunks) + 1} ({h.header}): its body has"
                         f" {seen_old} old and {seen_new} new line(s), the header says {old_n} and {new_n}")
    fd.hunks.append(h)
    return j


def _place(text: list, hunk: Hunk, expected: int, floor: int) -> int | None:
    """Where ``hunk``'s old lines match ``text`` exactly: ``expected``, else the nearest index
    at or after ``floor``; None when nowhere."""
    n = len(hunk.old)
    candidates = range(floor, len(text) - n + 1)
    for k in sorted(candidates, key=lambda k: (abs(k - expected), k)):
        if text[k:k + n] == hunk.old:
            return k
    return None


def apply_file(fd: FileDiff, text: str | None, name: str) -> str | None:
    """``fd`` applied to a file's text (None: the file does not exist); the new text, None
    for a deleted file; a UsageError naming the patch, the file and the hunk that does not apply."""
    if fd.old_path is None and text is not None:
        raise UsageError(f"patch {name}: {fd.path} hunk 1 ({fd.hunks[0].header}) creates a file that exists")
    if fd.old_path is not None and text is None:
        raise UsageError(f"patch {name}: {fd.path} hunk 1 ({fd.hunks[0].header}) does not apply: no such file in"
                         f" the tree")
    lines = (text or "").splitlines(keepends=True)
    out: list = []
    pos = 0  # lines[:pos] are done
    shift = 0  # where the previous hunk landed against where it said
    for n, h in enumerate(fd.hunks, 1):
        expected = max(h.old_start - 1 + (0 if h.old else 1), 0) + shift
        at = _place(lines, h, expected, pos)
        if at is None:
            first = next((ln for ln in h.old if ln.strip()), "").strip()
            raise UsageError(f"patch {name}: {fd.path} hunk {n} ({h.header}) does not apply: its"
                             f" {len(h.old)} context/removed line(s) (from {first[:60]!r}) are not in the file"
                             f" at or after line {pos + 1}")
        shift = at - (h.old_start - 1 + (0 if h.old else 1))
        out += lines[pos:at] + h.new
        pos = at + len(h.old)
    out += lines[pos:]
    if fd.new_path is None:
        if out:
            raise UsageError(f"patch {name}: {fd.path} is deleted but its hunks leave {len(out)} line(s)")
        return None
    return "".join(out)


def copy_and_apply(source: Path, dest: Path, patch: Path) -> tuple:
    """A copy of the ``vllm/`` package of the tree ``source`` under ``dest`` (which must not
    exist), ``patch`` applied to it: (the paths it changed, the paths it left out: a diff of a
    file outside ``vllm/``, e.g. a regression test under ``tests/``, which no run imports).
    ``source`` is only read. Every hunk is checked before anything is copied or written, so a
    patch that does not apply raises before the copy exists."""
    try:
        text = patch.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--patch {patch}: not a readable text file ({e})") from None
    results: dict = {}
    skipped = []
    for fd in parse(text, str(patch)):
        if PurePosixPath(fd.path).parts[0] != PACKAGE:
            skipped.append(fd.path)
            continue
        target = source / fd.path
        before = results[fd.path] if fd.path in results else (target.read_text() if target.is_file() else None)
        results[fd.path] = apply_file(fd, before, str(patch))
    if not results:  # nothing the runs import would differ: a review of two equal trees says nothing
        raise UsageError(f"patch {patch}: changes no file under {PACKAGE}/ (only {', '.join(sorted(set(skipped)))});"
                         f" paths must be relative to the tree's root: {PACKAGE}/...")
    shutil.copytree(source / PACKAGE, dest / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, after in results.items():
        target = dest / rel
        if after is None:
            target.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(after)
    return sorted(results), sorted(set(skipped))
