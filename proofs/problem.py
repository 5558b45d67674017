"""The shape of a proof obligation: ``Obligation`` (what it claims, about which releases, within
which ``Bound``, on which premises), the ``Problem`` its builder returns, and ``problem``, which adds
the premises' Z3 faces. Each property's module builds its obligations from these; the runner
(``runner.py``) runs any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from kvbound.spec import Variant
from kvbound.spec.verdicts import Verdict
from kvbound.spec.versions import LATEST, RELEASES, REPRESENTATIVE, Span, between, first_release, release_features

from .encoding import Code, code_for


# The code each obligation encodes, by the first release of its row of RELEASES. The proofs model
# the rows from the first whose asserts the encoding states (keys checked only where blocks are pending).
MODELLED = Span(first_release(lambda f: not f.keys_every_group), LATEST)
CODE_LEGACY = code_for(MODELLED.first)  # the legacy scan (the rows to LEGACY_LAST_RELEASE)
LEGACY_LAST_RELEASE = REPRESENTATIVE[Variant.LEGACY]  # each variant's last row
CODE_030 = code_for(first_release(lambda f: f.variant is Variant.FIXED))  # the fixed scan; the window ignores retained tokens
CODE_031 = code_for(first_release(lambda f: f.window_counts_retained))  # the window counts retained tokens
FIXED_LAST_RELEASE = REPRESENTATIVE[Variant.FIXED]
CODE_033 = code_for(first_release(lambda f: f.variant is Variant.FIXED_SYNC))  # sync loads, EAGLE partial tails


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
    releases: Span | None = None  # the releases, for an obligation without ``code`` (alignment, reservation, ...)
    releases_note: str = ""  # why the releases stop where they do, printed after them

    def __post_init__(self):
        if (self.code is None) == (self.releases is None):
            raise ValueError(f"obligation {self.id}: give its releases as a code (and last) or as a Span, not both")

    @property
    def span(self) -> Span:
        """The releases it is about, as data."""
        if self.code is None:
            return self.releases
        return Span(self.code.release.release, self.last or "")

    @property
    def release_range(self) -> str:
        return f"{self.span} ({self.releases_note})" if self.releases_note else str(self.span)

    def covered_codes(self) -> list:
        """``code`` and the code of every later row of RELEASES up to ``last`` that the encoding reads
        differently (its mutations kept): the codes a proved obligation must be proved for."""
        if self.code is None:
            return [None]
        out = [self.code]
        for r in between(self.span.first, self.span.last, [f.release for f in RELEASES]):
            code = Code(release_features(r), self.code.knobs)
            if all(code.signature != c.signature for c in out):
                out.append(code)
        return out


def problem(ob: "Obligation", code: Code | None = None) -> Problem:
    """The obligation's problem for ``code`` (default its own), its premises' Z3 faces added."""
    prob = ob.build(ob.code if code is None else code)
    if ob.premises:
        prob = replace(prob, premises=list(prob.premises) + prob.world.premise_terms(ob.premises))
    return prob
