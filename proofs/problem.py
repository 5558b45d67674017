"""The shape of a proof obligation: ``Obligation`` (what it claims, about which releases, within
which ``Bound``, on which premises), the ``Problem`` its builder returns, and ``problem``, which adds
the premises' Z3 faces. Each property's module builds its obligations from these; the runner
(``runner.py``) runs any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from kvbound.spec.verdicts import Verdict

from .encoding import Code, code_for


# The code each obligation encodes, by the first release of its row of RELEASES.
CODE_LEGACY, LEGACY_LAST_RELEASE = code_for("0.28.0"), "0.29.0"  # the proofs model 0.28+ (the legacy rows 0.28, 0.29)
CODE_030 = code_for("0.30.0")  # the fixed scan; the window in chunks ignores retained tokens
CODE_031 = code_for("0.31.0")  # 0.31 - 0.32: the window counts retained tokens
CODE_033 = code_for("0.33.0")  # sync loads, EAGLE partial tails
LATEST = "0.33.0"


@dataclass(frozen=True)
class Problem:
    """What the runner decides: is ``premises ∧ constraints ∧ ¬claim`` unsat?"""

    premises: list
    claim: object
    world: object = None  # the premises' Z3 faces (``premise_terms(ids)``) and a model's witness (``to_case``)
    constraints: list = field(default_factory=list)  # what pins the encoded code's unknowns (each plan's constraints)
    tables: bool = True  # symbolic block tables: the runner also searches tables of a few fixed lengths
    witness: Callable | None = None  # model -> Case, for a refutation
    shaping: list = field(default_factory=list)  # small-numbers constraints tried first for witnesses
    splits: tuple = (True,)  # a case split covering every input; proved iff every case is unsat
    cases: tuple = (True,)  # vacuity: the premises must admit an input in each of these cases


@dataclass(frozen=True)
class Bound:
    """How far a claim reaches, per dimension, as data (printed by prove, JSON, JUnit, catalogue).

    ``None`` in a dimension means Z3 reasons about every value (a symbolic table, an
    unbounded integer); a number is the largest value covered."""

    groups: int | None = 1  # KV-cache groups in one formula
    table_length: int | None = None  # blocks per group's table
    sizes: str = "unbounded"  # tokens_per_block, blocks_per_chunk, N, M: what ranges Z3 covers
    why: str = ""  # why the bounded dimensions are bounded

    def text(self) -> str:
        g = "—" if self.groups == 0 else ("any" if self.groups is None else
                                           ("1" if self.groups == 1 else f"≤{self.groups}"))
        t = "—" if self.table_length == 0 else ("any" if self.table_length is None else f"≤{self.table_length}")
        return f"groups {g}; table {t}; sizes {self.sizes}"

    def to_json(self) -> dict:
        return {"groups": self.groups, "table_length": self.table_length, "sizes": self.sizes, "why": self.why,
                "text": self.text()}


ONE_GROUP = Bound(1, None, "unbounded", "one group: the plan loops over groups with no state carried between "
                  "them, so a claim about one group holds for each (the hybrid obligations check groups together)")
NO_TABLE = Bound(0, 0, "unbounded", "arithmetic only: no table enters the formula")


@dataclass(frozen=True)
class Obligation:
    id: str
    statement: str  # English, for the report and the docs
    math: str  # the claim as a formula, for the invariant catalogue
    premise: str  # the premise that makes it hold (or whose absence the witness shows)
    expected: Verdict  # PROVED or REFUTED
    build: Callable  # (knobs) -> Problem
    code: Code | None = None  # the release it is about (its row of RELEASES); mutants perturb it
    reproduce: Callable | None = None  # (Case) -> str | None: None when the spec shows the failure
    bound: Bound = ONE_GROUP  # how far the claim reaches, per dimension
    premises: tuple = ()  # ids of proofs.premises assumed (their Z3 faces are added by ``problem``)
    mutable: bool = True  # does a mutant of the scan/plan change what it encodes?
    about: Code | None = None  # code outside the spec the witness is about (shown beside the drawing)
    last: str | None = None  # the last release it covers (from ``code``'s release): a proved one is proved
    # on every row of RELEASES in between whose encoded code differs (``covered_codes``)
    releases: str = ""  # the releases in words, for an obligation without ``code`` (alignment, reservation)

    @property
    def release_range(self) -> str:
        if self.code is None:
            return self.releases
        first = self.code.release.release
        last = self.last or first
        return first if last == first else f"{first} – {last}"

    def covered_codes(self) -> list:
        """``code`` and the code of every later row of RELEASES up to ``last`` that the encoding reads
        differently (its mutations kept): the codes a proved obligation must be proved for."""
        if self.code is None:
            return [None]
        from kvbound.spec import RELEASES
        from kvbound.spec.versions import parse_version

        lo, hi = parse_version(self.code.release.release)[:2], parse_version(self.last or self.code.release.release)[:2]
        out = [self.code]
        for first, row in RELEASES:
            if lo < first <= hi:
                code = Code(row, self.code.knobs)
                if all(code.signature != c.signature for c in out):
                    out.append(code)
        return out


def problem(ob: "Obligation", code: Code | None = None) -> Problem:
    """The obligation's problem for ``code`` (default its own), its premises' Z3 faces added."""
    prob = ob.build(ob.code if code is None else code)
    if ob.premises:
        prob = replace(prob, premises=list(prob.premises) + prob.world.premise_terms(ob.premises))
    return prob
