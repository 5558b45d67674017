"""Arithmetic and logic that fold on Python ints and build Z3 terms otherwise.

One encoding serves two uses: the unbounded obligations (every input a Z3
variable) and ``check_plan`` (a concrete case, only the outputs symbolic).
With concrete inputs these helpers evaluate in Python, so a concrete case costs
a handful of Z3 terms per group instead of a term per table position.
"""

from __future__ import annotations

import z3


def concrete(*xs) -> bool:
    return all(isinstance(x, (int, bool)) for x in xs)


def AND(*xs):
    terms = []
    for x in xs:
        if x is False:
            return False
        if x is not True:
            terms.append(x)
    if not terms:
        return True
    return terms[0] if len(terms) == 1 else z3.And(*terms)


def OR(*xs):
    terms = []
    for x in xs:
        if x is True:
            return True
        if x is not False:
            terms.append(x)
    if not terms:
        return False
    return terms[0] if len(terms) == 1 else z3.Or(*terms)


def NOT(x):
    return (not x) if isinstance(x, bool) else z3.Not(x)


def IMPLIES(a, b):
    return OR(NOT(a), b)


def IF(c, a, b):
    if c is True:
        return a
    if c is False:
        return b
    return z3.If(c, a, b)


def FLOORDIV(a, b):
    """Floor division for a >= 0, b >= 1 (Z3's integer ``/`` agrees there)."""
    return a // b if concrete(a, b) else a / b


def CDIV(a, b):
    """vLLM's ``cdiv`` for a >= 0, b >= 1."""
    return -(a // -b) if concrete(a, b) else (a + b - 1) / b


def MOD(a, b):
    return a % b


def MIN(a, b):
    return min(a, b) if concrete(a, b) else z3.If(a <= b, a, b)


def MAX(a, b):
    return max(a, b) if concrete(a, b) else z3.If(a >= b, a, b)


def as_bool(x) -> z3.BoolRef:
    return z3.BoolVal(x) if isinstance(x, bool) else x
