"""Arithmetic and logic that fold on Python ints and build Z3 terms otherwise.

One encoding serves two uses: the unbounded obligations (every input a Z3
variable) and ``check_plan`` (a concrete case, only the outputs symbolic).
With concrete inputs these helpers evaluate in Python, so a concrete case costs
a handful of Z3 terms per group instead of a term per table position.
"""

from __future__ import annotations

import z3

from kvbound.spec import cdiv


def concrete(*xs) -> bool:
    return all(isinstance(x, (int, bool)) for x in xs)


def _fold(xs, unit: bool, op: str, z3_op):
    """``xs`` joined by ``op`` (``and`` with unit True, ``or`` with unit False): the
    absorbing constant ends it, the unit drops out, one term stands alone."""
    terms = []
    for x in xs:
        if x is (not unit):
            return not unit
        if x is not unit:
            terms.append(x)
    if not terms:
        return unit
    if len(terms) == 1:
        return terms[0]
    if isinstance(terms[0], Sx):
        return Sx(f"({op} {' '.join(_lit(t) for t in terms)})")
    return z3_op(*terms)


def AND(*xs):
    return _fold(xs, True, "and", z3.And)


def OR(*xs):
    return _fold(xs, False, "or", z3.Or)


def NOT(x):
    if isinstance(x, bool):
        return not x
    return Sx(f"(not {x.text})") if isinstance(x, Sx) else z3.Not(x)


def IMPLIES(a, b):
    return OR(NOT(a), b)


def IF(c, a, b):
    if c is True:
        return a
    if c is False:
        return b
    if isinstance(c, Sx):
        return Sx(f"(ite {c.text} {_lit(a)} {_lit(b)})")
    return z3.If(c, a, b)


def FLOORDIV(a, b):
    """Floor division for a >= 0, b >= 1 (Z3's integer ``/`` agrees there)."""
    return a // b if concrete(a, b) or isinstance(a, Sx) or isinstance(b, Sx) else a / b


def CDIV(a, b):
    """vLLM's ``cdiv`` for a >= 0, b >= 1 (``kvbound.spec.cdiv`` on ints)."""
    if concrete(a, b):
        return cdiv(a, b)
    return FLOORDIV(a + b - 1, b)


def MOD(a, b):
    return a % b


def MIN(a, b):
    return min(a, b) if concrete(a, b) else IF(a <= b, a, b)


def MAX(a, b):
    return max(a, b) if concrete(a, b) else IF(a >= b, a, b)


def as_bool(x) -> z3.BoolRef:
    return z3.BoolVal(x) if isinstance(x, bool) else x


def _lit(x) -> str:
    if isinstance(x, Sx):
        return x.text
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x) if x >= 0 else f"(- {-x})"


class Sx:
    """An SMT-LIB term as text: the same encoding, built without Python Z3 objects.

    A concrete case leaves only a few unknowns per group; building their terms as
    text and letting Z3's parser make the ASTs in one call is several times faster
    than the Python API (which ``check_plan``'s rate needs). Semantics are SMT-LIB's:
    ``div``/``mod`` agree with Python's ``//``/``%`` for a positive divisor.
    """

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def _op(self, op, other, swap=False):
        a, b = (_lit(other), self.text) if swap else (self.text, _lit(other))
        return Sx(f"({op} {a} {b})")

    __add__ = lambda s, o: s._op("+", o)  # noqa: E731
    __radd__ = lambda s, o: s._op("+", o, True)  # noqa: E731
    __sub__ = lambda s, o: s._op("-", o)  # noqa: E731
    __rsub__ = lambda s, o: s._op("-", o, True)  # noqa: E731
    __mul__ = lambda s, o: s._op("*", o)  # noqa: E731
    __rmul__ = lambda s, o: s._op("*", o, True)  # noqa: E731
    __floordiv__ = lambda s, o: s._op("div", o)  # noqa: E731
    __rfloordiv__ = lambda s, o: s._op("div", o, True)  # noqa: E731
    __truediv__ = __floordiv__
    __mod__ = lambda s, o: s._op("mod", o)  # noqa: E731
    __rmod__ = lambda s, o: s._op("mod", o, True)  # noqa: E731
    __le__ = lambda s, o: s._op("<=", o)  # noqa: E731
    __lt__ = lambda s, o: s._op("<", o)  # noqa: E731
    __ge__ = lambda s, o: s._op(">=", o)  # noqa: E731
    __gt__ = lambda s, o: s._op(">", o)  # noqa: E731
    __eq__ = lambda s, o: s._op("=", o)  # noqa: E731
    __ne__ = lambda s, o: Sx(f"(not {s._op('=', o).text})")  # noqa: E731
    __hash__ = None

    def __bool__(self):
        raise TypeError("an Sx term has no Python truth value; use AND/OR/IF")

    def __repr__(self):
        return f"Sx({self.text})"
