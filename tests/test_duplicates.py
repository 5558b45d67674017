"""No logic written twice in kvbound: no run of 6 or more identical lines in two places.

Every module of kvbound (the layers spec/, proofs/, impl/ and the tool's own packages, read
where they are installed) is normalised line by line: each line stripped, blank lines,
comment-only lines and docstrings dropped. A run of ``MIN_LINES`` or more identical
normalised lines standing in two places (two modules, or two spots of one) is a finding,
unless every line of it is declarative: a literal, a tuple, list or dict entry, a call of
literals (a table row such as ``Mutant("x", "...", dict(knob=True)),``) or brackets alone.

This finds copies to the letter only: code alike but for its names and values (the
``duplicates`` command's ``shape`` rows) passes here.

The planted tests at the end show a copied function fails and a copied table does not.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict

from test_layers import installed_sources

MIN_LINES = 6
_DECLARATIVE_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.Dict,
                      ast.Set, ast.Call, ast.keyword, ast.Load, ast.UnaryOp, ast.USub, ast.JoinedStr,
                      ast.FormattedValue)
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_TABLE_NAME = re.compile(r"^[A-Za-z_][\w.]*\s*(:[^=]+)?=(?!=)\s*")  # "STEPS: dict = " opening a table


def _docstring_lines(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def normalised(text: str) -> list[tuple[int, str]]:
    """(line number, stripped line) of the lines that are code: no blank, comment-only or
    docstring line."""
    skip = _docstring_lines(ast.parse(text))
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#") and n not in skip:
            out.append((n, s))
    return out


def _brackets(text: str) -> tuple[int, str]:
    """How many closing brackets ``text`` starts with beyond what it opens, and the closers
    that would close what it leaves open."""
    stack, excess = [], 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.OP and tok.string in _CLOSERS:
                stack.append(_CLOSERS[tok.string])
            elif tok.type == tokenize.OP and tok.string in ")]}":
                if stack:
                    stack.pop()
                else:
                    excess += 1
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return excess, "".join(reversed(stack))


def declarative(line: str) -> bool:
    """Whether ``line`` is a piece of a table: brackets alone, or (open brackets closed,
    unmatched closers dropped, a leading ``NAME =`` dropped) a literal, an entry of a tuple
    or dict, a call of such or the arguments of one."""
    text = _TABLE_NAME.sub("", line.rstrip(",").strip(), count=1)
    if not text.strip("()[]{},: "):
        return True
    excess, closers = _brackets(text)
    while excess and text and text[-1] in ")]},":  # the closers of the entry this line ends
        excess -= text[-1] != ","
        text = text[:-1].rstrip()
    for candidate in (f"({text}{closers},)", f"{{{text}{closers}}}", f"row({text}{closers})"):
        try:
            tree = ast.parse(candidate, mode="eval")
        except SyntaxError:
            continue
        if all(isinstance(node, _DECLARATIVE_NODES) for node in ast.walk(tree)):
            return True
    return False


def repeats(sources: dict, min_lines: int = MIN_LINES) -> list[str]:
    """Each run of ``min_lines`` or more identical normalised lines found in two places,
    as "a:first-last ~ b:first-last" (the lines of each place), declarative runs left out."""
    lines = {name: normalised(text) for name, text in sources.items()}
    places = defaultdict(list)
    for name, rows in lines.items():
        for i in range(len(rows) - min_lines + 1):
            places[tuple(s for _, s in rows[i:i + min_lines])].append((name, i))
    starts = defaultdict(set)  # (a, b, offset) -> the windows of a that stand again in b, offset on
    for where in places.values():
        for x, (a, i) in enumerate(where):
            for b, j in where[x + 1:]:
                if a != b or j - i >= min_lines:
                    starts[(a, b, j - i)].add(i)
    out = []
    for (a, b, offset), windows in sorted(starts.items()):
        for i in sorted(windows):
            if i - 1 in windows:
                continue
            end = i
            while end + 1 in windows:
                end += 1
            run = lines[a][i:end + min_lines]
            if all(declarative(s) for _, s in run):
                continue
            other = lines[b][i + offset:end + offset + min_lines]
            out.append(f"{a}:{run[0][0]}-{run[-1][0]} ~ {b}:{other[0][0]}-{other[-1][0]}")
    return out


def test_no_module_repeats_six_lines_of_another():
    found = repeats(installed_sources())
    assert found == [], "written twice:\n" + "\n".join(found)


_FUNCTION = '''
def judged(rec, diff, mismatch):
    if mismatch:
        rec["config_mismatch"] = mismatch
        diff.append("config")
    rec["diff"] = diff
    rec["verdict"] = "disagree" if diff else "agree"
    return rec
'''

_TABLE = '''
STEPS = {
    "variant": (
        ("0.20.0", _L, "the load-start scan from 0"),
        ("0.30.0", _F, "the scan from cdiv(N, b)"),
        ("0.33.0", _FS, "as fixed; a sync load matches by position"),
    ),
    "keys": (
        Mutant("keys-slice-end", "keys end at T // tpc", "keys", dict(end_chunk_floor=True)),
        Mutant("pending+1", "group size k - start + 1", "plan",
               dict(pending_offset=1), killer="destinations-exact"),
    ),
}
'''


def test_a_copied_function_is_found_with_both_places():
    sources = {"kvbound.a": '"""A."""\n\nimport json\n' + _FUNCTION,
               "kvbound.b": "# b\nX = 1\n" + _FUNCTION.replace("\n    rec[", "\n\n    # a comment\n    rec[")}
    assert repeats(sources) == ["kvbound.a:5-11 ~ kvbound.b:4-14"]
    # the same function twice in one module is found too; five lines are not a run
    assert repeats({"kvbound.a": _FUNCTION + "\n" + _FUNCTION.replace("judged", "closed")}) == [
        "kvbound.a:3-8 ~ kvbound.a:12-17"]
    short = "\n".join(_FUNCTION.splitlines()[:6])
    assert repeats({"kvbound.a": short, "kvbound.b": short}) == []


def test_a_copied_table_is_declarative_and_allowed():
    assert repeats({"kvbound.a": _TABLE, "kvbound.b": "Y = 2\n" + _TABLE}) == []
    assert all(declarative(s) for _, s in normalised(_TABLE)[1:])
    assert not declarative('rec["diff"] = diff') and not declarative("return rec")
    assert not declarative("if mismatch:") and not declarative("for f in fields:")
